"""E-nodes as text, and the original term of every FX node inside the e-graph.

Every FX node i was loaded as ``Union(Id(i), TERM)``; :class:`TermIndex` finds
that TERM's e-node again in the saturated e-graph (by constructor and
canonical children), so "what was there" and "what was chosen" can be put side
by side.
"""

from __future__ import annotations

from collections.abc import Iterable

from optimus_eqsat.egraph_export import ClassRef, ExportedEGraph, TermNode
from optimus_eqsat.term import CTORS, OP_CTORS, Id, ListTerm, Term
from optimus_eqsat.translate import Translation

MAX_LIST_SHOWN = 8


class TermIndex:
    """Maps each FX node of a translation to its original e-node ``(class, index)``."""

    def __init__(self, translation: Translation, egraph: ExportedEGraph):
        self.t, self.eg = translation, egraph
        self._by_key: dict[tuple, int] | None = None

    def _key_index(self) -> dict[tuple, int]:
        if self._by_key is None:
            self._by_key = {(n.ctor, n.args): c for c, nodes in enumerate(self.eg.classes) for n in nodes}
        return self._by_key

    def original_term(self, fx_index: int) -> Term | None:
        """The term loaded for FX node ``fx_index`` (None if it had none)."""
        return self.t.terms.get(fx_index)

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
        stack: list[tuple[object, bool]] = [(term, False)]  # post-order; each sub-term resolves to a ClassRef
        while stack:
            v, expanded = stack.pop()
            if not isinstance(v, (Term, ListTerm)):
                continue
            if isinstance(v, Id):
                done[id(v)] = ClassRef(cls[v.i]) if v.i in cls else None
                continue
            values = [getattr(v, f) for f in CTORS[v.ctor].field_names]
            if not expanded:
                stack.append((v, True))
                stack.extend((x, False) for x in values if isinstance(x, (Term, ListTerm)))
                continue
            args = tuple(done.get(id(x)) if isinstance(x, (Term, ListTerm)) else x for x in values)
            c = index.get((v.ctor, args))
            if c is None:
                return []
            done[id(v)] = ClassRef(c)
            out.append((c, self.eg.classes[c].index(TermNode(v.ctor, args))))
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
    if head in OP_CTORS and args and isinstance(args[0], str):
        head = f"{head}[{args[0]}]"
        args = args[1:]
    shown = ", ".join(f"c{a.index}" if isinstance(a, ClassRef) else repr(a) for a in args)
    return f"{head}({shown})"


def expression(
    egraph: ExportedEGraph, c: int, choice: dict[int, int], depth: int = 2, names: dict[int, list[str]] | None = None
) -> str:
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
    members: list[int] = []
    more = False
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
    if node.ctor in OP_CTORS:
        key, rest = prims[0].strip("'"), prims[1:]
        return f"{key}({', '.join(kids + rest)})"
    if node.ctor == "Leaf":
        return kids[0] if kids else f"leaf{node.args[0]}"
    return f"{node.ctor.lower()}({', '.join(kids + prims)})"


def chosen_nodes(egraph: ExportedEGraph, choice: dict[int, int]) -> Iterable[tuple[int, TermNode]]:
    """(class, chosen e-node) for every class in a choice."""
    for c, k in choice.items():
        yield c, egraph.classes[c][k]
