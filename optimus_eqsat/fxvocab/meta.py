"""What FX nodes hold: tensor meta readers, and the one way to read a graph's shapes.

Graphs say what their nodes hold in node meta: ``meta["val"]`` (torch.export,
aten graphs; fake tensors), ``meta["example_value"]`` (Dynamo),
``meta["tensor_meta"]`` (ShapeProp) or, on programs the optimizer rebuilt,
:data:`SHAPE_META` (the e-graph's shape, a :class:`TensorInfo`). Where meta is
missing, :func:`node_values` runs the example inputs through the graph once.
"""

from __future__ import annotations

import contextlib
import logging
import unittest.mock
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.fx._pytree as fx_pytree
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.fx.node import map_aggregate

from optimus_eqsat.fxvocab.mutation import foreach_inplace, written_attributes
from optimus_eqsat.fxvocab.symbolic import concrete_inputs, size_hint

log = logging.getLogger("optimus_eqsat")

# meta key under which optimus_eqsat's rebuild leaves a TensorInfo known from the
# e-graph's shape analysis: cheap shapes for candidate programs, no fake tensors.
SHAPE_META = "optimus_eqsat_shape"
META_KEYS = ("val", "example_value", "tensor_meta")


@dataclass(frozen=True)
class TensorInfo:
    """Shape (None where symbolic and unhinted) and element size of a tensor."""

    shape: tuple[int | None, ...]
    itemsize: int

    @property
    def numel(self) -> int | None:
        total = 1
        for dim in self.shape:
            if dim is None:
                return None
            total *= dim
        return total

    @property
    def nbytes(self) -> int:
        return (self.numel or 0) * self.itemsize


def _dim(size: Any) -> int | None:
    """A size as an int: a SymInt's hint, read without adding a guard (``int(symint)``
    would specialize the graph to the example's size)."""
    hint = size_hint(size)
    if hint is not None:
        return hint
    try:
        return int(size)
    except Exception:
        return None


def tensor_infos(value: Any) -> list[TensorInfo] | None:
    """The tensors in a node's value (tensors, ShapeProp metadata, TensorInfo, or
    structures of them), flattened; [] when it holds none; None for None (unknown)."""
    from torch.fx.passes.shape_prop import TensorMetadata

    if isinstance(value, (torch.Tensor, TensorMetadata)):
        return [TensorInfo(tuple(_dim(s) for s in value.shape), value.dtype.itemsize)]
    if isinstance(value, TensorInfo):
        return [value]
    if isinstance(value, (tuple, list)):
        out: list[TensorInfo] = []
        for item in value:
            out.extend(tensor_infos(item) or [])
        return out
    if isinstance(value, dict):
        return tensor_infos(list(value.values()))
    if value is None:
        return None
    return []  # int, float, SymInt, bool: known and not a tensor


def memory_order(value: torch.Tensor) -> list[int]:
    """The dims of the buffer ``empty_like(value)`` allocates, from the outermost in memory to
    the innermost: so the order in which a random op over ``value`` draws its numbers.
    ``empty_like`` keeps a dense tensor's strides and lays out any other (a broadcast, a
    strided slice) as it suggests (contiguous, mostly); largest stride first, ties (size-1
    dims) in dim order."""
    like = torch.empty_like(value, device="meta")  # what eager allocates, without the memory
    strides = like.stride()
    return sorted(range(like.dim()), key=lambda d: -strides[d])


def meta_value(node: torch.fx.Node) -> Any:
    """What node meta says ``node`` holds: the first of ``meta["val"]``,
    ``["example_value"]``, ``["tensor_meta"]`` that is set; None if none is."""
    meta = node.meta
    for key in META_KEYS:
        value = meta.get(key)
        if value is not None:
            return value
    return None


def node_tensor_infos(node: torch.fx.Node) -> list[TensorInfo] | None:
    """Tensors a node produces, from :func:`meta_value`, else from ``[SHAPE_META]``;
    None when no meta is present."""
    value = _known_value(node)
    return None if value is None else tensor_infos(value)


#: Calls that switch the grad mode or autocast state: they hold no tensor.
STATE_SWITCHES = frozenset({"_set_grad_enabled", "_enter_autocast", "_exit_autocast"})
#: Calls that hold no tensor whatever their arguments (``torch.nn`` code logs its API usage).
_HOLD_NOTHING = STATE_SWITCHES | {"_log_api_usage_once"}


def holds_no_tensor(node: torch.fx.Node) -> bool:
    """Whether ``node`` holds no tensor by what it calls, so a missing meta hides nothing: a
    grad-mode or autocast switch or an API-usage log call (Dynamo gives these no meta), or an
    in-place foreach op (it returns None; the decomposition's running-statistics updates are
    such ops)."""
    if node.op != "call_function":
        return False
    return getattr(node.target, "__name__", "") in _HOLD_NOTHING or foreach_inplace(node)


def _known_value(node: torch.fx.Node) -> Any:
    value = meta_value(node)
    return node.meta.get(SHAPE_META) if value is None else value


def fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    """The value a ``get_attr`` node reads: ``target`` is a dotted path ("projs.3.bias")."""
    obj: Any = gm
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


# ---------------------------------------------------------------- example inputs


class ExampleInputError(ValueError):
    """Example inputs that do not fit the graph (a caller's mistake)."""


def flat_example_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None) -> Sequence[Any] | None:
    """``example_inputs`` as the graph's placeholders take them. A module from ``torch.export``
    (``ExportedProgram.module()``) is called with the program's inputs as the user passes them
    (a dict of features, say) and flattens them into its placeholders by its input spec: example
    inputs given that way are flattened the same way. Trailing placeholders with a default (a
    forward's defaulted arguments, as ``symbolic_trace`` writes them) that the inputs leave out
    take their default, as a call of the module would. Others are returned as they are."""
    codegen = gm.graph._codegen
    if example_inputs is None:
        return example_inputs
    if not isinstance(codegen, torch.fx.graph._PyTreeCodeGen):
        return _with_defaults(gm, example_inputs)
    placeholders = sum(n.op == "placeholder" for n in gm.graph.nodes)
    if len(example_inputs) == placeholders and not any(isinstance(x, (dict, list, tuple)) for x in example_inputs):
        return example_inputs
    given: tuple[tuple[Any, ...], dict[str, Any]] = (tuple(example_inputs), {})
    try:
        flat = list(fx_pytree.tree_flatten_spec(given, codegen.pytree_info.in_spec))
    except Exception:  # not the module's call signature: check_example_inputs names the mismatch
        return example_inputs
    # (the spec reads what it knows and ignores the rest: an input too many must stay an error)
    return flat if len(flat) == len(torch.utils._pytree.tree_leaves(given)) else example_inputs


def _with_defaults(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Sequence[Any]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    left_out = placeholders[len(example_inputs) :]
    if not left_out or not all(n.args for n in left_out):  # (a placeholder's args: its default)
        return example_inputs
    return [*example_inputs, *(n.args[0] for n in left_out)]


def check_example_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Raise :class:`ExampleInputError` when ``example_inputs`` cannot be the graph's inputs:
    a different count, or a tensor whose shape or dtype differs from the placeholder's meta
    (symbolic sizes match anything)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(example_inputs) != len(placeholders):
        raise ExampleInputError(
            f"{len(example_inputs)} example inputs for {len(placeholders)} placeholders "
            f"({', '.join(n.name for n in placeholders)})"
        )
    for k, (node, value) in enumerate(zip(placeholders, example_inputs)):
        meta = meta_value(node)
        if not isinstance(meta, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        want, got = tuple(meta.shape), tuple(value.shape)
        fits = len(want) == len(got) and all(not isinstance(w, int) or w == g for w, g in zip(want, got))
        if not fits or meta.dtype != value.dtype:
            raise ExampleInputError(
                f"example input {k} ({node.name!r}) is {tuple(got)} {value.dtype}; the graph expects "
                f"{tuple(int(w) if isinstance(w, int) else str(w) for w in want)} {meta.dtype}"
            )


def _meta_like(x: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``x``'s shape, dtype and strides (the layout decides the order a random
    op draws in); contiguous where ``x`` has no strides (a sparse tensor)."""
    try:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    except (RuntimeError, NotImplementedError):
        return torch.empty(0).new_empty(x.shape, dtype=x.dtype, device="meta")


def _to_meta(value: Any) -> tuple[Any, bool]:
    """``value`` with every tensor replaced by a meta tensor like it (:func:`_meta_like`),
    and whether it held a tensor."""
    if isinstance(value, torch.Tensor):
        return _meta_like(value), True
    if not isinstance(value, (tuple, list, dict)):
        return value, False
    found = False

    def convert(x: Any) -> Any:
        nonlocal found
        if isinstance(x, torch.Tensor):
            found = True
            return _meta_like(x)
        return x

    return map_aggregate(value, convert), found


class _Recorder(torch.fx.Interpreter):
    """Runs the graph on example inputs, recording what each node holds as meta tensors."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.seen: dict[torch.fx.Node, Any] = {}
        self.current: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current = n
        try:
            out = super().run_node(n)
        except DataDependentOutputException:
            # ``x.item()`` of a fake tensor (Dynamo under dynamic=True lifts a module's float
            # attributes, a norm's momentum, a dropout's p, as 0-d tensor inputs read with
            # ``.item()``): the symbolic scalar Dynamo traced it as is the value.
            out = _traced_scalar(n)
            if out is None:
                raise
        value, found = _to_meta(out)
        if found:
            self.seen[n] = value
        return out


def _traced_scalar(n: torch.fx.Node) -> Any:
    """The scalar (a SymFloat, SymInt or SymBool, or a plain number) that ``n``'s tracer
    recorded for it, or None."""
    value = meta_value(n)
    return value if isinstance(value, (torch.SymFloat, torch.SymInt, torch.SymBool, float, int, bool)) else None


def copied_inputs(
    inputs: Sequence[Any],
    budget_bytes: int,
    must: Collection[int] = (),
    may: Callable[[torch.Tensor], bool] = lambda x: True,
) -> list[Any]:
    """``inputs`` with copies of the tensors a run of ours must not write to: those at
    positions ``must``, and those ``may`` accepts while their bytes fit in ``budget_bytes``
    (in order). A graph can write to its inputs (a batch norm's running statistics, a
    counter a model bumps): a run for shapes or for timing must leave the caller's alone."""
    out = []
    for k, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.layout == torch.strided:
            size = x.untyped_storage().nbytes()
            if k in must or (may(x) and size <= budget_bytes):
                budget_bytes -= 0 if k in must else size
                x = same_layout_copy(x)
        out.append(x)
    return out


def same_layout_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with its strides (``clone`` makes a column slice contiguous, and a
    compiled program asserts its inputs' strides), as a leaf that requires grad as ``x`` does.
    An expanded tensor (stride 0 along some dims) is copied once along them and expanded
    again, so its strides stay 0; a tensor whose elements overlap otherwise is cloned."""
    detached = x.detach()
    if _overlaps(x):
        broadcast = [d for d, (size, stride) in enumerate(zip(x.shape, x.stride())) if stride == 0 and size > 1]
        core = detached[tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(x.dim()))]
        if broadcast and not _overlaps(core):
            copy = same_layout_copy(core).expand(x.shape).detach()
        else:
            copy = detached.clone()
    else:
        copy = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device).copy_(detached)
    return copy.requires_grad_(x.requires_grad)


def _overlaps(x: torch.Tensor) -> bool:
    """Whether two elements of ``x`` share memory (each dimension's stride, smallest first,
    must step past everything the smaller ones span)."""
    span = 0
    for size, stride in sorted((d for d in zip(x.shape, x.stride()) if d[0] > 1), key=lambda d: d[1]):
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def input_versions(inputs: Sequence[Any]) -> dict[int, int]:
    """Version counters of the tensors in ``inputs`` (inference tensors keep none): compare
    them after a run to see which it wrote to."""
    return {k: x._version for k, x in enumerate(inputs) if isinstance(x, torch.Tensor) and not x.is_inference()}


def warn_if_written(inputs: Sequence[Any], before: dict[int, int], what: str) -> None:
    """Log a warning naming the inputs whose version moved since ``before``."""
    changed = [k for k, v in input_versions(inputs).items() if before.get(k, v) != v]
    if changed:
        log.warning("optimus_eqsat: %s wrote to input(s) %s, which it ran on as they are", what, changed)


# A run for shapes works on copies of the inputs up to this many bytes in all.
RUN_COPY_BYTES = 256 << 20


def record_shapes(gm: torch.fx.GraphModule, example_inputs: tuple | list) -> dict[torch.fx.Node, Any]:
    """Meta tensors per node from one run on example inputs: a tensor's own, or the
    structure (tuple, list, dict) of a result that holds tensors; nodes that hold no
    tensor (sizes, scalars) are absent. The run works on copies of the inputs
    (:func:`copied_inputs`, up to :data:`RUN_COPY_BYTES`): a graph that writes to its
    inputs (a batch norm in training) leaves the caller's untouched.

    Raises :class:`ExampleInputError` naming the node where the run failed: inputs that
    do not run through the graph are a caller's mistake, not a graph to optimize blind."""
    recorder = _Recorder(gm)
    example_inputs = concrete_inputs(example_inputs) or []  # a SymInt input runs at its hint
    before = input_versions(example_inputs)
    # (the caller's RNG state is put back too: a dropout in the graph draws from it)
    devices = sorted({x.device.index or 0 for x in example_inputs if isinstance(x, torch.Tensor) and x.is_cuda})
    try:
        with (
            torch.no_grad(),
            module_state_kept(gm),
            torch.random.fork_rng(devices=devices),
            _in_fake_mode_of(example_inputs),
        ):
            recorder.run(*copied_inputs(example_inputs, RUN_COPY_BYTES))
    except Exception as exc:
        failed = recorder.current.name if recorder.current is not None else "?"
        raise ExampleInputError(
            f"the example inputs ({', '.join(_describe(v) for v in example_inputs)}) "
            f"do not run through the graph: at {failed!r}: {type(exc).__name__}: {exc}"
        ) from exc
    warn_if_written(example_inputs, before, "the run for shapes")
    return recorder.seen


@contextlib.contextmanager
def _in_fake_mode_of(example_inputs: Sequence[Any]) -> Any:
    """With fake example inputs (a compile's, e.g. the pieces DDPOptimizer cuts), their fake
    mode: what the graph makes from nothing (a dropout's random mask, a factory's tensor) is
    fake like them, and the graph's real constants are taken as fake (as DDPOptimizer runs
    its pieces). Otherwise nothing."""
    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    if fake_mode is None:
        yield
        return
    with fake_mode, unittest.mock.patch.object(fake_mode, "allow_non_fake_inputs", True):
        yield


@contextlib.contextmanager
def module_state_kept(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Put ``gm``'s buffers (a traced batch-norm module's statistics and count) and the
    parameters its graph writes (the table of an embedding with ``max_norm``) back as they
    were after the block: a run of the graph for its shapes must leave the model alone."""
    params = dict(gm.named_parameters())
    state = [b for _, b in gm.named_buffers()] + [params[n] for n in sorted(written_attributes(gm)) if n in params]
    with _restoring(list(zip(state, copied_inputs(state, RUN_COPY_BYTES)))):
        yield


@contextlib.contextmanager
def _restoring(saved: list[tuple[torch.Tensor, Any]]) -> Any:
    """Put each tensor back to its saved copy (a tensor too large to copy is its own copy
    and stays as the run left it). By value, not by version counter: a batch norm's kernel
    updates its running statistics without moving their version counters. A tensor the run
    left as it was is not written: it may share its version counter with an input (weights
    moved into a stack of the parameter cache are views of it), which would then look
    written by the run."""
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, copy in saved:
                if copy is not tensor and not torch.equal(tensor, copy):
                    tensor.copy_(copy)


def _describe(value: Any) -> str:
    return f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__


def node_values(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    *,
    shape_meta: bool = False,
) -> dict[torch.fx.Node, Any]:
    """What each node holds: :func:`meta_value` and, where that is None and example
    inputs are given, the value :func:`record_shapes` records in one run of them (the
    run happens only when some node lacks meta that may hold a tensor: not the output, nor
    a node that :func:`holds_no_tensor`). None where neither says (also for nodes that hold
    no tensor and have no meta).

    ``shape_meta=True``: a node with only :data:`SHAPE_META` (an e-graph shape the
    rebuild left, no dtype) counts as known and holds that :class:`TensorInfo`.
    Raises :class:`ExampleInputError` when the inputs do not run through the graph.
    """
    read = _known_value if shape_meta else meta_value
    values = {n: read(n) for n in gm.graph.nodes}
    if example_inputs is not None and any(
        v is None and n.op != "output" and not holds_no_tensor(n) for n, v in values.items()
    ):
        recorded = record_shapes(gm, tuple(example_inputs))
        for node, value in values.items():
            if value is None:
                values[node] = recorded.get(node)
    return values
