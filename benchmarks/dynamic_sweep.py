"""Dynamic batch sweep: every zoo model compiled with a symbolic batch dim against static shapes.

For each model: the optimizer's predicted launches with static shapes and with
``dynamic=True`` (compiled once at ``--compile-batch``), how many times Dynamo
compiled again while the dynamic program ran at the other batch sizes, and the
largest difference from eager at each batch size, forward and gradients (float
inputs and parameters). ``--inductor`` adds Inductor's CPU kernel count
(forward and backward, :mod:`optimus_eqsat.inductor_count`) through our backend,
static and dynamic.

The optimizer runs with the behaviour snapshot's exact extractor and far time
limits (``DETERMINISTIC``), so a loaded machine does not change the result.
Graphs run eagerly through ``make_backend(inductor=False)``; Dynamo is asked to
specialize floats, which is what the Inductor path ends with (under
``dynamic=True`` Dynamo first lifts float attributes such as a layer norm's eps
to tensor inputs, Inductor restarts the trace with them specialized, and our
backend sees that second graph).

    python -m benchmarks.dynamic_sweep                 # all seven zoo models
    python -m benchmarks.dynamic_sweep --models dlrm --inductor
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.behaviour_snapshot import DETERMINISTIC
from benchmarks.zoo import MODELS
from optimus_eqsat.backend import make_backend

BATCHES = (1, 7, 256)
COMPILE_BATCH = 16


@dataclass
class SweepRow:
    """One model's static and dynamic results."""

    model: str
    static_launches: tuple[int | None, int | None]  # (before, after) the optimizer, static shapes
    dynamic_launches: tuple[int | None, int | None]  # the same, symbolic batch
    recompiles: int  # compiles after the first while running the dynamic program at BATCHES
    max_diff: dict[int, float] = field(default_factory=dict)  # batch -> max abs diff (outputs and grads)
    close: bool = True  # every output and gradient close to eager's at every batch size
    fell_back: str | None = None  # the dynamic optimization's fallback reason
    same_batches: bool = True  # static and dynamic formed and kept the same batches
    inductor_static: int | None = None
    inductor_dynamic: int | None = None
    seconds: float = 0.0


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _outputs_and_grads(model: Any, inputs: Sequence[torch.Tensor], mark_batch: bool = False) -> list[torch.Tensor]:
    """Outputs, then gradients of their weighted sum wrt float inputs and parameters.
    ``mark_batch``: mark the batch dim of every input dynamic (``mark_dynamic``)."""
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    for x in leaves if mark_batch else ():
        torch._dynamo.mark_dynamic(x, 0)
    outs = _flat(model(*leaves))
    wrt = [x for x in leaves if x.requires_grad] + [p for p in model.parameters() if p.requires_grad]
    loss = sum((o * (k + 1)).sum() for k, o in enumerate(outs) if o.is_floating_point())
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [o.detach() for o in outs] + [g for g in grads if g is not None]


def compare(reference: torch.nn.Module, candidate: Any, inputs: Sequence[torch.Tensor]) -> tuple[float, bool]:
    """Largest absolute difference between the two, outputs and gradients, and whether every
    tensor is close (rtol 1e-4, atol 1e-5: gradients of a large batch sum large numbers)."""
    want, got = _outputs_and_grads(reference, inputs), _outputs_and_grads(candidate, inputs)
    assert len(want) == len(got), (len(want), len(got))
    diff = max(float((w - g).abs().max()) if w.numel() else 0.0 for w, g in zip(want, got))
    return diff, all(torch.allclose(g, w, rtol=1e-4, atol=1e-5) for w, g in zip(want, got))


def _compile(model: torch.nn.Module, dynamic: bool, **options: Any) -> tuple[Any, Any]:
    backend = make_backend(inductor=False, **{**DETERMINISTIC, **options})
    return torch.compile(model, backend=backend, dynamic=False if not dynamic else None), backend


def sweep_model(
    name: str,
    batches: Sequence[int] = BATCHES,
    compile_batch: int = COMPILE_BATCH,
    inductor: bool = False,
    **options: Any,
) -> SweepRow:
    """One model's row (module in train mode, so gradients are compared)."""
    start = time.perf_counter()
    spec = MODELS[name]
    model = spec.build()
    with torch._dynamo.config.patch(specialize_float=True):
        torch._dynamo.reset()
        static, static_backend = _compile(model, False, **options)
        _outputs_and_grads(static, spec.inputs(compile_batch, 0))
        torch._dynamo.reset()
        dynamic, backend = _compile(model, True, **options)
        _outputs_and_grads(dynamic, spec.inputs(compile_batch, 0), mark_batch=True)
        results = {b: compare(model, dynamic, spec.inputs(b, 1)) for b in batches if b != 1}
        recompiles = len(backend.reports) - 1  # batch 1 comes last: Dynamo's 0/1 specialization recompiles it
        if 1 in batches:
            results[1] = compare(model, dynamic, spec.inputs(1, 1))
        torch._dynamo.reset()
    sr, dr = static_backend.reports[0], backend.reports[0]
    row = SweepRow(
        name,
        (sr.launches_before, sr.launches_after),
        (dr.launches_before, dr.launches_after),
        recompiles,
        {b: d for b, (d, _) in sorted(results.items())},
        all(ok for _, ok in results.values()),
        dr.fallback_reason if dr.fell_back else None,
        (sr.batched, sr.dropped_batches) == (dr.batched, dr.dropped_batches),
    )
    if inductor:
        row.inductor_static, row.inductor_dynamic = (
            inductor_kernels(name, dynamic, compile_batch, **options) for dynamic in (False, True)
        )
    row.seconds = time.perf_counter() - start
    return row


def inductor_kernels(name: str, dynamic: bool, batch: int = COMPILE_BATCH, **options: Any) -> int:
    """Inductor's CPU kernels (forward and backward) for one zoo model through our backend
    (``dynamic``: the inputs' batch dim marked dynamic). Raises when the optimizer fell back."""
    from optimus_eqsat.inductor_count import count_inductor_kernels

    spec = MODELS[name]
    backend = make_backend(measure=False, **{**DETERMINISTIC, **options})
    inputs = spec.inputs(batch, 0)
    for x in inputs if dynamic else ():
        torch._dynamo.mark_dynamic(x, 0)
    count = count_inductor_kernels(spec.build(), inputs, training=True, backend=backend)
    report = backend.reports[-1]
    if report.fell_back and report.fallback_reason and not report.fallback_reason.startswith("predicted"):
        raise RuntimeError(f"{name}: the optimizer fell back under Inductor: {report.fallback_reason}")
    return count.total


def format_table(rows: Sequence[SweepRow]) -> str:
    """The sweep as a Markdown table."""
    batches = sorted({b for r in rows for b in r.max_diff})
    head = [
        "model",
        "launches static",
        "launches dynamic",
        "same batches",
        "recompiles",
        *(f"max abs diff @{b}" for b in batches),
        "close",
        "inductor static",
        "inductor dynamic",
        "s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.model,
            "{} -> {}".format(*r.static_launches),
            "{} -> {}".format(*r.dynamic_launches),
            "yes" if r.same_batches else "no",
            str(r.recompiles),
            *(f"{r.max_diff[b]:.1e}" for b in batches),
            "yes" if r.close else "no",
            str(r.inductor_static if r.inductor_static is not None else "-"),
            str(r.inductor_dynamic if r.inductor_dynamic is not None else "-"),
            f"{r.seconds:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    parser.add_argument("--inductor", action="store_true", help="also count Inductor's CPU kernels")
    parser.add_argument("--profile", default="cpu", help="the optimizer's device profile (default cpu)")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        rows.append(sweep_model(name, inductor=args.inductor, profile=args.profile))
        if rows[-1].fell_back:
            print(f"{name}: fell back: {rows[-1].fell_back}")
    print(format_table(rows))


if __name__ == "__main__":
    main()
