"""Chosen program -> FX GraphModule, built iteratively (graphs are 100,000 deep).

Placeholders come first, in their original order. Ordered nodes (side effects,
mutation) are copied verbatim in their original order; everything else is
emitted on demand, before its first user, so dead terms vanish. A node that
computes the same e-class as an original node takes that node's name and meta
(same class, same value).
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
import torch.fx

from .extract.fx_cost import SHAPE_META, TensorInfo, node_tensor_infos
from .egraph_export import ClassRef, ExportedEGraph, TermNode
from .translate import VIEW_OPS, Translation
from .normalize import canonical_name


class RebuildError(RuntimeError):
    """The chosen program cannot be written as an FX graph (for example, a cycle)."""


# Emitted views of a graph input alias that input; outputs must not gain new aliasing.
_VIEW_TARGETS = {torch.narrow, torch.reshape, torch.permute, "expand", operator.getitem}


def _scalar(c: float) -> int | float:
    """The Python scalar to write: whole numbers as ints (integral tensors keep their
    dtype; float tensors compute the same), unless too large for int64."""
    return int(c) if float(c).is_integer() and abs(c) < 2**62 else c


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
        self.ordered = sorted(i for i in t.ordered if i in t.copied)
        self.next_ordered = 0
        self.aliases_input: set[torch.fx.Node] = set()

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
        gm = torch.fx.GraphModule(self.t.gm, self.graph, class_name=type(self.t.gm).__name__)
        gm.graph.lint()
        return gm

    def _original_input_aliases(self) -> set[torch.fx.Node]:
        aliases: set[torch.fx.Node] = set()
        for n in self.t.gm.graph.nodes:
            if n.op in ("placeholder", "get_attr"):
                aliases.add(n)
            elif canonical_name(n) in VIEW_OPS and any(a in aliases for a in n.all_input_nodes):
                aliases.add(n)
        return aliases

    def _materialize_ordered(self, upto: int) -> None:
        """Copy ordered nodes with index < upto, in order."""
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
        """Original node i copied verbatim, its arguments mapped to emitted values."""
        self.of_original[i] = self.graph.node_copy(self.t.nodes[i], self._original_arg)
        return self.of_original[i]

    def _task_for_original(self, i: int) -> tuple[str, int]:
        if self.t.status.get(i) in ("term", "leaf"):
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
        active: set[tuple[str, int]] = set()
        while stack:
            task, expanded = stack.pop()
            if self._done(task):
                continue
            if expanded:
                active.discard(task)
                self._emit(task)
                continue
            if task in active:
                raise RebuildError(f"cycle through {task}")
            active.add(task)
            stack.append((task, True))
            for dep in self._deps(task):
                if not self._done(dep):
                    if dep in active:
                        raise RebuildError(f"cycle through {dep}")
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
            if key in self.t.ordered and key in self.t.copied:
                self._materialize_ordered(key)  # earlier side effects first
            if node.op in ("placeholder", "get_attr"):
                return []
            return [self._task_for_original(self.t.index[a]) for a in node.all_input_nodes]
        node = self._chosen(key)
        if node.ctor == "Leaf":
            return [] if node.args[0] in self.t.param_leaves else [("orig", node.args[0])]
        if node.ctor == "Cat":
            return [("class", m) for m in self._list_members(node.args[0].index)[0]]
        return [("class", ch) for ch in node.children]

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
        if key in self.eg.shapes and not any(k in new.meta for k in ("val", "example_value", "tensor_meta")):
            new.meta[SHAPE_META] = TensorInfo(self.eg.shapes[key], self._itemsize(new))
        self.of_class[key] = new

    def _itemsize(self, new: torch.fx.Node) -> int:
        """Element size of a new node: its first tensor input's (ops here keep dtype), else 4."""
        for a in new.all_input_nodes:
            infos = node_tensor_infos(a)
            if infos:
                return infos[0].itemsize
        return 4

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
        if ctor == "Slice":
            x, d, a, b = args
            new = g.call_function(torch.narrow, (val(x), d, a, b - a))
        elif ctor == "Reshape":
            new = g.call_function(torch.reshape, (val(args[0]), list(args[1])))
        elif ctor == "Permute":
            new = g.call_function(torch.permute, (val(args[0]), list(args[1])))
        elif ctor == "Expand":
            new = g.call_method("expand", (val(args[0]), list(args[1])))
        elif ctor == "Cat":
            members, dim = self._list_members(args[0].index)
            return g.call_function(torch.cat, ([self.of_class[m] for m in members], dim))
        elif ctor == "Scalar":
            return self._emit_scalar(*args)
        elif ctor in ("Unary", "Binary", "Op1", "Op2", "Op3"):
            spec = self.t.registry.specs[args[0]]
            return spec.emit(g, [val(a) for a in args[1:]])
        else:
            raise RebuildError(f"cannot emit {ctor}")
        if new.args[0] in self.aliases_input:
            self.aliases_input.add(new)
        return new

    def _emit_scalar(self, key: str, x: ClassRef, c: float) -> torch.fx.Node:
        value, g = _scalar(c), self.graph
        reversed_ops = {"rdiv": operator.truediv, "rpow": operator.pow}
        if key in reversed_ops:
            return g.call_function(reversed_ops[key], (value, self.of_class[x.index]))
        return g.call_function(self.t.registry.specs[key].target, (self.of_class[x.index], value))


def rebuild(t: Translation, eg: ExportedEGraph, choice: dict[int, int]) -> torch.fx.GraphModule:
    """Write the chosen program as a new GraphModule (the original is untouched)."""
    return Rebuilder(t, eg, choice).build()


def _placeholder_value(node: torch.fx.Node) -> Any:
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    return None


def propagate_meta(gm: torch.fx.GraphModule, example_inputs: Any = None) -> bool:
    """Give every node ``meta["val"]`` (a fake tensor) so cost models see shapes.

    Uses the example inputs, else the placeholders' own meta. Returns False
    (leaving meta as it is) when neither is available or shapes are symbolic.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = list(example_inputs) if example_inputs is not None else [_placeholder_value(n) for n in placeholders]
    if len(values) != len(placeholders):
        return False
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = []
    for v in values:
        if isinstance(v, torch.Tensor):
            if not all(isinstance(s, int) for s in v.shape):
                return False
            with mode:
                fakes.append(torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device))
        elif v is None:
            return False
        else:
            fakes.append(v)
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception:  # meta is an aid to cost models, never a reason to fail
        return False
    if any("example_value" in n.meta for n in placeholders):
        # Dynamo graphs keep shapes in "example_value", which Inductor's own
        # pre-grad passes read: new nodes need it, copied nodes need it current.
        for n in gm.graph.nodes:
            if "val" in n.meta:
                n.meta["example_value"] = n.meta["val"]
    return True
