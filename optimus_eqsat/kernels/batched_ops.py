"""Plain PyTorch functions that batched programs call (written into the rebuilt FX graph).

Batching (rewrites/batching/) builds terms whose op keys are these functions:
Inductor traces through them like any torch code.

* :func:`shift_segments`: the index shift of a batched embedding lookup into
  tables laid end to end (one elementwise kernel for all tables); :func:`shift_rows`
  the same for stacked indices (a symbolic batch size).
* The packing helpers of a grouped linear (``gl_item``, ``gl_list``,
  ``gl_cons``) and :func:`grouped_linear_packed`: the term language has only
  fixed-arity ops, so a grouped call's 3N operands travel in a chain of packing
  terms; the rebuilder replaces the chain by one ``grouped_linear`` call (see
  rewrites/batching/grouped_linear.py), and a chain left in a graph still
  computes the right thing through :func:`grouped_linear_packed`.
"""

from __future__ import annotations

import torch

from optimus_eqsat.kernels.grouped_linear import grouped_linear


def shift_segments(idx: torch.Tensor, starts: tuple[int, ...], rows: tuple[int, ...]) -> torch.Tensor:
    """Flat indices of tables laid end to end: position p in segment s (segments start at
    ``starts``, ``starts[0] == 0``) gets ``sum(rows[:s])`` added. One elementwise kernel under
    Inductor (a comparison per boundary), so the index shift of all tables costs one kernel."""
    pos = torch.arange(idx.numel(), device=idx.device)
    out = idx
    for start, previous in zip(starts[1:], rows[:-1]):  # past each boundary, skip the table before it
        out = out + (pos >= start).to(idx.dtype) * previous
    return out


def shift_rows(idx: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """Indices into tables laid end to end, stacked along the first dim: row k gets
    ``sum(rows[:k])`` added. The stacked form of :func:`shift_segments` for indices of a
    symbolic size (the shift depends on the row only, never on the batch size); one
    elementwise kernel under Inductor."""
    row = torch.arange(idx.shape[0], device=idx.device).view(-1, *([1] * (idx.dim() - 1)))
    out = idx
    for k, previous in enumerate(rows[:-1]):  # rows after table k skip it
        out = out + (row > k).to(idx.dtype) * previous
    return out


def gl_item(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> tuple:
    """One member's operands (packing only; erased when the grouped call is emitted)."""
    return (x, w, b)


def gl_list(item: tuple) -> list:
    return [item]


def gl_cons(items: list, item: tuple) -> list:
    return [*items, item]


def grouped_linear_packed(items: list) -> list[torch.Tensor]:
    """The grouped call on packed operands (what a chain left in a graph computes)."""
    return grouped_linear([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
