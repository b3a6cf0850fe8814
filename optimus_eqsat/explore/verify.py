"""Numeric check of a rebuilt graph against the original on example inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten


class ExportMismatch(AssertionError):
    """The steered program computes something else than the original."""


def check_same(
    original: torch.fx.GraphModule,
    candidate: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> float:
    """Run both on ``example_inputs``; return the max abs difference or raise ExportMismatch."""
    with torch.no_grad():
        want, _ = tree_flatten(original(*example_inputs))
        got, _ = tree_flatten(candidate(*example_inputs))
    if len(want) != len(got):
        raise ExportMismatch(f"{len(got)} outputs, expected {len(want)}")
    worst = 0.0
    for k, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
                raise ExportMismatch(
                    f"output {k}: {getattr(g, 'shape', type(g))} vs expected {tuple(w.shape)} {w.dtype}"
                )
            if w.numel():
                worst = max(worst, (w.double() - g.double()).abs().max().item())
            if not torch.allclose(w, g, rtol=rtol, atol=atol, equal_nan=True):
                raise ExportMismatch(f"output {k} differs: max abs diff {worst:.3e} (rtol={rtol}, atol={atol})")
        elif w != g:
            raise ExportMismatch(f"output {k}: {g!r} vs expected {w!r}")
    return worst
