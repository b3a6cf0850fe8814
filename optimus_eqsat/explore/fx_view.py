"""An FX graph as a picture, its nodes grouped into the kernels the cost model predicts.

Each predicted kernel (``extract.fx_cost.predict_kernels``) is a DOT cluster
labelled with its schedule position, kind and predicted time; nodes outside
every kernel (views, inputs, free cats) are drawn dashed. Parameters
(``get_attr``) are hidden unless asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.fx as fx

from optimus_eqsat import fxvocab
from optimus_eqsat.explore.display import Picture, esc, html_table, quote

KIND_COLOURS = {
    "matmul": "#fbd3c0",
    "pointwise": "#cfe5f2",
    "reduction": "#ddd7ee",
    "cat": "#fdf0c8",
    "gather": "#d5ecd0",
    "opaque": "#e4e4e4",
}


def op_label(gm: fx.GraphModule, node: fx.Node) -> str:
    """A short name of what a node does (the cost model's label of a call; else the node's op)."""
    if node.op not in ("call_module", "call_function", "call_method"):
        return node.op
    try:
        return fxvocab.op_label(gm, node)
    except AttributeError:  # a call_module whose module is gone
        return str(node.target)


def shape_of(node: fx.Node) -> str:
    shape = getattr(fxvocab.meta_value(node), "shape", None)
    return "" if shape is None else "x".join(str(s) for s in shape)


def _kind(kernel) -> str:
    return getattr(kernel.kind, "value", str(kernel.kind))


def kernel_of(kernels: Sequence) -> dict[fx.Node, int]:
    return {n: k for k, kernel in enumerate(kernels) for n in kernel.nodes}


def fx_picture(
    gm: fx.GraphModule, kernels: Sequence, title: str = "", max_nodes: int = 300, show_params: bool = False
) -> Picture:
    """The graph of ``gm`` with ``kernels`` (PredictedKernel list for ``gm``) as clusters."""
    nodes = [n for n in gm.graph.nodes if show_params or n.op != "get_attr"]
    info = ""
    if len(nodes) > max_nodes:
        info = f"showing the first {max_nodes} of {len(nodes)} nodes (max_nodes)"
        nodes = nodes[:max_nodes] + [n for n in nodes[max_nodes:] if n.op == "output"]
    shown = set(nodes)
    ids = {n: f"n{i}" for i, n in enumerate(nodes)}
    where = kernel_of(kernels)
    lines = [
        "digraph fx {",
        "rankdir=TB; newrank=true; node [shape=box, fontsize=10, fontname=Helvetica, height=0.3];",
        "edge [arrowsize=0.6]; graph [fontsize=10, fontname=Helvetica];",
    ]
    for k, kernel in enumerate(kernels):
        members = [n for n in kernel.nodes if n in shown]
        if not members:
            continue
        kind = _kind(kernel)
        label = f"#{k} {kind}  {kernel.seconds * 1e6:.2f} us"
        lines.append(
            f"subgraph cluster_k{k} {{ label={quote(label)}; style=filled; "
            f'fillcolor={quote(KIND_COLOURS.get(kind, "#eeeeee"))}; color="#777777";'
        )
        lines += [f"  {ids[n]};" for n in members]
        lines.append("}")
    for n in nodes:
        label = f"{n.name}\n{op_label(gm, n)}"
        shape = shape_of(n)
        if shape:
            label += f"\n{shape}"
        style = "" if n in where else ', style="dashed"'
        if n.op in ("placeholder", "output"):
            style = ', shape=ellipse, style="filled", fillcolor="#ffffff"'
        lines.append(f"{ids[n]} [label={quote(label)}{style}];")
    for n in nodes:
        for a in n.all_input_nodes:
            if a in shown:
                lines.append(f"{ids[a]} -> {ids[n]};")
    lines.append("}")
    rows = [
        [
            ids[n],
            n.name,
            op_label(gm, n),
            shape_of(n),
            f"#{where[n]} {_kind(kernels[where[n]])}" if n in where else "(no launch)",
            ", ".join(a.name for a in n.all_input_nodes),
        ]
        for n in nodes
    ]
    fallback = html_table(["id", "node", "op", "shape", "kernel", "inputs"], rows)
    launches = f"{len(kernels)} predicted launches, {sum(k.seconds for k in kernels) * 1e6:.1f} us"
    return Picture("\n".join(lines), fallback, f"{title} ({launches})" if title else launches, info)


def kernels_html(kernels: Sequence) -> str:
    """The predicted kernels as an HTML table (one row per launch)."""
    rows = [
        [k, _kind(kr), f"{kr.seconds * 1e6:.2f}", kr.note, ", ".join(n.name for n in kr.nodes)]
        for k, kr in enumerate(kernels)
    ]
    return html_table(["#", "kind", "us", "note", "nodes"], rows)


__all__ = ["fx_picture", "kernels_html", "op_label", "esc"]
