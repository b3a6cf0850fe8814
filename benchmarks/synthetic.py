"""Synthetic FX graphs of a given size, built directly (no tracing) so 100,000 nodes is cheap."""

from __future__ import annotations

import operator

import torch
import torch.fx


def split_cat_chain(n_nodes: int, pieces: int = 4, width: int = 8, batch: int = 2) -> tuple[torch.fx.GraphModule, tuple]:
    """A chain of blocks ``x = relu(cat(split(x)))`` (a split, its getitems, a cat and a relu).

    Every block is a split->cat round trip the optimizer removes, so the result
    is a chain of relus. Each node carries ``meta["val"]`` like a Dynamo graph.
    """
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    example = torch.randn(batch, pieces * width)
    x.meta["val"] = example
    per_block = pieces + 3
    meta = torch.empty(batch, pieces * width, device="meta")
    piece_meta = torch.empty(batch, width, device="meta")
    for _ in range(max(1, n_nodes // per_block)):
        split = graph.call_function(torch.split, (x, width), {"dim": 1})
        split.meta["val"] = tuple(piece_meta for _ in range(pieces))
        items = []
        for i in range(pieces):
            item = graph.call_function(operator.getitem, (split, i))
            item.meta["val"] = piece_meta
            items.append(item)
        cat = graph.call_function(torch.cat, (items,), {"dim": 1})
        cat.meta["val"] = meta
        x = graph.call_function(torch.relu, (cat,))
        x.meta["val"] = meta
    graph.output((x,))
    return torch.fx.GraphModule(torch.nn.Module(), graph), (example,)
