"""DDP's buckets against batching: two gloo ranks on loopback train ``torch.compile(DDP(model))``.

Methods:

- ``inductor``: Inductor, DDPOptimizer cutting the graph at its buckets;
- ``pieces``: our backend on each of DDPOptimizer's pieces alone (``whole_ddp_graph=False``,
  the behaviour before the backend decided on the whole graph);
- ``ours``: the default backend, which optimizes Dynamo's whole graph and lets DDPOptimizer cut
  the program it kept (:mod:`optimus_eqsat.ddp_whole_graph`);
- ``one_graph``: our backend with ``optimize_ddp=False``: one graph, no pieces (DDP's reducer
  all-reduces the buckets as the one backward's gradients arrive).

Per model and method:

- **launches**: kernels in Inductor's CPU output code of one training step (forward and
  backward), summed over the pieces, caches off, the optimizer's own program
  (``measure=False``); and how many pieces DDPOptimizer made;
- **step time**: forward, backward (with DDP's all-reduces) and an SGD step, default options
  (measured choice on), in lockstep interleaved rounds on both ranks (a fixed schedule, so the
  ranks' collectives pair up): per round each method takes a turn of warm-up and timed steps,
  the turn's time is the slower rank's; medians and the per-round ratio to Inductor with its
  10th and 90th percentiles (:mod:`benchmarks.stats`). The persistent cache is on, as users
  run: a measured choice an earlier run stored is reused (the ``kept`` column says what each
  compile kept; ``OPTIMUS_EQSAT_CACHE=0`` decides afresh).

Models are ``zoo:NAME@SCALE`` (:mod:`benchmarks.zoo`) or ``library:NAME`` (the library-style
models of ``tests/library_style.py``, batch norm and dropout in training).

    python -m benchmarks.ddp_buckets --out benchmarks/results/ddp_buckets.md
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from benchmarks.stats import spread

DEFAULT_MODELS = ("zoo:mmoe@12", "zoo:ple@6", "library:deepctr.PLE")
STEP_METHODS = ("inductor", "pieces", "ours", "one_graph")
COUNT_METHODS = ("inductor", "pieces", "ours", "one_graph")
WORLD = 2


def build(name: str, batch: int) -> tuple[torch.nn.Module, tuple]:
    """The model and inputs named ``zoo:NAME@SCALE`` or ``library:NAME``."""
    kind, _, rest = name.partition(":")
    if kind == "zoo":
        from benchmarks.zoo import MODELS

        model, _, scale = rest.partition("@")
        spec = MODELS[model]
        return spec.build(scale=int(scale or 1)), spec.inputs(batch, scale=int(scale or 1))
    if kind == "library":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.library_style import BUILDERS

        return BUILDERS[rest](batch)
    raise ValueError(f"unknown model {name!r}: zoo:NAME@SCALE or library:NAME")


def _loss(out: Any) -> torch.Tensor:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return sum(o.float().square().mean() for o in outs)


def _backend(method: str, measure: bool) -> Any:
    from optimus_eqsat.backend import make_backend

    if method == "inductor":
        return "inductor"
    if method == "pieces":
        return make_backend(measure=measure, whole_ddp_graph=False)
    return make_backend(measure=measure)  # (measure=True: the default backend's options)


def _step(name: str, method: str, batch: int, bucket_mb: float, measure: bool) -> tuple[Callable[[], None], Any]:
    """One method's training step on this rank's shard, compiled (not yet called)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model, inputs = build(name, batch)
    model.train()
    ddp = DDP(model, bucket_cap_mb=bucket_mb)
    backend = _backend(method, measure)
    compiled = torch.compile(ddp, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        _loss(compiled(*inputs)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, backend


def count(name: str, method: str, batch: int, bucket_mb: float) -> dict[str, Any]:
    """Kernels in the output code of one step of ``method`` (caches off, no measured choice)."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    from optimus_eqsat.inductor_count import count_kernels_in_code

    torch._dynamo.reset()
    patch = torch._dynamo.config.patch(optimize_ddp=method != "one_graph")
    with patch, config.patch(force_disable_caches=True):
        step, backend = _step(name, "ours" if method == "one_graph" else method, batch, bucket_mb, measure=False)
        _, codes = run_and_get_code(step)
    launches = sum(sum(count_kernels_in_code(code)) for code in codes)
    reports = getattr(backend, "reports", [])
    pieces = [r.ddp_pieces[1] for r in reports if r.ddp_pieces is not None]
    return {"launches": launches, "graphs": len(codes), "pieces": pieces[0] if pieces else None}


def _turn(step: Callable[[], None], warmup: int, steps: int) -> float:
    """Milliseconds per step of a turn on the slower rank."""
    import torch.distributed as dist

    for _ in range(warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = torch.tensor([(time.perf_counter() - start) * 1e3 / steps])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def time_methods(name: str, batch: int, bucket_mb: float, rounds: int, warmup: int, steps: int) -> dict[str, Any]:
    """Interleaved lockstep rounds of every step method (default options)."""
    compiled, first_call_s, kept = {}, {}, {}
    for method in STEP_METHODS:
        torch._dynamo.reset()
        step, backend = _step(name, "ours" if method == "one_graph" else method, batch, bucket_mb, measure=True)
        start = time.perf_counter()
        with torch._dynamo.config.patch(optimize_ddp=method != "one_graph"):
            step()  # compiles (ours: and decides on the first real call)
        first_call_s[method] = time.perf_counter() - start
        compiled[method] = step
        kept[method] = [
            r.measured.kept if r.measured is not None else ("original" if r.fell_back else "optimized")
            for r in getattr(backend, "reports", [])
        ]
    round_ms: dict[str, list[float]] = {m: [] for m in STEP_METHODS}
    for r in range(rounds):
        order = STEP_METHODS[r % len(STEP_METHODS) :] + STEP_METHODS[: r % len(STEP_METHODS)]
        for method in order:
            round_ms[method].append(_turn(compiled[method], warmup, steps))
    result: dict[str, Any] = {"first_call_s": first_call_s, "kept": kept}
    for method in STEP_METHODS:
        result[f"{method}_ms"] = spread(round_ms[method]).median
        ratios = [a / b for a, b in zip(round_ms[method], round_ms["inductor"])]
        result[f"{method}_ratio"] = str(spread(ratios))
    return result


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=600)
    )
    # DDPOptimizer asserts its first bucket (1 MiB in torch) is no larger than the others
    dist._DEFAULT_FIRST_BUCKET_BYTES = min(dist._DEFAULT_FIRST_BUCKET_BYTES, int(args.bucket_mb * 2**20))
    results = {}
    try:
        for name in args.models:
            row: dict[str, Any] = {"model": name}
            for method in COUNT_METHODS:
                row[f"count_{method}"] = count(name, method, args.batch, args.bucket_mb)
            if args.rounds:
                row.update(time_methods(name, args.batch, args.bucket_mb, args.rounds, args.warmup, args.steps))
            results[name] = row
            if rank == 0:
                print(json.dumps(row), flush=True)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def table(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines = [
        f"Two gloo ranks (loopback, 1 thread each), batch {args.batch} per rank, `bucket_cap_mb={args.bucket_mb}` "
        f"(first bucket {min(1.0, args.bucket_mb):g} MiB), "
        f"{args.rounds} lockstep rounds of {args.warmup} + {args.steps} steps.",
        "",
        "| model | launches (graphs): Inductor | ours per piece | ours whole graph | one graph "
        "| step ms: Inductor | ours per piece (ratio) | ours whole graph (ratio) | ours one graph (ratio) "
        "| kept: per piece; whole; one graph |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results.values():

        def launches(method: str) -> str:
            c = row[f"count_{method}"]  # noqa: B023 (called within this iteration)
            return f"{c['launches']} ({c['graphs']} graphs)"

        kept = row.get("kept", {})
        steps = (
            (
                f"{row['inductor_ms']:.2f} | {row['pieces_ms']:.2f} ({row['pieces_ratio']}) | "
                f"{row['ours_ms']:.2f} ({row['ours_ratio']}) | {row['one_graph_ms']:.2f} ({row['one_graph_ratio']}) | "
                + "; ".join(", ".join(kept.get(m, [])) or "-" for m in ("pieces", "ours", "one_graph"))
            )
            if "inductor_ms" in row
            else "- | - | - | - | -"
        )
        lines.append(
            f"| {row['model']} | {launches('inductor')} | {launches('pieces')} | {launches('ours')} | "
            f"{launches('one_graph')} | {steps} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw = Path(tempfile.mkdtemp()) / "ddp_buckets.json"
    mp.start_processes(_worker, args=(port, args, str(raw)), nprocs=WORLD, start_method="spawn")
    lines = table(json.loads(raw.read_text()), args)
    command = "python -m benchmarks.ddp_buckets " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join([*lines, "", f"`{command}`", ""])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# DDP buckets and batching\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
