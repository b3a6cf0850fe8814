"""Autocast's casts written into a torch-level graph, so the graph can be rewritten.

Under ``torch.autocast`` in force around a compiled model, each torch-level op of Dynamo's
graph is cast by what it is as it runs: a linear casts its input, weight and bias to bfloat16,
a ``cat`` of a bfloat16 and a float32 tensor casts the first to float32, an add casts nothing.
The e-graph knows none of this: its equalities hold for ops that compute in the dtypes of
their inputs, so a rewrite can change what precision a value is computed in (a batched linear
built as a matmul plus a separate add of a float32 bias promotes to float32 where the linear
gave bfloat16).

:func:`with_explicit_casts` makes each of those casts a node of its own (``x.to(dtype)``,
the ``_to_copy`` autocast would make) in front of the op that makes it. After that no op of the
graph is cast when it runs (autocast leaves an op alone whose inputs already have the dtype it
wants), so the graph computes under autocast exactly what it computes without, and the
e-graph's equalities hold for it. Whether autocast would cast something is not read off a
table of its op lists (they differ by device and release): each op is run once on fake
tensors under the autocast in force and once without, and the ``_to_copy`` calls of its
inputs that only the first makes are the casts. :func:`autocast_casts_in` asks the same of a
rebuilt graph: a rewrite that introduced an op autocast would cast (a ``sum`` on CUDA under
float16) shows there, and the optimizer keeps the original.

A region of the graph under its own autocast state (``with torch.autocast(...)`` inside a
compiled training step, Dynamo's ``_enter_autocast`` ... ``_exit_autocast`` nodes) is read the
same way, each op under the state of the region it sits in; its casts written out, the region
changes nothing and is dropped, so its ops batch with one another (and with the graph's other
ops of the same dtypes). A region that turns autocast off inside autocast in force cannot be
dropped as such (its float32 ops would be cast then): the graph rebuilt from such a copy runs
as a whole in a region turning the autocast in force off (:func:`without_autocast`), which
changes nothing for it, all its casts written out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

from optimus_eqsat.checkpoint_regions import inline_checkpoints, region_tags
from optimus_eqsat.fx_graphs import copy_module
from optimus_eqsat.fxvocab import fetch_attr, meta_value
from optimus_eqsat.fxvocab.global_state import is_switch, switch_arg
from optimus_eqsat.fxvocab.symbolic import DeclinedGraph
from optimus_eqsat.rebuild import propagate_meta

__all__ = ["ExplicitCasts", "autocast_casts_in", "autocast_off", "with_explicit_casts", "without_autocast"]

#: (device type, dtype) of each autocast in force
AutocastStates = Sequence[tuple[str, torch.dtype]]


class _CastRecorder(TorchDispatchMode):
    """Records every ``_to_copy`` to another dtype: (id of the tensor cast, dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: list[tuple[int, torch.dtype]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") is not None:
            self.casts.append((id(args[0]), kwargs["dtype"]))
        return func(*args, **kwargs)


_ENTER, _EXIT = "_enter_autocast", "_exit_autocast"


class _Simulator:
    """Runs a graph's nodes in order on static fake tensors (the inputs' from their meta, every
    other value its own op's result under autocast, so a graph whose meta was made without
    autocast is still read right), and tells for each op what autocast casts: the autocast in
    force around the graph, or the one of the graph's own region the op sits in (between an
    ``_enter_autocast`` node and its ``_exit_autocast``)."""

    def __init__(self, root: torch.fx.GraphModule, states: AutocastStates):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.root = root
        self.state: dict[str, torch.dtype | None] = dict(states)  # device -> dtype (None: off)
        self.devices = set(self.state) | {
            str(switch_arg(node, 0, "device_type", "cuda")) for node in root.graph.nodes if is_switch(node, _ENTER)
        }
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.values: dict[torch.fx.Node, Any] = {}

    def casts(self) -> Iterator[tuple[torch.fx.Node, dict[torch.fx.Node, torch.dtype]]]:
        """Every op of the graph, in order, with the input nodes autocast casts when it runs
        (and the dtype each is cast to). Raises :class:`_Unknown` where it cannot tell."""
        outer: list[dict[str, torch.dtype | None]] = []  # the states the open regions replaced
        for node in list(self.root.graph.nodes):
            if is_switch(node, _ENTER):
                outer.append(dict(self.state))
                device = str(switch_arg(node, 0, "device_type", "cuda"))
                enabled = bool(switch_arg(node, 2, "enabled", True))
                dtype = switch_arg(node, 1, "dtype", None) or self.state.get(device) or torch.get_autocast_dtype(device)
                self.state[device] = dtype if enabled else None
            elif is_switch(node, _EXIT):
                if not outer:
                    raise _Unknown(f"{node.name} closes an autocast region the graph does not open")
                self.state = outer.pop()
            elif is_switch(node, "_set_grad_enabled"):
                continue  # (grad mode changes no dtype; run, it would switch the caller's)
            elif node.op == "placeholder":
                value = meta_value(node)
                if value is None:
                    raise _Unknown(f"input {node.name} has no value in the graph's meta")
                self.values[node] = self._fake(value)
            elif node.op == "get_attr":
                self.values[node] = self._fake(fetch_attr(self.root, str(node.target)))
            elif node.op == "call_module":
                raise _Unknown(f"{node.name} calls a module")
            elif node.op in ("call_function", "call_method"):
                yield node, self._node_casts(node)
        if outer:
            raise _Unknown("an autocast region does not close in the graph")

    def _fake(self, value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return type(value)(self._fake(v) for v in value)
        if not isinstance(value, torch.Tensor):
            return value
        if not all(isinstance(s, int) for s in (*value.shape, *value.stride())):
            raise _Unknown("a symbolic size")
        with self.mode:
            return torch.empty_strided(
                tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device=value.device
            )

    def _node_casts(self, node: torch.fx.Node) -> dict[torch.fx.Node, torch.dtype]:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), self.values.__getitem__)
        try:  # the casts the op makes of itself (a ``to``), which autocast's are not
            plain, off = self._run(node, args, kwargs, {})
        except _Unknown:  # (an op autocast makes run: a linear of a bf16 input and float32 weight)
            plain, off = _FAILED, []
        self.values[node], on = self._run(node, args, kwargs, self.state)
        made = [cast for cast in on if cast not in off]
        by_id = {id(self.values[n]): n for n in node.all_input_nodes}
        casts: dict[torch.fx.Node, torch.dtype] = {}
        for tensor, dtype in made:
            if tensor not in by_id:
                raise _Unknown(f"{node.name} casts a value of its own to {dtype}")
            if casts.setdefault(by_id[tensor], dtype) != dtype:
                raise _Unknown(f"{node.name} casts {by_id[tensor].name} to two dtypes")
        promoted = plain is not _FAILED and _dtypes(plain) == _dtypes(self.values[node])
        if promoted and all(_widens(self.values[n].dtype, dtype) for n, dtype in casts.items()):
            return {}  # (autocast's "promote": the type promotion the op makes anyway, written out)
        return casts

    def _run(
        self, node: torch.fx.Node, args: Any, kwargs: Any, state: dict[str, torch.dtype | None]
    ) -> tuple[Any, list]:
        """(what ``node`` returns, the casts it makes) under the autocast ``state`` (a device
        it leaves out, or maps to None, runs with autocast off)."""
        recorder = _CastRecorder()
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(self.mode)
                for device in sorted(self.devices):
                    dtype = state.get(device)
                    stack.enter_context(torch.autocast(device, dtype, enabled=dtype is not None, cache_enabled=False))
                stack.enter_context(recorder)
                if node.op == "call_method":
                    result = getattr(args[0], str(node.target))(*args[1:], **kwargs)
                else:
                    result = node.target(*args, **kwargs)  # type: ignore[operator]
        except Exception as exc:
            raise _Unknown(f"{node.name} does not run on fake tensors ({type(exc).__name__})") from exc
        return result, recorder.casts


_FAILED = object()


def _widens(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether a cast from ``source`` to ``target`` is exact (a float to a wider float)."""
    return source.is_floating_point and target.is_floating_point and target.itemsize > source.itemsize


class _Unknown(Exception):
    """What autocast does to a node cannot be told: the message says why."""


def _with_bodies(gm: torch.fx.GraphModule) -> str | None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            return node.name
    return None


@dataclass(frozen=True)
class ExplicitCasts:
    """What :func:`with_explicit_casts` made: ``gm``, a copy computing without autocast what the
    graph computes under the autocast in force; ``needs_autocast_off``: the autocast in force
    would still cast ops of ``gm`` (a region of the graph turned it off for them), so ``gm``,
    and a graph rebuilt from it, must run with it off (:func:`without_autocast`)."""

    gm: torch.fx.GraphModule
    needs_autocast_off: bool


def with_explicit_casts(gm: torch.fx.GraphModule, states: AutocastStates) -> ExplicitCasts:
    """A copy of ``gm`` that computes without autocast what ``gm`` computes under the autocast
    ``states``: each cast autocast makes is a ``to`` node of its own. The casts of the graph's
    own autocast regions (``with torch.autocast(...)`` inside a compiled function) are written
    alike, and the regions dropped. The copy computes the same under ``states`` unless a
    region turned autocast off for some of its ops (``needs_autocast_off``).

    Checkpointed regions are inlined first (their ops tagged to be recomputed, as
    :mod:`optimus_eqsat.checkpoint_regions` does for every graph). Raises :class:`DeclinedGraph`
    when what autocast does cannot be told for every op (a module call, an op that does not run
    on fake tensors, a symbolic size, another higher-order op whose body would run under
    autocast).
    """
    result = copy_module(gm)
    inline_checkpoints(result)  # (the regions' ops, tagged to be recomputed, are the graph's own)
    body = _with_bodies(result)
    if body is not None:
        raise DeclinedGraph(f"autocast in force or in regions, and a higher-order op ({body}): left as it is")
    simulator = _Simulator(result, states)
    try:
        for node, casts in simulator.casts():
            for source, dtype in casts.items():
                _cast_before(result.graph, node, source, dtype)
    except _Unknown as exc:
        raise DeclinedGraph(f"autocast in force or in regions, and what it casts cannot be told: {exc}") from exc
    _drop_autocast_regions(result.graph)
    result.recompile()
    if any(_dtypes(meta_value(n)) != _dtypes(v) for n, v in simulator.values.items()):
        # meta made without this autocast (a graph traced before it was entered): the
        # e-graph reads dtypes off it, so it must say what runs (without autocast: a float32
        # region's ops, its markers dropped, would be cast under it)
        with autocast_off(simulator.devices):
            made = propagate_meta(result)
        if not made:
            raise DeclinedGraph("autocast in force, and the graph's meta, made without it, cannot be made anew")
    # (a region that turned autocast off inside ``states``: without it, its ops would be cast)
    return ExplicitCasts(result, bool(states) and bool(autocast_casts_in(result, states)))


@contextlib.contextmanager
def autocast_off(devices: Iterable[str]) -> Iterator[None]:
    """Autocast turned off on ``devices`` (a graph with its casts written out runs so)."""
    with contextlib.ExitStack() as stack:
        for device in devices:
            stack.enter_context(torch.autocast(device, enabled=False))
        yield


def without_autocast(gm: torch.fx.GraphModule, devices: Sequence[str]) -> None:
    """Wraps the whole of ``gm`` (in place) in a region turning autocast off on ``devices``, so
    that it computes under autocast what it computes without (its casts written out)."""
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op != "placeholder")
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(first):
        enters = [
            graph.call_function(torch.amp.autocast_mode._enter_autocast, (device, None, False, None))
            for device in devices
        ]
    with graph.inserting_before(output):
        for enter in reversed(enters):  # (the region entered last exits first)
            graph.call_function(torch.amp.autocast_mode._exit_autocast, (enter,))
    gm.recompile()


def _drop_autocast_regions(graph: torch.fx.Graph) -> None:
    """Erases the graph's ``_enter_autocast`` / ``_exit_autocast`` nodes (their casts written
    out, the regions change nothing)."""
    for node in [n for n in graph.nodes if is_switch(n, _EXIT)]:
        graph.erase_node(node)
    for node in [n for n in graph.nodes if is_switch(n, _ENTER)]:
        if node.users:  # (the region's context object read by something else than its exit)
            raise DeclinedGraph(f"{node.name}'s autocast context is read by {next(iter(node.users)).name}")
        graph.erase_node(node)


def _dtypes(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return tuple(_dtypes(v) for v in value)
    return value.dtype if isinstance(value, torch.Tensor) else None


def autocast_casts_in(gm: torch.fx.GraphModule, states: AutocastStates) -> list[str]:
    """The casts autocast ``states`` would make when ``gm`` runs, ``"node: input -> dtype"``
    each (empty: ``gm`` computes the same with autocast as without); a graph it cannot tell
    about gives the reason."""
    try:
        return [
            f"{node.name}: {source.name} -> {dtype}"
            for node, casts in _Simulator(gm, states).casts()
            for source, dtype in casts.items()
        ]
    except _Unknown as exc:
        return [str(exc)]


def _cast_before(graph: torch.fx.Graph, node: torch.fx.Node, source: torch.fx.Node, dtype: torch.dtype) -> None:
    """``node`` reads ``source`` cast to ``dtype`` (a new node just before it) where it read
    ``source``."""
    with graph.inserting_before(node):
        cast = graph.call_method("to", (source, dtype))
    cast.meta.update(region_tags(node))  # (recomputed with the op it feeds, in its region)
    value = meta_value(source)
    mode = getattr(value, "fake_mode", None)  # (the value's own: a tracing context may hold another)
    if mode is not None:
        with mode:
            value = value.to(dtype)
        for key in ("val", "example_value"):
            if key in source.meta:
                cast.meta[key] = value
    node.replace_input_with(source, cast)
