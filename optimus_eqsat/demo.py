"""The built-in default model of the quick start, and the demo that runs it.

A compact recommendation model with what Optimus was built for: per-feature
towers fed by splits of one dense block, split/cat round trips, unbind/stack
plumbing, and many small same-shaped linears.

:func:`run_demo` (``optimus-eqsat`` with no arguments) measures the model on this
machine's CPU, eager against Inductor against ``torch.compile(backend="optimus_eqsat")``,
in inference and in training: step time (interleaved rounds, median), the kernels in
Inductor's output code of the program each one runs, and the first call (a cold
compile plus one step). The cost model's step time for a GPU is printed apart,
marked as a prediction.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


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


# The measured side by side: one thread, the process's CPU time as the clock (robust on a
# machine shared with other jobs), turns of at least TURN_S in ROUNDS interleaved rounds.
BATCH = 64
ROUNDS = 21
TURN_S = 0.05
MODES = ("inference", "training")
METHODS = ("eager", "Inductor", "ours")


@dataclass
class Row:
    """One method in one mode: what the table prints."""

    mode: str
    method: str
    step_s: float = float("nan")
    ratio: tuple[float, float, float] = (float("nan"),) * 3  # / Inductor's: per-round ratios' median, p10, p90
    kernels: int | None = None  # in Inductor's output code of the program that runs (forward + backward)
    first_call_s: float | None = None  # cold compile plus one step
    note: str = ""


@dataclass
class DemoResult:
    rows: list[Row] = field(default_factory=list)
    max_diff: dict[str, float] = field(default_factory=dict)  # ours vs eager, per mode
    ok: bool = True


def run_demo(profile: str = "h100", extractor: str = "auto", features: int = 8) -> int:
    """Measure the demo model on this machine (eager, Inductor, ours; inference and training)
    and print the cost model's prediction for ``profile``; 0 when our numerics match eager's."""
    from optimus_eqsat.api import optimize_graph

    progress = _Progress(total=2 + len(MODES) * 4)
    model = DemoRecModel(features=features)
    inputs = model.example_inputs(BATCH)
    print(
        f"optimus-eqsat demo: {type(model).__name__}, {features} feature towers (layer_norm -> linear -> relu "
        f"on splits of one dense block, split/cat and unbind/stack plumbing), batch {BATCH}",
        flush=True,
    )

    # The optimizer on the traced graph, priced for a GPU: the prediction (it also loads
    # the optimizer once, as the warm-up below does for Inductor).
    with progress.stage(f"optimizer on the traced graph, priced for {profile}"):
        start = time.perf_counter()
        optimized = optimize_graph(
            torch.fx.symbolic_trace(model),
            inputs,
            profile=profile,
            extractor=extractor,
            mode="training",
            persistent_cache=False,
        )
        optimizer_s = time.perf_counter() - start
    report = optimized.meta["optimus_eqsat"]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with progress.stage("warm-up compile (the compiler's one-time start-up, not counted)"):
            _warm_up()
        result = DemoResult()
        for mode in MODES:
            _measure_mode(mode, features, extractor, progress, result)
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        progress.close()

    print()
    print(
        f"Measured on this machine: {_machine()}; one thread; step time: median of {ROUNDS} interleaved "
        "rounds (CPU time), / Inductor: the per-round ratios' median and 10th / 90th percentiles"
    )
    print(_table(result.rows))
    print(
        'ours = torch.compile(model, backend="optimus_eqsat"); kernels: calls in Inductor\'s output code '
        "of the program that runs\n(forward + backward in training); first call: compile with Inductor's "
        "caches off, plus one step."
    )
    what = {"inference": "inference outputs", "training": "training gradients"}
    print(
        "numerics, ours vs eager: "
        + ", ".join(f"{what[mode]} max abs diff {diff:.1e}" for mode, diff in result.max_diff.items())
        + (" -> OK" if result.ok else " -> MISMATCH")
    )
    print()
    print(
        f"Predicted by the cost model for {profile} (a prediction, not measured here): training step "
        f"{_us(report.cost_before)} -> {_us(report.cost_after)}, kernel launches "
        f"{report.launches_before} -> {report.launches_after}"
    )
    batched = ", ".join(f"{k} x{v}" for k, v in report.batched.items()) or "none"
    print(
        f"optimizer on the traced graph: {report.nodes_before} -> {report.nodes_after} FX ops in "
        f"{optimizer_s:.1f} s; batched: {batched}"
    )
    if logging.getLogger().isEnabledFor(logging.INFO):
        print(report.summary())
    else:
        print("(optimus-eqsat -v prints the optimizer's whole report)")
    return 0 if result.ok else 1


def _measure_mode(mode: str, features: int, extractor: str, progress: _Progress, result: DemoResult) -> None:
    """Compile, check and time eager, Inductor and ours in one mode; rows go to ``result``."""
    from torch._inductor.utils import run_and_get_code

    from optimus_eqsat.backend import make_backend
    from optimus_eqsat.inductor_count import count_kernels_in_code

    training = mode == "training"
    torch._dynamo.reset()
    (x,) = DemoRecModel(features=features).example_inputs(BATCH)
    models = {name: DemoRecModel(features=features).train(training) for name in METHODS}
    backend = make_backend(extractor=extractor)
    programs: dict[str, Callable] = {"eager": models["eager"]}
    rows = {name: Row(mode, name) for name in METHODS}
    codes: dict[str, list[str]] = {}

    def step(name: str) -> torch.Tensor:
        model, program = models[name], programs[name]
        if not training:
            with torch.no_grad():
                return program(x)
        model.zero_grad(set_to_none=True)
        out = program(x)
        out.sum().backward()
        return out

    for name, compiler in (("Inductor", "inductor"), ("ours", backend)):
        with progress.stage(f"{mode}: {name}, compile and first step"):
            programs[name] = torch.compile(models[name], backend=compiler)
            start = time.perf_counter()
            with _cold(), _quiet_stderr():
                _, codes[name] = run_and_get_code(step, name)
            rows[name].first_call_s = time.perf_counter() - start

    with progress.stage(f"{mode}: numeric check against eager"):
        expected, got = step("eager"), step("ours")
        pairs = [(expected, got)]
        if training:
            mine = dict(models["ours"].named_parameters())
            pairs = [(_grad(p), _grad(mine[n])) for n, p in models["eager"].named_parameters()]
        diff = max((a - b).abs().max().item() for a, b in pairs)
        ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs)
        result.max_diff[mode] = diff
        result.ok = result.ok and ok

    with progress.stage(f"{mode}: timing eager, Inductor and ours in {ROUNDS} interleaved rounds"), _quiet_stderr():
        times, ratios = _interleaved({name: functools.partial(step, name) for name in METHODS}, "Inductor")
    for name in METHODS:
        rows[name].step_s, rows[name].ratio = times[name], ratios[name]

    inductor_kernels = sum(sum(count_kernels_in_code(code)) for code in codes["Inductor"])
    rows["Inductor"].kernels = inductor_kernels

    def masked_kernels() -> int:
        """Kernels of the original with its masks recomputed, compiled again (after the timing:
        this resets Dynamo)."""
        from optimus_eqsat.compile_plan import mask_patches
        from optimus_eqsat.inductor_count import count_inductor_kernels

        counted = count_inductor_kernels(DemoRecModel(features=features), (x,), training=True, options=mask_patches())
        return counted.generated + counted.extern

    rows["ours"].kernels, rows["ours"].note = _our_program(backend, codes["ours"], inductor_kernels, masked_kernels)
    result.rows.extend(rows[name] for name in METHODS)


def _our_program(
    backend: Callable, codes: list[str], inductor_kernels: int, masked_kernels: Callable[[], int]
) -> tuple[int | None, str]:
    """Kernels of the program our backend runs, and what it kept. The measured choice
    compiled its baseline beside ours: the original graph as Inductor alone compiles it
    (Inductor's kernels), or in CPU training the original with its masks recomputed
    (``masked_kernels()`` counts them); what is left of the kernels compiled is ours."""
    from optimus_eqsat.inductor_count import count_kernels_in_code

    compiled = sum(sum(count_kernels_in_code(code)) for code in codes)
    reports = getattr(backend, "reports", [])
    report = reports[-1] if reports else None
    measured = report.measured if report is not None else None
    if measured is None or not measured.rounds:
        if measured is not None:
            return compiled, measured.reason
        if report is not None and report.fell_back:
            return compiled, f"the original: {report.fallback_reason}"
        return compiled, "nothing rewritten: the original, compiled once"
    baseline = "the original with its masks recomputed" if "masked" in measured.step_s else "the original"
    times = (
        f"its first call timed ours at {measured.ratio:.2f}x {baseline}, "
        f"p25-p75 {measured.ratio_p25:.2f}-{measured.ratio_p75:.2f}"
    )
    if measured.kept == "original":
        return inductor_kernels, f"measured choice kept the original ({times}: {measured.reason})"
    if measured.kept == "optimized" and set(measured.compile_s) <= {"original", "masked"}:
        baseline_kernels = masked_kernels() if "masked" in measured.compile_s else inductor_kernels
        return compiled - baseline_kernels, f"measured choice kept ours ({times})"
    return None, f"measured choice kept {measured.kept} ({times}: {measured.reason})"


def _grad(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient after one step (zeros where none reached it)."""
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)


def _interleaved(
    steps: dict[str, Callable[[], Any]], baseline: str
) -> tuple[dict[str, float], dict[str, tuple[float, float, float]]]:
    """Median step seconds per method, and the per-round ratios to ``baseline`` (median, 10th
    and 90th percentiles): every round each method takes a turn (one untimed step, then steps
    for at least TURN_S of this thread's CPU time), the order rotating from round to round."""
    names = list(steps)
    for name in names:
        for _ in range(3):
            steps[name]()
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            steps[name]()
            count, start = 0, time.thread_time()
            while True:
                steps[name]()
                count += 1
                elapsed = time.thread_time() - start
                if elapsed >= TURN_S:
                    break
            per_round[name].append(elapsed / count)
    times = {name: statistics.median(v) for name, v in per_round.items()}
    ratios = {}
    for name in names:
        values = [a / b for a, b in zip(per_round[name], per_round[baseline])]
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        ratios[name] = (statistics.median(values), deciles[0], deciles[-1])
    return times, ratios


def _warm_up() -> None:
    """Compile a tiny function with Inductor, forward and backward, caches off: the compiler's
    one-time costs (imports, worker processes, the C++ toolchain) then land on no method."""
    with _cold(), _quiet_stderr():
        fn = torch.compile(lambda a: (torch.relu(a) * 3).sum(), backend="inductor")
        fn(torch.randn(8, requires_grad=True)).backward()
    torch._dynamo.reset()


@contextlib.contextmanager
def _cold() -> Iterator[None]:
    """Inductor's caches off (a cold compile, as a first run pays), without Dynamo's warning
    that its profile-guided cache is off with them."""
    import warnings

    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        yield


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Hold what is written to file descriptor 2 and write it back afterwards without the
    profiler's start/stop lines (the measured choice reads peak memory with the profiler)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode(errors="replace").splitlines(keepends=True)
                if "ActivityProfilerHandler" not in line
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


class _Progress:
    """A progress bar on a terminal (tqdm, when installed; its clock ticks through a long
    stage), else one line per stage, on stderr."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.out = os.fdopen(os.dup(2), "w")  # not redirected by _quiet_stderr
        self.closed = threading.Event()
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if tqdm is None or not self.out.isatty():
            self.bar = None
        else:
            self.bar = tqdm(
                total=total, file=self.out, leave=False, bar_format="{n_fmt}/{total_fmt} [{elapsed}] {desc}"
            )
            threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self.closed.wait(1.0) and self.bar is not None:
            self.bar.refresh()

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[None]:
        if self.bar is not None:
            self.bar.set_description_str(text)
        else:
            print(
                f"[{self.done + 1}/{self.total} {time.perf_counter() - self.start:5.0f} s] {text}",
                file=self.out,
                flush=True,
            )
        yield
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        self.closed.set()
        if self.bar is not None:
            self.bar.close()
        self.out.close()


def _machine() -> str:
    cores = os.cpu_count() or 0
    return f"{platform.machine()} CPU, {cores} cores, torch {torch.__version__}"


def _table(rows: list[Row]) -> str:
    header = (
        f"{'mode':<10} {'method':<9} {'step time':>10} {'/ Inductor [p10, p90]':>22} {'kernels':>8} {'first call':>11}"
    )
    lines = [header]
    for row in rows:
        kernels = "-" if row.kernels is None else str(row.kernels)
        first = "-" if row.first_call_s is None else f"{row.first_call_s:.1f} s"
        median, low, high = row.ratio
        ratio = f"{median:.2f}x [{low:.2f}, {high:.2f}]"
        line = f"{row.mode:<10} {row.method:<9} {row.step_s * 1e3:>7.3f} ms {ratio:>22} {kernels:>8} {first:>11}"
        lines.append(line + (f"  {row.note}" if row.note else ""))
    return "\n".join(lines)


def _us(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e6:.0f} us"
