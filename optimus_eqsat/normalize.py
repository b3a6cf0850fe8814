"""Normalization at the FX boundary: every spelling of an op becomes one term.

Method and function spellings (``x.split`` / ``torch.split`` / ``aten.split``),
``dim=`` / ``axis=``, negative dims, varargs sizes and module calls all map to
one canonical op name, whose handler builds the term-language term. So rules
never see variants. A handler raises :class:`Unsupported` when it cannot
express a node exactly (unknown shape, an unusual argument); the node then
stays opaque, kept verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from optimus_eqsat.fxvocab import (
    EXPAND_OPS,
    OP_KINDS,
    RESHAPE_OPS,
    canonical_name,  # noqa: F401  (re-exported: the translator's op names)
)
from optimus_eqsat.op_keys import (
    ADD,
    BINARY_KEYS,
    DIV,
    LINEAR,
    LINEAR_B,
    MATMUL_KEY,
    MAXIMUM,
    MINIMUM,
    MUL,
    NEG,
    OP_KEYS,
    POW,
    RDIV,
    RPOW,
    RSUB,
    SUB,
)
from optimus_eqsat.opspec import GATHER, MATMUL, POINTWISE
from optimus_eqsat.term import Binary, Cat, Expand, Id, ListTerm, Op2, Op3, Permute, Reshape, Scalar, Slice, Term, Unary
from optimus_eqsat.tuple_ops import TUPLE_OPS, h_tuple_op


class Unsupported(Exception):
    """This node cannot be expressed exactly; keep it opaque."""


class Context(Protocol):
    """What a handler may ask the translator."""

    node: torch.fx.Node

    def ref(self, value: Any) -> Id: ...
    def shape(self, value: Any) -> tuple[int, ...]: ...
    def out_shape(self) -> tuple[int, ...]: ...
    def same_dtype_as_input(self, value: Any) -> bool: ...
    def generic(self, kind: str, elementwise: bool = False) -> Term: ...
    def named(self, key: str, target: Any, n_operands: int, kind: str) -> str: ...
    def pieces(self, value: Any) -> list[Term] | None: ...
    def cons(self, items: list[Term], dim: int) -> ListTerm: ...


Handler = Callable[[Context, dict[str, Any]], "Term | list[Term]"]

# ---------------------------------------------------------------- argument binding


def bind(node: torch.fx.Node, params: list[str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Bind a call's args/kwargs to parameter names (first name of each alias group).

    A parameter written "dim|axis" accepts either keyword; positional args fill
    parameters in order.
    """
    bound: dict[str, Any] = dict(defaults or {})
    names = [p.split("|") for p in params]
    if len(node.args) > len(names):
        raise Unsupported(f"{len(node.args)} positional args for {params}")
    for value, aliases in zip(node.args, names):
        bound[aliases[0]] = value
    for key, value in node.kwargs.items():
        for aliases in names:
            if key in aliases:
                bound[aliases[0]] = value
                break
        else:
            raise Unsupported(f"unknown keyword {key!r}")
    missing = [a[0] for a in names if a[0] not in bound]
    if missing:
        raise Unsupported(f"missing {missing}")
    return bound


def _varargs_sizes(node: torch.fx.Node) -> tuple:
    rest = node.args[1:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        return tuple(rest[0])
    return tuple(rest)


def _concrete(size: int, what: str) -> int:
    """A size a handler computes with: symbolic sizes (codes < 0, see fxvocab.symbolic) raise
    Unsupported, so the node stays opaque instead of holding only at the example size."""
    if size < 0:
        raise Unsupported(f"{what} along a symbolic dim")
    return size


def _dim(d: Any, rank: int) -> int:
    if not isinstance(d, int) or isinstance(d, bool):
        raise Unsupported(f"dim {d!r} is not an int")
    if not -rank <= d < max(rank, 1):
        raise Unsupported(f"dim {d} out of range for rank {rank}")
    return d % rank if rank else 0


# ---------------------------------------------------------------- structural handlers


def _split_pieces(ctx: Context, x: Any, sizes: list[int], dim: int) -> list[Term]:
    out: list[Term]
    ref, out, start = ctx.ref(x), [], 0
    for size in sizes:
        out.append(Slice(ref, dim, start, start + size))
        start += size
    return out


def h_split(ctx: Context, a: dict[str, Any]) -> list[Term]:
    shape = ctx.shape(a["input"])
    dim = _dim(a["dim"], len(shape))
    total, size = _concrete(shape[dim], "split"), a["size"]
    if isinstance(size, int):
        if size <= 0:
            raise Unsupported("split size must be positive")
        sizes = [min(size, total - s) for s in range(0, total, size)] or [0]
    elif isinstance(size, (list, tuple)) and all(isinstance(s, int) for s in size) and sum(size) == total:
        sizes = list(size)
    else:
        raise Unsupported(f"split sizes {size!r}")
    return _split_pieces(ctx, a["input"], sizes, dim)


def h_chunk(ctx: Context, a: dict[str, Any]) -> list[Term]:
    shape = ctx.shape(a["input"])
    dim = _dim(a["dim"], len(shape))
    chunks, total = a["chunks"], _concrete(shape[dim], "chunk")
    if not isinstance(chunks, int) or chunks <= 0:
        raise Unsupported("chunks")
    step = -(-total // chunks) if total else 0
    sizes = [min(step, total - s) for s in range(0, total, step)] if step else [0] * chunks
    return _split_pieces(ctx, a["input"], sizes, dim)


def h_unbind(ctx: Context, a: dict[str, Any]) -> list[Term]:
    shape = ctx.shape(a["input"])
    dim = _dim(a["dim"], len(shape))
    squeezed = shape[:dim] + shape[dim + 1 :]
    ref = ctx.ref(a["input"])
    return [Reshape(Slice(ref, dim, i, i + 1), squeezed) for i in range(_concrete(shape[dim], "unbind"))]


def h_narrow(ctx: Context, a: dict[str, Any]) -> Term:
    shape = ctx.shape(a["input"])
    dim = _dim(a["dim"], len(shape))
    start, length = a["start"], a["length"]
    if not isinstance(start, int) or not isinstance(length, int):
        raise Unsupported("narrow with tensor start")
    size = _concrete(shape[dim], "narrow")
    start = start % size if start < 0 else start
    return Slice(ctx.ref(a["input"]), dim, start, start + length)


def _clamp_range(start: Any, stop: Any, size: int) -> tuple[int, int]:
    start = 0 if start is None else start
    stop = size if stop is None else stop
    if not isinstance(start, int) or not isinstance(stop, int):
        raise Unsupported("non-int slice bound")
    start = max(0, min(size, start + size if start < 0 else start))
    stop = max(start, min(size, stop + size if stop < 0 else stop))
    return start, stop


def h_aten_slice(ctx: Context, a: dict[str, Any]) -> Term:
    shape = ctx.shape(a["input"])
    dim = _dim(a["dim"], len(shape))
    if a["step"] != 1:
        raise Unsupported("slice step")
    if (
        shape[dim] < 0
        and a["start"] in (None, 0)
        and (a["end"] is None or (isinstance(a["end"], int) and a["end"] >= 2**62))
    ):
        return ctx.ref(a["input"])  # the whole of a symbolic dim (aten's x[:, ...])
    start, stop = _clamp_range(a["start"], a["end"], _concrete(shape[dim], "slice"))
    return Slice(ctx.ref(a["input"]), dim, start, stop)


def h_select(ctx: Context, a: dict[str, Any]) -> Term:
    shape = ctx.shape(a["input"])
    dim = _dim(a["dim"], len(shape))
    index = a["index"]
    size = _concrete(shape[dim], "select")
    if not isinstance(index, int) or not -size <= index < size:
        raise Unsupported("select index")
    index %= size
    return Reshape(Slice(ctx.ref(a["input"]), dim, index, index + 1), shape[:dim] + shape[dim + 1 :])


def h_getitem(ctx: Context, a: dict[str, Any]) -> Term:
    container, index = a["input"], a["index"]
    pieces = ctx.pieces(container)
    if pieces is not None:
        if not isinstance(index, int):
            raise Unsupported("getitem of a split with a non-int index")
        return pieces[index]
    return _tensor_index(ctx, container, index)


def _tensor_index(ctx: Context, x: Any, index: Any) -> Term:
    """x[index] for ints, slices with step 1, None and Ellipsis."""
    shape = list(ctx.shape(x))
    items = list(index) if isinstance(index, tuple) else [index]
    if any(not (i is None or i is Ellipsis or isinstance(i, (int, slice))) or isinstance(i, bool) for i in items):
        raise Unsupported("advanced indexing")
    if items.count(Ellipsis) > 1:
        raise Unsupported("two ellipses")
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - consumed)
    items += [slice(None)] * (len(shape) - sum(1 for i in items if i is not None))
    term: Term = ctx.ref(x)
    dim, out_shape = 0, []
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        size = shape[dim]
        if isinstance(item, slice) and item.start in (None, 0) and item.stop is None and item.step in (None, 1):
            out_shape.append(size)  # the whole dim (kept symbolic when it is)
            dim += 1
            continue
        size = _concrete(size, "indexing")
        if isinstance(item, int):
            if not -size <= item < size:
                raise Unsupported("index out of range")
            i = item % size
            term = Slice(term, dim, i, i + 1)
        else:
            if item.step not in (None, 1):
                raise Unsupported("slice step")
            start, stop = _clamp_range(item.start, item.stop, size)
            if (start, stop) != (0, size):
                term = Slice(term, dim, start, stop)
            out_shape.append(stop - start)
        dim += 1
    if tuple(out_shape) != ctx.out_shape():
        raise Unsupported("indexing result shape disagrees with meta")
    full = tuple(out_shape)
    return term if _is_plain_slice(items) else Reshape(term, full)


def _is_plain_slice(items: list) -> bool:
    return all(isinstance(i, slice) for i in items)


def _tensor_list(ctx: Context, tensors: Any) -> list[Term]:
    pieces = ctx.pieces(tensors)
    if pieces is not None:
        return pieces
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise Unsupported("cat of a non-list")
    return [ctx.ref(t) for t in tensors]


def _one_dtype(ctx: Context, tensors: Any) -> None:
    """A cat of mixed dtypes promotes them, and promotion does not commute with the rules
    that move ops into or out of a cat (the e-graph tracks no dtypes): keep it opaque."""
    if isinstance(tensors, (list, tuple)) and not all(ctx.same_dtype_as_input(t) for t in tensors):
        raise Unsupported("cat of mixed dtypes")


def h_cat(ctx: Context, a: dict[str, Any]) -> Term:
    out = ctx.out_shape()
    dim = _dim(a["dim"], len(out))
    _one_dtype(ctx, a["tensors"])
    return Cat(ctx.cons(_tensor_list(ctx, a["tensors"]), dim))


def h_stack(ctx: Context, a: dict[str, Any]) -> Term:
    out = ctx.out_shape()
    dim = _dim(a["dim"], len(out))
    _one_dtype(ctx, a["tensors"])
    member = out[:dim] + (1,) + out[dim + 1 :]
    items: list[Term] = [Reshape(t, member) for t in _tensor_list(ctx, a["tensors"])]
    return Cat(ctx.cons(items, dim))


def h_reshape(ctx: Context, a: dict[str, Any]) -> Term:
    """reshape / view / flatten / unflatten / squeeze / unsqueeze: the result shape says it all."""
    x = ctx.node.args[0] if ctx.node.args else a.get("input")
    if ctx.node.target in ("view", torch.Tensor.view) and any(isinstance(v, torch.dtype) for v in ctx.node.args[1:]):
        raise Unsupported("view as dtype")
    return Reshape(ctx.ref(x), ctx.out_shape())


def h_expand(ctx: Context, a: dict[str, Any]) -> Term:
    return Expand(ctx.ref(ctx.node.args[0]), ctx.out_shape())


def h_permute(ctx: Context, a: dict[str, Any]) -> Term:
    x = ctx.node.args[0]
    rank = len(ctx.shape(x))
    perm = tuple(_dim(d, rank) for d in _varargs_sizes(ctx.node))
    if sorted(perm) != list(range(rank)):
        raise Unsupported("bad permutation")
    return Permute(ctx.ref(x), perm)


def h_transpose(ctx: Context, a: dict[str, Any]) -> Term:
    rank = len(ctx.shape(a["input"]))
    perm = list(range(rank))
    d0, d1 = _dim(a["dim0"], rank), _dim(a["dim1"], rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return Permute(ctx.ref(a["input"]), tuple(perm))


def h_t(ctx: Context, a: dict[str, Any]) -> Term:
    rank = len(ctx.shape(a["input"]))
    if rank < 2:
        return ctx.ref(a["input"])
    return Permute(ctx.ref(a["input"]), (1, 0))


def h_movedim(ctx: Context, a: dict[str, Any]) -> Term:
    rank = len(ctx.shape(a["input"]))
    src, dst = a["source"], a["destination"]
    src = [src] if isinstance(src, int) else list(src)
    dst = [dst] if isinstance(dst, int) else list(dst)
    src, dst = [_dim(d, rank) for d in src], [_dim(d, rank) for d in dst]
    perm = [-1] * rank
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(rank) if d not in src)
    perm = [p if p >= 0 else next(rest) for p in perm]
    return Permute(ctx.ref(a["input"]), tuple(perm))


def h_identity(ctx: Context, a: dict[str, Any]) -> Term:
    return ctx.ref(a["input"])


def h_dropout(ctx: Context, a: dict[str, Any]) -> Term:
    if a["training"] and a["p"] != 0:
        raise Unsupported("dropout in training mode is random")
    return ctx.ref(a["input"])


# ---------------------------------------------------------------- arithmetic

_ARITH = set(BINARY_KEYS)  # (their FX names are their keys)
# Reflected ops (``torch.rsub(x, c)`` and ``x.__rsub__(c)`` are ``c - x``): swapped, the plain op
_REVERSED = {"radd": ADD, "rmul": MUL, "rsub": SUB, "rdiv": DIV, "rpow": POW}  # FX name -> key
_COMMUTATIVE = {ADD, MUL, MAXIMUM, MINIMUM}


def _named(ctx: Context, key: str) -> str:
    """The fixed op key ``key`` (:mod:`optimus_eqsat.op_keys`), registered for the rebuilder."""
    return ctx.named(key, *OP_KEYS[key].spec())


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def h_arith(name: str) -> Handler:
    """Tensor-tensor ops become Binary; tensor-scalar ops Scalar (when dtype is kept)."""

    def handler(ctx: Context, a: dict[str, Any]) -> Term:
        if a.get("alpha", 1) != 1 or a.get("rounding_mode") is not None:
            return ctx.generic(POINTWISE, elementwise=True)
        x, y = a["input"], a["other"]
        op = name
        if op in _REVERSED:
            x, y, op = y, x, _REVERSED[op]
        if isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node):
            if op not in BINARY_KEYS:
                raise Unsupported(op)
            key = _named(ctx, op)
            return Binary(key, ctx.ref(x), ctx.ref(y))
        if _is_number(x) and isinstance(y, torch.fx.Node) and op in _COMMUTATIVE:
            x, y = y, x
        elif _is_number(x) and isinstance(y, torch.fx.Node):
            op, x, y = {SUB: RSUB, DIV: RDIV, POW: RPOW}[op], y, x
        if not (isinstance(x, torch.fx.Node) and _is_number(y)) or not ctx.same_dtype_as_input(x):
            return ctx.generic(POINTWISE, elementwise=True)
        # Same spec as the Binary op of that name (rebuild reads only its target for scalars)
        key = _named(ctx, op)
        return Scalar(key, ctx.ref(x), float(y))

    return handler


# ---------------------------------------------------------------- generic ops

# Elementwise ops of one tensor (any extra args are constants in the key).
ELEMENTWISE_UNARY = {
    "relu",
    "relu6",
    "tanh",
    "sigmoid",
    "gelu",
    "silu",
    "exp",
    "log",
    "log1p",
    "expm1",
    "neg",
    "abs",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "square",
    "clamp",
    "clamp_min",
    "clamp_max",
    "nan_to_num",
    "detach",
    "hardtanh",
    "leaky_relu",
    "elu",
    "selu",
    "softplus",
    "mish",
    "hardswish",
    "hardsigmoid",
    "erf",
    "sign",
    "floor",
    "ceil",
    "round",
    "trunc",
    "logical_not",
    "to",
    "float",
    "half",
    "bfloat16",
    "double",
    "int",
    "long",
    "bool",
    "type",
    "clone",
    "logit",
}
# Elementwise ops of several tensors.
ELEMENTWISE_MULTI = {
    "where",
    "lerp",
    "addcmul",
    "addcdiv",
    "masked_fill",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "bitwise_and",
    "bitwise_or",
    # backward graphs (AOTAutograd without Inductor's decompositions), prims.fma
    "threshold_backward",
    "sigmoid_backward",
    "tanh_backward",
    "gelu_backward",
    "silu_backward",
    "fma",
}
# Other pure, deterministic ops, with their cost-model kind (the vocabulary's;
# opspec's kind strings are KernelKind values).
GENERIC_KINDS = {
    name: OP_KINDS[name].value
    for name in (
        "softmax",
        "log_softmax",
        "sum",
        "mean",
        "amax",
        "amin",
        "var",
        "std",
        "norm",
        "layer_norm",
        "logsumexp",
        "cumsum",
        "prod",
        "argmax",
        "argmin",
        "rms_norm",
        "matmul",
        "mm",
        "bmm",
        "linear",
        "baddbmm",
        "embedding",
        "index_select",
        "gather",
    )
}


def h_generic(kind: str, elementwise: bool = False) -> Handler:
    def handler(ctx: Context, a: dict[str, Any]) -> Term:
        return ctx.generic(kind, elementwise=elementwise)

    return handler


def h_neg(ctx: Context, a: dict[str, Any]) -> Term:
    """A plain neg (one tensor, nothing else) gets the fixed key "neg" that rules match on."""
    node = ctx.node
    if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], torch.fx.Node):
        return ctx.generic(POINTWISE, elementwise=True)
    return Unary(_named(ctx, NEG), ctx.ref(node.args[0]))


def h_matmul(ctx: Context, a: dict[str, Any]) -> Term:
    key = _named(ctx, MATMUL_KEY)
    return Op2(key, ctx.ref(a["input"]), ctx.ref(a["other"]))


def h_linear(ctx: Context, a: dict[str, Any]) -> Term:
    x, w, b = ctx.ref(a["input"]), ctx.ref(a["weight"]), a.get("bias")
    if b is None:
        key = _named(ctx, LINEAR)
        return Op2(key, x, w)
    key = _named(ctx, LINEAR_B)
    return Op3(key, x, w, ctx.ref(b))


def _transpose_of(value: Any) -> torch.fx.Node | None:
    """The 2-D tensor whose transpose ``value`` is (a ``t``, ``permute [1, 0]`` or
    ``transpose(0, 1)`` node), else None."""
    if not isinstance(value, torch.fx.Node) or not value.args or not isinstance(value.args[0], torch.fx.Node):
        return None
    name, rest = canonical_name(value), value.args[1:]
    if name == "permute" and len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        rest = tuple(rest[0])
    swap = (
        (name == "t" and not rest and not value.kwargs)
        or (name == "permute" and tuple(rest) == (1, 0))
        or (name == "transpose" and len(rest) == 2 and {d % 2 for d in rest if isinstance(d, int)} == {0, 1})
    )
    return value.args[0] if swap else None


def _rank(ctx: Context, value: Any) -> int | None:
    try:
        return len(ctx.shape(value))
    except Unsupported:
        return None


def h_mm(ctx: Context, a: dict[str, Any]) -> Term:
    """mm(x, w.t()) is linear(x, w) (AOTAutograd's spelling of an nn.Linear and of its
    input gradient), so the linear batch kinds see it; any other mm is a matmul."""
    w = _transpose_of(a["mat2"])
    if w is not None and _rank(ctx, w) == 2:
        return Op2(_named(ctx, LINEAR), ctx.ref(a["input"]), ctx.ref(w))
    return h_matmul(ctx, {"input": a["input"], "other": a["mat2"]})


def h_addmm(ctx: Context, a: dict[str, Any]) -> Term:
    """addmm(b, x, w) = b + x @ w (beta = alpha = 1 only); with w = v.t() and a 1-D b,
    linear(x, v, b) (AOTAutograd's spelling of an nn.Linear)."""
    if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1:
        return ctx.generic(MATMUL)
    v = _transpose_of(a["mat2"])
    if v is not None and _rank(ctx, v) == 2 and _rank(ctx, a["input"]) == 1:
        return Op3(_named(ctx, LINEAR_B), ctx.ref(a["mat1"]), ctx.ref(v), ctx.ref(a["input"]))
    mm = _named(ctx, MATMUL_KEY)
    add = _named(ctx, ADD)
    return Binary(add, Op2(mm, ctx.ref(a["mat1"]), ctx.ref(a["mat2"])), ctx.ref(a["input"]))


def h_embedding(ctx: Context, a: dict[str, Any]) -> Term:
    """F.embedding with max_norm renormalizes rows of its table in place: kept opaque."""
    node = ctx.node
    if node.target is F.embedding:
        max_norm = node.args[3] if len(node.args) > 3 else node.kwargs.get("max_norm")
        if max_norm is not None:
            raise Unsupported("embedding with max_norm writes to its table")
    return ctx.generic(GATHER)


# ---------------------------------------------------------------- the table

_X = "input|self|tensor|x"
_DIM = "dim|axis"

HANDLERS: dict[str, tuple[list[str], dict[str, Any], Handler]] = {
    "split": ([_X, "size|split_size_or_sections|split_size|split_sizes", _DIM], {"dim": 0}, h_split),
    "chunk": ([_X, "chunks", _DIM], {"dim": 0}, h_chunk),
    "unbind": ([_X, _DIM], {"dim": 0}, h_unbind),
    "narrow": ([_X, _DIM, "start", "length"], {}, h_narrow),
    "slice": ([_X, _DIM, "start", "end", "step"], {"dim": 0, "start": None, "end": None, "step": 1}, h_aten_slice),
    "select": ([_X, _DIM, "index"], {}, h_select),
    "getitem": ([_X, "index"], {}, h_getitem),
    "cat": (["tensors", _DIM, "out"], {"dim": 0, "out": None}, h_cat),
    "stack": (["tensors", _DIM, "out"], {"dim": 0, "out": None}, h_stack),
    "contiguous": ([_X, "memory_format"], {"memory_format": None}, h_identity),
    "alias": ([_X], {}, h_identity),  # aten graphs before Inductor's no-op removal
    "dropout": ([_X, "p", "training", "inplace"], {"p": 0.5, "training": True, "inplace": False}, h_dropout),
    "transpose": ([_X, "dim0", "dim1"], {}, h_transpose),
    "t": ([_X], {}, h_t),
    "movedim": ([_X, "source", "destination"], {}, h_movedim),
    "matmul": ([_X, "other"], {}, h_matmul),
    "mm": ([_X, "mat2|other"], {}, h_mm),
    "bmm": ([_X, "mat2|other"], {}, lambda c, a: h_matmul(c, {"input": a["input"], "other": a["mat2"]})),
    "linear": ([_X, "weight", "bias"], {"bias": None}, h_linear),
    "addmm": ([_X, "mat1", "mat2", "beta", "alpha"], {"beta": 1, "alpha": 1}, h_addmm),
    "neg": ([], {}, h_neg),
    "embedding": ([], {}, h_embedding),
}
# Views whose result shape comes from meta: only the input tensor is read.
for _name in sorted(RESHAPE_OPS):
    HANDLERS[_name] = ([], {}, h_reshape)
for _name in sorted(EXPAND_OPS):
    HANDLERS[_name] = ([], {}, h_expand)
HANDLERS["permute"] = ([], {}, h_permute)
for _name in _ARITH | set(_REVERSED):
    HANDLERS[_name] = (
        [_X, "other|exponent", "alpha", "rounding_mode"],
        {"alpha": 1, "rounding_mode": None},
        h_arith(_name),
    )
for _name in ELEMENTWISE_UNARY:
    HANDLERS.setdefault(_name, ([], {}, h_generic(POINTWISE, elementwise=True)))
for _name in ELEMENTWISE_MULTI:
    HANDLERS.setdefault(_name, ([], {}, h_generic(POINTWISE, elementwise=True)))
for _name, _kind in GENERIC_KINDS.items():
    HANDLERS.setdefault(_name, ([], {}, h_generic(_kind)))
for _name in TUPLE_OPS:  # items read by getitem users: one term per item
    HANDLERS.setdefault(_name, ([], {}, h_tuple_op))

# ---------------------------------------------------------------- modules
# call_module nodes of symbolic_trace graphs become the functional op, with the
# module's parameters as leaves: module type -> (op name, functional target,
# parameter names read, constant kwargs taken from the module).


def _embedding_constants(m: nn.Embedding) -> dict[str, Any]:
    """An nn.Embedding's flags as F.embedding kwargs (those that change the gradient kept).

    max_norm renormalizes the table in place on every lookup: not a pure op.
    """
    if m.max_norm is not None:
        raise Unsupported("embedding with max_norm writes to its table")
    flags = {"padding_idx": m.padding_idx}
    if m.scale_grad_by_freq:
        flags["scale_grad_by_freq"] = True
    if m.sparse:
        flags["sparse"] = True
    return flags


MODULE_OPS: dict[type, tuple[str, Any, tuple[str, ...], Callable[[nn.Module], dict[str, Any]]]] = {
    nn.Linear: ("linear", F.linear, ("weight", "bias"), lambda m: {}),
    nn.ReLU: ("relu", torch.relu, (), lambda m: {}),
    nn.Tanh: ("tanh", torch.tanh, (), lambda m: {}),
    nn.Sigmoid: ("sigmoid", torch.sigmoid, (), lambda m: {}),
    nn.SiLU: ("silu", F.silu, (), lambda m: {}),
    nn.GELU: ("gelu", F.gelu, (), lambda m: {"approximate": m.approximate}),
    nn.LayerNorm: (
        "layer_norm",
        F.layer_norm,
        ("weight", "bias"),
        lambda m: {"normalized_shape": tuple(cast(nn.LayerNorm, m).normalized_shape), "eps": m.eps},
    ),
    nn.Embedding: ("embedding", F.embedding, ("weight",), lambda m: _embedding_constants(cast(nn.Embedding, m))),
    nn.Softmax: ("softmax", F.softmax, (), lambda m: {"dim": m.dim}),
    nn.Identity: ("identity", None, (), lambda m: {}),
    nn.Dropout: ("dropout", None, (), lambda m: {}),
    nn.Flatten: ("flatten", None, (), lambda m: {}),
}
