"""The term language, declared once: one dataclass per egglog constructor.

Every constructor of the e-graph's language is a frozen dataclass below. Its
fields, in egglog argument order, give its signature (``Term`` fields are the
``Tensor`` sort, ``ListTerm`` fields ``TList``, ``int`` ``i64``, ``float``
``f64``, ``str`` ``String``, ``Shape`` the ``Shape`` vector); its
:class:`Role` says whether it is a view, how the cost model prices it and how
the rebuilder writes it back as FX. The translator and batching build these
objects; they become egglog text only when the e-graph loads them
(:func:`render`), and :func:`egglog_declarations` writes the datatype
declarations the language program starts with. After saturation the e-graph
is read back as generic rows (``egraph_export.TermNode``: a constructor name
and arguments), which look their constructor up in :data:`CTORS`.

    >>> render(Reshape(Slice(Id(3), 1, 0, 4), (8, 4)))
    '(Reshape (Slice (Id 3) 1 0 4) (vec-of 8 4))'
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar
from typing import Union as _Union

import torch
from typing_extensions import dataclass_transform

Shape = tuple[int, ...]


class Role(enum.Enum):
    """What a constructor is, for pricing and rebuilding."""

    NAMING = "naming"  # Id, LId: tie facts together; never extracted
    LEAF = "leaf"  # a value kept as it is (placeholder, parameter, opaque op): free
    VIEW = "view"  # metadata only (slice, reshape, permute, expand, list end): launches nothing
    CELL = "cell"  # one member of a cat list
    CAT = "cat"  # torch.cat of a list: a copy unless it fuses
    ELEMENTWISE = "elementwise"  # Unary/Binary/Scalar: fuse with neighbours
    OP = "op"  # Op1-Op3: priced by the kind of its op key
    HELPER = "helper"  # rewritten away by rules: never extracted


# Roles the rebuilder writes as FX (the rest are never part of a program).
EMITTED_ROLES = frozenset({Role.LEAF, Role.VIEW, Role.CELL, Role.CAT, Role.ELEMENTWISE, Role.OP})


class Term:
    """A ``Tensor`` term."""

    __slots__ = ()
    ctor: ClassVar[str]

    def __str__(self) -> str:
        return render(self)


class ListTerm:
    """A ``TList`` term: tensors concatenated along one dim (the dim sits in the list's end)."""

    __slots__ = ()
    ctor: ClassVar[str]

    def __str__(self) -> str:
        return render(self)


@dataclass(frozen=True)
class CtorInfo:
    """One constructor: egglog name, signature, role, how it is declared, and its doc line."""

    name: str
    cls: type
    field_names: tuple[str, ...]
    sorts: tuple[str, ...]  # egglog sorts of the fields
    output: str  # "Tensor" or "TList"
    role: Role
    declared_in_datatype: bool  # inside `(datatype Tensor ...)` / `(datatype TList ...)`, else `(constructor ...)`
    doc: str
    # The FX call a view is rebuilt as: ``fx(term, operand) -> (op, target, args)``, where the
    # term's fields are plain values; None for constructors the rebuilder handles itself
    # (leaves, lists, cats, op keys).
    fx: Callable[..., tuple[str, object, tuple]] | None = None

    @property
    def arity(self) -> int:
        """Number of ``Tensor``/``TList`` children."""
        return sum(s in ("Tensor", "TList") for s in self.sorts)

    @property
    def is_view(self) -> bool:
        return self.role is Role.VIEW

    @property
    def emitted(self) -> bool:
        return self.role in EMITTED_ROLES

    def pattern(self, suffix: str = "_") -> str:
        """An egglog query pattern with a fresh variable per field, e.g. ``(Slice x_ dim_ start_ end_)``."""
        return f"({self.name} {' '.join(f + suffix for f in self.field_names)})"


CTORS: dict[str, CtorInfo] = {}

_SORT_OF = {"Term": "Tensor", "ListTerm": "TList", "int": "i64", "float": "f64", "str": "String", "Shape": "Shape"}


@dataclass_transform(frozen_default=True)  # (type checkers see each constructor as the dataclass it is)
def _ctor(role: Role, doc: str, datatype: bool = True, fx: Callable | None = None) -> Callable[[type], type]:
    """Register a dataclass as a constructor of the language (declaration order is egglog's)."""

    def register(cls: type) -> type:
        cls = dataclass(frozen=True, slots=True)(cls)
        hints = typing.get_type_hints(cls, globalns=globals())
        names = tuple(f.name for f in fields(cls))
        sorts = tuple(_SORT_OF[_hint_name(hints[n])] for n in names)
        output = "TList" if issubclass(cls, ListTerm) else "Tensor"
        cls.ctor = cls.__name__  # type: ignore[attr-defined]
        CTORS[cls.__name__] = CtorInfo(cls.__name__, cls, names, sorts, output, role, datatype, doc, fx)
        return cls

    return register


def _hint_name(hint: object) -> str:
    if hint is Shape or typing.get_origin(hint) is tuple:
        return "Shape"
    return getattr(hint, "__name__", str(hint))


# ---------------------------------------------------------------- Tensor constructors
# Argument order is egglog's; the doc line says what the term computes.


@_ctor(Role.NAMING, "FX node i (naming only: never extracted)")
class Id(Term):
    i: int


@_ctor(Role.LEAF, "value i kept as is: placeholder, parameter, opaque op")
class Leaf(Term):
    i: int


@_ctor(
    Role.VIEW,
    "x dim start end == x.narrow(dim, start, end - start), 0 <= dim",
    fx=lambda t, x: ("call_function", torch.narrow, (x, t.dim, t.start, t.end - t.start)),
)
class Slice(Term):
    x: Term
    dim: int
    start: int
    end: int


@_ctor(
    Role.VIEW,
    "x shape == x.reshape(shape), shape fully explicit",
    fx=lambda t, x: ("call_function", torch.reshape, (x, list(t.shape))),
)
class Reshape(Term):
    x: Term
    shape: Shape


@_ctor(Role.VIEW, "x perm == x.permute(perm)", fx=lambda t, x: ("call_function", torch.permute, (x, list(t.perm))))
class Permute(Term):
    x: Term
    perm: Shape


@_ctor(
    Role.VIEW,
    "x shape == x.expand(shape), shape fully explicit",
    fx=lambda t, x: ("call_method", "expand", (x, list(t.shape))),
)
class Expand(Term):
    x: Term
    shape: Shape


@_ctor(Role.ELEMENTWISE, "op x: elementwise op of one tensor")
class Unary(Term):
    op: str
    x: Term


@_ctor(Role.ELEMENTWISE, 'op a b: elementwise op with broadcasting: "add" "sub" "mul" "div" ...')
class Binary(Term):
    op: str
    a: Term
    b: Term


@_ctor(Role.ELEMENTWISE, 'op x c: elementwise op of a tensor and a Python scalar: "add" "mul" "rsub" ...')
class Scalar(Term):
    op: str
    x: Term
    c: float


@_ctor(Role.OP, "op x: any other known pure op (softmax, sum, layer_norm, ...)")
class Op1(Term):
    op: str
    x: Term


@_ctor(Role.OP, 'op a b: e.g. "matmul", "linear", "embedding"')
class Op2(Term):
    op: str
    a: Term
    b: Term


@_ctor(Role.OP, 'op a b c: e.g. "linear" with bias, "where"')
class Op3(Term):
    op: str
    a: Term
    b: Term
    c: Term


# ---------------------------------------------------------------- TList constructors
# A list of tensors concatenated along one dim; the dim sits in the list's end
# (TNil dim), so a list always means "these tensors, concatenated along dim" and
# list-level rewrites (merging adjacent slices) are sound.


@_ctor(Role.VIEW, "dim: the end of a list")
class TNil(ListTerm):
    dim: int


@_ctor(Role.CELL, "head tail")
class TCons(ListTerm):
    head: Term
    tail: ListTerm


@_ctor(Role.NAMING, "name of a long list's tail (naming only: never extracted)")
class LId(ListTerm):
    k: int


# Declared after both sorts: they refer to the other one.


@_ctor(Role.CAT, "list == torch.cat(list, dim of the list)", datatype=False)
class Cat(Term):
    items: ListTerm


@_ctor(Role.HELPER, "helper: list append (rewritten away, never extracted)", datatype=False)
class LAppend(ListTerm):
    a: ListTerm
    b: ListTerm


@_ctor(Role.HELPER, "helper: op applied to every member (rewritten away)", datatype=False)
class MapUnary(ListTerm):
    op: str
    items: ListTerm


AnyTerm = _Union[Term, ListTerm]  # noqa: UP007 (Union is a term of the language here)
# Tensor constructors other than Slice (rules written per constructor read these).
NON_SLICE_TENSOR_CTORS = tuple(
    c for c in CTORS.values() if c.output == "Tensor" and c.role is not Role.NAMING and c.name != "Slice"
)
VIEW_CTORS = frozenset(c.name for c in CTORS.values() if c.role is Role.VIEW)
EMITTED_CTORS = frozenset(c.name for c in CTORS.values() if c.emitted)
OP_CTORS = frozenset(c.name for c in CTORS.values() if c.role in (Role.ELEMENTWISE, Role.OP))  # carry an op key
ELEMENTWISE_CTORS = frozenset(c.name for c in CTORS.values() if c.role is Role.ELEMENTWISE)


def ctor_of(name: str) -> CtorInfo | None:
    """The declaration of constructor ``name`` (None: a user rule file's own constructor)."""
    return CTORS.get(name)


# ---------------------------------------------------------------- rendering


def render_shape(values: Iterable[int]) -> str:
    """A Shape literal: ``(vec-of 4 16)``, ``(vec-empty)``."""
    texts = [str(int(v)) for v in values]
    return f"(vec-of {' '.join(texts)})" if texts else "(vec-empty)"


def _atom(value: Any, sort: str) -> str:
    if sort == "String":
        return f'"{value}"'
    if sort == "f64":
        return repr(float(value))
    if sort == "Shape":
        return render_shape(value)
    return str(int(value))  # type: ignore[call-overload]


def render(term: AnyTerm) -> str:
    """The egglog text of a term. Terms nest shallowly (long lists are named in chunks, see
    ``terms.cons_list``), so recursion depth stays small."""
    info = CTORS[term.ctor]
    parts = [info.name]
    for name, sort in zip(info.field_names, info.sorts):
        value = getattr(term, name)
        parts.append(render(value) if sort in ("Tensor", "TList") else _atom(value, sort))
    return f"({' '.join(parts)})"


def egglog_declarations() -> str:
    """The sorts and constructors of the language, as egglog declarations (in declaration order)."""
    lines = [
        ";; generated from optimus_eqsat/term.py: one constructor per op, argument order as there",
        "(sort Shape (Vec i64))",
    ]
    for sort in ("Tensor", "TList"):
        lines.append(f"(datatype {sort}")
        for info in CTORS.values():
            if info.output == sort and info.declared_in_datatype:
                lines.append(f"  ({info.name}{''.join(' ' + s for s in info.sorts)})  ; {info.doc}")
        lines.append(")")
    for info in CTORS.values():
        if not info.declared_in_datatype:
            lines.append(f"(constructor {info.name} ({' '.join(info.sorts)}) {info.output})  ; {info.doc}")
    return "\n".join(lines)


# ---------------------------------------------------------------- facts
# What a translation (or batching) asks the e-graph to hold. Rendered at load time.


@dataclass(frozen=True, slots=True)
class Union:
    """``name`` (an Id or LId) equals ``term``. Loaded as an alias row (language.egg):
    inserting a row and unioning all rows at the end is ten times cheaper than a union each."""

    name: Id | LId
    term: AnyTerm

    def render(self) -> str:
        relation = "lalias" if isinstance(self.name, LId) else "alias"
        return f"({relation} {render(self.name)} {render(self.term)})"


@dataclass(frozen=True, slots=True)
class KnownShape:
    """The shape of the value named ``name`` (from FX meta, or a batched term's)."""

    name: Id
    shape: Shape

    def render(self) -> str:
        return f"(set (shape {render(self.name)}) {render_shape(self.shape)})"


@dataclass(frozen=True, slots=True)
class ListFacts:
    """The cat dim and total size along it of a named list chunk (seeds of the list analyses)."""

    name: LId
    dim: int
    size: int

    def render(self) -> str:
        return f"(set (ldim {render(self.name)}) {self.dim})\n(set (lsize {render(self.name)}) {self.size})"


Fact = _Union[Union, KnownShape, ListFacts]  # noqa: UP007


# ---------------------------------------------------------------- long lists

# egglog's parser recurses per nesting level: 1,000 nested list cells parse in
# 0.2 s, 5,000 in 4.5 s, 20,000 crash the process. Longer lists are chained
# through named cells (LId) of at most this many members each. Loading costs
# per cell grow with the nesting too: 0.24 ms a cell in chunks of 64, 0.1 ms in
# chunks of 16 (batching's stacks of the 300-feature extreme graph).
MAX_INLINE_LIST = 16


def cons_list(
    items: Sequence[Term],
    dim: int,
    emit: Callable[[Fact], None],
    new_list_id: Callable[[], int],
    sizes: Sequence[int] | None = None,
) -> ListTerm:
    """The list of ``items`` concatenated along ``dim``.

    Long lists are built tail first in chunks; each finished chunk is named
    ``LId(k)`` by a fact passed to ``emit``, so no term nests deeply. With
    ``sizes`` (each item's extent along ``dim``) every named chunk also gets its
    ``ldim`` and ``lsize``: the shape rules derive those one cell per saturation
    round from the list's end, and a round costs tens of milliseconds on a large
    e-graph, so a list of thousands of members would take seconds to settle;
    seeded, no walk is longer than one chunk. Sizes that are symbolic (codes < 0,
    fxvocab/symbolic.py) seed nothing: their sums would mean nothing.
    """
    if sizes is not None and any(s < 0 for s in sizes):
        sizes = None
    tail: ListTerm = TNil(dim)
    chunks = [items[i : i + MAX_INLINE_LIST] for i in range(0, len(items), MAX_INLINE_LIST)] or [[]]
    suffix, suffix_size = len(items), 0
    for n, chunk in enumerate(reversed(chunks)):
        term = tail
        for item in reversed(chunk):
            term = TCons(item, term)
        if n == len(chunks) - 1:
            return term
        name = LId(new_list_id())
        emit(Union(name, term))
        if sizes is not None:
            suffix_size += sum(sizes[suffix - len(chunk) : suffix])
            emit(ListFacts(name, dim, suffix_size))
        suffix -= len(chunk)
        tail = name
    return tail
