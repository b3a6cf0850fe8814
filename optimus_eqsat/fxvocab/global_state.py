"""Regions of a graph that run under another grad mode or autocast state.

Dynamo keeps a ``with torch.no_grad():`` or ``with torch.autocast(...):`` inside a forward as
state-changing nodes around the region (``torch._C._set_grad_enabled(False)`` ...
``_set_grad_enabled(True)``; ``_enter_autocast(device, dtype, enabled, cache)`` ...
``_exit_autocast(ctx)``); the ops between them read that state when they run. The e-graph has
no notion of it: a batch of linears from both sides of the boundary would compute the
no-grad members with gradients (their parameters then train) or the full-precision members
in bfloat16, and a rebuilt node may land on the other side of a boundary. So a graph whose
regions change the state is declined (its pieces after AOTAutograd, where the state is
folded into the ops, are still optimized by the post-grad passes). Autocast and no-grad
regions are the exceptions the optimizer makes: it writes the casts they make into the graph
(``optimus_eqsat.autocast_casts``), or a no-grad region's reads as detaches
(``optimus_eqsat.no_grad_regions``), and drops them. A region turning grad mode on, and
inference mode, still decline.

A region that sets the state already in force is no change and does not decline: Hugging
Face's rotary embeddings run under ``torch.autocast(enabled=False)``, a no-op unless the
caller enabled autocast. Neither is a no-grad region none of whose ops reads a value that
needs a gradient (the same rotary embedding is a ``@torch.no_grad()`` method); the optimized
graph is walked again, and a rebuilt op that landed in such a region reading one sends the
optimizer back to the original. The state in force at the start is the one Dynamo traced the graph
under and guards on (its tracing context's), else the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx

from optimus_eqsat.fxvocab.meta import STATE_SWITCHES, fetch_attr, meta_value
from optimus_eqsat.fxvocab.names import target_name
from optimus_eqsat.fxvocab.symbolic import DeclinedGraph

_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class _State:
    grad: bool
    autocast: tuple[tuple[str, bool, Any], ...]  # (device, enabled, dtype) per device

    @classmethod
    def current(cls) -> _State:
        """The state the graph runs under: Dynamo's (the state it traced under and guards on,
        which a compile step may have changed since: Inductor's passes run with autocast off),
        else the caller's."""
        context = torch._guards.TracingContext.try_get()
        saved = context.global_context.global_state if context is not None else {}

        def value(key: str, now: Any) -> Any:
            return saved[key][1] if key in saved else now

        return cls(
            bool(value("grad_enabled", torch.is_grad_enabled())),
            (
                (
                    "cpu",
                    bool(value("autocast_cpu_enabled", torch.is_autocast_enabled("cpu"))),
                    value("autocast_cpu_dtype", torch.get_autocast_dtype("cpu")),
                ),
                (
                    "cuda",
                    bool(value("autocast_enabled", torch.is_autocast_enabled("cuda"))),
                    value("autocast_gpu_dtype", torch.get_autocast_dtype("cuda")),
                ),
            ),
        )

    def autocast_of(self, device: str) -> tuple[bool, Any]:
        for d, enabled, dtype in self.autocast:
            if d == device:
                return enabled, dtype
        return False, None

    def with_autocast(self, device: str, enabled: bool, dtype: Any) -> _State:
        others = tuple(entry for entry in self.autocast if entry[0] != device)
        return replace(self, autocast=(*others, (device, enabled, dtype)))


def traced_state() -> tuple[Any, ...]:
    """The grad mode and every device's autocast state (enabled, dtype) the graph being compiled
    runs under, as a plain tuple (a cache key's part: the same graph optimizes differently,
    and may decline, under another state)."""
    state = _State.current()
    return (state.grad, tuple((d, enabled, str(dtype)) for d, enabled, dtype in state.autocast))


def is_switch(node: torch.fx.Node, *names: str) -> bool:
    """Whether ``node`` calls one of the state switches ``names`` (``_set_grad_enabled``, ...)."""
    return node.op == "call_function" and target_name(node.target) in names


def switch_arg(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    """Argument ``index`` (keyword ``name``) of a state switch's call (``_set_grad_enabled``,
    ``_enter_autocast``), ``default`` where the call leaves it out."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def state_changes(
    gm: torch.fx.GraphModule, grad: bool = True, autocast: bool = True, no_grad: bool = True
) -> list[str]:
    """The nodes of ``gm`` that change the grad mode (``no_grad``: turned off, ``grad``: turned
    on or inference mode) or an autocast state in force (``autocast``) from the state the graph
    runs under on, each as ``"name: what"``; the bodies of higher-order ops (a checkpointed
    function's, which the optimizer inlines) are walked where they are called.

    Grad mode turned off counts only where an op inside the region reads a value that needs a
    gradient: without one, the region computes what it would with grad mode on (Hugging Face's
    ``@torch.no_grad()`` rotary embedding reads position ids and a buffer). Whether a value
    needs a gradient is read off the inputs (a placeholder's meta value or a parameter; an
    input of unknown kind counts as needing one) and carried through the ops."""
    kinds = {kind for kind, wanted in (("grad", grad), ("autocast", autocast), ("no_grad", no_grad)) if wanted}
    return [change for kind, change in state_changes_by_kind(gm) if kind in kinds]


def state_changes_by_kind(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """:func:`state_changes` of every kind, in the graph's order, each as ``(kind, change)``:
    ``"no_grad"``, ``"grad"`` or ``"autocast"`` (one walk, for a caller that treats each kind
    its own way)."""
    changes: list[tuple[str, str]] = []
    _walk(gm, gm.graph, _State.current(), changes, {})
    return changes


def _needs_grad_at_input(root: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    value = _input_value(root, node)
    if value is _UNKNOWN:
        return True  # (as if it needed one)
    return isinstance(value, torch.Tensor) and value.requires_grad


_UNKNOWN = object()


def _input_value(root: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    """What a graph input holds: a ``get_attr``'s attribute of ``root``, a placeholder's meta
    value; :data:`_UNKNOWN` where neither says."""
    if node.op == "get_attr":
        try:
            return fetch_attr(root, str(node.target))
        except AttributeError:
            return _UNKNOWN
    value = meta_value(node)
    return _UNKNOWN if value is None else value


def _walk(
    root: torch.fx.GraphModule,
    graph: torch.fx.Graph,
    state: _State,
    changes: list[tuple[str, str]],
    needs_grad: dict[torch.fx.Node, bool],
) -> None:
    saved: list[_State] = []
    grad_at_start = state.grad
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            needs_grad[node] = _needs_grad_at_input(root, node)
            continue
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        reads_grad = any(needs_grad.get(a, False) for a in node.all_input_nodes)
        if node.op == "call_module":
            try:
                params = list(root.get_submodule(str(node.target)).parameters())
            except AttributeError:
                params = []
                reads_grad = True
            reads_grad = reads_grad or any(p.requires_grad for p in params)
        name = target_name(node.target) if node.op != "call_module" else ""
        needs_grad[node] = state.grad and reads_grad and name != "detach"
        if grad_at_start and not state.grad and reads_grad and name not in STATE_SWITCHES:
            changes.append(("no_grad", f"{node.name}: reads a value that needs a gradient with grad mode off"))
        if node.op != "call_function":
            continue
        for arg in node.args:
            body = _body(root, arg)
            if body is not None:
                _walk(root, body.graph, state, changes, {})
        if name == "_set_grad_enabled":
            enabled = bool(switch_arg(node, 0, "mode", True))
            if enabled and not state.grad and not grad_at_start:
                changes.append(("grad", f"{node.name}: grad mode on"))
            state = replace(state, grad=enabled)
        elif name in ("_enter_autocast", "_enter_inference_mode"):
            saved.append(state)
            if name == "_enter_inference_mode":
                if switch_arg(node, 0, "mode", True):
                    changes.append(("grad", f"{node.name}: inference mode"))
                continue
            device = str(switch_arg(node, 0, "device_type", "cuda"))
            enabled = bool(switch_arg(node, 2, "enabled", True))
            dtype = switch_arg(node, 1, "dtype", None)
            if enabled and dtype is None:
                dtype = torch.get_autocast_dtype(device) if device in _DEVICES else None
            before = state.autocast_of(device)
            if enabled != before[0] or (enabled and dtype != before[1]):
                what = f"autocast {device} {'on, ' + str(dtype) if enabled else 'off'}"
                changes.append(("autocast", f"{node.name}: {what}"))
            state = state.with_autocast(device, enabled, dtype)
        elif name in ("_exit_autocast", "_exit_inference_mode") and saved:
            state = saved.pop()


def _body(root: torch.fx.GraphModule, arg: Any) -> torch.fx.GraphModule | None:
    """The graph module a higher-order op's argument names (``get_attr`` of a submodule), if any."""
    if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
        return None
    try:
        body = root.get_submodule(str(arg.target))
    except AttributeError:
        return None
    return body if isinstance(body, torch.fx.GraphModule) else None


def ambient_autocast(gm: torch.fx.GraphModule) -> list[tuple[str, torch.dtype]]:
    """The autocast states in force, ``(device, dtype)`` each, that decide when ``gm`` runs the
    precision of its torch-level ops (a linear, a ``call_method``): for the devices of its
    tensors (every device when their meta does not say). An aten graph's ops are not cast when
    they run (AOTAutograd wrote the casts into it), so it has none."""
    if not any(_cast_when_run(node) for node in gm.graph.nodes):
        return []
    devices = {
        value.device.type
        for node in gm.graph.nodes
        if node.op in ("placeholder", "get_attr") and isinstance(value := _input_value(gm, node), torch.Tensor)
    }
    return [
        (device, dtype)
        for device, enabled, dtype in _State.current().autocast
        if enabled and (not devices or device in devices)
    ]


def _cast_when_run(node: torch.fx.Node) -> bool:
    """Whether autocast may change what ``node`` computes when it runs: a module or method call,
    or a function other than an operator of torch's dispatcher or Python's own."""
    if node.op in ("call_module", "call_method"):
        return True
    if node.op != "call_function":
        return False
    if isinstance(node.target, torch._ops.OperatorBase):
        return False
    return getattr(node.target, "__module__", None) not in ("_operator", "operator", "builtins", "math")


def decline_state_changes(changes: Sequence[str]) -> None:
    """Raise :class:`DeclinedGraph` when ``changes`` (of :func:`state_changes`) holds any: a
    region runs under another state than the rest (see the module docstring). (The optimizer
    passes only grad mode turned on and inference mode: it writes autocast's casts into the
    graph, for the autocast in force and for its regions alike, ``optimus_eqsat.autocast_casts``,
    and a no-grad region's reads as detaches, ``optimus_eqsat.no_grad_regions``.)"""
    if changes:
        raise DeclinedGraph(
            f"grad-mode or autocast regions in the graph ({'; '.join(changes[:4])}): ops on both sides "
            "of them cannot be batched or moved; left as it is"
        )
