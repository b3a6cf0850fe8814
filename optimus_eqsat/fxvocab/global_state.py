"""Regions of a graph that run under another grad mode or autocast state.

Dynamo keeps a ``with torch.no_grad():`` or ``with torch.autocast(...):`` inside a forward as
state-changing nodes around the region (``torch._C._set_grad_enabled(False)`` ...
``_set_grad_enabled(True)``; ``_enter_autocast(device, dtype, enabled, cache)`` ...
``_exit_autocast(ctx)``); the ops between them read that state when they run. The e-graph has
no notion of it: a batch of linears from both sides of the boundary would compute the
no-grad members with gradients (their parameters then train) or the full-precision members
in bfloat16, and a rebuilt node may land on the other side of a boundary. So a graph whose
regions change the state is declined (its pieces after AOTAutograd, where the state is
folded into the ops, are still optimized by the post-grad passes).

A region that sets the state already in force is no change and does not decline: Hugging
Face's rotary embeddings run under ``torch.autocast(enabled=False)``, a no-op unless the
caller enabled autocast. The state in force at the start is the one Dynamo traced the graph
under and guards on (its tracing context's), else the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx

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


def _arg(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def state_changes(gm: torch.fx.GraphModule) -> list[str]:
    """The nodes of ``gm`` that change the grad mode or an autocast state in force (from the
    state the graph runs under on), each as ``"name: what"``; the bodies of higher-order ops
    (a checkpointed function's, which the optimizer inlines) are walked where they are called."""
    changes: list[str] = []
    _walk(gm, gm.graph, _State.current(), changes)
    return changes


def _walk(root: torch.fx.GraphModule, graph: torch.fx.Graph, state: _State, changes: list[str]) -> None:
    saved: list[_State] = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for arg in node.args:
            body = _body(root, arg)
            if body is not None:
                _walk(root, body.graph, state, changes)
        name = target_name(node.target)
        if name == "_set_grad_enabled":
            enabled = bool(_arg(node, 0, "mode", True))
            if enabled != state.grad:
                changes.append(f"{node.name}: grad mode {'on' if enabled else 'off'}")
            state = replace(state, grad=enabled)
        elif name in ("_enter_autocast", "_enter_inference_mode"):
            saved.append(state)
            if name == "_enter_inference_mode":
                if _arg(node, 0, "mode", True):
                    changes.append(f"{node.name}: inference mode")
                continue
            device = str(_arg(node, 0, "device_type", "cuda"))
            enabled = bool(_arg(node, 2, "enabled", True))
            dtype = _arg(node, 1, "dtype", None)
            if enabled and dtype is None:
                dtype = torch.get_autocast_dtype(device) if device in _DEVICES else None
            before = state.autocast_of(device)
            if enabled != before[0] or (enabled and dtype != before[1]):
                changes.append(f"{node.name}: autocast {device} {'on, ' + str(dtype) if enabled else 'off'}")
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


def decline_state_changes(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`DeclinedGraph` when a region of ``gm`` runs under another grad mode or
    autocast state than the rest (see the module docstring)."""
    changes = state_changes(gm)
    if changes:
        raise DeclinedGraph(
            f"grad-mode or autocast regions in the graph ({'; '.join(changes[:4])}): ops on both sides "
            "of them cannot be batched or moved; left as it is"
        )
