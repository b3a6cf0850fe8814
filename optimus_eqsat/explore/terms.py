"""E-nodes as text, and the original term of every FX node inside the e-graph.

Every FX node i was loaded as ``(union (Id i) TERM)``; :class:`TermIndex` finds
that TERM's e-node again in the saturated e-graph (by constructor and
canonical children), so "what was there" and "what was chosen" can be put side
by side.
"""

from __future__ import annotations

from typing import Iterable

from ..egraph_export import ClassRef, ExportedEGraph, TermNode
from ..translate import Translation
from .sexpr import read_forms

MAX_LIST_SHOWN = 8


def _atom(a: str):
    if a.startswith('"'):
        return a[1:-1]
    try:
        return int(a)
    except ValueError:
        return float(a)


class TermIndex:
    """Maps each FX node of a translation to its original e-node ``(class, index)``."""

    def __init__(self, translation: Translation, egraph: ExportedEGraph):
        self.t, self.eg = translation, egraph
        self._by_key: dict[tuple, int] | None = None
        self._terms: dict[int, list] | None = None

    def _key_index(self) -> dict[tuple, int]:
        if self._by_key is None:
            self._by_key = {(n.ctor, n.args): c for c, nodes in enumerate(self.eg.classes) for n in nodes}
        return self._by_key

    def _facts(self) -> dict[int, list]:
        if self._terms is None:
            self._terms = {}
            for fact in self.t.facts:
                if not fact.startswith("(union (Id "):
                    continue
                (value,) = (f.value for f in read_forms(fact))
                self._terms[int(value[1][1])] = value[2]
        return self._terms

    def original_term(self, fx_index: int) -> list | None:
        """The s-expression loaded for FX node ``fx_index`` (None if it had none)."""
        return self._facts().get(fx_index)

    def original_enode(self, fx_index: int) -> tuple[int, int] | None:
        """``(class, index in egraph.classes[class])`` of the loaded term, if still present."""
        found = self.original_choice(fx_index)
        return found[-1] if found else None

    def original_choice(self, fx_index: int) -> list[tuple[int, int]]:
        """``(class, node index)`` of the loaded term and of its nested sub-terms (the term last).

        Empty when the node loaded no term or the term is no longer in the e-graph.
        """
        term = self.original_term(fx_index)
        if term is None:
            return []
        index, cls = self._key_index(), self.eg.class_of_id
        done: dict[int, object] = {}
        out: list[tuple[int, int]] = []
        stack = [(term, False)]  # post-order over the nested term; each list resolves to a ClassRef
        while stack:
            v, expanded = stack.pop()
            if not isinstance(v, list):
                continue
            if not expanded:
                stack.append((v, True))
                stack.extend((x, False) for x in v[1:] if isinstance(x, list))
                continue
            head, rest = v[0], v[1:]
            if head == "Id":
                done[id(v)] = ClassRef(cls[int(rest[0])]) if int(rest[0]) in cls else None
                continue
            if head == "vec-of":
                done[id(v)] = tuple(int(x) for x in rest)
                continue
            args = tuple(done.get(id(x)) if isinstance(x, list) else _atom(x) for x in rest)
            c = index.get((head, args))
            if c is None:
                return []
            done[id(v)] = ClassRef(c)
            out.append((c, self.eg.classes[c].index(TermNode(head, args))))
        return out


def class_names(translation: Translation, egraph: ExportedEGraph) -> dict[int, list[str]]:
    """E-class -> names of the FX nodes (and parameter leaves) that compute it."""
    names: dict[int, list[str]] = {}
    for i, c in sorted(egraph.class_of_id.items()):
        if i < len(translation.nodes):
            node = translation.nodes[i]
            label = translation.param_leaves.get(i, node.name)
            names.setdefault(c, []).append(label)
    return names


def node_text(node: TermNode, op_names: dict[str, str] | None = None) -> str:
    """One e-node on one line: ``Slice(c0, 1, 48, 64)``, ``Op3[linear_b](c5, c6, c7)``."""
    args = list(node.args)
    head = node.ctor
    if head in ("Unary", "Binary", "Scalar", "Op1", "Op2", "Op3") and args and isinstance(args[0], str):
        head = f"{head}[{args[0]}]"
        args = args[1:]
    shown = ", ".join(f"c{a.index}" if isinstance(a, ClassRef) else repr(a) for a in args)
    return f"{head}({shown})"


def expression(egraph: ExportedEGraph, c: int, choice: dict[int, int], depth: int = 2,
               names: dict[int, list[str]] | None = None) -> str:
    """The chosen program below class ``c`` as text, ``depth`` levels deep (iterative)."""
    names = names or {}

    def leaf(k: int) -> str:
        return names[k][0] if k in names else f"c{k}"

    # explicit stack: (class, depth left) -> text, children first
    memo: dict[tuple[int, int], str] = {}
    stack = [(c, depth, False)]
    while stack:
        k, d, expanded = stack.pop()
        if (k, d) in memo:
            continue
        if d <= 0 or k not in choice:
            memo[(k, d)] = leaf(k)
            continue
        node = egraph.classes[k][choice[k]]
        if node.ctor == "Leaf":
            memo[(k, d)] = leaf(k)
            continue
        kids = _shown_children(egraph, node, choice)
        if not expanded:
            stack.append((k, d, True))
            stack.extend((ch, d - 1, False) for ch in kids if (ch, d - 1) not in memo)
            continue
        memo[(k, d)] = _render(node, [memo[(ch, d - 1)] for ch in kids], egraph, choice)
    return memo[(c, depth)]


def _list_members(egraph: ExportedEGraph, node: TermNode, choice: dict[int, int]) -> tuple[list[int], bool]:
    members, more = [], False
    while node.ctor == "TCons":
        head, tail = node.args
        if len(members) == MAX_LIST_SHOWN:
            more = True
            break
        members.append(head.index)
        if tail.index not in choice:
            break
        node = egraph.classes[tail.index][choice[tail.index]]
    return members, more


def _shown_children(egraph: ExportedEGraph, node: TermNode, choice: dict[int, int]) -> list[int]:
    if node.ctor == "Cat" and node.args[0].index in choice:
        lst = egraph.classes[node.args[0].index][choice[node.args[0].index]]
        return _list_members(egraph, lst, choice)[0]
    if node.ctor == "TCons":
        return _list_members(egraph, node, choice)[0]
    return list(node.children)


def _render(node: TermNode, kids: list[str], egraph: ExportedEGraph, choice: dict[int, int]) -> str:
    prims = [repr(a) for a in node.args if not isinstance(a, ClassRef)]
    if node.ctor == "Cat" and node.args[0].index not in choice:
        return f"cat({kids[0]})"
    if node.ctor in ("Cat", "TCons"):
        lst = node if node.ctor == "TCons" else egraph.classes[node.args[0].index][choice[node.args[0].index]]
        _, more = _list_members(egraph, lst, choice)
        body = "[" + ", ".join(kids) + (", ..." if more else "") + "]"
        return f"cat({body})" if node.ctor == "Cat" else body
    if node.ctor in ("Unary", "Binary", "Scalar", "Op1", "Op2", "Op3"):
        key, rest = prims[0].strip("'"), prims[1:]
        return f"{key}({', '.join(kids + rest)})"
    if node.ctor == "Leaf":
        return kids[0] if kids else f"leaf{node.args[0]}"
    return f"{node.ctor.lower()}({', '.join(kids + prims)})"


def chosen_nodes(egraph: ExportedEGraph, choice: dict[int, int]) -> Iterable[tuple[int, TermNode]]:
    """(class, chosen e-node) for every class in a choice."""
    for c, k in choice.items():
        yield c, egraph.classes[c][k]
