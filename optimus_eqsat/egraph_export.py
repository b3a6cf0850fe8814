"""Read a saturated egglog e-graph back into plain Python.

:func:`export` freezes the e-graph and returns :class:`TermNode` rows grouped by
e-class (tensor and list classes alike), with primitive arguments decoded.
The extractor sees the same graph as an :class:`ExtractionGraph` with costs
from a cost function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from optimus_eqsat.extract.egraph import ENode, ExtractionGraph
from optimus_eqsat.term import CTORS, EMITTED_CTORS, VIEW_CTORS, Role

if TYPE_CHECKING:
    import egglog.bindings as eb

VALUE_SORTS = ("Tensor", "TList")
# The constructors the rebuilder can write as FX (term.py). Anything else (Id/LId
# names, helpers such as LAppend/MapUnary, constructors a user rule file declares)
# is never part of a program.
EMITTED = EMITTED_CTORS
# What parameter_cache computes once and keeps right: views, list cells and cats.
_CONSTANT_CTORS = frozenset(c.name for c in CTORS.values() if c.role in (Role.VIEW, Role.CELL, Role.CAT))


@dataclass(frozen=True)
class ClassRef:
    """An argument that is an e-class (a tensor or a list)."""

    index: int


@dataclass(frozen=True)
class TermNode:
    """One e-node: constructor, arguments in declaration order (ClassRef or a primitive)."""

    ctor: str
    args: tuple

    @cached_property  # read once per extraction and per rebuild step: computed once
    def children(self) -> tuple[int, ...]:
        return tuple(a.index for a in self.args if isinstance(a, ClassRef))

    @cached_property
    def label(self) -> str:
        """Constructor and primitive arguments, e.g. ``Slice(1, 0, 4)``."""
        prims = [repr(a) for a in self.args if not isinstance(a, ClassRef)]
        return f"{self.ctor}({', '.join(prims)})" if prims else self.ctor


@dataclass
class ExportedEGraph:
    """E-classes with their term nodes, the class of every FX node id, and shapes."""

    classes: list[list[TermNode]] = field(default_factory=list)
    class_of_id: dict[int, int] = field(default_factory=dict)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # class -> shape

    def input_classes(self) -> set[int]:
        """Classes holding a leaf (graph input, parameter) or a view of one: what Inductor
        copies into a cat with one foreach kernel, however many there are."""
        return set(self._steps_up({"Leaf"}, VIEW_CTORS - {"TNil"}, child=0))

    def constant_classes(self, leaf_ids: set[int]) -> set[int]:
        """Classes a cache can compute once from the leaves of ``leaf_ids`` (parameters) and keep
        right (``parameter_cache``): those leaves, lists of them along dim 0 (from the empty
        list ``TNil 0`` up through cells), cats of such lists and views of all these. Pointwise
        work on parameters is not among them: it is done every step. One pass over the nodes,
        each counted down as its children are found (a worklist)."""
        waiting: dict[int, list[list]] = {}  # class -> [node's class, children still unknown]
        found: set[int] = set()
        frontier: list[int] = []
        for c, nodes in enumerate(self.classes):
            for n in nodes:
                seed = n.ctor == "Leaf" and n.args[0] in leaf_ids or n.ctor == "TNil" and n.args[0] == 0
                if seed and c not in found:
                    found.add(c)
                    frontier.append(c)
                if n.ctor not in _CONSTANT_CTORS or not n.children:
                    continue
                entry = [c, len(set(n.children))]
                for child in set(n.children):
                    waiting.setdefault(child, []).append(entry)
        while frontier:
            below = frontier.pop()
            for entry in waiting.pop(below, ()):
                entry[1] -= 1
                if entry[1] == 0 and entry[0] not in found:
                    found.add(entry[0])
                    frontier.append(entry[0])
        return found

    def list_lengths(self) -> dict[int, int]:
        """Fewest members of any list each list class can be (TNil 0, TCons 1 + tail)."""
        return self._steps_up({"TNil"}, {"TCons"}, child=1)

    def _steps_up(self, seeds: Set[str], edges: Set[str], child: int) -> dict[int, int]:
        """Breadth-first from the classes holding a ``seeds`` node, up through ``edges``
        nodes (from their ``child``-th child to their class): every class reached, with
        its fewest steps. One pass however long the chains (a 2,000-item list)."""
        parents: dict[int, list[int]] = {}
        steps: dict[int, int] = {}
        for c, nodes in enumerate(self.classes):
            for n in nodes:
                if n.ctor in seeds:
                    steps[c] = 0
                elif n.ctor in edges:
                    parents.setdefault(n.children[child], []).append(c)
        frontier = list(steps)
        while frontier:
            nxt = []
            for below in frontier:
                for c in parents.get(below, ()):
                    if c not in steps:
                        steps[c] = steps[below] + 1
                        nxt.append(c)
            frontier = nxt
        return steps

    def extraction_graph(self, roots: list[int], cost: Callable[[int, TermNode], float]) -> ExtractionGraph:
        """The graph an extractor reads; ``cost(class, node)`` prices each node."""
        classes = [
            [ENode(n.label, n.children, cost(c, n) if n.ctor in EMITTED else math.inf) for n in nodes]
            for c, nodes in enumerate(self.classes)
        ]
        return ExtractionGraph(classes, roots)


def export(egraph: eb.EGraph) -> ExportedEGraph:
    """Freeze ``egraph`` and group its constructor rows by e-class."""
    frozen = egraph.freeze()
    out = ExportedEGraph()
    class_index: dict[Any, int] = {}

    def cls(value: Any) -> int:
        index = class_index.get(value)
        if index is None:
            index = class_index[value] = len(out.classes)
            out.classes.append([])
        return index

    decoders: dict[str, Callable[[Any], Any]] = {
        "i64": egraph.value_to_i64,
        "f64": egraph.value_to_f64,
        "String": egraph.value_to_string,
        "Shape": lambda v: tuple(egraph.value_to_i64(x) for x in egraph.value_to_vec(v)),
    }
    shape_rows = None
    for name, function in frozen.functions.items():
        if name == "shape":
            shape_rows = function.rows
            continue
        if function.output_sort not in VALUE_SORTS:
            continue
        sorts = function.input_sorts
        for row in function.rows:
            if row.subsumed:
                continue
            args = tuple(
                ClassRef(cls(v)) if sort in VALUE_SORTS else decoders[sort](v) for sort, v in zip(sorts, row.inputs)
            )
            c = cls(row.output)
            out.classes[c].append(TermNode(name, args))
            if name == "Id":
                out.class_of_id[cast(int, args[0])] = c  # (an Id's argument: an i64)
    for row in shape_rows or ():
        (tensor,) = row.inputs
        if tensor in class_index:
            out.shapes[class_index[tensor]] = decoders["Shape"](row.output)
    return out
