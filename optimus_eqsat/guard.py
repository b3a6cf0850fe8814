"""Never slower, measured: compile the candidates, time them side by side, keep the fastest.

The cost model predicts; this module checks. Each candidate program (the
original graph and the optimizer's choice) is compiled with Inductor and run on
the example inputs in interleaved rounds: every round runs each program a few
steps in a rotating order, and the ratio to the original is taken per round
(the machine's drift hits both alike). The optimized program is kept only when
it is faster beyond the noise (its median ratio below ``1 - margin`` and its
75th percentile below 1) and its peak memory stays within ``MEMORY_SLACK`` of the
original's (a stack of weights built every step costs memory as well as time).
Peak memory is what a step holds at its peak: the inputs it runs on (parameters
included: Dynamo passes them as inputs), what a program keeps between steps, and
what the step allocates. Otherwise the original is kept.

A step is what the user pays: the forward in inference, forward and backward
in training. The user's state is left alone: gradients are returned by
``torch.autograd.grad`` (nothing accumulates into ``.grad``), the programs run on
copies of the inputs the graph writes to and of every input without grad (buffers
such as a batch norm's running statistics, and data; :func:`timing_inputs`), and the
RNG state is restored after timing.

In the ``torch.compile`` backend the measurement happens on the first real call
of the compiled program (:class:`FirstCallChoice`), on that call's inputs: running
a compiled backward inside Dynamo's own compile trips its compile metrics, and
whether the step is a training step is only known at the call. Torch calls
compiled programs in places where timing is unsafe, and the choice must not
crash or stall the user's step there:

- at compile time, on fake tensors (Dynamo's DDPOptimizer runs every compiled
  piece once so to compile the next): a program runs, undecided;
- inside the user's forward with hooks on the inputs (FSDP2's, DDP's): a training
  step is timed on detached aliases of the inputs (:func:`timing_inputs`), so no
  user autograd graph, tensor hook or parameter hook is reached, with compiled
  autograd off;
- where timing cannot be done safely at all (:func:`unsafe_to_time`: collective ops,
  whose rounds every rank must run alike; tensor-subclass inputs such as DTensor;
  list inputs a program consumes, as compiled autograd's; a call inside a backward, or
  under saved-tensor hooks, as a compiled module called inside ``checkpoint()`` is):
  nothing is timed and the optimizer's prediction decides (the candidate exists only
  where it predicted a gain), which the result says.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx

from optimus_eqsat.fxvocab import ALIASING_OPS, canonical_name
from optimus_eqsat.fxvocab.meta import copied_inputs, input_versions, warn_if_written
from optimus_eqsat.fxvocab.mutation import written_inputs
from optimus_eqsat.inductor_compat import dynamo_compile_lock, first_line

log = logging.getLogger("optimus_eqsat")

Program = Callable[..., Any]

# A candidate may use this much more memory at its peak than the original: 5% and 1 MiB. Less
# than a MiB is below what a GPU's caching allocator reserves at a time (small blocks come
# from 2 MiB segments) and below a CPU process's noise, so it cannot cost a user a batch size;
# a tighter bytes term kept slower programs for tens of KiB on small models.
MEMORY_SLACK = (1.05, 1 << 20)


# The reason of a choice that needed no timing: no pass rewrote the program.
NOTHING_TO_TIME = "no rewrite that needs timing"


@dataclass
class GuardResult:
    """What the measurement found (``OptimizeReport.measured``)."""

    kept: str  # name of the program kept
    step_s: dict[str, float]  # median step seconds per program
    ratio: float  # optimized / original, median of the per-round ratios
    ratio_p25: float
    ratio_p75: float
    rounds: int
    compile_s: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    peak_bytes: dict[str, int] = field(default_factory=dict)  # peak memory of one step, above the start
    resident_bytes: int = 0  # the step's inputs, parameters included: held by both programs
    timing_s: float = 0.0  # wall seconds the measurement took (warm-up, rounds, memory)
    # each program's first step in the measurement: in training it compiles the backward
    first_step_s: dict[str, float] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        """What the measured choice cost: compiling the original and timing both."""
        return self.timing_s + sum(self.compile_s.values()) + sum(self.first_step_s.values())

    def summary(self) -> str:
        if not self.rounds:
            return f"not timed: {self.reason}"
        times = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in self.step_s.items())
        memory = (
            " peak "
            + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in self.peak_bytes.items())
            + f" above {self.resident_bytes / 2**20:.2f} MiB of inputs"
            if self.peak_bytes
            else ""
        )
        return (
            f"measured {times}; ratio {self.ratio:.3f} [{self.ratio_p25:.3f}, {self.ratio_p75:.3f}] over "
            f"{self.rounds} rounds;{memory}: kept {self.kept} ({self.reason})"
        )


def mutated_placeholders(gm: torch.fx.GraphModule) -> set[int]:
    """Positions of the placeholders the graph writes to (in place, or through a view)."""
    placeholders = {n: k for k, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    written = set()
    base: torch.fx.Node | None
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        for base in written_inputs(gm, node):
            while base is not None and base.op != "placeholder" and canonical_name(base) in ALIASING_OPS:
                base = base.args[0] if base.args and isinstance(base.args[0], torch.fx.Node) else None
            if base in placeholders:
                written.add(placeholders[base])
    return written


# Inputs that do not require grad (buffers, data) are copied for the timing whatever the graph
# says it writes, up to this many bytes in all: an op that writes an input without saying so
# (a norm's running statistics were missed once) then writes a copy.
COPY_INPUTS_BYTES = 256 << 20


def timing_inputs(example_inputs: Sequence[Any], written: set[int], training: bool = False) -> list[Any]:
    """The inputs the measurement runs on: copies of those the graph writes to (``written``)
    and of every other input that does not require grad while they fit in
    :data:`COPY_INPUTS_BYTES` (on a GPU also within an eighth of its free memory);
    parameters (and inputs that require grad) as they are, or, in ``training``, as
    detached aliases (same storage, new leaves): the timed backward then stops at them and
    reaches no autograd graph or hook of the user's (FSDP2's and DDP's hooks, a gradient
    hook) in the middle of the user's step."""
    budget = COPY_INPUTS_BYTES
    device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.is_cuda), None)
    if device is not None:
        budget = min(budget, torch.cuda.mem_get_info(device)[0] // 8)
    inputs = copied_inputs(example_inputs, budget, must=written, may=lambda x: not x.requires_grad)
    if not training:  # (no backward runs; aliases would stop the parameter cache from packing)
        return inputs
    return [x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in inputs]


# Namespaces of collective ops (c10d, functional collectives, DTensor's): every rank must run
# them alike, so a graph holding one is never timed (ranks would time different numbers of rounds).
COLLECTIVE_NAMESPACES = frozenset(
    {"c10d", "c10d_functional", "_c10d_functional", "_c10d_functional_autograd", "_dtensor", "symm_mem"}
)


def _is_collective(target: Any) -> bool:
    namespace = getattr(target, "namespace", None)  # an OpOverload
    if namespace is None and hasattr(target, "_qualified_op_name"):  # an OpOverloadPacket
        namespace = target._qualified_op_name.split("::")[0]
    if namespace is not None:
        return namespace in COLLECTIVE_NAMESPACES
    return (getattr(target, "__module__", None) or "").startswith("torch.distributed")


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` (or a graph it holds, a higher-order op's body) calls a collective op
    or a function of ``torch.distributed``."""
    return any(
        node.op in ("call_function", "call_method") and _is_collective(node.target)
        for module in gm.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


def compile_time_call(args: Sequence[Any]) -> bool:
    """Whether a call of a compiled program happens at compile time, not in a real step: on
    fake tensors, under a fake mode, or while torch.compile or torch.export traces (Dynamo's
    DDPOptimizer runs each compiled piece once on fake tensors to compile the next)."""
    from torch._subclasses.fake_tensor import is_fake

    return (
        torch.compiler.is_compiling()
        or torch._guards.active_fake_mode() is not None
        or any(isinstance(x, torch.Tensor) and is_fake(x) for x in args)
    )


def unsafe_to_time(gm: torch.fx.GraphModule, args: Sequence[Any]) -> str:
    """Why the programs computing ``gm`` cannot be timed on a real call with ``args`` (empty
    when they can)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if any(isinstance(x, (list, tuple)) for x in args):
        return "its inputs are lists a program consumes (compiled autograd's boxed inputs)"
    if any(isinstance(x, torch.Tensor) and is_traceable_wrapper_subclass(x) for x in args):
        return "tensor-subclass inputs (DTensor)"
    if torch._C._current_graph_task_id() != -1:
        return "called inside a backward"
    if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
        # (a compiled module called inside checkpoint(): the timed backward would unpack
        # through the user's hooks and recompute the user's region, calling this program again)
        return "saved-tensor hooks are active (activation checkpointing or offloading around the call)"
    if has_collectives(gm):
        return "the graph calls collective ops, which every rank must run alike"
    if torch.autograd._profiler_enabled():
        # (the CPU's peak memory is read with a profiler of our own, and opening one ends the
        # user's session; the user's would also record the timing, and slow what it times)
        return "a profiler is recording"
    return ""


def _compiled_autograd_off() -> contextlib.AbstractContextManager:
    """Compiled autograd off (when it is loaded): the timed backward is an ordinary one, not
    captured and compiled inside the user's step."""
    compiled_autograd = sys.modules.get("torch._dynamo.compiled_autograd")
    return compiled_autograd._disable() if compiled_autograd is not None else contextlib.nullcontext()


def _on_cuda(inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)


def _flat_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat_tensors(o)]
    return []


def _layout(out: Any) -> list[tuple[Any, ...]] | None:
    """Shapes and strides of the tensors in ``out`` (None when any is symbolic)."""
    layout = [(tuple(t.shape), tuple(t.stride())) for t in _flat_tensors(out)]
    concrete = all(isinstance(v, int) for shape, stride in layout for v in (*shape, *stride))
    return layout if concrete else None


def step_function(
    program: Program, inputs: Sequence[Any], training: bool, layouts: list[Any] | None = None
) -> Callable[[], None]:
    """One step of ``program``: the forward, and in training the gradients of every input
    that requires grad (parameters included) by ``torch.autograd.grad`` with compiled
    autograd off, so nothing accumulates into the user's ``.grad``. ``layouts`` (optional)
    receives the outputs' :func:`_layout` of the first step.

    The first step retains the autograd graph: AOTAutograd compiles a program's backward on
    its first use, for that use's kind, and one compiled for a backward that frees the graph
    donates saved buffers and refuses every later ``retain_graph=True`` or
    ``create_graph=True``. Under Inductor the user's first backward decides; here the measured
    choice runs first, so it compiles the kind every backward can run (PCGrad and GradNorm
    take each task's gradients with ``retain_graph=True``). A backward Inductor's caches
    served compiled for the other kind runs as it was compiled."""
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    on_cuda = _on_cuda(inputs)
    first = True

    def step() -> None:
        nonlocal first
        if on_cuda:  # programs compiled with CUDA graphs (mode="reduce-overhead") take turns:
            torch.compiler.cudagraph_mark_step_begin()  # each step is a new one, not a continuation
        out = program(*inputs)
        if layouts is not None and not layouts:
            layouts.append(_layout(out))
        if training and wrt:
            outs = [o for o in _flat_tensors(out) if o.requires_grad]
            if outs:
                loss = cast(torch.Tensor, sum(o.float().sum() for o in outs))  # (outs is not empty)
                with _compiled_autograd_off():
                    try:
                        torch.autograd.grad(loss, wrt, allow_unused=True, retain_graph=first)
                    except RuntimeError:
                        if not first:
                            raise
                        # (a backward compiled already, by a cache entry: it runs as it was compiled)
                        torch.autograd.grad(loss, wrt, allow_unused=True)
                first = False
        if on_cuda:
            torch.cuda.synchronize()

    return step


def _time(step: Callable[[], None], repeats: int) -> float:
    """Median seconds of ``repeats`` steps."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_interleaved(
    steps: dict[str, Callable[[], None]],
    budget_s: float = 1.0,
    min_rounds: int = 5,
    max_rounds: int = 60,
    warmup: int = 2,
) -> dict[str, list[float]]:
    """Per-round median step seconds of every program, in interleaved rounds.

    Each round runs every program ``repeats`` steps (enough for about a millisecond), in
    an order that rotates from round to round; rounds continue until ``budget_s`` is
    spent (at least ``min_rounds``, at most ``max_rounds``)."""
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    one = {name: _time(steps[name], 1) for name in names}
    repeats = {name: max(1, min(20, int(1e-3 / max(one[name], 1e-6)))) for name in names}
    rounds: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    r = 0
    while r < max_rounds and (r < min_rounds or time.perf_counter() - start < budget_s):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            rounds[name].append(_time(steps[name], repeats[name]))
        r += 1
    return rounds


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    pos = q * (len(values) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def choose(
    rounds: dict[str, list[float]],
    baseline: str,
    candidate: str,
    margin: float = 0.01,
    peak_bytes: dict[str, int] | None = None,
    resident_bytes: int = 0,
    memory_slack: tuple[float, int] = MEMORY_SLACK,
) -> GuardResult:
    """Keep ``candidate`` only when it is faster than ``baseline`` beyond the noise and its
    peak memory (when measured: ``peak_bytes`` above the ``resident_bytes`` both hold) within
    ``memory_slack`` (a factor and bytes on top) of the baseline's."""
    ratios = [c / b for c, b in zip(rounds[candidate], rounds[baseline])]
    median, p25, p75 = statistics.median(ratios), _quantile(ratios, 0.25), _quantile(ratios, 0.75)
    faster = median < 1 - margin and p75 < 1
    peaks = peak_bytes or {}
    scale, slack = memory_slack
    lean = not peaks or peaks[candidate] + resident_bytes <= (peaks[baseline] + resident_bytes) * scale + slack
    kept = candidate if faster and lean else baseline
    reason = (
        "faster beyond the noise"
        if faster and lean
        else "more peak memory"
        if faster
        else "not faster beyond the noise"
        if median < 1
        else "slower"
    )
    return GuardResult(
        kept,
        {k: statistics.median(v) for k, v in rounds.items()},
        median,
        p25,
        p75,
        len(ratios),
        reason=reason,
        peak_bytes=dict(peaks),
        resident_bytes=resident_bytes,
    )


def resident_bytes(inputs: Sequence[Any]) -> int:
    """Bytes of the storages of the tensors in ``inputs``, each storage once."""
    storages = {
        x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()
        for x in inputs
        if isinstance(x, torch.Tensor) and x.layout == torch.strided
    }
    return sum(storages.values())


def step_peak_bytes(step: Callable[[], None], on_cuda: bool) -> int:
    """Peak bytes allocated during one step above what was allocated before it: CUDA's
    allocator statistics, or on the CPU the profiler's allocation events replayed in order."""
    if on_cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return max(torch.cuda.max_memory_allocated() - base, 0)
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _ONE_PROFILER:  # (threads serving one model decide each of their programs at once)
        with _stderr_silenced():
            prof.start()
        try:
            step()
        finally:
            with _stderr_silenced():
                prof.stop()
    recorded = cast(Any, prof.profiler).kineto_results.events()  # (torch's stubs type it loosely)
    events = sorted((e.start_ns(), e.nbytes()) for e in recorded if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


#: Held while this process's profiler runs: torch's profiler is one per process (two sessions
#: at once crash it), and the standard error each silences must be restored in order.
_ONE_PROFILER = threading.Lock()


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """The process's standard error (file descriptor 2) sent nowhere: torch's profiler prints a
    line there as it starts and as it stops, which would land in the user's output on every
    first call that measures on the CPU."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _CompileContext:
    """Dynamo's tracing context of a compile, and how it fakeified each input tensor, for a
    compile that runs after Dynamo's (on the first call). Dynamo forgets the second when its
    compile ends; without both, Inductor's FX graph and AOTAutograd caches bypass the compile
    ('No shape env') or AOTAutograd gives the inputs symbolic sizes."""

    def __init__(self, context: Any, inputs: dict[Any, Any]) -> None:
        self.context, self.inputs = context, inputs

    @classmethod
    def capture(cls) -> _CompileContext:
        context = torch._guards.TracingContext.try_get()
        if context is None:
            return cls(None, {})
        known = context.tensor_to_context
        return cls(context, {t: known[t] for t in list(known.keys())})

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        if self.context is None or torch._guards.TracingContext.try_get() is not None:
            yield
            return
        known = self.context.tensor_to_context
        restored = [t for t in self.inputs if t not in known]
        for t in restored:
            known[t] = self.inputs[t]
        try:
            with torch._guards.tracing(self.context):
                yield
        finally:
            for t in restored:  # (Dynamo drops them so that swap_tensors works after a compile)
                known.pop(t, None)


class Deferred:
    """A program compiled only when a measurement needs it (``compile_s`` says how long it took)."""

    def __init__(self, compile: Callable[[], Program]):
        self._compile, self.compile_s = compile, 0.0
        self._context = _CompileContext.capture()

    def __call__(self) -> Program:
        start = time.perf_counter()
        with dynamo_compile_lock(), self._context.entered():  # (threads: one compile at a time)
            program = self._compile()
        self.compile_s = time.perf_counter() - start
        return program


class FirstCallChoice:
    """A compiled program that times its candidates on its first real call and then runs the one kept.

    ``programs`` holds compiled callables of one function under the names ``baseline``
    and ``candidate`` (the baseline may be :class:`Deferred`); ``gm`` is that function's
    graph (to find inputs it writes to). ``rewritten`` (optional) tells, after one step of
    the candidate, whether any pass rewrote it; when none did, the candidate is the
    baseline's program and is kept untimed (see :func:`measure_and_choose`).
    ``on_result`` receives the :class:`GuardResult`, or the exception when timing failed
    (the baseline is then kept: nothing showed the candidate faster).

    A call at compile time (:func:`compile_time_call`) runs the candidate and decides
    nothing (programs compiled for it answer with fake outputs: each is called so); what
    it returned fixes the output layout the programs compiled after it (DDPOptimizer's
    next pieces) expect, and a program laid out otherwise is not kept. Where timing is
    unsafe (:func:`unsafe_to_time`) the candidate is kept untimed, as the optimizer
    predicted it faster; ``run_at_compile_time`` (optional) runs a program on such a call
    (a program behind a parameter cache must not pack fake parameters)."""

    def __init__(
        self,
        programs: dict[str, Program | Deferred],
        gm: torch.fx.GraphModule,
        budget_s: float,
        on_result: Callable[[GuardResult | Exception], None],
        baseline: str = "original",
        candidate: str = "optimized",
        rewritten: Callable[[bool], bool] | None = None,
        memory_slack: tuple[float, int] = MEMORY_SLACK,
        run_at_compile_time: Callable[[Program, Sequence[Any]], Any] | None = None,
    ):
        self.programs, self.gm, self.budget_s, self.on_result = programs, gm, budget_s, on_result
        self.baseline, self.candidate, self.rewritten = baseline, candidate, rewritten
        self.memory_slack = memory_slack
        self.run_at_compile_time = run_at_compile_time or (lambda program, args: program(*args))
        self.chosen: Program | None = None
        self.layout: list[Any] | None = None  # what a call at compile time returned
        self._deciding = threading.Lock()
        self._decider: int | None = None  # the thread deciding, while it does

    def __call__(self, *args: Any) -> Any:
        if self.chosen is None:
            if compile_time_call(args):
                return self._undecided(args)
            if self._decider == threading.get_ident():
                # called again from within its own measurement (a hook of the user's the timed
                # step reached): the candidate runs, as at compile time; waiting would deadlock
                return self.programs[self.candidate](*args)
            with self._deciding:  # threads serving one model: the first decides, the rest wait
                if self.chosen is None:
                    self._decider = threading.get_ident()
                    try:
                        self.chosen = self.programs[self._decide(args)]
                    finally:
                        self._decider = None
                    self.programs = {}  # the program not kept can be freed
        return self.chosen(*args)

    def _undecided(self, args: Sequence[Any]) -> Any:
        """Run the candidate at compile time; every other compiled program is called too, so
        that one compiled in DDPOptimizer's fake pass spends its fake first call here."""
        out = self.run_at_compile_time(self.programs[self.candidate], args)
        for name, program in self.programs.items():
            if name != self.candidate and not isinstance(program, Deferred):
                try:
                    self.run_at_compile_time(program, args)
                except Exception as exc:  # (a program not compiled for such a call)
                    log.debug("optimus_eqsat: %s not run at compile time: %s", name, exc)
        self.layout = _layout(out)
        return out

    def _decide(self, args: Sequence[Any]) -> str:
        training = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in args)
        try:
            why = unsafe_to_time(self.gm, args)
            if why:
                result = GuardResult(
                    self.candidate,
                    {},
                    1.0,
                    1.0,
                    1.0,
                    0,
                    reason=f"cannot time here: {why}; kept {self.candidate} as the optimizer predicted it faster",
                )
                log.info("optimus_eqsat: %s", result.reason)
            else:
                result = measure_and_choose(
                    self.programs,
                    self.gm,
                    args,
                    training,
                    self.baseline,
                    self.candidate,
                    budget_s=self.budget_s,
                    rewritten=self.rewritten,
                    memory_slack=self.memory_slack,
                    layout=self.layout,
                )
        except Exception as exc:  # never fail the user's step over a measurement
            log.warning(
                "optimus_eqsat: could not time the programs (%s: %s); keeping the original",
                type(exc).__name__,
                str(exc).strip().splitlines()[:1],
            )
            self.on_result(exc)
            kept = self.baseline if self.layout is None else self.candidate  # (later pieces expect its layout)
            if isinstance(self.programs[kept], Deferred):
                try:
                    self.programs[kept] = self.programs[kept]()
                except Exception as again:
                    if kept == self.candidate:
                        raise
                    log.warning(
                        "optimus_eqsat: could not compile the original (%s); keeping the optimized", first_line(again)
                    )
                    return self.candidate
            return kept
        self.on_result(result)
        return result.kept


def measure_and_choose(
    programs: dict[str, Program | Deferred],
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    training: bool,
    baseline: str = "original",
    candidate: str = "optimized",
    budget_s: float = 1.0,
    margin: float = 0.01,
    rewritten: Callable[[bool], bool] | None = None,
    memory_slack: tuple[float, int] = MEMORY_SLACK,
    layout: list[Any] | None = None,
) -> GuardResult:
    """Time compiled ``programs[baseline]`` and ``programs[candidate]`` (both computing ``gm``'s
    function) on ``example_inputs`` and choose between them. The RNG state is restored
    afterwards and the programs run on :func:`timing_inputs` (copies of what they could write;
    in training, detached aliases of the rest). Memory a program holds between steps (its ``held_bytes``, a cache) is added
    to its peak.

    A :class:`Deferred` program is compiled here, replaced in ``programs`` by what it made.
    With ``rewritten``, one step of the candidate runs first (compiling what it compiles
    lazily: a training step's backward, where the post-grad pass runs); if
    ``rewritten(training)`` then says no pass changed the candidate, it is the baseline's
    own program: kept untimed, and a deferred baseline is never compiled.

    With ``layout`` (the output shapes and strides programs compiled after this one were
    compiled for), a program whose outputs are laid out otherwise is not kept."""
    inputs = timing_inputs(example_inputs, mutated_placeholders(gm), training)
    before = input_versions(example_inputs)
    start = time.perf_counter()
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    compile_s: dict[str, float] = {}
    first_step_s: dict[str, float] = {}
    try:
        if rewritten is not None:
            first_step_s[candidate] = _time(step_function(programs[candidate], inputs, training), 1)
            if not rewritten(training):
                # (no timing_s: that step was mostly the backward's compile, which any compile pays)
                return GuardResult(
                    candidate,
                    {},
                    1.0,
                    1.0,
                    1.0,
                    0,
                    reason=f"{NOTHING_TO_TIME} (the program is the original, or it with bool masks "
                    "recomputed), compiled once",
                )
        layouts: dict[str, list[Any]] = {}
        rounds, peaks = _time_programs(
            programs, [baseline, candidate], inputs, training, budget_s, compile_s, layouts, first_step_s
        )
        result = choose(rounds, baseline, candidate, margin, peaks, resident_bytes(inputs), memory_slack)
        if layout is not None and result.kept != candidate and layouts.get(result.kept) != [layout]:
            result.reason = (
                f"{result.reason}, but {result.kept}'s outputs are laid out "
                "otherwise than the programs compiled after it expect"
            )
            result.kept = candidate
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        warn_if_written(example_inputs, before, "timing the programs")  # (an op no analysis knows)
    result.compile_s, result.first_step_s = compile_s, first_step_s
    result.timing_s = time.perf_counter() - start - sum(compile_s.values()) - sum(first_step_s.values())
    return result


def _time_programs(
    programs: dict[str, Program | Deferred],
    names: Sequence[str],
    inputs: Sequence[Any],
    training: bool,
    budget_s: float,
    compile_s: dict[str, float],
    layouts: dict[str, list[Any]] | None = None,
    first_step_s: dict[str, float] | None = None,
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Interleaved rounds and step peaks of ``programs[names]``, compiling any still
    :class:`Deferred` (its compile time goes to ``compile_s``); ``layouts`` (optional)
    receives each program's output layout. ``first_step_s`` (optional) receives the time of
    the first step of each program not in it yet (a training step's backward compiles there:
    Inductor's work, not the timing's)."""
    for name in names:
        program = programs[name]
        if isinstance(program, Deferred):
            programs[name], compile_s[name] = program(), program.compile_s
    seen: dict[str, list[Any]] = {name: [] for name in names}
    steps = {name: step_function(programs[name], inputs, training, seen[name]) for name in names}
    if first_step_s is not None:
        for name in names:
            if name not in first_step_s:
                first_step_s[name] = _time(steps[name], 1)
    rounds = time_interleaved(steps, budget_s=budget_s)
    on_cuda = _on_cuda(inputs)
    peaks = {
        name: step_peak_bytes(step, on_cuda) + getattr(programs[name], "held_bytes", 0) for name, step in steps.items()
    }
    if layouts is not None:
        layouts.update(seen)
    return rounds, peaks
