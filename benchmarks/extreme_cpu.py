"""Compile FX programs of one model with Inductor on this CPU, count their kernels, time them.

The extreme study (benchmarks/extreme_study.py) compares two programs of one
model: Dynamo's graph as Inductor compiles it by default, and the graph our
optimizer made from that same capture. Each program is compiled once, through
``torch.compile`` of its own copy of the model with a backend that hands
Inductor the given program in place of the graph Dynamo traced (so the step
includes Dynamo's guards and wrapper, as a user's step does, and the optimizer
does not run again). That one compile gives both

- the kernel count: the launches in Inductor's output code, parsed as
  ``optimus_eqsat.inductor_count.count_inductor_kernels`` parses it (forward
  and, in training, backward); and
- the compiled step, timed with the harness's interleaved rounds
  (benchmarks/rounds.py) on this process's CPU clock with one thread: the median
  round, and the median of the per-round ratios to the default program.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks import instrument, measure, stats
from benchmarks.rounds import RoundPlan, run_rounds
from optimus_eqsat.fx_graphs import copy_module

BASELINE = "default"


@dataclass
class CompiledProgram:
    """One program compiled by Inductor: its step, kernel counts and first outputs."""

    step: Callable[[], list[torch.Tensor]]
    generated: int
    extern: int
    outputs: list[torch.Tensor]
    backend_calls: Callable[[], int]

    @property
    def launches(self) -> int:
        return self.generated + self.extern


def program_backend(program: torch.fx.GraphModule, expected: Sequence[torch.Size]) -> Callable:
    """A Dynamo backend compiling ``program`` (a graph of the same capture) with Inductor.

    ``expected``: the shapes of the capture's inputs; a graph Dynamo traces with other
    inputs is an error (the program would not fit it). ``backend.calls`` counts calls.
    """
    from optimus_eqsat.backend import compile_program as inductor_as_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        backend.calls += 1
        shapes = [tuple(getattr(x, "shape", ())) for x in example_inputs]
        if shapes != [tuple(s) for s in expected]:
            raise RuntimeError("Dynamo traced other inputs than the program's capture")
        # as our backend compiles it (inference: behind its parameter cache); Inductor edits
        # what it compiles, hence the copy
        return inductor_as_backend(copy_module(program), example_inputs)

    backend.calls = 0  # type: ignore[attr-defined]
    return backend


def compile_program(
    model: torch.nn.Module, inputs: tuple, program: torch.fx.GraphModule, expected: Sequence[torch.Size], training: bool
) -> CompiledProgram:
    """``program`` compiled for a copy of ``model``; its first step (the compile) is run
    here, and Inductor's output code of that step gives the kernel counts."""
    from torch._inductor import config as inductor_config

    work = copy.deepcopy(model).train(training)
    backend = program_backend(program, expected)
    compiled = torch.compile(work, backend=backend, fullgraph=True)
    step = measure.make_step(compiled, work, inputs, training)
    with inductor_config.patch(force_disable_caches=True), instrument.capture_output_code() as codes:
        outputs = [o.detach().clone() for o in step()]
    generated, extern = instrument.count_kernels(codes)
    return CompiledProgram(step, generated, extern, outputs, lambda: backend.calls)


def compile_and_time(
    model: torch.nn.Module,
    inputs: tuple,
    programs: Mapping[str, torch.fx.GraphModule],
    expected: Sequence[torch.Size],
    training: bool,
    plan: RoundPlan | None,
) -> dict[str, dict[str, Any]]:
    """Compile every program (``programs[BASELINE]`` first), count its kernels and, with a
    ``plan``, time all of them in interleaved rounds on one thread and the CPU clock.

    Returns per program: ``generated``, ``extern``, ``launches``, ``max_abs_diff`` (of its
    outputs against the baseline's), and with a plan ``step_ms`` (median round),
    ``step_ms_p10`` / ``_p90``, ``ratio`` (median paired ratio to the baseline), ``rounds``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(
            recompile_limit=max(torch._dynamo.config.recompile_limit, 2 * len(programs) + 2)
        ):
            compiled = {name: compile_program(model, inputs, gm, expected, training) for name, gm in programs.items()}
            base = compiled[BASELINE].outputs
            out = {
                name: {
                    "generated": c.generated,
                    "extern": c.extern,
                    "launches": c.launches,
                    "max_abs_diff": measure.max_abs_diff(c.outputs, base),
                }
                for name, c in compiled.items()
            }
            if plan is None:
                return out
            steps = {name: measure.timed_step(c.step, "cpu", clock="cpu") for name, c in compiled.items()}
            gc.collect()
            gc.disable()  # a collection in one program's turn would bill it for everyone's garbage
            try:
                result = run_rounds(steps, plan, baseline=BASELINE)
            finally:
                gc.enable()
            for name, c in compiled.items():
                if name in result.errors:
                    raise RuntimeError(f"{name}: {result.errors[name]}")
                if c.backend_calls() != 1:
                    raise RuntimeError(f"{name}: Dynamo compiled {c.backend_calls()} times (recompiled)")
                times = stats.spread(result.round_ms[name])
                out[name].update(
                    step_ms=times.median,
                    step_ms_p10=times.p10,
                    step_ms_p90=times.p90,
                    ratio=stats.spread(result.ratios(BASELINE)[name]).median,
                    rounds=times.n,
                )
            return out
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(threads)
