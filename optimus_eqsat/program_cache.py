"""What survives a restart: the optimizer's program for a graph, and the measured choice's
decision, on disk (:mod:`.disk_cache`).

A program is keyed by the graph's code and attributes, its inputs' shapes, strides, dtypes
and devices, the options, the global modes it depends on (grad mode, Inductor's freezing and
``fallback_random``) and the package's code fingerprint. Graphs with symbolic sizes are not
cached. The stored program is the result graph without its fake-tensor meta (pickled), the
rest of each node's meta, and, for values the result shares with the input graph, which
input node they came from: restored, the program is the same graph over the same
parameters with the same meta the optimizer would have given it.

A decision (which program the backend's first call kept) is keyed by the program's key,
the backend's own options and the machine (CPU model and threads, or the GPU's name).
"""

from __future__ import annotations

import copy
import logging
import operator
import pickle
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.fx

from optimus_eqsat.disk_cache import DiskCache, cache_enabled, cache_root, code_fingerprint, digest
from optimus_eqsat.fx_graphs import carry_dynamo_attributes, copy_module
from optimus_eqsat.fxvocab.global_state import traced_state
from optimus_eqsat.fxvocab.symbolic import symbolic_value
from optimus_eqsat.report import OptimizeReport

log = logging.getLogger("optimus_eqsat")

PROGRAMS = DiskCache("programs")
DECISIONS = DiskCache("decisions")

# Meta holding fake tensors: never pickled; linked to the input graph's node or recomputed.
_FAKE_META = ("val", "example_value")


@dataclass
class StoredProgram:
    """A result of :func:`~optimus_eqsat.optimize_graph` as stored on disk."""

    report: OptimizeReport
    kept_original: bool  # the result is the input graph (a fallback by the cost model)
    nodes: bytes = b""  # the result's nodes, pickled (_pickled_nodes)
    attributes: dict[str, str] = field(default_factory=dict)  # result target -> input graph's name
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> picklable meta
    links: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)  # node -> key -> (input node, key)
    wants_meta: bool = False  # fake-tensor meta propagated over the result


def program_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, options: Any) -> str | None:
    """The key of ``gm``'s program under ``options`` (an ``OptimizeOptions``), or None when the
    cache is off or the graph cannot be keyed (symbolic sizes, inputs of unknown kinds); never raises."""
    if not (options.persistent_cache and cache_enabled()):
        return None
    try:
        return _program_key(gm, example_inputs, options)
    except _NotKeyable as exc:
        log.debug("optimus_eqsat: not cached: %s", exc)
        return None
    except Exception as exc:  # the cache is an aid: never a reason to fail
        log.info("optimus_eqsat: not cached (%s: %s)", type(exc).__name__, exc)
        return None


class _NotKeyable(Exception):
    pass


def _program_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, options: Any) -> str:
    from torch._inductor import config as inductor_config

    inputs = [_value_signature(x) for x in example_inputs] if example_inputs is not None else None
    placeholders = [
        _value_signature(n.meta.get("val", n.meta.get("example_value")))
        for n in gm.graph.nodes
        if n.op == "placeholder"
    ]
    tensors = [
        (name, _value_signature(t))
        for name, t in [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]
    ]
    constants = sorted((name, _value_signature(v)) for name, v in gm.__dict__.items() if isinstance(v, torch.Tensor))
    # (a module's repr leaves out its training flag, which a call_module batch norm or dropout reads)
    modules = [
        (name, type(m).__qualname__, m.training, m.code if isinstance(m, torch.fx.GraphModule) else repr(m))
        for name, m in gm.named_modules()
    ]
    option_values = [(f.name, getattr(options, f.name)) for f in fields(options) if f.name != "persistent_cache"]
    rule_files = [open(path, "rb").read() for path in options.rule_files]
    modes = (
        traced_state(),  # grad mode and autocast per device (a region inside may change it)
        bool(inductor_config.freezing),
        bool(inductor_config.fallback_random),
    )
    return digest(
        code_fingerprint(),
        gm.code,
        inputs,
        placeholders,
        tensors,
        constants,
        modules,
        option_values,
        rule_files,
        modes,
        _device_profiles(),
    )


def _device_profiles() -> tuple[Any, ...]:
    """What the cost model's "auto" profile reads besides the inputs' device: the CPU threads
    and the user's calibrated profiles (``optimus-eqsat calibrate`` writes them next to this
    cache), by name, size and modification time."""
    folder = cache_root() / "profiles"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return torch.get_num_threads(), [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _value_signature(value: Any) -> Any:
    """What of an input the optimizer may depend on (never its values for tensors)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if symbolic_value(value) or isinstance(value, (torch.SymFloat, torch.SymBool)):
        raise _NotKeyable("symbolic sizes")
    if isinstance(value, torch.Tensor):
        return (
            type(value).__name__,
            tuple(value.shape),
            value.stride(),
            value.storage_offset(),
            str(value.dtype),
            str(value.device),
            value.requires_grad,
            isinstance(value, torch.nn.Parameter),
        )
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [_value_signature(v) for v in value]
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    raise _NotKeyable(f"an input of type {type(value).__name__}")


def load_program(
    key: str, gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None
) -> torch.fx.GraphModule | None:
    """The stored result for ``key`` rebuilt over ``gm``'s parameters, its report marked as
    read from the cache; None on a miss or when it cannot be restored (logged)."""
    start = time.perf_counter()
    stored = PROGRAMS.get(key)
    if stored is None:
        return None
    try:
        result = copy_module(gm) if stored.kept_original else _restore(stored, gm, example_inputs)
    except Exception as exc:
        log.info("optimus_eqsat: cached program not restored (%s: %s); optimizing", type(exc).__name__, exc)
        return None
    report = copy.deepcopy(stored.report)
    report.from_cache = True
    report.phase_seconds = {"cache": time.perf_counter() - start}
    result.meta["optimus_eqsat"] = report
    return result


def store_program(
    key: str, gm: torch.fx.GraphModule, result: torch.fx.GraphModule, report: OptimizeReport, wants_meta: bool
) -> bool:
    """Store ``result`` (of optimizing ``gm``) under ``key``; not a fallback for an error. A run
    the time limit cut is stored: a restart then compiles the same program without
    optimizing again (``optimus-eqsat cache --clear`` lets a later run try for more)."""
    if report.fell_back and not _decided_by_the_model(report):
        return False
    try:
        stored = StoredProgram(report=replace(report, measured=None), kept_original=report.fell_back)
        if not report.fell_back:
            _describe(stored, gm, result, wants_meta)
    except Exception as exc:
        log.info("optimus_eqsat: program not cached (%s: %s)", type(exc).__name__, exc)
        return False
    return PROGRAMS.put(key, stored)


def _decided_by_the_model(report: OptimizeReport) -> bool:
    """Whether a fallback is the cost model's verdict (predicted slower or too small a gain),
    a declined graph or a time limit: not an error."""
    reason = report.fallback_reason or ""
    return reason.startswith(("predicted", "declined", "time limit"))


def _describe(stored: StoredProgram, gm: torch.fx.GraphModule, result: torch.fx.GraphModule, wants_meta: bool) -> None:
    """Fill ``stored`` with ``result``'s graph, attributes and meta (raises when an attribute
    of the result is not one of ``gm``'s: it could not be restored)."""
    names_in_input = _attribute_names(gm)
    for node in result.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            obj = operator.attrgetter(node.target)(result)
            if id(obj) not in names_in_input:
                raise ValueError(f"attribute {node.target} is not the input graph's")
            stored.attributes[node.target] = names_in_input[id(obj)]
    fakes = {id(v): (n.name, k) for n in gm.graph.nodes for k, v in n.meta.items() if k in _FAKE_META}
    for node in result.graph.nodes:
        kept, links = {}, {}
        for k, v in node.meta.items():
            if id(v) in fakes:
                links[k] = fakes[id(v)]
            elif k not in _FAKE_META and _picklable(v):
                kept[k] = v
        stored.meta[node.name], stored.links[node.name] = kept, links
    stored.nodes = _pickled_nodes(result.graph)
    stored.wants_meta = wants_meta


class _NodeRef:
    """A node named in another node's arguments, as pickled."""

    def __init__(self, name: str):
        self.name = name


class _FunctionRef:
    """A function pickle cannot name (``F.max_pool2d`` is a local of torch's
    ``boolean_dispatch``), by the module and name it is reachable at."""

    def __init__(self, target: Any):
        self.module, self.name = target.__module__, target.__name__

    def resolve(self) -> Any:
        import importlib

        return getattr(importlib.import_module(self.module), self.name)


class _OpRef(_FunctionRef):
    """An operator of ``torch.ops`` (``aten.mm.default``, ``aten.mm``), by namespace, name and
    overload: pickle cannot name one (a post-grad graph is made of them)."""

    def __init__(self, target: torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        self.parts: tuple[str, ...]
        if isinstance(target, torch._ops.OpOverload):
            self.parts = (target.namespace, target._opname, target._overloadname)
        else:
            namespace, name = target._qualified_op_name.split("::")
            self.parts = (namespace, name)

    def resolve(self) -> Any:
        return operator.attrgetter(".".join(self.parts))(torch.ops)


def _picklable_target(target: Any) -> Any:
    """``target``, or a :class:`_FunctionRef` to it when pickle cannot name it but its module
    attribute of that name is the very function (an :class:`_OpRef` for ``torch.ops``'s)."""
    if _picklable(target):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        op = _OpRef(target)
        if op.resolve() is not target:
            raise ValueError(f"target {target!r} cannot be named")
        return op
    ref = _FunctionRef(target)
    if ref.resolve() is not target:
        raise ValueError(f"target {target!r} cannot be named")
    return ref


def _pickled_nodes(graph: torch.fx.Graph) -> bytes:
    """The graph as a flat list (pickling a Graph recurses along its linked list of nodes and
    overflows the stack at a few hundred nodes) with its code generator."""

    def ref(node: torch.fx.Node) -> Any:
        return _NodeRef(node.name)

    rows = [
        (
            n.op,
            n.name,
            _picklable_target(n.target) if n.op == "call_function" else n.target,
            torch.fx.node.map_arg(n.args, ref),
            torch.fx.node.map_arg(n.kwargs, ref),
            n.type,
        )
        for n in graph.nodes
    ]
    return pickle.dumps((rows, graph._codegen), protocol=pickle.HIGHEST_PROTOCOL)


def _unpickled_graph(data: bytes) -> torch.fx.Graph:
    rows, codegen = pickle.loads(data)
    graph, made = torch.fx.Graph(), {}  # type: torch.fx.Graph, dict[str, torch.fx.Node]

    def node(arg: Any) -> Any:
        return made[arg.name] if isinstance(arg, _NodeRef) else arg

    for op, name, target, args, kwargs, type_ in rows:
        target = target.resolve() if isinstance(target, _FunctionRef) else target
        args = torch.fx.node.map_aggregate(args, node)
        kwargs = torch.fx.node.map_aggregate(kwargs, node)
        made[name] = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_)
        if made[name].name != name:
            raise ValueError(f"node {name} restored as {made[name].name}")
    graph._codegen = codegen
    return graph


def _restore(
    stored: StoredProgram, gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None
) -> torch.fx.GraphModule:
    from optimus_eqsat.rebuild import propagate_meta

    graph = _unpickled_graph(stored.nodes)
    inputs = {n.name: n for n in gm.graph.nodes}
    for node in graph.nodes:
        node.meta = dict(stored.meta.get(node.name, {}))
        for k, (name, key) in stored.links.get(node.name, {}).items():
            node.meta[k] = inputs[name].meta[key]
    root = {target: operator.attrgetter(name)(gm) for target, name in stored.attributes.items()}
    result = torch.fx.GraphModule(root, graph, class_name=type(gm).__name__)
    carry_dynamo_attributes(gm, result)
    if stored.wants_meta:
        propagate_meta(result, example_inputs)
    return result


def _attribute_names(gm: torch.fx.GraphModule) -> dict[int, str]:
    """id -> qualified name of every module, parameter, buffer and tensor attribute of ``gm``."""
    names: dict[int, str] = {}
    for prefix, module in gm.named_modules(remove_duplicate=False):
        names.setdefault(id(module), prefix)
        for name, value in module.__dict__.items():
            if isinstance(value, torch.Tensor):
                names.setdefault(id(value), f"{prefix}.{name}" if prefix else name)
        for name, value in [*module._parameters.items(), *module._buffers.items()]:
            if value is not None:
                names.setdefault(id(value), f"{prefix}.{name}" if prefix else name)
    return names


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


def decision_key(program: str | None, backend_options: Any, example_inputs: Sequence[Any]) -> str | None:
    """The key of the measured choice for a program key under the backend's options, on this
    machine (the device of the inputs), or None without a program key."""
    if program is None:
        return None
    devices = sorted({x.device.type for x in example_inputs if isinstance(x, torch.Tensor)})
    machine = [platform.machine(), platform.processor(), torch.get_num_threads()]
    if "cuda" in devices and torch.cuda.is_available():
        machine.append(torch.cuda.get_device_name())
    return digest(program, backend_options, devices, machine)


@dataclass
class StoredDecision:
    """Which program a measured first call kept, and what it measured."""

    kept: str  # "optimized", "original" or "masked"
    measured: Any  # the guard.GuardResult


def load_decision(key: str | None) -> StoredDecision | None:
    """The decision stored under ``key``; its measurement says it was made by an earlier run and
    holds none of that run's compile or timing seconds (this process spent none of them)."""
    stored = DECISIONS.get(key) if key is not None else None
    if stored is None:
        return None
    earlier = replace(
        stored.measured,
        compile_s={},
        first_step_s={},
        timing_s=0.0,
        reason=f"{stored.measured.reason}; an earlier run's measurement, cached",
    )
    return StoredDecision(stored.kept, earlier)


def store_decision(key: str | None, measured: Any) -> None:
    """Store a decision (a ``guard.GuardResult``) under ``key``: a timed one, or one that needed
    no timing because no pass rewrote the program. The latter matters most: in a restarted
    process Inductor's caches serve the program without running our passes, so the backend
    cannot see that they left it alone and would time it against a fresh compile of the
    original (ResNet-18 training: 67 s warm against Inductor's 5 s). Not stored: a choice
    that could not time here (collectives, fake tensors), which a later call may time."""
    if key is None or measured is None:
        return
    from optimus_eqsat.guard import NOTHING_TO_TIME

    if measured.rounds or measured.reason.startswith(NOTHING_TO_TIME):
        DECISIONS.put(key, StoredDecision(measured.kept, measured))
