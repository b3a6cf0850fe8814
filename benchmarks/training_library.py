"""Issue 26's targets: training steps of library-style recommendation models.

Models: the re-implementations of torch-rechub's and deepctr-torch's MLP/DNN, MMOE
and PLE in ``tests/library_style.py`` (rechub with its defaults, deepctr with
``dnn_use_bn=True, dnn_dropout=0.1``; ``+ckpt``: every expert called through
``torch.utils.checkpoint``), or with ``--source library`` the libraries' own MMOE
and PLE (``pip install torch-rechub deepctr-torch``; built as
``benchmarks/library_models.py`` builds them, deepctr's with batch norm and a dropout
of 0.1).

Per model:

- **launches** of one training step (forward + backward, kernels in Inductor's CPU
  output code, :func:`optimus_eqsat.inductor_count.count_inductor_kernels`, caches
  off) under Inductor's defaults, Inductor with its Optimus passes
  (``benchmarks/methods.py``'s ``OPTIMUS_PRE_GRAD`` / ``OPTIMUS_POST_GRAD``) and ours
  (``make_backend(measure=False, profile="h200")``: the optimizer deciding for a GPU
  profile; beside it the nodes its pre- and post-grad passes gave a batched alternative,
  ``report.batched``, whether extraction kept them or not);
- **step time** on the CPU (``--batches``, one thread) of the default backend
  (``backend="optimus_eqsat"``, measured choice on) against Inductor's (``--time-models``:
  by default the issue's four targets, rechub and deepctr MMOE and PLE), in interleaved
  rounds (:func:`benchmarks.library_models.time_step`): each method's median step and
  the median per-round ratio with its 10th and 90th percentiles.

    python -m benchmarks.training_library --out benchmarks/results/training_library/style.md
    python -m benchmarks.training_library --source library \\
        --out benchmarks/results/training_library/library.md

``--append`` keeps the rows of an earlier run into ``--out`` and runs only the models it
lacks (a long run finished in parts; the table lists every command).

The issue's targets: launches at most 0.5x Inductor and 0.7x Inductor+Optimus
(checkpointed: 0.6x Inductor); step time at most 1.02x Inductor at every batch and
0.9x at batch 32.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.library_models import Case, library_cases, time_step
from benchmarks.methods import OPTIMUS_POST_GRAD, OPTIMUS_PRE_GRAD
from benchmarks.rounds import RoundPlan
from optimus_eqsat.inductor_count import count_inductor_kernels

STYLE_MODELS = (
    "rechub.MLP",
    "rechub.MMOE",
    "rechub.PLE",
    "deepctr.DNN",
    "deepctr.MMOE",
    "deepctr.PLE",
    "rechub.MMOE+ckpt",
    "rechub.PLE+ckpt",
    "deepctr.MMOE+ckpt",
    "deepctr.PLE+ckpt",
)
LIBRARY_MODELS = ("rechub.MMOE", "rechub.PLE", "deepctr.MMOE", "deepctr.PLE")
TIMED_MODELS = ("rechub.MMOE", "rechub.PLE", "deepctr.MMOE", "deepctr.PLE")  # the step-time targets
COUNTS = ("inductor", "inductor_optimus", "ours")


def _deepctr_training(name: str) -> Callable[[int], Case]:
    """deepctr-torch's ``name`` (MMOE or PLE) with ``dnn_use_bn=True, dnn_dropout=0.1``, on the
    feature columns and inputs of :mod:`benchmarks.library_models`."""
    import deepctr_torch.models as dc
    from deepctr_torch.inputs import DenseFeat, SparseFeat

    def build(batch: int) -> Case:
        columns = [SparseFeat(f"s{i}", 50, embedding_dim=8) for i in range(6)] + [
            DenseFeat(f"d{i}", 1) for i in range(3)
        ]
        model = getattr(dc, name)(columns, dnn_use_bn=True, dnn_dropout=0.1)
        x = torch.cat([torch.randint(0, 50, (batch, 6)).float(), torch.randn(batch, 3)], dim=1)
        return model, (x,)

    return build


def builders(source: str) -> dict[str, Callable[[int], Case]]:
    """Name -> builder ``(batch) -> (model, inputs)`` of the library-style models or the libraries' own."""
    if source == "style":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.library_style import BUILDERS

        return dict(BUILDERS)
    cases = library_cases()
    return {
        "rechub.MMOE": cases["rechub.MMOE"],
        "rechub.PLE": cases["rechub.PLE"],
        "deepctr.MMOE": _deepctr_training("MMOE"),
        "deepctr.PLE": _deepctr_training("PLE"),
    }


#: ``--autocast`` names
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class AutocastInside(torch.nn.Module):
    """``model`` called under ``torch.autocast`` entered inside the compiled forward (a region
    of Dynamo's graph, as in a training step that enters it itself)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, *inputs: Any) -> Any:
        with torch.autocast("cpu", dtype=self.dtype):
            return self.model(*inputs)


def _autocast_inside(build: Callable[[int], Case], dtype: torch.dtype) -> Callable[[int], Case]:
    def wrapped(batch: int) -> Case:
        model, inputs = build(batch)
        return AutocastInside(model, dtype), inputs

    return wrapped


def count_launches(build: Callable[[int], Case], config: str, batch: int) -> tuple[int, int]:
    """(kernels of one training step under ``config``, nodes our passes gave a batched alternative in
    the e-graph, whether extraction kept it or not: 0 for Inductor's)."""
    torch.manual_seed(0)
    model, inputs = build(batch)
    kwargs: dict[str, Any] = {"training": True, "options": {"force_disable_caches": True}}
    backend = None
    if config == "inductor_optimus":
        kwargs["fusion_options"] = {**OPTIMUS_PRE_GRAD, **OPTIMUS_POST_GRAD}
    elif config == "ours":
        from optimus_eqsat.backend import make_backend

        backend = make_backend(measure=False, profile="h200")
        kwargs["backend"] = backend
    total = count_inductor_kernels(model, inputs, **kwargs).total
    reports = [*getattr(backend, "reports", []), *(r for _, r in getattr(backend, "post_grad_reports", []))]
    return total, sum(sum(r.batched.values()) for r in reports if not r.fell_back)


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def table(rows: list[dict[str, Any]], batches: list[int]) -> list[str]:
    """One markdown row per model: launches and their ratios, then per batch the step times."""
    head = ["model", "Inductor", "+Optimus", "ours", "ours / Inductor", "ours / +Optimus", "batched alternatives"]
    for b in batches:
        head += [f"b{b} Inductor ms", f"b{b} ours ms", f"b{b} ours / Inductor [p10, p90] (rounds)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["model"],
            *(str(r.get(c, "-")) for c in COUNTS),
            _ratio(r.get("ours"), r.get("inductor")),
            _ratio(r.get("ours"), r.get("inductor_optimus")),
            str(r.get("batches", "-")),
        ]
        for b in batches:
            if f"b{b}_ratio" in r:
                cells += [
                    f"{r[f'b{b}_inductor_ms']:.2f}",
                    f"{r[f'b{b}_ours_ms']:.2f}",
                    f"{r[f'b{b}_ratio']:.2f} [{r[f'b{b}_ratio_p10']:.2f}, {r[f'b{b}_ratio_p90']:.2f}] "
                    f"({r[f'b{b}_rounds']})",
                ]
            else:
                cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def previous(out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows (without errors) and commands of an earlier run into ``out``, for ``--append``."""
    if not out.with_suffix(".csv").exists():
        return [], []
    with open(out.with_suffix(".csv"), newline="") as fh:
        rows = [{k: _number(v) for k, v in r.items() if v != ""} for r in csv.DictReader(fh)]
    commands = out.with_suffix(".commands").read_text().splitlines() if out.with_suffix(".commands").exists() else []
    return [r for r in rows if not r.get("error")], commands


def write(out: Path, commands: list[str], rows: list[dict[str, Any]], batches: list[int], note: str) -> None:
    """The markdown table (with the commands and what was measured), a CSV of every column and the
    commands beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    errors = [f"- {r['model']}: {r['error']}" for r in rows if r.get("error")]
    out.with_suffix(".commands").write_text("\n".join(commands) + "\n")
    out.write_text(
        "# Training steps of library-style recommendation models (issue 26)\n\n"
        + "".join(f"Command: `{c}`\n\n" for c in commands)
        + f"{note}\n\n"
        + "\n".join(table(rows, batches))
        + "\n"
        + ("\nErrors:\n\n" + "\n".join(errors) + "\n" if errors else "")
    )
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, keys)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--source",
        choices=("style", "library"),
        default="style",
        help="tests/library_style.py's models, or the installed libraries' own",
    )
    parser.add_argument("--models", default="", help="comma-separated names (default: every model of the source)")
    parser.add_argument("--count-batch", type=int, default=32, help="batch of the launch counts")
    parser.add_argument("--batches", default="32,256", help="batches of the step times ('' for none)")
    parser.add_argument(
        "--time-models",
        default=",".join(TIMED_MODELS),
        help="the models whose step time is measured ('all': every model counted)",
    )
    parser.add_argument(
        "--autocast",
        choices=("bf16", "fp16"),
        help="count and time every model under torch.autocast('cpu', dtype) around the call",
    )
    parser.add_argument(
        "--autocast-inside",
        action="store_true",
        help="with --autocast: enter it inside the compiled forward instead (a region of Dynamo's graph)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-rounds", type=int, default=15)
    parser.add_argument("--max-timing-s", type=float, default=40.0, help="no round starts after this, per case")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/training_library/style.md"))
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows (and commands) of an earlier run into --out; its models are not rerun",
    )
    args = parser.parse_args(argv)
    if args.autocast_inside and not args.autocast:
        parser.error("--autocast-inside needs --autocast")
    torch.set_num_threads(args.threads)
    cases = builders(args.source)
    default = STYLE_MODELS if args.source == "style" else LIBRARY_MODELS
    names = [n for n in args.models.split(",") if n] or list(default)
    batches = [int(b) for b in args.batches.split(",") if b]
    plan = RoundPlan(max_rounds=args.max_rounds, max_seconds=args.max_timing_s)
    command = "python -m benchmarks.training_library " + " ".join(argv if argv is not None else sys.argv[1:])
    rows, commands = previous(args.out) if args.append else ([], [])
    commands.append(command)
    names = [n for n in names if n not in {r["model"] for r in rows}]
    note = (
        f"Launches: one training step (forward + backward) at batch {args.count_batch}, kernels in Inductor's CPU "
        'output code; ours = `make_backend(measure=False, profile="h200")`; "batched alternatives": nodes its '
        "pre- and post-grad passes gave a batched alternative (`report.batched`), kept or not. Step time: wall clock, CPU, "
        f"{args.threads} thread(s), default backend (measured choice on) against Inductor, interleaved rounds; "
        "ratio = median of per-round ratios [p10, p90]."
    )
    if args.autocast and args.autocast_inside:
        note += (
            f" Every model's forward entering `torch.autocast('cpu', dtype={AUTOCAST_DTYPES[args.autocast]})` itself."
        )
        cases = {n: _autocast_inside(build, AUTOCAST_DTYPES[args.autocast]) for n, build in cases.items()}
    elif args.autocast:
        note += f" Everything under `torch.autocast('cpu', dtype={AUTOCAST_DTYPES[args.autocast]})` around the call."
    for name in names:
        row: dict[str, Any] = {"model": name}
        rows.append(row)
        around = args.autocast and not args.autocast_inside
        autocast = torch.autocast("cpu", dtype=AUTOCAST_DTYPES[args.autocast]) if around else contextlib.nullcontext()
        try:
            with autocast:
                for config in COUNTS:
                    start = time.perf_counter()
                    row[config], batched = count_launches(cases[name], config, args.count_batch)
                    if config == "ours":
                        row["batches"] = batched
                    seconds = time.perf_counter() - start
                    print(f"{name} {config}: {row[config]} launches ({seconds:.0f} s)", flush=True)
                for batch in batches if args.time_models == "all" or name in args.time_models.split(",") else []:
                    timed = time_step(cases[name], batch, True, plan)
                    row.update({f"b{batch}_{k}": v for k, v in timed.items()})
                    print(f"{name} b{batch}: " + ", ".join(f"{k} {v:.3g}" for k, v in timed.items()), flush=True)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the run
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            print(f"{name}: {row['error']}", flush=True)
        write(args.out, commands, rows, batches, note)
    print("\n".join(table(rows, batches)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
