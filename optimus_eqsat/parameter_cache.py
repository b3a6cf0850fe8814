"""Stacks of weights built once, in the weights' own storage (inference).

A batched program reads its weights stacked: ``stack([w_1, ..., w_n])`` feeds one
batched matmul. Compiled as it is, that stack copies every weight on every step,
which can cost more than the launches batching saves: the batched program can then
be slower than the original, where with the stacks built once it is faster.
Inductor's ``freezing`` builds them once but then ignores any change of the
weights, and holds them beside the weights. Here the weights move instead:

- :func:`packable_work` finds the stacks and cats (along dim 0) of whole
  parameters, and the views of them, that the graph computes from parameters
  alone;
- :func:`split_parameter_work` cuts the graph there: a *prologue* computing those
  values, and the *main* graph, which takes them as its first inputs;
- :class:`CachedParameterWork` runs the prologue on the first call and *packs*:
  each stacked parameter's data is moved into its slot of the stack
  (``p.data = stack[k]``; values, shapes and strides unchanged). From then on the
  stack is the parameters' storage, so every later write to them, however it is
  made (an optimizer step, ``load_state_dict``, ``p.data.mul_``), is a write to
  the stack: the cached values stay right and no second copy is held. Each call
  only checks that every parameter still lives where it was packed; when one was
  rebound (``p.data = other``), the prologue runs on every call from then on, as
  the uncut program would.

Parameters are packed only when nothing else can be watching their storage: each
owns its whole storage, no two share one, and on a GPU each slot starts 16-byte
aligned (Inductor's Triton code assumes it of parameters it saw aligned; its CPU
code loads unaligned). Parameters that are already packed in that
layout (an earlier compile of the same model) are used where they are. A call
with grad enabled and a parameter requiring grad runs the prologue with autograd.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx as fx

from optimus_eqsat.extract.freezing import outermost, parameter_values
from optimus_eqsat.fxvocab import VIEW_OPS, WHOLE_VIEW_OPS
from optimus_eqsat.fxvocab.names import canonical_name
from optimus_eqsat.guard import resident_bytes
from optimus_eqsat.inductor_compat import dynamo_compile_lock
from optimus_eqsat.translate import written_memory

log = logging.getLogger(__name__)

__all__ = ["CachedParameterWork", "Pack", "ParameterWork", "packable_nodes", "packable_work", "split_parameter_work"]

_ALIGN = 16  # bytes: what Inductor's GPU code assumes of a parameter's data
_DATA_PTR = torch.Tensor.data_ptr


@dataclass
class Pack:
    """A stack or cat along dim 0 whose members are whole parameters (``params``: their
    placeholders), each read as it is or through views that keep its element order."""

    node: fx.Node
    params: list[fx.Node]


@dataclass
class PackableWork:
    """The nodes a cache can compute once and keep right: parameters, packs and views of them."""

    nodes: set[fx.Node]
    packs: list[Pack]


def _dim0(node: fx.Node) -> bool:
    dim: object = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return dim == 0


def _whole_parameter(node: fx.Node, params: set[fx.Node]) -> fx.Node | None:
    """The parameter placeholder ``node`` is, or is an order-keeping view of; else None."""
    while node not in params:
        if node.op not in ("call_function", "call_method") or canonical_name(node) not in WHOLE_VIEW_OPS:
            return None
        if not node.args or not isinstance(node.args[0], fx.Node):
            return None
        node = node.args[0]
    return node


def _packable_params(members: list[fx.Node], values: dict[fx.Node, Any]) -> bool:
    tensors = [values[m] for m in members]
    first = tensors[0]
    align = 1 if first.device.type == "cpu" else _ALIGN
    return len(set(members)) == len(members) and all(
        t.dtype == first.dtype
        and t.device == first.device
        and t.is_contiguous()
        and t.nbytes % align == 0
        and t.nbytes > 0
        for t in tensors
    )


def packable_work(
    gm: fx.GraphModule, example_inputs: Sequence[Any], values: dict[fx.Node, Any] | None = None
) -> PackableWork:
    """The stacks and cats along dim 0 of whole, lifted parameters (placeholders whose example
    is an ``nn.Parameter``), each parameter in one at most, with the parameters and the views
    computed from them alone. ``values``: :func:`parameter_values` of ``gm`` when known."""
    values = parameter_values(gm, example_inputs) if values is None else values
    # Work on memory the graph writes is not cached: a cached value would miss the writes
    # (a parameter updated in place in the forward, a stack the graph then adds into).
    written = written_memory(gm, list(gm.graph.nodes)).tainted
    unsafe = written | {u for n in written for u in n.users}
    values = {n: v for n, v in values.items() if n not in unsafe}
    params = {n for n in values if n.op == "placeholder"}
    nodes: set[fx.Node] = set(params)
    packs: list[Pack] = []
    claimed: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node not in values or node.op not in ("call_function", "call_method"):
            continue
        name = canonical_name(node)
        if name in VIEW_OPS and all(a in nodes for a in node.all_input_nodes):
            nodes.add(node)
        elif name in ("stack", "cat") and _dim0(node) and isinstance(node.args[0], (list, tuple)):
            found = [_whole_parameter(m, params) if isinstance(m, fx.Node) else None for m in node.args[0]]
            members = cast("list[fx.Node]", found)  # (read only once None is not among them)
            if found and None not in found and not claimed & set(members) and _packable_params(members, values):
                claimed.update(members)
                packs.append(Pack(node, members))
                nodes.add(node)
                nodes.update(a for m in node.args[0] for a in _chain(m, params))
    return PackableWork(nodes, packs)


def packable_nodes(gm: fx.GraphModule, example_inputs: Sequence[Any], values: dict[fx.Node, Any]) -> set[fx.Node]:
    """The nodes of :func:`packable_work` (a ``select`` for ``extract.freezing.fold_parameters``)."""
    return packable_work(gm, example_inputs, values).nodes


def _chain(node: fx.Node, params: set[fx.Node]) -> list[fx.Node]:
    """``node`` and the views between it and its parameter."""
    out = []
    while node not in params:
        out.append(node)
        node = cast(fx.Node, node.args[0])  # (a whole view's input)
    return out


@dataclass
class ParameterWork:
    """A graph cut into its packable parameter work (the prologue) and the rest.

    ``prologue`` takes the inputs at ``param_positions`` (in that order) and returns the
    values ``main`` takes first, before all of the original inputs, followed by the
    packs' stacks; ``packs`` gives, per pack, the index of its stack among the prologue's
    outputs and the indices of its members among the prologue's inputs.
    ``example_values``: the values on the example inputs (for compiling ``main``)."""

    prologue: fx.GraphModule
    main: fx.GraphModule
    param_positions: list[int]
    packs: list[tuple[int, list[int]]]
    n_values: int
    example_values: list[torch.Tensor] = field(repr=False)


def split_parameter_work(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> ParameterWork | None:
    """Cut ``gm`` at its packable parameter work (:func:`packable_work`); None when it has no
    pack (nothing to save) or the inputs are fake (nothing to run)."""
    if any(isinstance(x, torch._subclasses.FakeTensor) for x in example_inputs):
        return None
    values = parameter_values(gm, example_inputs)
    work = packable_work(gm, example_inputs, values)
    if not work.packs:
        return None
    needed = outermost({n: values[n] for n in values if n in work.nodes})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    read = {a for n in work.nodes if n.op != "placeholder" for a in n.all_input_nodes}
    param_positions = [k for k, n in enumerate(placeholders) if n in work.nodes and n in read]
    position_of = {placeholders[k]: i for i, k in enumerate(param_positions)}

    # the prologue: parameter placeholders -> the values the rest reads, then the stacks
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for k in param_positions:
        env[placeholders[k]] = graph.placeholder(placeholders[k].name)
        env[placeholders[k]].meta = dict(placeholders[k].meta)
    for node in gm.graph.nodes:
        if node in work.nodes and node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[n] for n in needed) + tuple(env[p.node] for p in work.packs))
    prologue = fx.GraphModule(gm, graph, class_name="ParameterPrologue")
    packs = [(len(needed) + j, [position_of[m] for m in p.params]) for j, p in enumerate(work.packs)]

    # the main graph: the values as new first inputs, the work they replace dead
    main = fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    old_to_new = dict(zip(gm.graph.nodes, main.graph.nodes))
    first = next(iter(main.graph.nodes))
    for k, node in enumerate(needed):
        with main.graph.inserting_before(first):
            value = main.graph.placeholder(f"cached_parameter_work_{k}")
        value.meta = dict(node.meta)
        old_to_new[node].replace_all_uses_with(value)
    # Only the replaced work goes: FX's dead-code elimination would also drop an in-place
    # method call whose result is unused (``x.mul_(y)``), which it does not see as impure.
    replaced = {old_to_new[n] for n in work.nodes if n.op != "placeholder"}
    for node in reversed(list(main.graph.nodes)):
        if node in replaced and not node.users:
            main.graph.erase_node(node)
    main.recompile()
    return ParameterWork(prologue, main, param_positions, packs, len(needed), [values[n] for n in needed])


def static_example_values(values: Sequence[torch.Tensor]) -> list[Any]:
    """The cached values as Inductor should see them: fakes of the tracing fake mode with static
    sizes. Handed over as real tensors, Inductor would fakify them with size symbols that no
    guard source knows (they are not among the tensors Dynamo traced), and a guard on such a
    symbol makes Dynamo fail (an ``IndexError`` in ``produce_guards``)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode()
    if mode is None or mode.shape_env is None:
        return list(values)
    return [mode.from_tensor(v, static_shapes=True) for v in values]


def _adjacent(params: Sequence[torch.Tensor]) -> bool:
    """Whether ``params`` lie one after another in one storage, in order (packed)."""
    storage = params[0].untyped_storage().data_ptr()
    end = params[0].data_ptr()
    for p in params:
        if p.untyped_storage().data_ptr() != storage or p.data_ptr() != end or not p.is_contiguous():
            return False
        end += p.nbytes
    return True


def _owns_storage(p: torch.Tensor) -> bool:
    """Whether ``p`` is the only tensor on its whole storage: nothing else (a tied weight, a
    ``w = p.data`` kept by the user) would stop seeing ``p`` once it moves."""
    storage = p.untyped_storage()
    # c10's count of the storage's users: this tensor and the Python storage object just made
    users = torch._C._storage_Use_Count(storage._cdata)
    return p.is_contiguous() and p.storage_offset() == 0 and storage.nbytes() == p.nbytes and users <= 2


class _PackedPrologue(fx.Interpreter):
    """The prologue, with each pack's stack read where its parameters lie when they are packed
    (a view of their storage) instead of copied."""

    def __init__(self, prologue: fx.GraphModule, packs: list[tuple[int, list[int]]], params: tuple[torch.Tensor, ...]):
        super().__init__(prologue)
        outputs = cast(
            "tuple[fx.Node, ...]", next(n for n in reversed(prologue.graph.nodes) if n.op == "output").args[0]
        )
        self.members = {outputs[index]: [params[i] for i in members] for index, members in packs}

    def run_node(self, n: fx.Node) -> Any:
        group = self.members.get(n)
        if group is None or not _adjacent(group):
            return super().run_node(n)
        items = [self.env[m] for m in cast("Sequence[fx.Node]", n.args[0])]
        if canonical_name(n) == "stack":
            shape = (len(items), *items[0].shape)
        else:
            shape = (sum(t.shape[0] for t in items), *items[0].shape[1:])
        total = sum(p.numel() for p in group)
        return group[0].as_strided((total,), (1,), group[0].storage_offset()).view(shape)


class CachedParameterWork:
    """A compiled main graph behind its prologue, run once with the parameters packed
    (see the module's docstring). Called like the uncut graph's compiled program."""

    def __init__(self, work: ParameterWork, compiled_main: Any):
        self.prologue, self.main = work.prologue, compiled_main
        self.param_positions, self.packs, self.n_values = work.param_positions, work.packs, work.n_values
        self._ptrs: list[int] | None = None  # where each parameter's data was after packing
        self._values: tuple[torch.Tensor, ...] = ()
        self._params: tuple[torch.Tensor, ...] = ()
        self.live = True  # False once a parameter could not stay packed: the prologue runs every call
        self.runs = 0  # prologue runs

    def __call__(self, *args: Any) -> Any:
        params = tuple(args[k] for k in self.param_positions)
        if self.live and not (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            # packed values are views of the parameters' storage: right for as long as each
            # parameter's data is where it was packed
            if list(map(_DATA_PTR, params)) == self._ptrs or self._refresh(params):
                return self.main(*self._values, *args)
        self.runs += 1
        return self.main(*self.prologue(*params)[: self.n_values], *args)

    def _refresh(self, params: tuple[torch.Tensor, ...]) -> bool:
        """Run the prologue (on the first run packing the parameters into their stacks) and
        keep its values; False, and no caching from then on, when a parameter cannot stay
        packed (it moved after packing, or shares its storage)."""
        # inference_mode(False): built under the user's inference_mode, the stacks (the
        # parameters' new storage) would be inference tensors, and the model could not be
        # trained eagerly afterwards
        with torch.inference_mode(False), torch.no_grad():
            if self._ptrs is None and not self._all_packed(params):  # the first run: pack
                with dynamo_compile_lock():  # (a compile in another thread fakeifies them)
                    outs = _PackedPrologue(self.prologue, self.packs, params).run(*params)
                    for index, members in self.packs:
                        group = [params[i] for i in members]
                        if not _adjacent(group) and not self._pack(group, outs[index]):
                            break
            if not self._all_packed(params):
                log.info("optimus_eqsat: a parameter is shared or moved; its stack is built every step")
                self.live = False
                return False
            outs = _PackedPrologue(self.prologue, self.packs, params).run(*params)  # views of their storage
        self._values, self._params = tuple(outs[: self.n_values]), params
        self._ptrs = list(map(_DATA_PTR, params))
        self.runs += 1
        return True

    def _all_packed(self, params: tuple[torch.Tensor, ...]) -> bool:
        return all(_adjacent([params[i] for i in members]) for _, members in self.packs)

    @staticmethod
    def _pack(group: list[torch.Tensor], stacked: torch.Tensor) -> bool:
        """Move each parameter of ``group`` into its slot of ``stacked``; False (nothing moved)
        when one shares its storage or would sit unaligned."""
        if not all(_owns_storage(p) for p in group):
            return False
        flat = stacked.view(-1)
        if not stacked.is_contiguous() or stacked.device.type != "cpu" and flat.data_ptr() % _ALIGN:
            return False
        offset = 0
        for p in group:
            p.data = flat[offset : offset + p.numel()].view(p.shape)
            offset += p.numel()
        return True

    @property
    def held_bytes(self) -> int:
        """Bytes the cached values hold besides the parameters' own storage (0 when packed)."""
        return resident_bytes([*self._values, *self._params]) - resident_bytes(self._params)
