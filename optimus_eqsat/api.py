"""The public entry point: :func:`optimize_graph`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from optimus_eqsat import rewrites
from optimus_eqsat.aten_calls import torch_calls
from optimus_eqsat.autocast_casts import autocast_casts_in, autocast_off, with_explicit_casts, without_autocast
from optimus_eqsat.budget import Budget
from optimus_eqsat.checkpoint_regions import with_regions_inlined
from optimus_eqsat.decompose import before_translation
from optimus_eqsat.egraph_export import export
from optimus_eqsat.extract.egraph import ExtractionGraph
from optimus_eqsat.extract.egraph_cost import EGraphCost
from optimus_eqsat.extract.extractors import get_extractor
from optimus_eqsat.extract.freezing import parameter_placeholders
from optimus_eqsat.extract.group_search import GroupMove, batch_group_moves, improve_with_groups
from optimus_eqsat.fx_graphs import copy_module, has_fake_meta, keep_unread_state, op_count
from optimus_eqsat.fxvocab import flat_example_inputs, target_name
from optimus_eqsat.fxvocab.global_state import (
    ambient_autocast,
    decline_state_changes,
    state_changes,
    state_changes_by_kind,
)
from optimus_eqsat.fxvocab.symbolic import DeclinedGraph, decline_data_dependent_sizes
from optimus_eqsat.inductor_compat import is_dynamo_signal, split_attention_key_permutes
from optimus_eqsat.keep_gradients import keep_gradient_absences, keep_gradient_inputs
from optimus_eqsat.member_splits import narrows_as_splits
from optimus_eqsat.module_calls import functional_module_calls, guard_written_out_modes
from optimus_eqsat.no_grad_regions import with_no_grad_regions_detached
from optimus_eqsat.node_computations import same_program
from optimus_eqsat.objective import Objective, predict
from optimus_eqsat.options import OptimizeOptions
from optimus_eqsat.own_outputs import contiguous_outputs, input_views_as_written, own_sliced_outputs
from optimus_eqsat.program_cache import load_program, program_key, store_program
from optimus_eqsat.rebuild import RebuildCycle, propagate_meta, rebuild
from optimus_eqsat.refine_run import refine_run
from optimus_eqsat.report import OptimizeReport
from optimus_eqsat.rewrites import batching as _batching  # noqa: F401  (registers rewrites.batching)
from optimus_eqsat.run_support import gc_paused, phase, saved_tensor_hooks_held_off
from optimus_eqsat.saturate import EGraphSession, Limits, StopReason, TimeLimitReached
from optimus_eqsat.term import VIEW_CTORS
from optimus_eqsat.translate import translate

log = logging.getLogger("optimus_eqsat")

# Extractions a run builds at most where each runs in a cycle through an opaque op
# (OptimizationRun._build_without_cycles): each repair removes the member views of one cycle,
# and another may then close (five in a row on a fuzzed aten graph with in-place ops).
CYCLE_REPAIRS = 8


class OptimizationError(RuntimeError):
    """Raised (with raise_on_error=True) when any phase fails."""


def optimize_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, **options: Any
) -> torch.fx.GraphModule:
    """Optimize an FX graph by equality saturation; return a new GraphModule.

    Accepts graphs from ``torch.fx.symbolic_trace`` (call_module nodes), from
    Dynamo (a backend's ``gm``, shapes in ``meta["example_value"]``) and from
    ``torch.export`` (``meta["val"]``). Without shape meta, ``example_inputs``
    are run once to record shapes; without either, shape-dependent rules do
    not fire. The input module is not modified.

    The report (:class:`OptimizeReport`) is ``result.meta["optimus_eqsat"]``.
    On any failure the original graph is returned (as a new module) with the
    reason in the report and a logged warning, unless ``raise_on_error=True``.

    Example::

        gm = torch.fx.symbolic_trace(model)
        opt = optimize_graph(gm, (x,))
        print(opt.meta["optimus_eqsat"].summary())

    See :class:`OptimizeOptions` for the options.
    """
    opts = OptimizeOptions.from_kwargs(**options)
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"optimize_graph takes a torch.fx.GraphModule, got {type(gm).__name__}")
    example_inputs = flat_example_inputs(gm, example_inputs)  # (an exported module's call inputs)
    key = program_key(gm, example_inputs, opts)
    cached = load_program(key, gm, example_inputs) if key is not None else None
    if cached is not None:
        guard_written_out_modes(gm, keep_unread_state(gm, cached))
        return cached
    report = OptimizeReport(nodes_before=op_count(gm))
    wants_meta = None  # whether the run propagated fake-tensor meta (known once it ran)
    try:
        with gc_paused(), saved_tensor_hooks_held_off():
            decline_gradient_hooks(gm)
            run = OptimizationRun(gm, example_inputs, opts, report)
            result = run.optimize()
            wants_meta = run._wants_meta
            if run.session is not None:  # (nothing else holds this run: its e-graph serves the next)
                run.session.release()
    except DeclinedGraph as exc:  # declined, not failed: the graph is returned as it is
        log.info("optimus_eqsat: graph declined: %s", exc)
        report.fall_back(f"declined: {exc}")
        result = copy_module(gm, lazy=True)
    except TimeLimitReached as exc:  # the budget ran out before there was a program: the original
        log.info("optimus_eqsat: %s", exc)
        report.fall_back(f"{exc}; kept the original")
        report.stop_reason = StopReason.TIME_LIMIT.value
        result = copy_module(gm, lazy=True)
        key = None  # (not stored: a restart falls back as fast, and storing a large graph takes seconds)
    except BaseException as exc:  # (a panic in egglog's Rust code is a BaseException)
        if not isinstance(exc, Exception) and not is_rust_panic(exc):
            raise  # KeyboardInterrupt, SystemExit
        if is_dynamo_signal(exc):
            raise  # a control-flow signal of Dynamo's, not a failure
        if opts.raise_on_error:
            raise OptimizationError(f"optimus_eqsat failed: {exc}") from exc
        log.warning("optimus_eqsat: returning the original graph: %s: %s", type(exc).__name__, exc)
        report.fall_back(f"{type(exc).__name__}: {exc}")
        result = copy_module(gm, lazy=True)
    report.nodes_after = op_count(result)
    result.meta["optimus_eqsat"] = report
    keep_unread_state(gm, result)
    if key is not None:
        store_program(key, gm, result, report, bool(wants_meta))
    guard_written_out_modes(gm, result)  # (after the store: the cache holds graphs of tensors)
    return result


def _may_close_cycles(chosen: str, own: set[str]) -> bool:
    """Whether a class's chosen constructor may close a cycle through an opaque op, and can
    go: a view (a member read from a batched term, which reads the op's result) where no
    original node of the class is such a view, so the original program stays extractable."""
    return bool(own) and chosen in VIEW_CTORS and chosen not in own


def is_rust_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a panic raised by Rust code through pyo3 (egglog's): a
    ``BaseException`` that a failed optimization must still catch and fall back on."""
    return type(exc).__name__ == "PanicException"


#: Tensor methods that register a gradient hook (Dynamo keeps them in the graph, as a method or
#: as a function of the tensor and a hook body it lifts)
GRADIENT_HOOKS = frozenset({"register_hook", "register_post_accumulate_grad_hook"})


def decline_gradient_hooks(gm: torch.fx.GraphModule) -> None:
    """Raise :class:`DeclinedGraph` when the graph registers a gradient hook on one of its tensors
    (``emb.register_hook(...)`` in a forward): the whole gradient must reach that tensor, and a
    rewrite that computes its readers from what made it would bypass the hook."""
    hooked = [
        n.name
        for n in gm.graph.nodes
        if n.op in ("call_method", "call_function") and target_name(n.target) in GRADIENT_HOOKS
    ]
    if hooked:
        raise DeclinedGraph(f"gradient hooks registered in the graph ({', '.join(hooked[:4])}): left as it is")


class OptimizationRun:
    """One optimization, phase by phase, keeping every intermediate.

    :func:`optimize_graph` runs all phases; the exploration API keeps the
    object to inspect the saturated e-graph and re-extract with other choices.
    ``rulesets``: the egglog programs to load (default: ``options.egglog_rulesets()``;
    the explorer passes them with banned rules cut out).

    Attributes after :meth:`saturate`: ``translation`` (facts and the maps back
    to FX), ``session`` (the live egglog e-graph), ``saturation`` (its report),
    ``egraph`` (the exported e-graph: classes of term nodes), ``cost`` (the
    e-node cost function). After :meth:`extract`: ``graph`` (what the
    extractor read) and ``extraction``.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any] | None = None,
        options: OptimizeOptions | None = None,
        report: OptimizeReport | None = None,
        rulesets: Sequence[rewrites.RuleSet] | None = None,
    ):
        self.gm, self.example_inputs = gm, example_inputs
        # what is translated: ``gm``, its no-grad regions' reads detached and autocast's casts
        # written in (for autocast in force and for autocast regions) where it has them
        self.source: torch.fx.GraphModule = gm
        self.autocast: list[tuple[str, torch.dtype]] = []
        self.autocast_off = False  # whether the rebuilt graph runs with the autocast in force off
        # whether the translated graph carried fake-tensor meta where ``gm`` had none (its module
        # calls written out, with meta): its nodes' meta, copied into the rebuild, is then
        # propagated afresh there, not left as the value of the node it was copied from
        self.translated_with_meta = False
        self.session: EGraphSession | None = None  # made by saturate
        self.batches: rewrites.batching.Batches | None = None
        self.options = options or OptimizeOptions()
        self.rulesets = None if rulesets is None else list(rulesets)
        self.report = report or OptimizeReport(nodes_before=op_count(gm))
        self.objective = Objective.resolve(
            self.options.profile, self.options.mode, gm, example_inputs, self.options.cached_parameters
        )
        self.report.mode, self.report.profile = self.objective.mode, self.objective.profile.name

    def optimize(self) -> torch.fx.GraphModule:
        """Every phase in order: saturate, extract, finish (build, verify, refine)."""
        self.saturate()
        self.extract()
        return self.finish()

    def saturate(self) -> None:
        """Translate, load the facts and run the rule sets under the limits."""
        opts, report = self.options, self.report
        self.budget = budget = Budget(opts.time_limit_s)  # the whole run's (optimus_eqsat/budget.py)
        rulesets = opts.egglog_rulesets() if self.rulesets is None else self.rulesets
        with phase(report, "translate"):
            # (a graph the phases after saturation alone would take the budget for is not
            # translated, which costs seconds in proportion to its size: the original at once)
            budget.fx_nodes = op_count(self.gm)
            budget.check_fits()
            decline_data_dependent_sizes(self.gm)
            regions = state_changes_by_kind(self.gm)
            decline_state_changes([change for kind, change in regions if kind == "grad"])
            if any(kind == "no_grad" for kind, _ in regions):  # (ops in no-grad regions)
                self.source = with_no_grad_regions_detached(self.gm)
            self.autocast = ambient_autocast(self.gm)
            if self.autocast or any(kind == "autocast" for kind, _ in regions):
                # the e-graph's equalities hold for ops autocast leaves alone
                explicit = with_explicit_casts(self.source, self.autocast)
                self.source, self.autocast_off = explicit.gm, explicit.needs_autocast_off
            # norm and dropout modules (symbolic_trace) and aten calls (torch.export) as Dynamo
            # traces them; private in-place ops made out-of-place, batch norms decomposed,
            # dropouts sharing their draws
            source = functional_module_calls(torch_calls(self.source), self.example_inputs)
            self.translated_with_meta = has_fake_meta(source)
            self.translation = t = translate(before_translation(source), self.example_inputs)
        budget.fx_nodes = len(t.nodes)
        report.opaque_nodes = {t.nodes[i].name: why for i, why in t.opaque_reasons.items()}
        if not t.roots:  # (pieces Dynamo hands over may return only None or constants)
            raise DeclinedGraph("no output or kept op reads a tensor the graph computes: nothing to optimize")
        with phase(report, "load"):
            budget.check("loading the graph")
            self.session = EGraphSession(rulesets)
            self.session.load(t.facts, fx_nodes=len(t.nodes), deadline=budget.saturation_deadline())
        limits = dataclasses.replace(opts.limits, deadline=budget.saturation_deadline())
        with phase(report, "saturate"):
            self.saturation = sat = self.session.saturate(limits, record_eclasses=opts.record_eclasses)
        if sat.iterations == 0 and sat.stop_reason is StopReason.TIME_LIMIT:  # the e-graph is the original
            raise TimeLimitReached(f"time limit ({opts.time_limit_s:g} s) reached before saturation")
        if "batching" in opts.rulesets and sat.stop_reason is not StopReason.TIME_LIMIT:
            # Groups are found on the translated graph; their facts join the e-graph,
            # and a second saturation lets stacks cancel against splits and cats.
            with phase(report, "batch"):
                self.batches = rewrites.batching.batch_facts(t, self.objective.profile, self.objective.frozen)
                report.batched = self.batches.members
                self.session.load(self.batches.facts, fx_nodes=len(t.nodes))
            if self.batches.facts:
                with phase(report, "saturate"):
                    after = Limits(
                        opts.batch_iterations, opts.max_enodes, opts.time_limit_s, deadline=budget.saturation_deadline()
                    )
                    sat = self.saturation = self.session.saturate(
                        after, previous=sat, record_eclasses=opts.record_eclasses
                    )
        report.record_saturation(sat)
        with phase(report, "export"):
            self.egraph = export(self.session.egraph)
        report.eclasses = len(self.egraph.classes)
        shapes = self.egraph.shapes
        if t.symbols:  # symbolic sizes are priced at their example value
            shapes = {c: t.symbols.hinted(s) for c, s in shapes.items()}
        constants = (
            self.egraph.constant_classes(self._parameter_ids()) if self.objective.parameter_work_once else frozenset()
        )
        self.cost = EGraphCost(
            shapes,
            lambda key: t.registry.specs[key].kind,
            self.objective.profile,
            self.egraph.input_classes(),
            self.egraph.list_lengths(),
            self.objective.training,
            constants,
        )

    def _parameter_ids(self) -> set[int]:
        """Ids of the translation's parameters: lifted to inputs (Dynamo), module attributes
        (get_attr) and parameters of call_module nodes (the translation's parameter leaves)."""
        t = self.translation
        lifted = parameter_placeholders(t.gm, self.example_inputs or ())
        return {i for n, i in t.index.items() if n in lifted or n.op == "get_attr"} | set(t.param_leaves)

    @property
    def roots(self) -> list[int]:
        """E-classes extracted together: graph outputs and inputs of kept (opaque) nodes."""
        return [self.egraph.class_of_id[i] for i in self.translation.roots]

    def extract(self, cost: Any = None, extractor: str | None = None, graph: ExtractionGraph | None = None) -> None:
        """Choose one program; ``cost(class, node)`` overrides the e-node prices, or
        ``graph`` gives them already priced."""
        opts = self.options
        name = extractor or opts.extractor
        with phase(self.report, "extract"):
            self.graph = graph or self.egraph.extraction_graph(self.roots, cost or self.cost)
            ilp_s = opts.ilp_time_limit_s
            if hasattr(self, "budget"):  # what is left of the run's time budget
                name, ilp_s = self.budget.extractor(name, ilp_s)
            options = {"time_limit": ilp_s} if name in ("ilp", "auto") else {}
            self.extraction = get_extractor(name, **options).extract(self.graph)
            if self.batches is not None:
                self.extraction, self.report.group_moves = improve_with_groups(
                    self.graph, self.extraction, self.group_moves()
                )
        self.report.record_extraction(self.extraction)

    def build(self, meta: bool = True) -> torch.fx.GraphModule:
        """The extracted program as a new GraphModule (no cost check).

        ``meta=False`` skips fake-tensor propagation: new nodes then carry only
        the e-graph's shapes, enough for the cost model (candidates in refine).
        """
        result = rebuild(self.translation, self.egraph, self.extraction.choice)
        split_attention_key_permutes(result)  # a form Inductor's attention fusion crashes on
        if meta and self._wants_meta:
            # Dynamo/export graphs: new nodes get fake-tensor meta like the rest (Inductor's
            # own passes read it). A symbolic_trace graph with example inputs skips this:
            # the cost model runs the inputs instead, and fake tensors import torch._dynamo
            # (seconds, the first time).
            with self._as_it_runs():
                propagate_meta(result, self.example_inputs, self.translation.gm)
        return result

    def _build_without_cycles(self, meta: bool) -> torch.fx.GraphModule:
        """:meth:`build`; where the extraction runs in a cycle through an op the e-graph keeps
        opaque (what such an op reads is not in the e-graph, so the extractors cannot see it),
        extract again without the choices on it that may close it (:func:`_may_close_cycles`),
        at most ``CYCLE_REPAIRS`` times."""
        forbidden: set[tuple[int, int]] = set()  # (class, id of the e-node)
        own_kinds: dict[int, set[str]] | None = None  # made at the first cycle: most runs have none
        cost = self.cost

        def without_forbidden(c: int, node: Any) -> float:
            return math.inf if (c, id(node)) in forbidden else cost(c, node)

        for _ in range(CYCLE_REPAIRS):
            try:
                return self.build(meta)
            except RebuildCycle as exc:
                own_kinds = self._own_kinds() if own_kinds is None else own_kinds
                chosen = [(c, self.egraph.classes[c][self.extraction.choice[c]]) for c in exc.classes]
                closing = {(c, id(node)) for c, node in chosen if _may_close_cycles(node.ctor, own_kinds.get(c, set()))}
                if closing <= forbidden:
                    raise
                forbidden |= closing
                log.info("optimus_eqsat: %s; extracting again without %d choices on it", exc, len(closing))
                self.extract(cost=without_forbidden)
        return self.build(meta)

    def _own_kinds(self) -> dict[int, set[str]]:
        """Each e-class of an original node -> the constructors of its original nodes' terms."""
        kinds: dict[int, set[str]] = {}
        for i, term in self.translation.terms.items():
            if i in self.egraph.class_of_id:
                kinds.setdefault(self.egraph.class_of_id[i], set()).add(term.ctor)
        return kinds

    def _as_it_runs(self) -> contextlib.AbstractContextManager[None]:
        """The autocast in force turned off: the translated graph has its casts written out
        and computes without it what the original computes under it (a float32 region's ops,
        its markers dropped, would be cast under it)."""
        return autocast_off(device for device, _ in self.autocast)

    @property
    def _wants_meta(self) -> bool:
        """Whether a full build propagates fake-tensor meta (Dynamo/export graphs, and graphs
        whose module calls were written out with meta)."""
        return self.example_inputs is None or has_fake_meta(self.gm) or self.translated_with_meta

    def _not_worth_it(self) -> str | None:
        """Why the result is not worth a different program (predicted slower, or faster by less
        than ``min_gain``); None when it is."""
        report, min_gain = self.report, self.options.min_gain
        before, after = report.cost_before, report.cost_after
        assert before is not None and after is not None  # (finish predicted both)
        if (report.launches_after, after) == (report.launches_before, before):
            return None  # predicted alike: unchanged, not a fallback
        if after > before * (1 + 1e-9):
            return f"predicted cost rose ({before:.3e} s -> {after:.3e} s)"
        step = before + self.options.rest_of_step_s  # min_gain is a fraction of the whole step
        if before - after < min_gain * step:
            of = "" if step == before else f" of a {step:.3e} s step"
            return (
                f"predicted gain {(before - after) / step:.2%}{of} below min_gain {min_gain:.0%} "
                f"({before:.3e} s -> {after:.3e} s)"
            )
        return None

    def group_moves(self) -> list[GroupMove]:
        """For every batch group: each member's choice of its slice of the batched term."""
        assert self.batches is not None, "group moves need a run with batching"
        return batch_group_moves(self.egraph, self.batches.groups, lambda i: self.translation.nodes[i].name)

    def finish(self) -> torch.fx.GraphModule:
        """Rebuild, predict launches before/after, and keep the original if the result is worse."""
        with self._as_it_runs():  # (predictions may run the graphs)
            return self._finish()

    def _finish(self) -> torch.fx.GraphModule:
        opts, report, gm = self.options, self.report, self.gm
        # With refine, candidates are compared on cheap builds (e-graph shapes, no fake
        # tensors: most of a build's time); only the winner gets full meta.
        refine = opts.refine_batches and self.batches is not None
        result: torch.fx.GraphModule | None
        with phase(report, "rebuild"):
            result = self._build_without_cycles(meta=not refine)
        with phase(report, "verify"):
            before = with_regions_inlined(self.source)
            report.launches_before, report.cost_before = predict(before, self.example_inputs, self.objective)
            if same_program(result, before):  # (nothing rewritten: it costs what it cost)
                report.launches_after, report.cost_after = report.launches_before, report.cost_before
            else:
                report.launches_after, report.cost_after = predict(result, self.example_inputs, self.objective)
        if refine:
            with phase(report, "refine"):
                result, report.launches_after, report.cost_after = refine_run(
                    self, result, report.launches_after, report.cost_after
                )
            with phase(report, "rebuild"):
                if result is None:  # a variant won: build it, with meta
                    result = self.build()
                elif self._wants_meta:  # the cheap build was kept: only its meta is missing
                    propagate_meta(result, self.example_inputs, self.translation.gm)
        reason = self._not_worth_it() if opts.never_worse else None
        misplaced = [] if reason else state_changes(result)  # (the original had none: see saturate)
        if misplaced:
            reason = f"the rebuilt graph changes what a grad-mode or autocast region computes ({misplaced[0]})"
        cast = [] if reason or not self.autocast or self.autocast_off else autocast_casts_in(result, self.autocast)
        if cast:
            reason = f"autocast would cast an op of the rebuilt graph ({cast[0]}), changing its precision"
        if reason:
            report.fall_back(f"{reason}; kept the original")
            log.info("optimus_eqsat: %s", report.fallback_reason)
            report.launches_after, report.cost_after = report.launches_before, report.cost_before
            return copy_module(gm)
        # (before the copies below, which are contiguous)
        rewritten = input_views_as_written(gm, result)
        rewritten += contiguous_outputs(gm, result, self.example_inputs)
        if self.objective.mode == "training":  # (the source's detaches say what no-grad regions read)
            kept = keep_gradient_inputs(self.source, result, self.example_inputs)
            rewritten += keep_gradient_absences(self.source, result, self.example_inputs)
            rewritten += own_sliced_outputs(gm, result)
            report.kept_gradient_inputs = kept
            rewritten += kept
            rewritten += narrows_as_splits(result)  # (after the outputs' copies, which read the narrows)
        if rewritten and self._wants_meta:
            propagate_meta(result, self.example_inputs)
        if self.autocast_off:  # (its casts are all written out: see optimus_eqsat/autocast_casts.py)
            without_autocast(result, [device for device, _ in self.autocast])
        return result
