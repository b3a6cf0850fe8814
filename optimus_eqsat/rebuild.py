"""Chosen program -> FX GraphModule, built iteratively (graphs are 100,000 deep).

Placeholders come first, in their original order. Ordered nodes (side effects,
mutation) are copied verbatim, each after the effects it must follow
(``Translation.effect_deps``: earlier effects on the same memory); everything else
is emitted on demand, before its first user, so dead terms vanish. A node that
computes the same e-class as an original node takes that node's name and meta
(same class, same value).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import operator
import re
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.fx
from torch.fx.node import map_aggregate, map_arg

from optimus_eqsat.checkpoint_regions import region_tags
from optimus_eqsat.egraph_export import ClassRef, ExportedEGraph, TermNode
from optimus_eqsat.fx_graphs import carry_dynamo_attributes
from optimus_eqsat.fxvocab import (
    ALIASING_OPS,
    FAST_META_VIEW_FUNCTIONS,
    FAST_META_VIEW_METHODS,
    METADATA_MUTATORS,
    SHAPE_META,
    TensorInfo,
    canonical_name,
    fetch_attr,
    meta_value,
    node_tensor_infos,
    target_name,
)
from optimus_eqsat.fxvocab.meta import module_state_kept
from optimus_eqsat.fxvocab.symbolic import all_concrete, static_tensor, symbolic_value
from optimus_eqsat.node_computations import computation, same_computation
from optimus_eqsat.rebuild_sizes import SizeWriter
from optimus_eqsat.term import CTORS, OP_CTORS
from optimus_eqsat.translate import NodeStatus, Translation

if TYPE_CHECKING:
    from torch.fx.node import Target

log = logging.getLogger(__name__)


class RebuildError(RuntimeError):
    """The chosen program cannot be written as an FX graph (for example, a cycle)."""


class RebuildCycle(RebuildError):
    """The chosen program runs in a cycle: ``classes`` are the e-classes on it, in order. The
    extractors keep their choices acyclic in the e-graph; what an op the e-graph keeps opaque
    reads is not in it, so a cycle through such an op is found here."""

    def __init__(self, message: str, classes: list[int]):
        super().__init__(message)
        self.classes = classes


def _cycle(path: list[tuple[str, int]], back_to: tuple[str, int]) -> RebuildCycle:
    """The cycle the task ``back_to`` closes on ``path`` (the tasks being expanded, in order)."""
    on_cycle = path[path.index(back_to) :]
    return RebuildCycle(f"cycle through {back_to}", [key for kind, key in on_cycle if kind == "class"])


def python_scalar(c: float) -> int | float:
    """The Python scalar to write: whole numbers as ints (integral tensors keep their
    dtype; float tensors compute the same), unless too large for int64."""
    return int(c) if float(c).is_integer() and abs(c) < 2**62 else c


def _name_base(target: Any) -> str:
    """What torch.fx would name a node calling ``target`` (before its numeric suffix)."""
    name = target if isinstance(target, str) else getattr(target, "__name__", type(target).__name__)
    return re.sub(r"\W", "_", name).strip("_") or "node"


class Rebuilder:
    """Writes one extraction result as a new FX graph."""

    def __init__(self, t: Translation, eg: ExportedEGraph, choice: dict[int, int]):
        self.t, self.eg, self.choice = t, eg, choice
        self.graph = torch.fx.Graph()
        self.of_class: dict[int, torch.fx.Node] = {}
        self.of_original: dict[int, torch.fx.Node] = {}
        self.name_of_class: dict[int, int] = {}
        for i, c in sorted(eg.class_of_id.items(), reverse=True):
            if i < len(t.gm.graph.nodes):
                self.name_of_class[c] = i  # earliest original node of each class
        self.region_of_class = _regions_of_classes(t, eg)
        self.ordered = sorted(i for i in t.ordered if i in t.copied)
        self.ordered_set = set(self.ordered)
        self.next_ordered = 0
        self.aliases_input: set[torch.fx.Node] = set()
        # New nodes get names no original node has. Left to torch.fx, a new "add" after a
        # copied "add_5" counts up from 5 past every name already used (a counter the
        # copy lowered): quadratic in the nodes of one op (a wide model has thousands of adds).
        self.taken_names = {n.name for n in t.gm.graph.nodes}
        self.next_suffix: dict[str, int] = {}
        # symbolic sizes (a dynamic batch) are written as run-time values, never the example's
        self.sizes = SizeWriter(t.symbols, lambda n: self.of_original[self.t.index[n]], self._new_node)

    # ---------------------------------------------------------------- driver
    def build(self) -> torch.fx.GraphModule:
        nodes = self.t.nodes
        for i, n in enumerate(nodes):
            if n.op == "placeholder":
                new = self.graph.node_copy(n, lambda a: a)
                self.of_original[i] = new
                self.aliases_input.add(new)
        self._materialize_ordered(len(nodes))
        output = next(n for n in reversed(self.t.gm.graph.nodes) if n.op == "output")
        needed = [self._task_for_original(self.t.index[a]) for a in output.all_input_nodes]
        self._run(needed)
        original_aliases = self._original_input_aliases()

        def out_value(a: torch.fx.Node) -> torch.fx.Node:
            new = self._original_arg(a)
            if new in self.aliases_input and a not in original_aliases:
                new = self.graph.call_method("clone", (new,))  # never return an input where a fresh tensor was
            return new

        new_output = self.graph.output(torch.fx.node.map_arg(output.args[0], out_value))
        new_output.meta = copy.copy(output.meta)
        self.graph._codegen = copy.deepcopy(self.t.gm.graph._codegen)
        if self.region_of_class:
            _tag_region_inputs(self.graph)
        gm = torch.fx.GraphModule(self.t.gm, self.graph, class_name=type(self.t.gm).__name__)
        gm.graph.lint()
        return carry_dynamo_attributes(self.t.gm, gm)

    def _original_input_aliases(self) -> set[torch.fx.Node]:
        aliases: set[torch.fx.Node] = set()
        for n in self.t.gm.graph.nodes:
            if n.op in ("placeholder", "get_attr"):
                aliases.add(n)
            elif canonical_name(n) in ALIASING_OPS and any(a in aliases for a in n.all_input_nodes):
                aliases.add(n)
        return aliases

    def _materialize_ordered(self, upto: int) -> None:
        """Copy ordered nodes with index < upto (each after what it waits for)."""
        while self.next_ordered < len(self.ordered) and self.ordered[self.next_ordered] < upto:
            i = self.ordered[self.next_ordered]
            self.next_ordered += 1
            self._run([("orig", i)])

    # ---------------------------------------------------------------- tasks
    # A task is ("class", c): emit the chosen node of class c; or ("orig", i):
    # copy original node i verbatim. Post-order with an explicit stack.

    def _original_arg(self, a: torch.fx.Node) -> torch.fx.Node:
        """The emitted value of original node ``a`` (already emitted: a dependency)."""
        return self._value(self._task_for_original(self.t.index[a]))

    def _copy_original(self, i: int) -> torch.fx.Node:
        """Original node i copied verbatim, its arguments mapped to emitted values (for a random
        op whose numbers must be eager's, in the memory layout its inputs had)."""
        arg = self._same_layout_arg if i in self.t.layout_sensitive else self._original_arg
        self.of_original[i] = self.graph.node_copy(self.t.nodes[i], arg)
        return self.of_original[i]

    def _same_layout_arg(self, a: torch.fx.Node) -> torch.fx.Node:
        """The emitted value of ``a`` laid out in memory in the order ``a`` was: a random op
        draws its numbers in the memory order of its input (``empty_like`` keeps the order
        of the strides), and an emitted value may be laid out otherwise (a cat of a permute's
        splits is the permute; a permuted view may come back computed contiguously). The
        original graph's own inputs are passed as they are, and so is a value meta says is
        no tensor (a dropout's probability under dynamic shapes is a SymFloat); a value of
        unknown layout (no value in the translation's run) is made contiguous."""
        new = self._original_arg(a)
        i = self.t.index[a]
        if new is self.of_original.get(i) and self.t.nodes[i].op == "placeholder":
            return new
        if node_tensor_infos(a) == []:
            return new
        order = self.t.memory_orders.get(i)
        if order is None or order == list(range(len(order))):
            return self.graph.call_method("contiguous", (new,))
        inverse = [order.index(d) for d in range(len(order))]
        dense = self.graph.call_method("contiguous", (self.graph.call_method("permute", (new, *order)),))
        return self.graph.call_method("permute", (dense, *inverse))

    def _task_for_original(self, i: int) -> tuple[str, int]:
        if self.t.status.get(i) in (NodeStatus.TERM, NodeStatus.LEAF):
            return ("class", self.eg.class_of_id[i])
        return ("orig", i)

    def _value(self, task: tuple[str, int]) -> torch.fx.Node:
        kind, key = task
        return self.of_class[key] if kind == "class" else self.of_original[key]

    def _done(self, task: tuple[str, int]) -> bool:
        kind, key = task
        return key in (self.of_class if kind == "class" else self.of_original)

    def _run(self, tasks: list[tuple[str, int]]) -> None:
        stack = [(task, False) for task in reversed(tasks)]
        # the tasks being expanded: the path from a root to the current one, in order
        active: dict[tuple[str, int], None] = {}
        while stack:
            task, expanded = stack.pop()
            if self._done(task):
                continue
            if expanded:
                active.pop(task, None)
                self._emit(task)
                continue
            if task in active:
                raise _cycle(list(active), task)
            active[task] = None
            stack.append((task, True))
            for dep in self._deps(task):
                if not self._done(dep):
                    if dep in active:
                        raise _cycle(list(active), dep)
                    stack.append((dep, False))

    def _chosen(self, c: int) -> TermNode:
        if c not in self.choice:
            raise RebuildError(f"e-class {c} has no chosen node")
        return self.eg.classes[c][self.choice[c]]

    def _list_members(self, c: int) -> tuple[list[int], int]:
        members = []
        node = self._chosen(c)
        while node.ctor == "TCons":
            head, tail = node.args
            members.append(head.index)
            node = self._chosen(tail.index)
        if node.ctor != "TNil":
            raise RebuildError(f"list ends in {node.ctor}")
        return members, node.args[0]

    def _deps(self, task: tuple[str, int]) -> list[tuple[str, int]]:
        kind, key = task
        if kind == "orig":
            node = self.t.nodes[key]
            if node.op in ("placeholder", "get_attr"):
                return []
            deps = [self._task_for_original(self.t.index[a]) for a in node.all_input_nodes]
            if key in self.ordered_set:  # earlier effects on the same memory first
                deps += [("orig", d) for d in self.t.effect_deps.get(key, ()) if d in self.ordered_set]
            return deps
        term = self._chosen(key)
        if term.ctor == "Leaf":
            return [] if term.args[0] in self.t.param_leaves else [("orig", term.args[0])]
        if term.ctor == "Cat":
            members, dim = self._list_members(term.args[0].index)
            stacked = self._stacked(members, dim)
            return [("class", m) for m in (stacked[0] if stacked else members)]
        return [("class", ch) for ch in term.children]

    def _stacked(self, members: list[int], dim: int) -> tuple[list[int], tuple[int, ...] | None] | None:
        """The classes a cat's members reshape, when the cat is a stack of them: every
        member is chosen as a reshape that inserts a unit dim at ``dim`` or, at dim 0,
        any reshape to one shape with a leading 1; with the shape the stack is then
        reshaped to (None: none needed). Emitted as one ``torch.stack``: a stack of
        2,000 parameters is one node, not 2,000 reshapes and a cat."""
        inner, shapes = [], set()
        for m in members:
            node = self._chosen(m)
            if node.ctor != "Reshape" or node.args[0].index not in self.eg.shapes:
                return None
            inner.append(node.args[0].index)
            shapes.add((tuple(node.args[1]), self.eg.shapes[node.args[0].index]))
        if len(shapes) != 1:
            return None  # torch.stack needs one shape
        ((target, source),) = shapes
        if target == source[:dim] + (1,) + source[dim:]:
            return inner, None
        if dim == 0 and target[:1] == (1,):
            return inner, (len(inner), *target[1:])
        return None

    # ---------------------------------------------------------------- emission
    def _emit(self, task: tuple[str, int]) -> None:
        kind, key = task
        if kind == "orig":
            self._copy_original(key)
            return
        new = self._emit_term(self._chosen(key))
        if new.op not in ("placeholder",) and key in self.name_of_class and not new.meta:
            original = self.t.nodes[self.name_of_class[key]]
            if new.op != "get_attr":
                new._rename(original.name)
            new.meta = copy.copy(original.meta)
        if key in self.region_of_class and not region_tags(new):  # a batch of checkpointed members
            new.meta.update(self.region_of_class[key])
        if key in self.eg.shapes and not any(k in new.meta for k in ("val", "example_value", "tensor_meta")):
            new.meta[SHAPE_META] = TensorInfo(self.t.symbols.hinted(self.eg.shapes[key]), self._itemsize(new))
        _give_item_shape(new)
        self.of_class[key] = new

    def _itemsize(self, new: torch.fx.Node) -> int:
        """Element size of a new node: its first tensor input's (ops here keep dtype), else 4."""
        for a in new.all_input_nodes:
            infos = node_tensor_infos(a)
            if infos:
                return infos[0].itemsize
        return 4

    def _fresh_name(self, target: Any) -> str:
        """A name for a new node calling ``target`` that no original node has."""
        base = _name_base(target)
        k = self.next_suffix.get(base, 0)
        while f"{base}_{k}" in self.taken_names:
            k += 1
        self.next_suffix[base] = k + 1
        return f"{base}_{k}"

    def _new_node(self, op: str, target: Any, args: tuple) -> torch.fx.Node:
        """A new node, freshly named."""
        return self.graph.create_node(op, target, args, name=self._fresh_name(target))

    def _call(self, target: Any, args: tuple) -> torch.fx.Node:
        """A new call_function node, freshly named."""
        return self.graph.call_function(target, args, name=self._fresh_name(target))

    def _emit_term(self, node: TermNode) -> torch.fx.Node:
        g, ctor, args = self.graph, node.ctor, node.args
        val = lambda a: self.of_class[a.index]  # noqa: E731
        if ctor == "Leaf":
            i = args[0]
            if i in self.t.param_leaves:
                new = g.get_attr(self.t.param_leaves[i])
                self.aliases_input.add(new)
                return new
            if i not in self.of_original and self._copy_original(i).op == "get_attr":
                self.aliases_input.add(self.of_original[i])
            return self.of_original[i]
        info = CTORS.get(ctor)
        if info is not None and info.fx is not None:  # a view: the FX call term.py declares for it
            op, target, call_args = info.fx(info.cls(*args), val(args[0]))
            if ctor in ("Reshape", "Expand") and not all_concrete(args[1]):
                call_args = (call_args[0], self._symbolic_sizes(ctor, args))
            new = g.create_node(op, cast("Target", target), call_args, name=self._fresh_name(target))
        elif ctor == "Cat":
            members, dim = self._list_members(args[0].index)
            stacked = self._stacked(members, dim)
            if stacked is not None:
                sources, reshaped = stacked
                new = self._call(torch.stack, ([self.of_class[x] for x in sources], dim))
                if reshaped is None:
                    return new
                # (the reshape gets its class's shape; the stack in between needs one too, or
                # predicting the program would run it on the example inputs)
                source = self.t.symbols.hinted(self.eg.shapes[sources[0]])
                new.meta[SHAPE_META] = TensorInfo((len(sources), *source), self._itemsize(new))
                return self._call(torch.reshape, (new, self.sizes.reshape_sizes(reshaped)))
            return self._call(torch.cat, ([self.of_class[m] for m in members], dim))
        elif ctor == "Scalar":
            return self._emit_scalar(*args)
        elif ctor in OP_CTORS:  # (Scalar, also an op constructor, is handled above)
            spec = self.t.registry.specs[args[0]]
            return spec.emit(g, [val(a) for a in args[1:]], name=self._fresh_name(spec.target))
        else:
            raise RebuildError(f"cannot emit {ctor}")
        if new.args[0] in self.aliases_input:
            self.aliases_input.add(new)
        return new

    def _symbolic_sizes(self, ctor: str, args: tuple) -> list:
        """The size arguments of a reshape or expand to a shape with symbolic sizes."""
        if ctor == "Reshape":
            return self.sizes.reshape_sizes(args[1])
        return self.sizes.expand_sizes(args[1], self.eg.shapes.get(args[0].index))

    def _emit_scalar(self, key: str, x: ClassRef, c: float) -> torch.fx.Node:
        value = python_scalar(c)
        reversed_ops = {"rdiv": operator.truediv, "rpow": operator.pow}
        if key in reversed_ops:
            return self._call(reversed_ops[key], (value, self.of_class[x.index]))
        return self._call(self.t.registry.specs[key].target, (self.of_class[x.index], value))


def _regions_of_classes(t: Translation, eg: ExportedEGraph) -> dict[int, dict[str, Any]]:
    """The checkpointed region (recompute tags) of each e-class that computes a tagged original
    node, or a batched term all of whose members are tagged: what the rebuilt node is tagged
    with, so the partitioner recomputes a batch of checkpointed experts as it did them."""
    tags = {i: region_tags(n) for i, n in enumerate(t.gm.graph.nodes) if region_tags(n)}
    if not tags:
        return {}
    regions: dict[int, dict[str, Any]] = {}
    for batched, members in t.batch_members.items():
        if all(m in tags for m in members) and batched in eg.class_of_id:
            regions[eg.class_of_id[batched]] = tags[members[0]]
    for i, region in tags.items():
        if i in eg.class_of_id:
            regions.setdefault(eg.class_of_id[i], region)
    return regions


def _tag_region_inputs(graph: torch.fx.Graph) -> None:
    """Tag for recomputation every untagged op whose users are all tagged (a batched
    region's matmul under its bias add, the stacks it reads): it serves the checkpointed
    regions alone, so it is recomputed with them."""
    for node in reversed(graph.nodes):
        if node.op in ("call_function", "call_method") and node.users and not region_tags(node):
            tags = [region_tags(u) for u in node.users]
            if all(tags):
                node.meta.update(tags[0])


def rebuild(t: Translation, eg: ExportedEGraph, choice: dict[int, int]) -> torch.fx.GraphModule:
    """Write the chosen program as a new GraphModule (the original is untouched)."""
    return Rebuilder(t, eg, choice).build()


def _placeholder_value(node: torch.fx.Node) -> Any:
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    return None


def propagate_meta(
    gm: torch.fx.GraphModule, example_inputs: Any = None, reference: torch.fx.GraphModule | None = None
) -> bool:
    """See :func:`_propagate_meta`; a module call of the graph (``symbolic_trace``'s) runs its
    real module on fake inputs, which writes the module's real buffers (a batch norm's count):
    they are put back as they were.

    ``reference``: the graph ``gm`` was rebuilt from, whose nodes' meta ``gm``'s nodes of the
    same name carry. A node computing what its namesake there computes, from inputs whose
    values are unchanged, keeps its copied value without running (most of a rebuilt graph)."""
    if any(n.op == "call_module" for n in gm.graph.nodes):
        with module_state_kept(gm):
            return _propagate_meta(gm, example_inputs, reference)
    return _propagate_meta(gm, example_inputs, reference)


def _propagate_meta(
    gm: torch.fx.GraphModule, example_inputs: Any = None, reference: torch.fx.GraphModule | None = None
) -> bool:
    """Give every node ``meta["val"]`` (a fake tensor) so cost models see shapes.

    Uses the example inputs, else the placeholders' own meta. Returns False
    (leaving meta as it is) when neither is available or shapes are symbolic.

    The result is what FakeTensorProp gives (shapes, dtypes, devices, strides,
    requires_grad False), computed faster (see ``_fast_meta``), with one
    difference: placeholders with fake values of their own (Dynamo, export) keep
    them, and the graph's values stay in that fake mode. FakeTensorProp in a fresh
    mode is the fallback.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    own = [_placeholder_value(n) for n in placeholders]
    if any(symbolic_value(v) for v in own):
        return _symbolic_fake_prop(gm, own)
    values = list(example_inputs) if example_inputs is not None else own
    if len(values) != len(placeholders):
        return False
    for v in values:
        if v is None or (isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape)):
            return False
    try:
        vals = _fast_meta(gm, placeholders, values, reference)
    except Exception as exc:  # meta is an aid: fall back to FakeTensorProp
        log.debug("optimus_eqsat: fast meta propagation failed (%r); using FakeTensorProp", exc)
        vals = None
    if vals is not None:
        for n, v in vals.items():
            n.meta["val"] = v
    else:
        saved = {n: dict(n.meta) for n in gm.graph.nodes}
        if not _fake_tensor_prop(gm, values):
            for n in gm.graph.nodes:  # FakeTensorProp writes as it goes: undo a partial run
                n.meta.clear()
                n.meta.update(saved[n])
            return False
    if any("example_value" in n.meta for n in placeholders):
        # Dynamo graphs keep shapes in "example_value", which Inductor's own
        # pre-grad passes read: new nodes need it, copied nodes need it current.
        for n in gm.graph.nodes:
            if "val" in n.meta:
                n.meta["example_value"] = n.meta["val"]
    return True


def _symbolic_fake_prop(gm: torch.fx.GraphModule, fakes: list[Any]) -> bool:
    """FakeTensorProp from the placeholders' own symbolic fake values, in their mode (Dynamo's):
    new nodes get symbolic sizes like the rest, never the example's (run with real example
    inputs they would be static, and Inductor's passes would read the example's sizes)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    modes = {v.fake_mode for v in fakes if isinstance(v, FakeTensor)}
    if len(modes) != 1 or any(v is None for v in fakes):
        return False
    saved = {n: dict(n.meta) for n in gm.graph.nodes}
    try:
        # The Python dispatcher, as Dynamo traces: composite ops (F.pad) then run their
        # symbolic decompositions instead of reading concrete sizes (a guard on each).
        with enable_python_dispatcher():
            FakeTensorProp(gm, modes.pop()).propagate_dont_convert_inputs(*fakes)
    except Exception as exc:  # meta is an aid: keep what the graph had
        log.debug("optimus_eqsat: symbolic meta propagation failed (%r)", exc)
        for n in gm.graph.nodes:
            n.meta.clear()
            n.meta.update(saved[n])
        return False
    if any("example_value" in n.meta for n in gm.graph.nodes if n.op == "placeholder"):
        for n in gm.graph.nodes:  # Dynamo graphs: Inductor's pre-grad passes read example_value
            if "val" in n.meta:
                n.meta["example_value"] = n.meta["val"]
    return True


def _fake_tensor_prop(gm: torch.fx.GraphModule, values: list[Any]) -> bool:
    """FakeTensorProp over the whole graph in a fresh mode (the slow, general path)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(v: torch.Tensor) -> torch.Tensor:
        with mode:
            return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)

    class AttributesAsFakes(FakeTensorProp):
        """Reads the module's tensors as fakes of their own: the mode would otherwise take a
        real 0-d tensor as its constant, and an in-place op of the graph (an optimizer's
        ``step += 1``) would write the real one."""

        def __init__(self, module: torch.fx.GraphModule, mode: FakeTensorMode):
            super().__init__(module, mode)
            self.fakes: dict[str, torch.Tensor] = {}

        def fetch_attr(self, target: str) -> Any:
            value = super().fetch_attr(target)
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                if target not in self.fakes:  # (same strides and offset, no constant)
                    self.fakes[target] = mode.from_tensor(value, static_shapes=True)
                return self.fakes[target]
            return value

    fakes = [fake(v) if isinstance(v, torch.Tensor) else v for v in values]
    try:
        AttributesAsFakes(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception:  # meta is an aid to cost models, never a reason to fail
        return False
    return True


# ---------------------------------------------------------------- fast meta propagation
# Most nodes of a rebuilt graph are views (narrow, reshape, permute, expand,
# getitem) whose fake value is the view op's meta kernel applied to the input's
# fake tensor: run that kernel directly (C++, no fake-tensor dispatch) and wrap
# the result. A node whose copied meta already has exactly the computed
# metadata keeps its value. Other ops run under the fake mode, as FakeTensorProp
# runs them. Every value lives in one fake mode: the placeholders' own (Dynamo's,
# so copied values can be kept) or, without one, a fresh mode. The views run
# directly and the ops that rule this path out are fxvocab's FAST_META_VIEW_*
# and METADATA_MUTATORS tables.


def _basic_index(idx: Any) -> bool:
    """Indexing that is a view: ints, int slices, None, Ellipsis."""
    items = idx if isinstance(idx, tuple) else (idx,)
    for i in items:
        if isinstance(i, slice):
            if not all(b is None or type(b) is int for b in (i.start, i.stop, i.step)):
                return False
        elif not (i is None or i is Ellipsis or type(i) is int):
            return False
    return True


def _first_fake(args: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor

    x = args[0]
    if isinstance(x, (list, tuple)) and x:
        x = x[0]
    return x if isinstance(x, FakeTensor) else None


def _same_device_fakes(xs: Any, mode: Any) -> bool:
    """A non-empty list of fake tensors of ``mode``, all on one device."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(xs, (list, tuple)) or not xs:
        return False
    device = xs[0].fake_device if isinstance(xs[0], FakeTensor) else None
    return all(isinstance(x, FakeTensor) and x.fake_mode is mode and x.fake_device == device for x in xs)


def _same_meta(old: Any, new: torch.Tensor, device: torch.device, mode: Any) -> bool:
    """``old`` is a detached fake tensor of ``mode`` with exactly ``new``'s metadata (on ``device``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return (
        isinstance(old, FakeTensor)
        and old.fake_mode is mode
        and old.dtype == new.dtype
        and old.fake_device == device
        and not old.requires_grad  # values are detached
        and old.shape == new.shape
        and old.stride() == new.stride()
        and old.storage_offset() == new.storage_offset()
        and old.layout == new.layout
    )


def _fakes_of(value: Any, mode: Any) -> bool:
    """``value`` is a fake tensor of ``mode``, or a non-empty tuple or list of them."""
    from torch._subclasses.fake_tensor import FakeTensor

    items = value if isinstance(value, (tuple, list)) and value else (value,)
    return all(isinstance(x, FakeTensor) and x.fake_mode is mode for x in items)


def _placeholder_fakes(placeholders: list[torch.fx.Node], values: list[Any]) -> tuple[Any, list[Any]] | None:
    """The placeholders' fake values, all from one fake mode, when they fit ``values``."""
    from torch._subclasses.fake_tensor import FakeTensor

    modes: set[Any] = set()
    fakes: list[Any] = []
    for n, v in zip(placeholders, values):
        if not isinstance(v, torch.Tensor):
            if not isinstance(v, (int, float, bool)):
                return None
            fakes.append(v)
            continue
        fake = v if isinstance(v, FakeTensor) else _placeholder_value(n)
        if not isinstance(fake, FakeTensor) or fake.layout != torch.strided or not static_tensor(fake):
            return None  # (symbolic sizes are never compared: that would add guards)
        if fake is not v and not (
            fake.shape == v.shape and fake.stride() == v.stride() and fake.dtype == v.dtype and fake.device == v.device
        ):
            return None
        modes.add(fake.fake_mode)
        fakes.append(fake)
    if len(modes) != 1:
        return None
    return modes.pop(), fakes


def _fast_meta(
    gm: torch.fx.GraphModule,
    placeholders: list[torch.fx.Node],
    values: list[Any],
    reference: torch.fx.GraphModule | None = None,
) -> dict | None:
    """Every node's new ``meta["val"]`` (nodes FakeTensorProp would leave alone are
    absent); None where this graph needs the general path. Writes no meta. With
    ``reference`` (see :func:`propagate_meta`), nodes that compute what their namesakes
    there computed, from unchanged values, keep their values without running."""
    from torch._dispatch.python import no_python_dispatcher
    from torch._subclasses.fake_impls import fast_detach
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

    nodes = list(gm.graph.nodes)
    for n in nodes:
        if n.op in ("call_function", "call_method") and target_name(n.target) in METADATA_MUTATORS:
            return None
        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator):
            return None
    found = _placeholder_fakes(placeholders, values)
    if found is not None:
        mode, fakes = found  # kept as they are (parameters: requires_grad, as Dynamo made them)
    else:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = []
        for v in values:
            if isinstance(v, torch.Tensor):
                with mode:
                    v = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)
            fakes.append(v)
    if found is not None and mode.shape_env is not None:
        # Copied values of this mode are compared with new ones: all must be static.
        for n in nodes:
            v = _placeholder_value(n)
            for x in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(x, FakeTensor) and x.fake_mode is mode and not static_tensor(x):
                    return None
                if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    return None

    # FakeTensorProp's values are snapshots (detached: requires_grad False). Views run
    # without grad, so their values are detached already; other ops run as
    # FakeTensorProp runs them, in the caller's grad mode.
    def extract(obj: Any) -> Any:  # FakeTensorProp's extract_val
        if isinstance(obj, FakeTensor):
            return fast_detach(obj.fake_mode, obj) if obj.requires_grad else obj
        if isinstance(obj, torch.Tensor):
            return fast_detach(mode, mode.from_tensor(obj, static_shapes=True))
        if isinstance(obj, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
            return obj
        return None

    env: dict[torch.fx.Node, Any] = {}
    vals: dict[torch.fx.Node, Any] = {}
    # the reference's computations, and the nodes whose value is the one their meta holds
    known = {} if reference is None else {r.name: c for r in reference.graph.nodes if (c := computation(r))}
    unchanged: set[torch.fx.Node] = set()
    lookup = env.__getitem__
    next_placeholder = iter(fakes)
    kernel_mode: contextlib.ExitStack | None = None  # entered around runs of view nodes

    def enter_kernel() -> None:
        nonlocal kernel_mode
        if kernel_mode is None:
            kernel_mode = contextlib.ExitStack()
            kernel_mode.enter_context(torch.no_grad())  # values are detached: no autograd
            kernel_mode.enter_context(no_python_dispatcher())
            kernel_mode.enter_context(in_kernel_invocation_manager(mode))
            kernel_mode.enter_context(torch._C.DisableTorchFunctionSubclass())

    def leave_kernel() -> None:
        nonlocal kernel_mode
        if kernel_mode is not None:
            kernel_mode, stack = None, cast(contextlib.ExitStack, kernel_mode)
            stack.close()

    try:
        for n in nodes:
            op = n.op
            if op == "placeholder":
                env[n] = v = next(next_placeholder)
                vals[n] = v if isinstance(v, FakeTensor) else extract(v)  # a placeholder's own: kept
                if vals[n] is _placeholder_value(n):
                    unchanged.add(n)
                continue
            old = _placeholder_value(n)
            if (  # (the cheap tests first: this runs for every node)
                n.name in known
                and all(a in unchanged for a in n.all_input_nodes)
                and same_computation(known, n)
                and _fakes_of(old, mode)
            ):
                leave_kernel()  # (a detach in kernel mode would put the value on the meta device)
                env[n] = old
                vals[n] = map_aggregate(old, extract)
                unchanged.add(n)
                continue
            if op == "output":
                leave_kernel()
                vals[n] = map_aggregate(map_arg(n.args[0], lookup), extract)
                continue
            if op == "get_attr":
                leave_kernel()
                real = fetch_attr(gm, n.target)
                if isinstance(real, torch.Tensor):
                    env[n] = fake = real if isinstance(real, FakeTensor) else mode.from_tensor(real, static_shapes=True)
                    val = extract(fake)
                    vals[n] = old if _same_meta(old, val, val.fake_device, mode) else val
                    if vals[n] is old:
                        unchanged.add(n)
                else:
                    env[n] = real
                continue
            args = map_arg(n.args, lookup)
            kwargs = map_arg(n.kwargs, lookup)
            target = n.target
            view = False
            fn: Any
            if op == "call_function":
                if target is operator.getitem:
                    base = args[0]
                    if isinstance(base, (tuple, list)):
                        result = base[args[1]]
                        env[n] = result
                        if isinstance(result, FakeTensor) and _same_meta(old, result, result.fake_device, mode):
                            vals[n] = old
                            unchanged.add(n)
                        else:
                            leave_kernel()
                            vals[n] = map_aggregate(result, extract)
                        continue
                    view = isinstance(base, FakeTensor) and _basic_index(args[1]) and not kwargs
                    fn = torch.Tensor.__getitem__
                elif target is torch.cat and len(args) + len(kwargs) <= 2 and set(kwargs) <= {"dim"}:
                    view = _same_device_fakes(args[0], mode)  # cat's meta kernel is what fake mode runs
                    fn = target
                else:
                    view = target in FAST_META_VIEW_FUNCTIONS
                    fn = target
            elif op == "call_method":
                view = target in FAST_META_VIEW_METHODS
                fn = getattr(torch.Tensor, target) if view else None
            if view and (first := _first_fake(args)) is not None and first.fake_mode is mode:
                device = first.fake_device
                enter_kernel()
                out = fn(*args, **kwargs)
                if isinstance(out, torch.Tensor):
                    if isinstance(out, FakeTensor):  # an input returned as it is
                        env[n] = out
                        leave_kernel()
                        vals[n] = extract(out)
                        continue
                    if _same_meta(old, out, device, mode):
                        result = old
                        unchanged.add(n)
                    else:
                        result = FakeTensor(mode, out, device, requires_grad=False)
                    env[n] = vals[n] = result
                elif isinstance(out, (tuple, list)):
                    if not all(isinstance(o, torch.Tensor) and not isinstance(o, FakeTensor) for o in out):
                        raise RuntimeError(f"unexpected view result of {n.format_node()}")
                    result = type(out)(FakeTensor(mode, o, device, requires_grad=False) for o in out)
                    env[n] = vals[n] = result
                else:  # size(), dim()
                    env[n] = out
                    vals[n] = map_aggregate(out, extract)
                continue
            leave_kernel()
            with mode:
                if op == "call_function":
                    result = target(*args, **kwargs)
                elif op == "call_method":
                    result = getattr(args[0], target)(*args[1:], **kwargs)
                elif op == "call_module":
                    result = gm.get_submodule(target)(*args, **kwargs)
                else:
                    raise RuntimeError(f"unknown node op {op}")
            env[n] = result
            if mode.shape_env is not None and not all(
                static_tensor(x) if isinstance(x, torch.Tensor) else not isinstance(x, torch.SymInt)
                for x in (result if isinstance(result, (tuple, list)) else (result,))
            ):
                raise RuntimeError(f"symbolic result of {n.format_node()}")  # FakeTensorProp handles these
            val = map_aggregate(result, extract)
            if val is not None:
                vals[n] = val
    finally:
        leave_kernel()
    return vals


def _give_item_shape(item: torch.fx.Node) -> None:
    """A ``getitem`` of a node without meta (a tuple op the rebuild emitted, ``var_mean``) gives
    its tensor's shape to that node's :data:`SHAPE_META`, a tuple with one slot per item read
    (None for an item nothing reads): predicting the program then knows the tuple without
    running it."""
    whole = item.args[0] if item.target is operator.getitem and len(item.args) == 2 else None
    if not isinstance(whole, torch.fx.Node) or not isinstance(item.args[1], int) or meta_value(whole) is not None:
        return
    known = whole.meta.get(SHAPE_META)
    infos = node_tensor_infos(item)
    if not infos or len(infos) != 1 or not isinstance(known, (tuple, type(None))):  # (x[0] of a tensor)
        return
    items = list(known or ())
    items += [None] * (item.args[1] + 1 - len(items))
    items[item.args[1]] = infos[0]
    whole.meta[SHAPE_META] = tuple(items)
