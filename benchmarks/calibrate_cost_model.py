"""Calibrate the launch model against the kernels Inductor really emits.

For each (name, model, inputs) case the graph Dynamo hands to Inductor is
captured, :func:`predicted_launches` is evaluated on it (CPU "cpp" fusion
flavour, and the GPU "triton" flavour for reference), and compared with
:func:`count_inductor_kernels` on the CPU. Usage::

    python benchmarks/calibrate_cost_model.py

Other drivers (the benchmark zoo, graphs from ``optimize_graph``) pass their
own case list to :func:`calibrate`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from optimus_eqsat.extract.fx_cost import predicted_launches
from optimus_eqsat.inductor_count import capture_dynamo_graphs, count_inductor_kernels

Case = tuple[str, Callable, Sequence[Any]]


# --------------------------------------------------------------------------
# Small in-file models
# --------------------------------------------------------------------------


class TowerStack(nn.Module):
    """Parallel MLP towers on slices of the input, concatenated, then a head."""

    def __init__(self, towers: int = 8, width: int = 32, depth: int = 3):
        super().__init__()
        self.width = width
        self.towers = nn.ModuleList(
            nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(width, width), nn.ReLU())])
            for _ in range(towers)
        )
        self.head = nn.Linear(towers * width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.split(self.width, dim=1)
        return torch.sigmoid(self.head(torch.cat([t(p) for t, p in zip(self.towers, parts)], dim=1)))


class SplitCatHeavy(nn.Module):
    """Split/cat plumbing: shuffles, stacks, pointwise on pieces, a linear."""

    def __init__(self, pieces: int = 8, width: int = 16):
        super().__init__()
        self.pieces, self.width = pieces, width
        self.proj = nn.Linear(pieces * width, pieces * width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        parts = list(x.split(self.width, dim=1))
        shuffled = torch.cat(parts[::-1], dim=1)
        y = self.proj(shuffled)
        pieces = [p.tanh() * 2 for p in y.split(self.width, dim=1)]
        stacked = torch.stack(pieces, dim=1)  # (b, pieces, width)
        merged = torch.cat([stacked.sum(1), parts[0] + parts[1]], dim=1)
        return merged.relu(), torch.cat(list(stacked.unbind(1)), dim=1) + y


class LayerNormLinearBlock(nn.Module):
    """Pre-norm MLP blocks with residuals (transformer feed-forward style)."""

    def __init__(self, width: int = 64, blocks: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln": nn.LayerNorm(width),
                    "up": nn.Linear(width, 2 * width),
                    "down": nn.Linear(2 * width, width),
                }
            )
            for _ in range(blocks)
        )
        self.final = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b["down"](nn.functional.gelu(b["up"](b["ln"](x))))
        return self.final(x)


class EmbeddingPool(nn.Module):
    """Several embedding tables, pooled, concatenated, then an MLP."""

    def __init__(self, tables: int = 4, rows: int = 100, dim: int = 16):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        self.mlp = nn.Sequential(nn.Linear(tables * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pooled = [e(idx[:, i]).mean(dim=1) for i, e in enumerate(self.embs)]
        return self.mlp(torch.cat(pooled, dim=1))


def default_cases(batch: int = 16) -> list[Case]:
    """The small calibration models of this file."""
    torch.manual_seed(0)
    return [
        ("tower_stack", TowerStack(), (torch.randn(batch, 8 * 32),)),
        ("split_cat_heavy", SplitCatHeavy(), (torch.randn(batch, 8 * 16),)),
        ("layernorm_linear", LayerNormLinearBlock(), (torch.randn(batch, 64),)),
        ("embedding_pool", EmbeddingPool(), (torch.randint(0, 100, (batch, 4, 5)),)),
    ]


# --------------------------------------------------------------------------
# Calibration loop
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationRow:
    """Predicted vs measured launches of one case."""

    name: str
    nodes: int
    predicted_cpu: int
    predicted_gpu: int
    inductor_generated: int
    inductor_extern: int
    seconds: float

    @property
    def inductor_total(self) -> int:
        return self.inductor_generated + self.inductor_extern

    @property
    def ratio(self) -> float:
        """predicted (CPU flavour) / measured; 1.0 is perfect."""
        return self.predicted_cpu / max(self.inductor_total, 1)


def calibrate_case(name: str, model: Callable, inputs: Sequence[Any]) -> CalibrationRow:
    """Predict on the Dynamo graph(s) and count Inductor's CPU kernels."""
    start = time.perf_counter()
    if isinstance(model, nn.Module):
        model.eval()
    graphs = capture_dynamo_graphs(model, inputs)
    nodes = sum(len(gm.graph.nodes) for gm in graphs)
    cpu = sum(predicted_launches(gm, profile="cpu") for gm in graphs)
    gpu = sum(predicted_launches(gm, profile="h100") for gm in graphs)
    measured = count_inductor_kernels(model, inputs)
    return CalibrationRow(name, nodes, cpu, gpu, measured.generated, measured.extern, time.perf_counter() - start)


def calibrate(cases: Iterable[Case]) -> list[CalibrationRow]:
    """One :class:`CalibrationRow` per (name, model, inputs) case; a case that
    fails (e.g. Inductor cannot compile it) is reported and skipped."""
    rows = []
    for name, model, inputs in cases:
        try:
            rows.append(calibrate_case(name, model, inputs))
        except Exception as exc:
            print(f"{name}: FAILED ({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]})")
    return rows


def format_table(rows: Sequence[CalibrationRow]) -> str:
    """A plain-text table (markdown-compatible)."""
    header = ("case", "fx nodes", "pred cpu", "inductor gen+ext", "ratio", "pred gpu", "s")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.nodes} | {r.predicted_cpu} | {r.inductor_generated}+{r.inductor_extern}"
            f"={r.inductor_total} | {r.ratio:.2f} | {r.predicted_gpu} | {r.seconds:.1f} |"
        )
    return "\n".join(lines)


def zoo_cases(batch: int = 16, names: Sequence[str] | None = None) -> list[Case]:
    """Each zoo model, and its graph after optimize_graph (same inputs), as cases."""
    from benchmarks.zoo import MODELS
    from optimus_eqsat import optimize_graph

    cases: list[Case] = []
    for name, spec in MODELS.items():
        if names and name not in names:
            continue
        model = spec.build(scale=1, seed=0).eval()
        inputs = spec.inputs(batch, 0)
        cases.append((name, model, inputs))
        try:
            optimized = optimize_graph(torch.fx.symbolic_trace(model), inputs, profile="cpu")
        except Exception as exc:  # a model symbolic_trace cannot take: original only
            print(f"{name}: no optimized case ({type(exc).__name__}: {exc})")
            continue
        cases.append((f"{name} (optimized)", optimized, inputs))
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--zoo", action="store_true", help="calibrate on the benchmark zoo, original and optimized")
    parser.add_argument("--models", default="", help="comma-separated zoo models (with --zoo)")
    parser.add_argument(
        "--out", default="", help="also write the table to this file (e.g. benchmarks/results/calibration_zoo.md)"
    )
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    rows = calibrate(zoo_cases(args.batch, names) if args.zoo else default_cases(args.batch))
    table = format_table(rows)
    print(table)
    worst = max((abs(r.ratio - 1.0) for r in rows), default=0.0)
    print(f"worst relative error: {worst:.0%}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + f"\n\nworst relative error: {worst:.0%}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
