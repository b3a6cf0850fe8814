"""What the term language computes, for the checker.

Every constructor of ``optimus_eqsat/term.py`` gets a torch meaning: views
through their ``fx`` hook (the call the rebuilder writes), ``Cat`` as
``torch.cat`` along its list's dim, lists as their members and dim, and the
op constructors (Unary, Binary, Scalar, Op1-Op3) through their op key. The
keys a rule can name are the translator's fixed keys (``ctx.named`` in
``normalize.py``), with the targets it registers for them; an op-key
*variable* is drawn from :data:`SAMPLE_OPS`, real ops of each kind. The
helper functions of the language (shape, ldim, lsize, vec-*, i64/f64
arithmetic) are :data:`PRIMITIVES`.

A tensor value carries a *scale* beside it: the magnitude of what it was
computed from (``|a| + |b|`` for ``a + b``, ``|a| @ |b|`` for a matmul, by a
forward derivative for other ops). Rounding errors are bounded by
``eps * scale``, so comparisons tolerate reassociated float arithmetic (the
algebraic rules fold constants) without tolerating wrong results.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from optimus_eqsat.op_keys import BINARY_KEYS, LINEAR, LINEAR_B, MATMUL_KEY, NEG, OP_KEYS, RDIV, RPOW, RSUB, SCALAR_KEYS
from optimus_eqsat.rebuild import python_scalar  # how the rebuilder writes a Scalar's constant (whole numbers as ints)
from optimus_eqsat.term import CTORS


class NotCheckable(Exception):
    """The rule uses something the checker gives no meaning (the message says what)."""


class Invalid(Exception):
    """This term is no program: ill-formed (a Slice past the end), or torch refuses it."""


class OutOfRange(Invalid):
    """A float op of the matched program left its dtype's normal range (overflow, underflow)."""


@dataclass(frozen=True)
class TV:
    """A tensor value and its scale (float64, same shape: magnitude of what it was computed from)."""

    value: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def of(t: torch.Tensor) -> TV:
        return TV(t, t.detach().double().abs())


@dataclass(frozen=True)
class ListVal:
    """A TList value: its members and the dim they are concatenated along."""

    items: tuple
    dim: int


# ---------------------------------------------------------------- op keys


@dataclass(frozen=True)
class OpMeaning:
    """What an op key computes: ``fn`` of the tensor operands (a Scalar's: the tensor and the constant).

    ``linear``: nonnegative multilinear in its operands (matmul, linear, sum), so its
    scale is ``fn`` of the operands' scales. ``operand_shape(i, previous shapes, size)``
    proposes a shape for operand i that fits the ones before (None: any shape).
    """

    key: str
    fn: Callable
    linear: bool = False
    operand_shape: Callable | None = None


def _matmul_operand(i: int, prev: list[tuple], size: Callable[[], int], rng) -> tuple | None:
    if i != 1 or not prev or not prev[0]:
        return None
    a, k = prev[0], prev[0][-1]
    roll = rng.random()
    if roll < 0.6 or len(a) < 3:
        return (k, size()) if roll < 0.8 else (k,)
    return (*a[:-2], k, size())


def _linear_operand(i: int, prev: list[tuple], size: Callable[[], int], rng) -> tuple | None:
    if i == 1 and prev and prev[0]:
        return (size(), prev[0][-1])
    if i == 2 and len(prev) > 1 and prev[1]:
        return (prev[1][0],) if rng.random() < 0.8 else ()
    return None


def _scalar_fn(key: str) -> Callable:
    if key == RDIV:  # the rebuilder writes c / x, c ** x for these (rebuild._emit_scalar)
        return lambda x, c: operator.truediv(c, x)
    if key == RPOW:
        return lambda x, c: operator.pow(c, x)
    target = cast(Callable, OP_KEYS[key].target)  # only the reversed keys above have a str target
    return lambda x, c: target(x, c)


NAMED_OPS: dict[str, dict[str, OpMeaning]] = {
    "Unary": {NEG: OpMeaning(NEG, torch.neg)},
    "Binary": {k: OpMeaning(k, cast(Callable, OP_KEYS[k].target)) for k in (*BINARY_KEYS, RSUB)},
    "Scalar": {k: OpMeaning(k, _scalar_fn(k)) for k in SCALAR_KEYS},
    "Op1": {},
    "Op2": {
        MATMUL_KEY: OpMeaning(MATMUL_KEY, torch.matmul, True, _matmul_operand),
        LINEAR: OpMeaning(LINEAR, F.linear, True, _linear_operand),
    },
    "Op3": {LINEAR_B: OpMeaning(LINEAR_B, F.linear, True, _linear_operand)},
}
NAMED_OPS["MapUnary"] = NAMED_OPS["Unary"]

_UNARY = {
    name: OpMeaning(name, fn)
    for name, fn in [
        ("relu", torch.relu),
        ("tanh", torch.tanh),
        ("sigmoid", torch.sigmoid),
        ("exp", torch.exp),
        ("neg", torch.neg),
        ("abs", torch.abs),
        ("sin", torch.sin),
        ("square", torch.square),
        ("reciprocal", torch.reciprocal),
        ("sqrt", torch.sqrt),
    ]
}
# Real ops an op-key variable of each constructor is instantiated with: a rule
# that holds only for some of them is unsound.
SAMPLE_OPS: dict[str, dict[str, OpMeaning]] = {
    "Unary": _UNARY,
    "MapUnary": _UNARY,
    "Binary": {k: NAMED_OPS["Binary"][k] for k in ("add", "mul", "sub", "div", "maximum")},
    "Scalar": NAMED_OPS["Scalar"],
    "Op1": {
        "sum(dim=-1)": OpMeaning("sum(dim=-1)", lambda x: x.sum(-1), True),
        "softmax(dim=-1)": OpMeaning("softmax(dim=-1)", lambda x: torch.softmax(x, -1)),
        "cumsum(dim=0)": OpMeaning("cumsum(dim=0)", lambda x: x.cumsum(0), True),
    },
    "Op2": NAMED_OPS["Op2"],
    "Op3": NAMED_OPS["Op3"],
}


def op_meaning(ctor: str, key: str) -> OpMeaning:
    """The meaning of op key ``key`` in constructor ``ctor`` (a fixed key, or a sample op's name)."""
    meaning = NAMED_OPS.get(ctor, {}).get(key) or SAMPLE_OPS.get(ctor, {}).get(key)
    if meaning is None and any(key in table for table in (*NAMED_OPS.values(), *SAMPLE_OPS.values())):
        raise Invalid(f'"{key}" is not a key of {ctor}')  # e.g. Op2 "neg": no such term exists
    if meaning is None:
        fixed = ", ".join(f'"{k}"' for k in NAMED_OPS.get(ctor, {})) or "none"
        raise NotCheckable(
            f'op key "{key}" of {ctor} has no fixed meaning (keys a rule can name there: {fixed}; '
            f"other ops get numbered keys per graph)"
        )
    return meaning


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def apply_op(meaning: OpMeaning, operands: list[TV], const: float | None = None, matched: bool = True) -> TV:
    """``meaning`` applied to tensor operands (and a Scalar's constant), with its scale.

    On the matched side (``matched``) a float result that over- or underflows its dtype
    where float64 does not raises OutOfRange: the sample is outside what float rewrites promise."""
    extra = () if const is None else (python_scalar(const),)
    values = [tv.value for tv in operands]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = meaning.fn(*values, *extra)
    except Exception as exc:  # torch refuses: shapes, dtypes
        raise Invalid(f"{meaning.key}: {_first_line(exc)}") from None
    if not isinstance(out, torch.Tensor):
        raise Invalid(f"{meaning.key} gave {type(out).__name__}, not a tensor")
    exact, scale = _scale(meaning, operands, extra, out)
    if matched and out.is_floating_point() and out.dtype != torch.float64:
        tiny = torch.finfo(out.dtype).tiny
        finite = torch.isfinite(exact)
        if ((torch.isinf(out) & finite) | (finite & (exact != 0) & (exact.abs() < tiny))).any():
            raise OutOfRange(f"{meaning.key} leaves the range of {out.dtype}")
    return TV(out, scale)


def _scale(
    meaning: OpMeaning, operands: list[TV], extra: tuple, out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the op in float64 on the same inputs, the scale of its result)."""
    x64 = tuple(tv.value.double() for tv in operands)
    fn = lambda *xs: meaning.fn(*xs, *extra)  # noqa: E731
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if meaning.linear:
                exact = fn(*x64)
                scale = fn(*(tv.scale for tv in operands)).abs()
            else:
                exact, scale = None, 0
                for i, tv in enumerate(operands):
                    tangents = tuple(tv.scale if j == i else torch.zeros_like(x) for j, x in enumerate(x64))
                    # without has_aux, jvp returns (output, jvp_out)
                    exact, tangent = cast(tuple[Any, Any], torch.func.jvp(fn, x64, tangents))
                    scale = scale + tangent.abs()
                exact = fn(*x64) if exact is None else exact
                scale = exact.abs() + scale
    except Exception:  # no derivative (or float64 refused): the largest input scale
        exact = out.double()
        biggest = max((float(tv.scale.max()) for tv in operands if tv.scale.numel()), default=0.0)
        scale = exact.abs() + biggest
    scale = torch.nan_to_num(scale.double().broadcast_to(out.shape), nan=math.inf)
    return exact.double().broadcast_to(out.shape), scale


# ---------------------------------------------------------------- constructors


def _call(op: str, target: object, args: tuple) -> torch.Tensor:
    if op == "call_method":
        return getattr(args[0], cast(str, target))(*args[1:])
    return cast(Callable, target)(*args)


def _check_view(ctor: str, x: torch.Tensor, fields: list) -> None:
    """The forms the translator writes (dims >= 0, bounds inside, explicit shapes)."""
    rank = x.dim()
    if ctor == "Slice":
        d, a, b = fields
        if not 0 <= d < rank or not 0 <= a <= b <= x.shape[d]:
            raise Invalid(f"Slice dim {d} [{a}:{b}] of shape {tuple(x.shape)}")
    elif ctor in ("Reshape", "Expand") and any(s < 0 for s in fields[0]):
        raise Invalid(f"{ctor} to {fields[0]}: shapes are explicit")
    elif ctor == "Permute" and sorted(fields[0]) != list(range(rank)):
        raise Invalid(f"Permute {fields[0]} of rank {rank}")


def apply_view(ctor: str, x: TV, fields: list) -> TV:
    """A view constructor through its ``fx`` hook: the FX call the rebuilder writes."""
    info = CTORS[ctor]
    _check_view(ctor, x.value, fields)
    term = info.cls(None, *fields)
    hook = cast(Callable[..., tuple[str, object, tuple]], info.fx)  # a view constructor has its fx hook
    try:
        value = _call(*hook(term, x.value))
        scale = _call(*hook(term, x.scale))
    except Exception as exc:
        raise Invalid(f"{ctor}: {_first_line(exc)}") from None
    return TV(value, scale)


def concat(items: tuple, dim: int) -> TV:
    """torch.cat of a list's members along its dim."""
    if not items:
        raise Invalid("cat of an empty list")
    if not 0 <= dim < items[0].value.dim():
        raise Invalid(f"cat along dim {dim} of rank-{items[0].value.dim()} tensors")
    try:
        return TV(torch.cat([i.value for i in items], dim), torch.cat([i.scale for i in items], dim))
    except Exception as exc:
        raise Invalid(f"cat: {_first_line(exc)}") from None


def apply_ctor(ctor: str, args: list, matched: bool) -> object:
    """The value of constructor ``ctor`` applied to argument values (Id/Leaf: see Instance)."""
    if ctor == "TNil":
        if args[0] < 0:
            raise Invalid(f"TNil {args[0]}")
        return ListVal((), args[0])
    if ctor == "TCons":
        return _list((args[0], *args[1].items[:1]), args[1].dim, args[1].items[1:])
    if ctor == "LAppend":
        a, b = args
        if a.dim != b.dim:
            raise Invalid(f"LAppend of lists on dims {a.dim} and {b.dim}")
        return _list(a.items + b.items, b.dim)
    if ctor == "MapUnary":
        meaning = op_meaning("Unary", args[0])
        return _list(tuple(apply_op(meaning, [i], matched=matched) for i in args[1].items), args[1].dim)
    if ctor == "Cat":
        return concat(args[0].items, args[0].dim)
    if ctor == "Scalar":
        return _scalar_op(args[0], args[1], args[2], matched)
    if ctor in ("Unary", "Binary", "Op1", "Op2", "Op3"):
        return apply_op(op_meaning(ctor, args[0]), list(args[1:]), matched=matched)
    info = CTORS.get(ctor)
    if info is not None and info.fx is not None:
        return apply_view(ctor, args[0], list(args[1:]))
    raise NotCheckable(f"constructor {ctor} has no meaning for the checker")


def _list(items: tuple, dim: int, checked: tuple = ()) -> ListVal:
    """A list whose members (``items``; ``checked`` already are) concatenate along ``dim``:
    one rank above ``dim``, equal sizes but along it."""
    first: Any = items[0].value if items else None  # read only in the loop over items
    for item in items:
        t = item.value
        if (
            not 0 <= dim < t.dim()
            or t.dim() != first.dim()
            or any(t.shape[i] != first.shape[i] for i in range(t.dim()) if i != dim)
        ):
            raise Invalid(f"list members {[list(i.value.shape) for i in items]} do not concatenate on dim {dim}")
    return ListVal(items + checked, dim)


def _scalar_op(key: str, x: TV, c: float, matched: bool) -> TV:
    out = apply_op(op_meaning("Scalar", key), [x], const=c, matched=matched)
    if out.value.dtype != x.value.dtype:  # normalize.h_arith: a Scalar never changes the dtype
        raise Invalid(f'Scalar "{key}" {c!r} turns {x.value.dtype} into {out.value.dtype}')
    return out


# ---------------------------------------------------------------- helper functions


def _i64_div(a: int, b: int) -> int:
    if b == 0:
        raise Invalid("i64 division by zero")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return _i64_div(a, b)
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _rem(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _i64_div(a, b)
    return math.fmod(a, b) if b != 0 else math.nan


def _vec_get(v: tuple, i: int):
    if not 0 <= i < len(v):
        raise Invalid(f"vec-get {i} of a vector of length {len(v)}")
    return v[i]


def _vec_set(v: tuple, i: int, x):
    _vec_get(v, i)
    return v[:i] + (x,) + v[i + 1 :]


def _vec_remove(v: tuple, i: int):
    _vec_get(v, i)
    return v[:i] + v[i + 1 :]


def _lsize(lst: ListVal) -> int:
    total = 0
    for item in lst.items:
        if lst.dim >= item.value.dim():
            raise Invalid(f"lsize along dim {lst.dim} of a rank-{item.value.dim()} member")
        total += item.value.shape[lst.dim]
    return total


PRIMITIVES: dict[str, Callable] = {
    "+": operator.add,
    "-": lambda a, b=None: -a if b is None else a - b,
    "*": operator.mul,
    "/": _div,
    "%": _rem,
    "min": min,
    "max": max,
    "abs": abs,
    "neg": operator.neg,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "!=": operator.ne,
    "=": operator.eq,
    "and": lambda a, b: a and b,
    "or": lambda a, b: a or b,
    "not": operator.not_,
    "xor": operator.xor,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<<": operator.lshift,
    ">>": operator.rshift,
    "not-i64": operator.invert,
    "to-f64": float,
    "to-i64": int,
    "log2": lambda a: a.bit_length() - 1,
    "sqrt": math.sqrt,
    "vec-of": lambda *xs: tuple(xs),
    "vec-empty": lambda: (),
    "vec-push": lambda v, x: (*v, x),
    "vec-pop": lambda v: v[:-1],
    "vec-append": lambda *vs: sum(vs, ()),
    "vec-get": _vec_get,
    "vec-set": _vec_set,
    "vec-length": len,
    "vec-remove": _vec_remove,
    "vec-range": lambda n: tuple(range(n)),
    "vec-contains": lambda v, x: x in v,
    "vec-not-contains": lambda v, x: x not in v,
    # the analyses of language.egg, computed from values
    "shape": lambda x: tuple(x.value.shape),
    "ldim": lambda lst: lst.dim,
    "lsize": _lsize,
}
