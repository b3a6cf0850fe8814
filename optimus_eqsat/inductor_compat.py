"""Keep our programs clear of known Inductor bugs that our rewrites would trigger.

Attention key permutes. Our permute rules fold ``k.transpose(1, 2)`` and the
``.transpose(-2, -1)`` of ``q @ k^T`` into one ``permute(0, 2, 3, 1)``. Inductor's
attention fusion (torch 2.13, ``fx_passes/fuse_attention.py``, pattern 28:
``matmul(q, k.transpose(-2, -1)).mul(s).softmax(-1).matmul(v)`` with
non-contiguous q/k/v) also matches that single permute, and its replacement
then hands SDPA the un-permuted tensor as the key: compiling under no_grad fails
with "Attempting to broadcast a dimension of length 16". Hand-written eager code
with the same permute fails the same way, so the bug is Inductor's; we only stop
emitting the form it trips on, by splitting such a key permute back into a
permute that keeps the last two axes in order and a swap of those two. Views
launch nothing, so the predicted cost is unchanged.

In-place reuse of a concatenation's piece. Inductor writes the pieces of a ``cat``
straight into the cat's buffer; each piece is then a buffer that only *aliases* a slice
of that storage (``NonOwningLayout``). Its in-place update decision (torch 2.13,
``Scheduler.decide_inplace_update``) counts the piece's own remaining readers but not
the cat's, so a pointwise kernel that is the piece's last reader may write its result
over the piece while the cat is still to be read (for example a backward whose batched
gradient matmuls read a cat of ``g`` and ``g.T`` pieces: wrong gradients, no error);
and the result then lives in the cat's storage, which Inductor frees, and hands on to
another buffer, once the cat's own readers are done. Batching makes many such cats.
:func:`install_inplace_alias_fix` keeps that decision off aliased storage: a piece of a
cat is never written over in place, nor a cat while a piece of it still has a reader;
every other in-place reuse stays on, for our programs as for Inductor's own. Installed
for the process: a backward compiled lazily, at the user's first ``backward()``, is
compiled outside our compiles.

Backwards lowered with their forward. AOTAutograd (torch 2.13) lets a backward reuse
("donate") the buffers its forward saved, and learns whether that is safe from the first
backward's ``retain_graph``: a backward compiled lazily, on its first use, is compiled for
that use. One compiled with its forward (``force_non_lazy_backward_lowering``, which
the backend needs under DDP) is compiled donating, and every later
``backward(retain_graph=True)`` then fails ("compiled with non-empty donated buffers"),
where Inductor alone runs it (multi-task gradients under DDP). Such backwards are
compiled without donated buffers (:func:`backwards_lowered_with_forwards`).

Donated buffers that are outputs. AOTAutograd (torch 2.13) lets a backward write over
("donate") a buffer its forward saved when that buffer's fake tensor shares no storage with
a forward output. Inductor then lowers a one-tensor ``cat`` or ``stack`` to a view of its
input, and AOTAutograd misses some views too (an ``unsqueeze`` of a ``split`` piece): a
forward output then lives in a saved buffer the backward overwrites, and a caller reading
the output after ``backward()`` (a metric logged after the step) reads the backward's values,
with Inductor alone too (found by the compiled fuzzer: one output 24 off). Two saved
tensors that are views of one buffer are both donated too, and the backward may write over
one while the other is still to be read (a weight gradient 1.3 off, once our post-grad pass
had moved its matmul after that write). The donated list leaves out
(:func:`install_donation_alias_fix`) every saved tensor whose storage a forward output or
another saved tensor may share: the same root through view ops, ``getitem`` of split pieces
and one-tensor ``cat`` or ``stack`` in the forward graph.

Sparse gradients. An embedding with ``sparse=True`` has a sparse gradient, a tensor
without storage. After a pass edits a backward graph, Inductor (torch 2.13,
``FakeTensorUpdater.incremental_update``) re-propagates the fake tensors downstream of
the edit and compares each new one with the old one by storage, which a sparse tensor
cannot give ("Cannot access storage of SparseTensorImpl"): any backward with a view
scatter (the gradient of a slice, which batching makes often) upstream of a sparse
gradient fails to compile, with Inductor alone too. :func:`install_sparse_gradient_fix`
gives such tensors their own identity instead of a storage, so they compare as changed
and get their new fake value.
"""

from __future__ import annotations

import contextlib
import operator
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast
from unittest import mock

import torch

from optimus_eqsat.fxvocab import SHAPE_META, TensorInfo, call_name, meta_value, node_tensor_infos

__all__ = [
    "split_attention_key_permutes",
    "is_dynamo_signal",
    "first_line",
    "install_donation_alias_fix",
    "install_inplace_alias_fix",
    "install_sparse_gradient_fix",
    "wrap_once",
]


@contextlib.contextmanager
def backwards_lowered_with_forwards() -> Iterator[None]:
    """Compile each backward with its forward, and without donated buffers, so it runs with
    ``retain_graph=True`` too. (With ``donated_buffer`` off at compile time, AOTAutograd
    leaves the donated list unset, which its runtime check reads as donating: the list is
    made empty instead. A saved-tensors hook filtered to donated buffers then applies to
    none, as under ``retain_graph=True``.)"""
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd import graph_compile

    with contextlib.ExitStack() as stack:
        stack.enter_context(functorch_config.patch(force_non_lazy_backward_lowering=True))
        if hasattr(graph_compile, "collect_bw_donated_buffer_idxs"):
            stack.enter_context(mock.patch.object(graph_compile, "collect_bw_donated_buffer_idxs", _no_donation))
        yield


def wrap_once(owner: object, name: str, wrap: Callable[[Callable], Callable]) -> bool:
    """Put ``wrap(original)`` in place of ``owner.name`` once per process: a later call finds
    the wrapper there and leaves it (the original is its ``__wrapped__``). False where ``owner``
    has no such attribute (another torch)."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    if not getattr(original, "_optimus_eqsat_wrapped", False):
        wrapper = wrap(original)
        wrapper._optimus_eqsat_wrapped = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
    return True


def install_sparse_gradient_fix() -> bool:
    """Let Inductor's fake-tensor updater compare tensors without storage (see the module
    docstring), once per process; False where this torch has no such updater. Installed for
    the process, not around our compiles alone: a backward compiled lazily, at the user's
    first ``backward()``, is compiled outside them."""
    try:
        from torch._inductor import fx_utils
    except ImportError:
        return False

    def wrap(storage_of: Callable[[torch.Tensor], int]) -> Callable[[torch.Tensor], int]:
        def get_storage(t: torch.Tensor) -> int:
            if not torch._C._has_storage(t):  # a sparse tensor: no storage to share, so its own
                return id(t)
            return storage_of(t)

        return get_storage

    return wrap_once(fx_utils, "get_storage", wrap)


def install_inplace_alias_fix() -> bool:
    """Keep Inductor from writing a kernel's result in place over a piece of a cat, or over a
    cat whose pieces are still to be read (see the module docstring), once per process; False
    where this torch has no such check."""
    try:
        from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    except ImportError:
        return False

    def wrap(can_reuse: Callable[..., bool]) -> Callable[..., bool]:
        def can_reuse_unaliased(self: object, input_buffer: Any, output_buffer: Any = None) -> bool:
            if not can_reuse(self, input_buffer, output_buffer):
                return False
            # (a second argument is the node that would write in place; without one the
            # wrapper asks whether a freed buffer's allocation may be handed on: unchanged)
            if output_buffer is None or not hasattr(output_buffer, "scheduler"):
                return True
            return not _unsafe_to_write_over(input_buffer, output_buffer)

        return can_reuse_unaliased

    return wrap_once(PythonWrapperCodegen, "can_reuse", wrap)


def install_donation_alias_fix() -> bool:
    """Keep every saved tensor that may share storage with a forward output or with another
    saved tensor out of the backward's donated buffers (see the module docstring), once per
    process; False where this torch does not donate. Installed for the process: a backward
    compiled lazily is compiled outside our compiles."""
    try:
        from torch._functorch._aot_autograd import graph_compile
    except ImportError:
        return False

    def wrap(collect: Callable[..., list[int]]) -> Callable[..., list[int]]:
        def collect_unaliased(fw_module: torch.fx.GraphModule, bw_module: Any, fw_metadata: Any) -> list[int]:
            donated = collect(fw_module, bw_module, fw_metadata)
            if not donated:
                return donated
            outputs = list(next(reversed(fw_module.graph.find_nodes(op="output"))).args[0])
            shared = {_storage_root(n) for n in outputs[: fw_metadata.num_forward] if isinstance(n, torch.fx.Node)}
            saved_roots = [_storage_root(n) for n in outputs[fw_metadata.tensors_saved_for_backwards_slice]]
            shared |= {root for root, n in Counter(saved_roots).items() if n > 1}  # (two saved views of one buffer)
            first = fw_metadata.num_symints_saved_for_bw  # (donated indices count the saved symints first)
            return [i for i in donated if saved_roots[i - first] not in shared]

        return collect_unaliased

    return wrap_once(graph_compile, "collect_bw_donated_buffer_idxs", wrap)


# Ops Inductor may lower to a view of their input though they are not views in ATen's schema.
_VIEWS_ONCE_LOWERED = {"aten._unsafe_view.default", "aten.reshape.default"}


def _storage_root(node: Any) -> Any:
    """The node whose storage ``node`` may share once lowered: followed through view ops,
    ``getitem`` of their list results and one-tensor ``cat`` / ``stack``."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.args:
        target, source = node.target, node.args[0]
        if target is operator.getitem:
            node = source
        elif isinstance(target, torch._ops.OpOverload) and (target.is_view or str(target) in _VIEWS_ONCE_LOWERED):
            node = source
        elif str(target) in ("aten.cat.default", "aten.stack.default") and isinstance(source, (list, tuple)):
            if len(source) != 1:
                break
            node = source[0]
        else:
            break
    return node


def _is_piece(buffer: Any) -> bool:
    """Whether ``buffer`` (an Inductor IR buffer) writes into another buffer's storage."""
    from torch._inductor import ir

    return isinstance(getattr(buffer, "layout", None), ir.NonOwningLayout)


def _storage_owner(buffer: Any) -> str | None:
    """The name of the buffer whose storage the piece ``buffer`` writes into (None where it
    cannot be named)."""
    from torch._inductor import ir

    target: Any = buffer.layout.view
    while isinstance(target, (ir.BaseView, ir.MutableBox)):  # views, storage and tensor boxes
        target = target.data
    return target.get_name() if isinstance(target, ir.Buffer) else None


def _aliases(scheduler: Any) -> dict[str, set[str]]:
    """Owner name -> names of the buffers that write into its storage, for one scheduler
    (layouts are fixed before scheduling, so it is computed once)."""
    aliases = getattr(scheduler, "_optimus_eqsat_aliases", None)
    if aliases is None:
        aliases = {}
        for name, buf in scheduler.name_to_buf.items():
            owner = _storage_owner(buf.node) if _is_piece(buf.node) else None
            if owner is not None:
                aliases.setdefault(owner, set()).add(name)
        scheduler._optimus_eqsat_aliases = aliases
    return aliases


def _unsafe_to_write_over(input_buffer: Any, node: Any) -> bool:
    """Whether ``node`` (the scheduler node that would write its result over ``input_buffer``)
    must not: ``input_buffer`` is a piece living in another buffer's storage (the result would
    live there too, where the owner's readers see it and which Inductor frees, and hands on,
    with the owner), or it owns pieces that have a reader still to run."""
    from torch._inductor.virtualized import V

    if getattr(input_buffer, "node", None) is None:
        return False
    if _is_piece(input_buffer.node):
        return True
    scheduler = node.scheduler
    pieces = _aliases(scheduler).get(input_buffer.get_name(), set())
    # (the readers Inductor's own decision also counts as done)
    done = node.ancestors | V.graph.removed_operations | scheduler.completed_operations
    for piece in pieces:
        buf = scheduler.name_to_buf.get(piece)
        if buf is not None and any(use.node.get_name() not in done for use in buf.users):
            return True
    return False


def _no_donation(*args: object, **kwargs: object) -> list[int]:
    return []


def dynamo_compile_lock() -> contextlib.AbstractContextManager:
    """Dynamo's lock around a compile (re-entrant; none where torch has no such lock). Work
    of ours that runs outside Dynamo's compile yet must not overlap another thread's compile
    holds it: a compile on the first call (it patches Inductor's process-wide config), and the
    parameter cache moving parameters (a compile fakeifies each parameter it reads)."""
    from torch._dynamo import convert_frame

    return getattr(convert_frame, "compile_lock", None) or contextlib.nullcontext()


def is_dynamo_signal(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Dynamo's control-flow signals rather than a failure.

    Dynamo raises ``RestartAnalysis`` (and subclasses such as
    ``TensorifyScalarRestartAnalysis``, raised from within Inductor under ``dynamic=True``)
    to re-trace a frame, and ``SkipFrame`` to run it eagerly. A backend that
    catches them as errors breaks the user's compile; they must propagate.
    """
    try:
        from torch._dynamo.exc import RestartAnalysis, SkipFrame
    except ImportError:  # a torch without Dynamo raises none of them
        return False
    return isinstance(exc, (RestartAnalysis, SkipFrame))


def is_graph_break_request(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the fake-tensor errors Dynamo answers with a graph break when a
    backend raises it (an op whose output shape depends on data, such as the ``nonzero`` in the
    backward of ``out[mask] = value``): Inductor raises it on the original graph as well."""
    try:
        from torch._dynamo.exc import exceptions_allowed_to_be_fallback
    except ImportError:  # a torch without Dynamo
        return False
    return isinstance(exc, exceptions_allowed_to_be_fallback)


def lifted_float_inputs(gm: torch.fx.GraphModule) -> list[str]:
    """Placeholders that are float attributes Dynamo lifted to 0-d float64 tensor inputs,
    read back with ``.item()`` (a norm's momentum or eps, a dropout's p, under
    ``dynamic=True`` with Dynamo's default ``specialize_float=False``). Inductor restarts the
    trace of such a graph with those floats specialized (``TensorifyScalarRestartAnalysis``),
    so the backend optimizes the restarted graph, not this one. A float read only by Python
    arithmetic with tensors (``h / (ms + self.eps).sqrt()``, T5's RMS norm) is turned into a
    tensor op instead and the trace is not restarted: such floats are not listed."""
    names = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = meta_value(node)
        if (
            isinstance(value, torch.Tensor)
            and value.dim() == 0
            and value.dtype == torch.float64
            and node.users
            and all(user.op == "call_method" and user.target == "item" for user in node.users)
            and not all(read.target in _FLOAT_ARITHMETIC for user in node.users for read in user.users)
        ):
            names.append(node.name)
    return names


#: Python operators on a float that Inductor turns into tensor arithmetic without a restart
_FLOAT_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow})


def first_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: first line of the message`` (the type alone for an empty message)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text[:limit]


_MATMULS = {"matmul", "bmm"}
_SCALES = {"mul", "div", "truediv"}
_SOFTMAX = {"softmax", "_softmax"}


def _permute_dims(node: torch.fx.Node) -> list[int] | None:
    """The dims of a ``permute`` node (function or method form), else None."""
    if call_name(node) != "permute":
        return None
    dims: torch.fx.node.Argument
    if node.op == "call_method":  # x.permute(0, 2, 3, 1) or x.permute([0, 2, 3, 1])
        dims = node.args[1:]
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = dims[0]
    else:  # torch.permute(x, [0, 2, 3, 1]), aten.permute, or dims=
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dims")
    if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(d, int) for d in dims):
        return None
    return [cast(int, d) % len(dims) for d in dims]  # all ints, checked above


def _feeds_softmax(node: torch.fx.Node, hops: int = 3) -> bool:
    """Whether ``node`` reaches a softmax through at most ``hops`` scale ops (mul / div)."""
    frontier = [node]
    for _ in range(hops):
        nxt = []
        for n in frontier:
            for user in n.users:
                name = call_name(user)
                if name in _SOFTMAX:
                    return True
                if name in _SCALES:
                    nxt.append(user)
        frontier = nxt
    return False


def split_attention_key_permutes(gm: torch.fx.GraphModule) -> int:
    """Split each attention key permute that moves the last axis into two permutes.

    Applies to ``matmul(q, permute(k, p))`` feeding a softmax (through scale
    ops) where ``p`` moves the last axis but is not just a swap of the last two:
    the key becomes ``permute(permute(k, p'), [.., n-1, n-2])`` with ``p'`` = p with
    its last two entries swapped. Returns how many were split; recompiles if any.
    """
    split = 0
    for node in list(gm.graph.nodes):
        if call_name(node) not in _MATMULS or len(node.args) < 2 or not isinstance(node.args[1], torch.fx.Node):
            continue
        key = node.args[1]
        dims = _permute_dims(key)
        if dims is None or len(dims) < 3 or dims[-1] == len(dims) - 1:
            continue
        first = dims[:-2] + [dims[-1], dims[-2]]
        if first == list(range(len(dims))) or not _feeds_softmax(node):
            continue  # already a plain transpose(-2, -1), or not attention
        swap = list(range(len(dims) - 2)) + [len(dims) - 1, len(dims) - 2]
        with gm.graph.inserting_after(key):
            head = gm.graph.call_function(torch.permute, (key.args[0], first))
        with gm.graph.inserting_after(head):
            tail = gm.graph.call_function(torch.permute, (head, swap))
        _copy_shape_meta(key, head, first, tail)
        node.replace_input_with(key, tail)
        if not key.users:
            gm.graph.erase_node(key)
        split += 1
    if split:
        gm.graph.lint()
        gm.recompile()
    return split


def _copy_shape_meta(key: torch.fx.Node, head: torch.fx.Node, first: list[int], tail: torch.fx.Node) -> None:
    """Shape meta for the two new permutes, from the key's input (the cost model reads it)."""
    infos = node_tensor_infos(cast(torch.fx.Node, key.args[0]))  # the permute's input
    if not infos or len(infos) != 1 or len(infos[0].shape) != len(first):
        return
    src = infos[0]
    shape = tuple(src.shape[d] for d in first)
    head.meta[SHAPE_META] = TensorInfo(shape, src.itemsize)
    tail_shape = shape[:-2] + (shape[-1], shape[-2])
    tail.meta[SHAPE_META] = TensorInfo(tail_shape, src.itemsize)
