"""A bounded neighbourhood of the e-graph as a picture.

Breadth-first from one e-class through child classes (``depth`` levels) and,
optionally, parent classes (``up`` levels), stopping at ``max_classes``; each
class shows at most ``max_nodes_per_class`` e-nodes (the chosen one first).
Edges to classes outside the window end in a small stub, so the picture of a
10,000-node model stays as small as the window.
"""

from __future__ import annotations

from collections import deque

from optimus_eqsat.egraph_export import ExportedEGraph
from optimus_eqsat.explore.display import Picture, html_table, quote
from optimus_eqsat.explore.steering import Steering
from optimus_eqsat.explore.terms import node_text

HIDDEN = {"Id"}  # naming nodes: shown as the class's FX names instead


def parents_index(egraph: ExportedEGraph) -> dict[int, set[int]]:
    """Child class -> classes with an e-node that reads it."""
    parents: dict[int, set[int]] = {}
    for c, nodes in enumerate(egraph.classes):
        for n in nodes:
            for ch in n.children:
                parents.setdefault(ch, set()).add(c)
    return parents


def window(
    egraph: ExportedEGraph, start: int, depth: int, up: int, max_classes: int, parents: dict[int, set[int]] | None
) -> list[int]:
    """Classes within ``depth`` below / ``up`` above ``start``, at most ``max_classes``, BFS order."""
    seen = {start: 0}
    order = [start]
    queue = deque([(start, 0, 0)])
    while queue and len(order) < max_classes:
        c, down_d, up_d = queue.popleft()
        steps = []
        if down_d < depth and up_d == 0:
            steps += [(ch, down_d + 1, 0) for n in egraph.classes[c] if n.ctor not in HIDDEN for ch in n.children]
        if parents is not None and up_d < up and down_d == 0:
            steps += [(p, 0, up_d + 1) for p in sorted(parents.get(c, ()))]
        for nxt, dd, ud in steps:
            if nxt not in seen and len(order) < max_classes:
                seen[nxt] = 1
                order.append(nxt)
                queue.append((nxt, dd, ud))
    return order


def neighbourhood_picture(
    egraph: ExportedEGraph,
    start: int,
    *,
    depth: int = 2,
    up: int = 0,
    max_classes: int = 25,
    max_nodes_per_class: int = 8,
    choice: dict[int, int] | None = None,
    steering: Steering | None = None,
    names: dict[int, list[str]] | None = None,
    costs=None,
    parents: dict[int, set[int]] | None = None,
) -> Picture:
    """The window around ``start``: classes as clusters, e-nodes inside, edges to child classes.

    ``costs(c, node)`` (optional) adds each e-node's price to its label.
    """
    choice, names, steering = choice or {}, names or {}, steering or Steering()
    classes = window(egraph, start, depth, up, max_classes, parents if up else None)
    inside = set(classes)
    lines = [
        "digraph egraph {",
        "compound=true; rankdir=TB; node [shape=box, fontsize=9, fontname=Helvetica, height=0.25];",
        "graph [fontsize=10, fontname=Helvetica]; edge [arrowsize=0.5];",
    ]
    edges, stubs, rows = [], set(), []
    anchor: dict[int, str] = {}
    hidden_nodes = 0
    for c in classes:
        nodes = [(k, n) for k, n in enumerate(egraph.classes[c]) if n.ctor not in HIDDEN]
        nodes.sort(key=lambda kn: kn[0] != choice.get(c))
        extra = len(nodes) - max_nodes_per_class
        nodes = nodes[:max_nodes_per_class]
        label = f"c{c}"
        if c in names:
            label += "  " + ", ".join(names[c][:3]) + (" ..." if len(names[c]) > 3 else "")
        if c in egraph.shapes:
            label += "  " + "x".join(map(str, egraph.shapes[c]))
        colour = "#fff2cc" if c == start else "#f5f5f5"
        lines.append(f"subgraph cluster_c{c} {{ label={quote(label)}; style=filled; fillcolor={quote(colour)};")
        for k, n in nodes:
            nid = f"c{c}_{k}"
            anchor.setdefault(c, nid)
            text = f"{k}: {node_text(n)}"
            if costs is not None:
                cost = costs(c, n)
                text += f"\n{cost * 1e6:.2f} us" if cost < float("inf") else "\ninf"
            attrs = []
            state = steering.state(c, k)
            if choice.get(c) == k:
                attrs.append('style="filled,bold", fillcolor="#b6e3b6"')
            if state in ("forbidden", "excluded by pin"):
                attrs.append('color="#cc0000", fontcolor="#cc0000"')
            if state == "pinned":
                attrs.append('penwidth=2.5, color="#006600"')
            lines.append(f"  {nid} [label={quote(text)}{', ' + ', '.join(attrs) if attrs else ''}];")
            rows.append([f"c{c}", k, node_text(n), "chosen" if choice.get(c) == k else "", state])
            for ch in n.children:
                edges.append((nid, ch))
        if extra > 0:
            hidden_nodes += extra
            lines.append(f"  c{c}_more [label={quote(f'+{extra} more')}, shape=plaintext];")
            anchor.setdefault(c, f"c{c}_more")
        if c not in anchor:
            anchor[c] = f"c{c}_empty"
            lines.append(f'  c{c}_empty [label="(naming only)", shape=plaintext];')
        lines.append("}")
    for nid, ch in edges:
        if nid.startswith(f"c{ch}_"):  # a node reading its own class (a cycle): no cluster head
            lines.append(f'{nid} -> {anchor[ch]} [color="#cc8800"];')
        elif ch in inside:
            lines.append(f"{nid} -> {anchor[ch]} [lhead=cluster_c{ch}];")
        else:
            stubs.add(ch)
            lines.append(f"{nid} -> stub{ch};")
    for ch in sorted(stubs):
        lines.append(f'stub{ch} [label={quote(f"c{ch} ...")}, shape=plaintext, fontcolor="#888888"];')
    lines.append("}")
    info = f"{len(classes)} e-classes shown (max_classes={max_classes}, depth={depth}, up={up})"
    if hidden_nodes:
        info += f"; {hidden_nodes} e-nodes hidden (max_nodes_per_class={max_nodes_per_class})"
    if stubs:
        info += f"; {len(stubs)} classes outside the window drawn as stubs"
    fallback = html_table(["class", "node", "e-node", "chosen", "steering"], rows)
    return Picture("\n".join(lines), fallback, f"e-graph around c{start}", info)
