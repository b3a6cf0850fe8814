"""The ``torch.compile`` backend: optimize Dynamo's graph, then hand it to Inductor.

Registered as ``optimus_eqsat`` through the ``torch_dynamo_backends`` entry
point, so ``torch.compile(model, backend="optimus_eqsat")`` works without
importing this package. The optimization runs twice: on Dynamo's pre-autograd
graph (``pre_grad``), which AOTAutograd inside Inductor then differentiates, and
as Inductor's post-grad pass on the aten graphs it compiles, forward and
backward (``post_grad``, :mod:`optimus_eqsat.postgrad`), installed only around
our own compile.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.fx

from optimus_eqsat.api import OptimizeOptions, optimize_graph
from optimus_eqsat.budget import backend_time_limit
from optimus_eqsat.compile_plan import CompilePlan, PassRecords, mask_patches
from optimus_eqsat.ddp_whole_graph import Piece, current_piece, piece_count, piece_mode, sink_input_work
from optimus_eqsat.ddp_whole_graph import install as install_ddp_whole_graph
from optimus_eqsat.fx_graphs import copy_module, op_count
from optimus_eqsat.fxvocab.mutation import written_attributes
from optimus_eqsat.fxvocab.symbolic import symbolic_value
from optimus_eqsat.guard import MEMORY_SLACK, Deferred, FirstCallChoice, GuardResult, compile_time_call
from optimus_eqsat.inductor_compat import (
    backwards_lowered_with_forwards,
    first_line,
    install_donation_alias_fix,
    install_inplace_alias_fix,
    install_sparse_gradient_fix,
    is_dynamo_signal,
    is_graph_break_request,
    lifted_float_inputs,
)
from optimus_eqsat.objective import freezing_enabled
from optimus_eqsat.parameter_cache import (
    CachedParameterWork,
    ParameterWork,
    split_parameter_work,
    static_example_values,
)
from optimus_eqsat.program_cache import StoredDecision, decision_key, load_decision, program_key, store_decision
from optimus_eqsat.report import OptimizeReport
from optimus_eqsat.run_support import saved_tensor_hooks_held_off

log = logging.getLogger("optimus_eqsat")


#: The backend's default ``min_gain`` (see :class:`~optimus_eqsat.options.OptimizeOptions`).
BACKEND_MIN_GAIN = 0.01


def make_backend(**options: Any) -> OptimusBackend:
    """A backend with :func:`optimize_graph` options, e.g. ``make_backend(extractor="greedy")``.

    Unless ``time_limit_s`` is given, each graph's optimization gets a budget that grows with
    its size (:func:`~optimus_eqsat.budget.backend_time_limit`: 10 s plus 4 ms per FX op, at
    most 60 s), as Inductor's own compile time does. A graph optimized before (same graph,
    input shapes, options and package code) is read from the persistent cache
    (:mod:`optimus_eqsat.disk_cache`), and so is the measured choice's decision for it on
    this machine: a restarted job compiles only the program kept.

    Backend options besides :func:`optimize_graph`'s:

    - ``inductor=False`` returns the optimized GraphModule itself (runs eagerly),
      which is handy for debugging rewrites without compiling;
    - ``measure=True`` (default) compiles the original graph too (in CPU training, the
      original with its bool masks recomputed instead); the first call of the compiled
      program times both on its inputs in interleaved rounds (forward, and backward in
      training) and keeps the optimized program only when it is faster beyond the noise
      (:mod:`optimus_eqsat.guard`); ``report.measured`` then says what was kept. It
      costs one more Inductor compile and about ``measure_budget_s`` of timing on the
      first call; nothing when no pass rewrote the graph (the compiled
      program is then the original graph, kept untimed; in training on the CPU with its
      bool masks recomputed from saved tensors, :mod:`optimus_eqsat.postgrad.bool_masks`,
      which costs no memory and no speed), and no pass rewrites a graph for less than
      ``min_gain`` of the predicted step (a backward graph's gain counts against its
      forward's time too);
    - ``measure_budget_s`` (default 1.0): seconds of interleaved timing;
    - ``memory_slack`` (default ``(1.05, 1 << 20)``): the measured choice keeps a faster program
      only when its peak memory (inputs and parameters included) stays within this factor of
      the original's plus these bytes; ``(1.5, 4 << 20)``, say, trades more memory
      for speed, ``(1.0, 0)`` allows none;
    - ``pre_grad=True``: optimize Dynamo's graph before AOTAutograd;
    - ``post_grad=True``: optimize the aten graphs Inductor compiles, forward and
      backward (Inductor's ``post_grad_custom_pre_pass``, patched around our compile
      only); their reports go to ``backend.post_grad_reports`` as (role, report);
    - ``recompute_masks=True``: in training on the CPU, boolean masks the backward needs
      (a ReLU's) are recomputed there from tensors it reads anyway instead of being saved:
      Inductor's C++ kernels write bool tensors slowly (:mod:`optimus_eqsat.postgrad.bool_masks`,
      Inductor's ``joint_custom_post_pass``, patched around our compile only);
    - ``inductor_config`` (default none): Inductor config patches (``{"max_autotune": True}``)
      for every program the backend compiles, and around the optimizer (which reads
      ``freezing``); ``torch.compile(..., backend="optimus_eqsat", mode=..., options=...)``
      fills it from the mode and from options that name Inductor configs;
    - ``whole_ddp_graph=True``: under ``torch.compile(DDP(model))``, optimize Dynamo's whole
      graph before DDPOptimizer cuts it at the gradient buckets, so experts in different
      buckets still batch (:mod:`.ddp_whole_graph`); the measured choice then times the
      optimized program's pieces against the original's. ``False``: each piece alone;
    - ``cache_parameters=True``: in inference, work on parameters alone (the stacks of
      batched weights) runs once and again only when a parameter changes, not every
      step: the parameters move into the stacks' storage (values unchanged), so the stacks
      follow every write to them (:mod:`optimus_eqsat.parameter_cache`; the optimizer prices
      it so). ``report.parameter_packs`` counts those stacks.
    """
    own, graph_options = BackendOptions.split(options)
    return OptimusBackend(own, graph_options)


class OptimusBackend:
    """A ``torch.compile`` backend made by :func:`make_backend`: its options are fixed when
    made; each graph's compile decides a :class:`~.compile_plan.CompilePlan` once.

    ``reports`` holds the pre-grad pass's report of every compile (with the measured
    choice's result once the first call decided it), ``post_grad_reports`` the post-grad
    pass's as (role, report). ``whole_ddp_graph`` is the hook :mod:`.ddp_whole_graph` calls
    under DDP, or None when that is off."""

    def __init__(self, own: BackendOptions, options: dict[str, Any]):
        self.own = own
        install_sparse_gradient_fix()  # (a sparse embedding's backward compiles; inductor_compat)
        options.setdefault("cached_parameters", own.cache_parameters)
        self.scaled_budget = "time_limit_s" not in options  # the default budget grows with each graph
        options.setdefault("raise_on_error", False)  # never crash inside a user's compile
        # A predicted gain under 1% is within the model's error and below the measured choice's
        # margin: the original graph, compiled once, serves better (OptimizeOptions.min_gain).
        options.setdefault("min_gain", BACKEND_MIN_GAIN)
        # A caller's mistake (an unknown option, a missing or broken rule file) is an error
        # here, when the backend is made, not later inside the user's compile.
        OptimizeOptions.from_kwargs(**options)
        self.options = options
        self.reports: list[OptimizeReport] = []
        self.post_grad_reports: list[tuple[str, OptimizeReport]] = []
        self._variants: dict[str, OptimusBackend] = {}  # for torch.compile's (mode, options): _with
        self.whole_ddp_graph: Callable[..., Callable] | None = (
            self.compile_whole_ddp_graph if own.whole_ddp_graph and install_ddp_whole_graph() else None
        )

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Callable:
        """Compile ``gm``. ``torch.compile(model, backend=this, mode=..., options=...)`` passes its
        ``mode`` and ``options`` here: the graph is then compiled by this backend's options with
        those on top (:func:`backend_options`), its reports kept here too."""
        key = _variant_key(mode, options)
        if key is not None:
            return self._with(key, mode, options)(gm, example_inputs)
        with _compile_scope(self.own.inductor_config, self.own.measure and _fake_first_call()):
            piece = current_piece()
            if piece is Piece.ORIGINAL:
                return self._compile_fx()(gm, example_inputs)
            if piece is Piece.OPTIMIZED:
                return self.compile_optimized_piece(gm, example_inputs)
            return self.compile_with_us(gm, example_inputs, run_pre_grad=self.own.pre_grad and piece is None)

    def _compile_fx(self) -> Callable:
        """Inductor's ``compile_fx`` with the user's config (a compile the first call runs,
        after :func:`_compile_scope` is gone, gets it too)."""
        return _inductor(self.own.inductor_config)

    def graph_options_for(self, gm: torch.fx.GraphModule) -> dict[str, Any]:
        """:func:`optimize_graph`'s options for ``gm``: the budget scaled to its size unless
        the caller gave one."""
        if self.scaled_budget:
            return {**self.options, "time_limit_s": backend_time_limit(op_count(gm))}
        return self.options

    def decision_for(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph_options: dict[str, Any], context: str = ""
    ) -> tuple[str | None, StoredDecision | None]:
        """The key of the measured choice on ``gm`` (in ``context``: "ddp" times programs cut at
        DDP's buckets), and what an earlier process decided there."""
        own = self.own
        decision_options = (
            own.inductor,
            own.inductor_config,
            own.measure_budget_s,
            own.memory_slack,
            own.pre_grad,
            own.post_grad,
            own.recompute_masks,
        )
        key = (
            _decision_key(gm, example_inputs, graph_options, (*decision_options, context))
            if own.measure and own.inductor
            else None
        )
        return key, load_decision(key)

    def from_stored_decision(self, original: torch.fx.GraphModule, stored: StoredDecision) -> OptimizeReport:
        """The report of a compile an earlier process's measured choice decided."""
        report = _report_of_decision(original, stored)
        self.reports.append(report)
        _log_report(report)
        return report

    def _with(self, key: str, mode: str | None, options: dict[str, Any] | None) -> OptimusBackend:
        """This backend's options with ``torch.compile``'s ``mode`` and ``options`` on top (made
        once per ``key``, their :func:`_variant_key`), reporting into this backend's lists."""
        if key not in self._variants:
            extra = backend_options(mode, options)
            config = {**self.own.inductor_config, **extra.pop("inductor_config", {})}
            made = {f.name: getattr(self.own, f.name) for f in fields(BackendOptions)}
            variant = make_backend(**{**made, **self.options, **extra, "inductor_config": config})
            variant.reports, variant.post_grad_reports = self.reports, self.post_grad_reports
            self._variants[key] = variant
        return self._variants[key]

    def compile_with_us(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], run_pre_grad: bool) -> Callable:
        """Dynamo's graph through our pre-grad pass (``run_pre_grad``), then Inductor with our
        post-grad and mask passes, behind the measured choice unless an earlier process decided."""
        own = self.own
        # Inductor's passes edit the graph they compile: the original is compiled from a copy.
        original = copy_module(gm)
        optimized, report = gm, None
        graph_options = self.graph_options_for(gm)
        decision, stored = self.decision_for(gm, example_inputs, graph_options)
        if stored is not None and stored.kept != "optimized":  # an earlier process measured it
            self.from_stored_decision(original, stored)
            return self._compile_fx()(
                original, example_inputs, **({"config_patches": mask_patches()} if stored.kept == "masked" else {})
            )
        lifted = lifted_float_inputs(gm) if run_pre_grad and own.inductor else []
        if lifted:  # Inductor restarts this trace: optimizing it would be wasted work
            report = OptimizeReport(nodes_before=op_count(gm), nodes_after=op_count(gm))
            report.fall_back(
                f"Dynamo lifted float attributes to tensor inputs ({', '.join(lifted[:4])}"
                f"{', ...' if len(lifted) > 4 else ''}): Inductor re-traces the graph with them "
                "specialized, and that graph is optimized"
            )
            self.reports.append(report)
        elif run_pre_grad:
            optimized = optimize_graph(gm, example_inputs, **graph_options)
            report = optimized.meta.get("optimus_eqsat")
            if report is not None:
                self.reports.append(report)
        if not own.inductor:
            _log_report(report)
            return optimized
        compile_fx = self._compile_fx()
        rewritten = report is not None and not report.fell_back and report.changed
        if not rewritten and not own.post_grad and not own.recompute_masks:
            _log_report(report)
            return compile_fx(original, example_inputs)
        program = optimized if rewritten else copy_module(original)
        if report is None:  # pre_grad=False: the report of this compile holds the measurement
            report = OptimizeReport(nodes_before=op_count(original), nodes_after=op_count(original))
            self.reports.append(report)
        plan = CompilePlan.decide(
            rewritten=rewritten,
            post_grad=own.post_grad,
            recompute_masks=own.recompute_masks,
            cache_parameters=self.options["cached_parameters"]
            and report.mode == "inference"
            and not freezing_enabled(),
            measure=own.measure
            and stored is None
            and not _writes_module_state(gm, report)
            # symbolic sizes: our post-grad pass skips the graph and no mask can read a constant
            # slice of a cat, so a graph the pre-grad pass left alone has nothing to time, and a
            # baseline would be compiled at once (where the shape environment lives) for nothing
            and (rewritten or not _symbolic(example_inputs)),
        )
        records = PassRecords()  # what this compile's passes record
        start = time.perf_counter()
        compiled = _compile_program(
            compile_fx,
            program,
            example_inputs,
            report,
            plan.patches(graph_options, self.post_grad_reports, records=records),
            plan.cache_parameters,
        )
        report.inductor_seconds = time.perf_counter() - start
        if compiled is None:
            return compile_fx(original, example_inputs)
        report.recomputed_masks = sum(records.masks)  # (the joint graph is partitioned in the forward's compile)
        if stored is not None:  # an earlier process measured this program faster
            report.measured, report.from_cache = stored.measured, True
        if not plan.measure and isinstance(compiled, CachedParameterWork) and _fake_first_call():
            compiled = CompileTimeSafe(compiled)
        if plan.measure:
            compiled = _measured(
                compile_fx,
                compiled,
                original,
                example_inputs,
                report,
                own.measure_budget_s,
                None if plan.rewritten else functools.partial(plan.pass_rewrote, records),
                own.memory_slack,
                self._masked_candidate(original, example_inputs, records),
                on_decided=lambda result: store_decision(decision, result),
                baseline_name="masked",
            )
        _log_report(report)
        return compiled

    def _masked_candidate(
        self, original: torch.fx.GraphModule, example_inputs: Sequence[Any], records: PassRecords
    ) -> dict[str, Deferred]:
        """The measured choice's baseline when masks were recomputed (CPU training): the original
        graph with the masks alone, compiled with Inductor's own settings, in place of the
        original. Recomputing a mask from a tensor the backward saves anyway costs no memory,
        and spares Inductor's bool stores, which on the CPU cost 10-20 ns an element against
        0.1-0.8 for a float op (benchmarks/results/bool_store.md); so the original is not
        compiled at all, one fwd+bwd compile less on the first call (the backend keeps this
        program untimed when none of our passes rewrote more than the masks). Our rewrites can
        cost memory the masks do not (transformer training at 256: 16% more peak memory, the
        masks alone 5% less, measured while our programs went without in-place reuse): the
        measured choice weighs ours against this program. Without a rewrite of ours besides the
        masks, our program is that one: not compiled twice."""
        if not any(records.masks) or _symbolic(example_inputs):
            return {}
        compile_fx = self._compile_fx()

        return {
            "masked": Deferred(lambda: compile_fx(copy_module(original), example_inputs, config_patches=mask_patches()))
        }

    def compile_optimized_piece(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        """A piece of a program our pre-grad pass rewrote, compiled as :meth:`compile_with_us`
        compiles such a program (the whole program's measured choice covers it)."""
        compile_fx = self._compile_fx()
        plan = CompilePlan.decide(
            rewritten=True,
            post_grad=self.own.post_grad,
            recompute_masks=self.own.recompute_masks,
            cache_parameters=False,
            measure=False,
        )
        patches = plan.patches(self.graph_options_for(gm), self.post_grad_reports)
        compiled = _compile(compile_fx, gm, example_inputs, OptimizeReport(), patches)
        return compiled if compiled is not None else compile_fx(gm, example_inputs)

    def compile_whole_ddp_graph(
        self,
        split: Callable[[torch.fx.GraphModule], Callable],
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        buckets: tuple[int, int] | None = None,
        *,
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Callable:
        """DDP (:mod:`.ddp_whole_graph`): optimize Dynamo's whole graph, then let DDPOptimizer cut
        the program kept into its buckets (``split``); the measured choice times the optimized
        program's pieces against the original's, both cut, on the first real call.
        ``torch.compile``'s ``mode`` and ``options``, where given, are on top of this backend's
        (as in :meth:`__call__`)."""
        key = _variant_key(mode, options)
        if key is not None:
            variant = self._with(key, mode, options)
            if variant.whole_ddp_graph is None:
                return split(gm)
            return variant.compile_whole_ddp_graph(split, gm, example_inputs, buckets)
        own = self.own
        if not (own.pre_grad and own.inductor):
            return split(gm)
        with _compile_scope(own.inductor_config, True):
            original = copy_module(gm)
            graph_options = self.graph_options_for(gm)
            # (the decision compares programs cut at these buckets)
            decision, stored = self.decision_for(gm, example_inputs, graph_options, context=f"ddp {buckets}")
            if stored is not None and stored.kept != "optimized":
                self.from_stored_decision(original, stored)
                with piece_mode(Piece.ORIGINAL):
                    return split(original)
            optimized = optimize_graph(gm, example_inputs, **graph_options)
            report = optimized.meta.get("optimus_eqsat")
            if report is not None:
                self.reports.append(report)
            if report is None or report.fell_back or not report.changed:
                _log_report(report)
                with piece_mode(Piece.UNCHANGED):  # our post-grad passes, measured per piece
                    return split(original)
            start = time.perf_counter()
            try:
                with piece_mode(Piece.OPTIMIZED):  # (weight stacks next to their layers: buckets close between them)
                    compiled = split(sink_input_work(optimized))
            except Exception as exc:
                if is_dynamo_signal(exc):
                    raise
                log.warning(
                    "optimus_eqsat: DDPOptimizer failed on the optimized graph (%s); compiling the original",
                    first_line(exc),
                )
                report.fall_back(f"DDPOptimizer: {type(exc).__name__}: {exc}"[:500])
                with piece_mode(Piece.UNCHANGED):
                    return split(original)
            report.inductor_seconds = time.perf_counter() - start
            if stored is not None:  # an earlier process measured this program faster
                report.measured, report.from_cache = stored.measured, True
            report.ddp_pieces = (None, piece_count(compiled))  # (the original is cut only to be timed)
            if own.measure and stored is None:
                start = time.perf_counter()
                with piece_mode(Piece.ORIGINAL):
                    baseline = split(copy_module(original))
                baseline_s = time.perf_counter() - start
                report.ddp_pieces = (piece_count(baseline), report.ddp_pieces[1])
                compiled = _measured(
                    self._compile_fx(),
                    compiled,
                    original,
                    example_inputs,
                    report,
                    own.measure_budget_s,
                    memory_slack=own.memory_slack,
                    baseline=(baseline, baseline_s),
                    on_decided=lambda result: store_decision(decision, result),
                )
            _log_report(report)
            return compiled


def _compile(
    compile_fx: Callable,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    report: OptimizeReport,
    patches: dict[str, Any] | None = None,
) -> Callable | None:
    """Inductor on the optimized graph with config ``patches`` (our post-grad pass); None (and
    a logged fallback) when Inductor fails on it."""
    try:
        return compile_fx(gm, example_inputs, config_patches=patches or {})
    except Exception as exc:
        if is_dynamo_signal(exc):
            raise  # Dynamo restarts the frame (e.g. to tensorify a scalar) and calls us again
        # Inductor's own passes can trip on shapes they do not expect (its attention-fusion
        # pattern on a folded q/k/v permute, for one). Never fail the user's
        # compile for it: compile the graph Dynamo gave us instead. An op Inductor cannot
        # compile at all (a data-dependent output shape) fails the original the same way, and
        # Dynamo splits the graph there as it does for Inductor alone: not worth a warning.
        log.log(
            logging.INFO if is_graph_break_request(exc) else logging.WARNING,
            "optimus_eqsat: Inductor failed on the optimized graph (%s); compiling the original",
            first_line(exc),
        )
        report.fall_back(f"Inductor: {type(exc).__name__}: {exc}"[:500])
        return None


def compile_program(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cache_parameters: bool = True) -> Callable:
    """Inductor on an optimized graph as the backend compiles it: in inference (grad off) behind
    the parameter cache when it has stacks of whole parameters (for benchmarks that compile
    programs they optimized themselves)."""
    compile_fx = _inductor({})

    cache = cache_parameters and not torch.is_grad_enabled() and not freezing_enabled()
    compiled = _compile_program(compile_fx, gm, example_inputs, OptimizeReport(), None, cache)
    return compiled if compiled is not None else compile_fx(gm, example_inputs)


def _compile_program(
    compile_fx: Callable,
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    report: OptimizeReport,
    patches: dict[str, Any] | None,
    cache: bool,
) -> Callable | None:
    """Inductor on the chosen program; with ``cache``, cut first at its parameter-only work,
    which then runs once (:class:`.parameter_cache.CachedParameterWork`). None on failure."""
    work = _parameter_work(gm, example_inputs) if cache else None
    if work is None:
        return _compile(compile_fx, gm, example_inputs, report, patches)
    compiled = _compile(
        compile_fx, work.main, [*static_example_values(work.example_values), *example_inputs], report, patches
    )
    if compiled is None:
        return None
    report.parameter_packs = len(work.packs)
    return CachedParameterWork(work, compiled)


def _parameter_work(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> ParameterWork | None:
    """``gm`` cut at its parameter-only work, which a cache runs once (:mod:`.parameter_cache`);
    None when there is none to cut or the cut fails (the graph is then compiled whole)."""
    try:
        return split_parameter_work(gm, example_inputs)
    except Exception as exc:
        if is_dynamo_signal(exc):
            raise
        log.info("optimus_eqsat: parameter work not cached (%s)", first_line(exc))
        return None


def _measured(
    compile_fx: Callable,
    compiled: Callable,
    original: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    report: OptimizeReport,
    budget_s: float,
    rewritten: Callable[[bool], bool] | None = None,
    memory_slack: tuple[float, int] = MEMORY_SLACK,
    extra: dict[str, Deferred] | None = None,
    on_decided: Callable[[GuardResult], None] | None = None,
    baseline: tuple[Callable, float] | None = None,
    baseline_name: str = "original",
) -> Callable:
    """``compiled`` and the original graph compiled (or ``baseline``: the original compiled by
    the caller, and the seconds that took), of which the first call keeps the faster.

    With ``baseline_name`` naming a program of ``extra`` (``"masked"``), that program is the
    baseline instead and the original is never compiled.

    With ``rewritten`` (``compiled`` is the original graph unless a post-grad pass rewrote
    it), the original is compiled again only when one did: most graphs a pass leaves alone
    then cost one compile and no timing. Graphs with symbolic shapes compile it at once
    (inside Dynamo's compile, where their shape environment lives)."""
    extra = extra or {}
    deferred = Deferred(lambda: compile_fx(copy_module(original), example_inputs))
    programs: dict[str, Any] = {"optimized": compiled, **extra}
    original_s = None
    if baseline_name not in extra:
        baseline_name = "original"
        lazy = rewritten is not None and not _symbolic(example_inputs)
        original_program, original_s = baseline if baseline is not None else (deferred if lazy else deferred(), None)
        programs = {"original": original_program, **programs}

    def record(result: GuardResult | Exception) -> None:
        if isinstance(result, Exception):
            report.fall_back(f"measurement failed: {first_line(result, 400)}")
            return
        for name, program in {"original": deferred, **extra}.items():
            if program.compile_s:
                result.compile_s[name] = program.compile_s
        if original_s is not None:
            result.compile_s["original"] = original_s
        report.measured = result
        if result.kept == "masked":
            report.fall_back(f"measured: kept the original graph with its masks recomputed: {result.summary()}")
        elif result.kept != "optimized":
            report.fall_back(f"measured not faster: {result.summary()}")
        log.info("optimus_eqsat: %s", result.summary())
        if on_decided is not None:
            on_decided(result)

    return FirstCallChoice(
        programs,
        original,
        budget_s,
        record,
        baseline=baseline_name,
        rewritten=rewritten,
        memory_slack=memory_slack,
        run_at_compile_time=run_at_compile_time,
    )


def _decision_key(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any], backend_options: tuple[Any, ...]
) -> str | None:
    """The persistent cache's key of the measured choice on this graph, or None (cache off, a
    graph it cannot key, or a call inside a backward, whose choice is never timed)."""
    try:
        opts = OptimizeOptions.from_kwargs(**options)
        return decision_key(program_key(gm, example_inputs, opts), backend_options, example_inputs)
    except Exception as exc:  # the cache is an aid: never a reason to fail
        log.info("optimus_eqsat: decision not cached (%s: %s)", type(exc).__name__, exc)
        return None


def _report_of_decision(original: torch.fx.GraphModule, stored: StoredDecision) -> OptimizeReport:
    """The report of a compile that an earlier process's measured choice decided: the
    original graph (or it with its masks recomputed) was kept."""
    report = OptimizeReport(
        nodes_before=op_count(original), nodes_after=op_count(original), measured=stored.measured, from_cache=True
    )
    report.fall_back(f"measured not faster (an earlier run's decision, cached): {stored.measured.summary()}")
    return report


def _writes_module_state(gm: torch.fx.GraphModule, report: OptimizeReport) -> bool:
    """Whether the graph writes tensors it reads as attributes, not as inputs (a compiled
    ``optimizer.step()``: Dynamo installs the parameters and the optimizer's state on the
    graph module). Timing would apply the step to them once per round, and the measured
    choice copies only inputs: such a graph is not timed (the report's ``measured`` stays
    None) and the optimizer's prediction decides."""
    written = written_attributes(gm)
    if written:
        log.info(
            "optimus_eqsat: not measured: the graph writes the module's own tensors (%s)",
            ", ".join(sorted(written)[:4]) + (", ..." if len(written) > 4 else ""),
        )
    return bool(written)


def _fake_first_call() -> bool:
    """Whether the program compiled now is called first on fake tensors (DDPOptimizer's pass)."""
    context = torch._guards.TracingContext.try_get()
    return bool(context is not None and getattr(context, "fakify_first_call", False))


def run_at_compile_time(program: Callable, args: Sequence[Any]) -> Any:
    """Run ``program`` on a call at compile time (fake tensors: DDPOptimizer's pass): a program
    behind a parameter cache runs its prologue on the call's parameters and packs nothing."""
    if isinstance(program, CachedParameterWork):
        params = [args[k] for k in program.param_positions]
        return program.main(*program.prologue(*params)[: program.n_values], *args)
    return program(*args)


class CompileTimeSafe:
    """A program behind a parameter cache whose first call may come at compile time
    (:func:`~.guard.compile_time_call`): that call runs it uncached (:func:`run_at_compile_time`)."""

    def __init__(self, program: CachedParameterWork):
        self.program, self.first = program, True

    def __call__(self, *args: Any) -> Any:
        if self.first:
            if compile_time_call(args):
                return run_at_compile_time(self.program, args)
            self.first = False
        return self.program(*args)


@contextlib.contextmanager
def _compile_scope(inductor_config: Mapping[str, Any], eager_backwards: bool) -> Iterator[None]:
    """The scope of one of the backend's compiles: the user's Inductor config, and with
    ``eager_backwards`` every backward compiled with its forward. DDPOptimizer's pieces need
    that: Dynamo hands their lazily compiled backwards one per-piece metadata record each, in
    reverse piece order, and the measured choice compiles several programs' backwards (without
    donated buffers, so ``retain_graph=True`` still works: :mod:`.inductor_compat`)."""
    from torch._inductor import config

    # (no result written over a cat's piece: inductor_compat; here, not when a backend is made,
    # which the import of this module does and a warm process should not pay Inductor's codegen for)
    install_inplace_alias_fix()
    install_donation_alias_fix()  # (no saved buffer that an output shares donated: inductor_compat)
    with contextlib.ExitStack() as patches:
        patches.enter_context(saved_tensor_hooks_held_off())  # (a compile inside checkpoint())
        if inductor_config:
            patches.enter_context(config.patch(dict(inductor_config)))
        if eager_backwards:
            patches.enter_context(backwards_lowered_with_forwards())
        yield


def _inductor(inductor_config: Mapping[str, Any]) -> Callable:
    """Inductor's ``compile_fx`` with the user's config (:func:`_with_config`)."""
    from torch._inductor.compile_fx import compile_fx

    return _with_config(compile_fx, inductor_config)


def _memory_slack(value: Any) -> tuple[float, int]:
    """``memory_slack`` checked when the backend is made: (factor >= 1, bytes >= 0)."""
    try:
        factor, extra = value
        factor, extra = float(factor), int(extra)
    except (TypeError, ValueError):
        raise ValueError(f"memory_slack must be (factor, bytes), got {value!r}") from None
    if factor < 1 or extra < 0:
        raise ValueError(f"memory_slack must be a factor >= 1 and bytes >= 0, got {value!r}")
    return factor, extra


def _symbolic(example_inputs: Sequence[Any]) -> bool:
    """Whether any example input is symbolic (a tensor's size, or a scalar)."""
    return any(symbolic_value(x) or isinstance(x, (torch.SymFloat, torch.SymBool)) for x in example_inputs)


def _log_report(report: OptimizeReport | None) -> None:
    if report is not None:
        log.info("optimus_eqsat backend:\n%s", report.summary())


def _inductor_config_names() -> set[str]:
    from torch._inductor import config as inductor

    return set(inductor.get_config_copy())


def _inductor_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` checked when the backend is made: every key an Inductor config."""
    unknown = sorted(set(config) - _inductor_config_names())
    if unknown:
        raise ValueError(f"inductor_config: not Inductor configs: {unknown}")
    return dict(config)


def _with_config(compile_fx: Callable, config: Mapping[str, Any]) -> Callable:
    """``compile_fx`` with ``config`` under its own ``config_patches`` (ours win: they keep
    our programs correct)."""
    if not config:
        return compile_fx

    def compile_with_config(
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        config_patches: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Callable:
        return compile_fx(gm, example_inputs, config_patches={**config, **(config_patches or {})}, **kwargs)

    return compile_with_config


def backend_options(mode: str | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`make_backend`'s options for ``torch.compile(mode=mode, options=options)``: the
    mode's Inductor configs (``"reduce-overhead"``: CUDA graphs), and each option that is
    not one of ours but names an Inductor config goes to ``inductor_config``."""
    from torch._inductor import list_mode_options

    ours = OptimizeOptions.names() | set(BACKEND_OPTIONS)
    result: dict[str, Any] = {}
    config = dict(list_mode_options(mode)) if mode not in (None, "default") else {}
    inductor_names = _inductor_config_names()
    for name, value in (options or {}).items():
        if name in ours:
            result[name] = value
        elif name in inductor_names:
            config[name] = value
        else:
            raise ValueError(
                f"optimus_eqsat backend: unknown option {name!r}: neither an optimize_graph or "
                f"backend option ({sorted(ours)}) nor an Inductor config"
            )
    if config:
        result["inductor_config"] = {**config, **result.get("inductor_config", {})}
    return result


@dataclass(frozen=True)
class BackendOptions:
    """:func:`make_backend`'s own options (besides :func:`optimize_graph`'s), checked when
    made; :func:`make_backend`'s docstring says what each does."""

    inductor: bool = True
    inductor_config: Mapping[str, Any] = field(default_factory=dict)
    measure: bool = True
    measure_budget_s: float = 1.0
    memory_slack: tuple[float, int] = MEMORY_SLACK
    pre_grad: bool = True
    post_grad: bool = True
    recompute_masks: bool = True
    cache_parameters: bool = True
    whole_ddp_graph: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "inductor_config", _inductor_config(dict(self.inductor_config or {})))
        object.__setattr__(self, "memory_slack", _memory_slack(self.memory_slack))

    @classmethod
    def split(cls, options: dict[str, Any]) -> tuple[BackendOptions, dict[str, Any]]:
        """The backend's options among ``options``, and the rest (:func:`optimize_graph`'s)."""
        own = {f.name: options[f.name] for f in fields(cls) if f.name in options}
        return cls(**own), {k: v for k, v in options.items() if k not in own}


BACKEND_OPTIONS = tuple(f.name for f in fields(BackendOptions))

_MADE: dict[str, Callable] = {}  # backends for torch.compile's (mode, options), by their repr


def optimus_eqsat_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable:
    """The default backend (entry point ``optimus_eqsat``). ``torch.compile`` passes its
    ``mode`` (when not "default") and ``options`` here: see :func:`backend_options`."""
    return _made(mode, options)(gm, example_inputs)


def _variant_key(mode: str | None, options: dict[str, Any] | None) -> str | None:
    """A key for ``torch.compile``'s ``mode`` and ``options``, or None when they ask for nothing."""
    if mode in (None, "default") and not options:
        return None
    return repr((mode, sorted((options or {}).items())))


def _made(mode: str | None, options: dict[str, Any] | None) -> Callable:
    """The backend made for ``torch.compile``'s ``mode`` and ``options`` (made once)."""
    key = _variant_key(mode, options)
    if key is None:
        return _DEFAULT
    if key not in _MADE:
        _MADE[key] = make_backend(**backend_options(mode, options))
    return _MADE[key]


def _whole_ddp_graph(
    split: Callable[[torch.fx.GraphModule], Callable],
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    buckets: tuple[int, int] | None = None,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable:
    """The default backend under DDP (:mod:`.ddp_whole_graph`): that of ``mode`` and ``options``."""
    made = _made(mode, options)
    whole = getattr(made, "whole_ddp_graph", None)
    return whole(split, gm, example_inputs, buckets=buckets) if whole is not None else split(gm)


optimus_eqsat_backend.whole_ddp_graph = _whole_ddp_graph  # type: ignore[attr-defined]
_DEFAULT = make_backend()
