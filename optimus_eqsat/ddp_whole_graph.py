"""Batching across DDP's buckets: our backend decides on Dynamo's whole graph before
DDPOptimizer cuts it.

Under ``torch.compile(DDP(model))`` Dynamo wraps the backend in ``DDPOptimizer``, whose
``compile_fn`` cuts the graph where a gradient bucket fills and compiles each piece alone, so
experts that land in different buckets are never batched. :func:`install` wraps
``DDPOptimizer.compile_fn``: for a backend that carries a ``whole_ddp_graph`` attribute (ours)
it hands the whole graph to that attribute, with a ``split`` callable that runs DDPOptimizer's
own cut-and-compile on a graph the backend chose; any other backend goes through untouched.
The cut then follows the optimized graph: a batched layer reads its members' weights in one
node, so their gradients fall in one bucket and no bucket straddles a batch.

While ``split`` compiles the pieces, :func:`piece_mode` tells the backend what each piece is
(:class:`Piece`), so it compiles it without optimizing it again.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from optimus_eqsat.inductor_compat import wrap_once

log = logging.getLogger("optimus_eqsat")

__all__ = ["Piece", "install", "piece_mode", "current_piece", "piece_count", "sink_input_work"]


class Piece(enum.Enum):
    """What a graph the backend is handed while :func:`piece_mode` is set is a piece of."""

    ORIGINAL = "original"  # of the graph as Dynamo traced it: compiled as Inductor compiles it
    OPTIMIZED = "optimized"  # of the program our optimizer chose for the whole graph
    UNCHANGED = "unchanged"  # of a graph the optimizer left as it was: our post-grad passes only


_PIECE: contextvars.ContextVar[Piece | None] = contextvars.ContextVar("optimus_eqsat_ddp_piece", default=None)


def current_piece() -> Piece | None:
    """What the graph compiled now is a piece of, or None outside :func:`piece_mode`."""
    return _PIECE.get()


@contextlib.contextmanager
def piece_mode(piece: Piece) -> Iterator[None]:
    """Mark the graphs DDPOptimizer hands the backend inside this block as pieces of ``piece``."""
    token = _PIECE.set(piece)
    try:
        yield
    finally:
        _PIECE.reset(token)


def piece_count(split_program: Callable) -> int:
    """How many pieces DDPOptimizer cut a graph into, from what its ``compile_fn`` returned (a
    GraphModule calling one compiled submodule per piece, or with one bucket the backend's own
    program)."""
    if not isinstance(split_program, torch.fx.GraphModule):
        return 1
    return sum(1 for node in split_program.graph.nodes if node.op == "call_module")


def sink_input_work(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Move each pure node that reads only parameters (graph inputs Dynamo marks as
    ``nn.Parameter``, through other such nodes) to just before its first user, in place;
    returns ``gm``.

    Our programs build a batched layer's weight stack at the top of the graph. DDPOptimizer
    counts a parameter into the bucket of the node that reads it, walking the graph backwards,
    so stacks at the top would put every parameter into the last piece it cuts: one piece, and
    no all-reduce overlapping the backward. Next to their layers, the stacks close buckets
    between batched layers as the original graph's parameters do between its layers."""
    graph = gm.graph
    parameters = {
        n for n in graph.find_nodes(op="placeholder") if isinstance(n.meta.get("example_value"), torch.nn.Parameter)
    }  # (as DDPOptimizer finds them)
    input_only: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr" or (
            node.op in ("call_function", "call_method")
            and not node.is_impure()
            and node.all_input_nodes
            and all(a in parameters or a in input_only for a in node.all_input_nodes)
        ):
            input_only.add(node)
    order: list[torch.fx.Node] = []
    placed: set[torch.fx.Node] = set()

    def place_with_inputs(node: torch.fx.Node) -> None:
        """Append ``node`` after the input-only nodes it reads that are not placed yet (iterative
        depth-first: chains of parameter work can be long)."""
        stack = [(node, False)]
        while stack:
            current, inputs_done = stack.pop()
            if current in placed:
                continue
            if inputs_done:
                placed.add(current)
                order.append(current)
                continue
            stack.append((current, True))
            stack.extend((a, False) for a in current.all_input_nodes if a in input_only and a not in placed)

    for node in list(graph.nodes):
        if node.op == "placeholder" or node in input_only:
            continue
        if node.op == "output":  # (input-only nodes nothing reads stay, at the end)
            for unread in (n for n in graph.nodes if n in input_only and n not in placed):
                place_with_inputs(unread)
        place_with_inputs(node)
    output = graph.output_node()
    for node in order:
        if node is not output:
            output.prepend(node)
    graph.lint()
    gm.recompile()
    return gm


class WholeGraphCompiler(Protocol):
    """``whole(split, gm, example_inputs, buckets=(first, cap))`` -> compiled program; ``split(gm)``
    compiles ``gm`` cut into DDP's buckets (bytes of the first bucket and of the others), each
    piece by the backend. (The default backend's also takes torch.compile's ``mode`` and
    ``options`` as keywords.)"""

    def __call__(
        self,
        split: Callable[[torch.fx.GraphModule], Callable],
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        /,
        *,
        buckets: tuple[int, int],
    ) -> Callable: ...


def _whole_graph_compiler(backend: Any) -> WholeGraphCompiler | None:
    """``backend``'s whole-graph compiler, looking through the wrappers Dynamo and
    ``torch.compile`` put around a backend (``WrapBackendDebug``, which copies the wrapped
    object's attributes, and ``_TorchCompileWrapper``, which calls ``compiler_fn(gm, inputs,
    **kwargs)`` with the mode and options of a backend named by string)."""
    kwargs: dict[str, Any] = {}
    for _ in range(4):  # (a few layers of wrappers, never a cycle)
        whole = getattr(backend, "whole_ddp_graph", None)
        if whole is not None:
            return functools.partial(whole, **kwargs) if kwargs else whole
        inner = getattr(backend, "compiler_fn", None) or getattr(backend, "_torchdynamo_orig_backend", None)
        if inner is None:
            return None
        if isinstance(getattr(backend, "kwargs", None), dict):
            kwargs = {**backend.kwargs, **kwargs}
        backend = inner
    return None


def install() -> bool:
    """Wrap ``DDPOptimizer.compile_fn`` once (idempotent); False where this torch has no
    DDPOptimizer of the expected shape, in which case the backend sees the pieces alone."""
    try:
        from torch._dynamo.backends.distributed import DDPOptimizer
    except ImportError:
        return False

    def wrap(cut: Callable) -> Callable:
        @functools.wraps(cut)
        def compile_fn(self: Any, gm: torch.fx.GraphModule, example_inputs: list[Any], **configs: Any) -> Callable:
            whole = _whole_graph_compiler(self.backend_compile_fn)
            if whole is None or configs:
                return cut(self, gm, example_inputs, **configs)
            return whole(
                lambda graph: cut(self, graph, example_inputs),
                gm,
                example_inputs,
                buckets=(self.first_bucket_cap, self.bucket_bytes_cap),
            )

        return compile_fn

    return wrap_once(DDPOptimizer, "compile_fn", wrap)
