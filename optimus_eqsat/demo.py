"""The built-in default model of the quick start, and the demo that runs it.

A compact recommendation model with what Optimus was built for: per-feature
towers fed by splits of one dense block, split/cat round trips, unbind/stack
plumbing, and many small same-shaped linears.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn


class DemoRecModel(nn.Module):
    """Dense block -> per-feature tower (layer_norm, linear, relu) -> concat -> head."""

    def __init__(self, features: int = 8, width: int = 16, hidden: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.features, self.width = features, width
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(features))
        self.towers = nn.ModuleList(nn.Linear(width, hidden) for _ in range(features))
        self.head = nn.Linear(features * hidden, 1)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(dense, self.width, dim=1)
        # split -> cat round trip that normalization passes leave behind
        regrouped = torch.cat([pieces[i] for i in range(self.features)], dim=1)
        pieces = regrouped.split(self.width, dim=1)
        towers = [torch.relu(self.towers[i](self.norms[i](pieces[i]))) for i in range(self.features)]
        stacked = torch.stack(towers, dim=0)
        flat = torch.cat(torch.unbind(stacked, dim=0), dim=1)
        return torch.sigmoid(self.head(flat))

    def example_inputs(self, batch: int = 64, seed: int = 0) -> tuple[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, self.features * self.width, generator=generator),)


def run_demo(profile: str = "h100", extractor: str = "auto", features: int = 8) -> int:
    """Optimize the demo model's FX graph and print what happened; 0 when numerics match."""
    from .api import optimize_graph

    model = DemoRecModel(features=features).eval()
    inputs = model.example_inputs()
    gm = torch.fx.symbolic_trace(model)
    start = time.perf_counter()
    optimized = optimize_graph(gm, inputs, profile=profile, extractor=extractor)
    elapsed = time.perf_counter() - start
    report = optimized.meta["optimus_eqsat"]
    print(f"optimus-eqsat demo: {type(model).__name__} ({features} features), profile {profile}")
    print(report.summary())
    print(f"optimizer wall time:  {elapsed:.2f} s")
    with torch.no_grad():
        expected, got = model(*inputs), optimized(*inputs)
    error = (expected - got).abs().max().item()
    ok = torch.allclose(expected, got, rtol=1e-4, atol=1e-5)
    print(f"numeric check vs eager: max abs diff {error:.2e} -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1
