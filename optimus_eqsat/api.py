"""The public entry point: :func:`optimize_graph`."""

from __future__ import annotations

import gc
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.fx

from . import rewrites
from .rewrites import batching as _batching  # noqa: F401  (registers rewrites.batching)
from .egraph_export import export
from .extract.egraph import ENode, ExtractionGraph
from .extract.egraph_cost import EGraphCost
from .extract.extractors import get_extractor
from .extract.group_search import GroupMove, improve_with_groups
from .inductor_compat import is_dynamo_signal, split_attention_key_permutes
from .rebuild import propagate_meta, rebuild
from .report import OptimizeReport
from .saturate import EGraphSession, Limits, check_ruleset
from .translate import translate

log = logging.getLogger("optimus_eqsat")

DEFAULT_RULESETS = ("splitcat", "algebraic", "batching")


@dataclass(frozen=True)
class OptimizeOptions:
    """Options of :func:`optimize_graph` (all keyword arguments).

    Attributes:
        rulesets: rule families to run, by name (unknown names are an error;
            families not shipped yet are skipped). Default: all shipped.
        rule_files: extra egglog rule files, each declaring one ruleset.
        max_iterations, max_enodes, time_limit_s: saturation limits.
        batch_iterations: iterations of the second saturation, after the batch facts join
            (their stacks meet the splits and cats around them within 5 on the benchmark
            models; each later one mostly walks long cat runs again: 1 s apiece at 2,000
            features).
        extractor: "auto" (ILP when small enough, else greedy), "greedy" or "ilp".
        ilp_time_limit_s: the ILP's own time limit.
        profile: device profile of the cost model ("h100", "h200", "a100", "cpu"), or a
            ``DeviceProfile`` (e.g. ``get_profile("h100", launch_overhead_s=3e-6)``).
        raise_on_error: raise instead of falling back to the original graph.
        never_worse: return the original when the cost model predicts the result slower.
        refine_batches: re-extract without each kind of batch and keep the variant the
            fusion-aware cost model (fx_cost) predicts fastest.
        refine_time_limit_s: a refine variant is started only when it is expected to end
            within this many seconds of refining (each variant is a greedy extraction and
            a rebuild, expected to take as long as the main one when that was greedy; on
            20,000-node graphs tens of seconds). The report lists the variants tried.
        record_eclasses: count e-classes after every iteration into the saturation
            history (costs a freeze of the e-graph each time; the explorer turns it on).
    """

    rulesets: tuple[str, ...] = DEFAULT_RULESETS
    rule_files: tuple[str, ...] = ()
    max_iterations: int = Limits.max_iterations
    max_enodes: int | None = Limits.max_enodes
    time_limit_s: float = Limits.time_limit_s
    batch_iterations: int = 6
    extractor: str = "auto"
    ilp_time_limit_s: float = 10.0
    profile: Any = "h100"  # str or extract.cost_model.DeviceProfile
    raise_on_error: bool = False
    never_worse: bool = True
    refine_batches: bool = True
    refine_time_limit_s: float = 10.0
    record_eclasses: bool = False

    @classmethod
    def from_kwargs(cls, **options: Any) -> "OptimizeOptions":
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown optimize_graph option(s) {sorted(unknown)}; known: {sorted(known)}")
        for name in ("rulesets", "rule_files"):
            if name in options and isinstance(options[name], (str, Path)):
                options[name] = (options[name],)
            if name in options:
                options[name] = tuple(str(v) for v in options[name])
        opts = cls(**options)
        opts.validate()
        return opts

    def validate(self) -> None:
        """Raise ValueError on option values that can never work (a caller's mistake, not a fallback)."""
        known = set(rewrites.builtin_rulesets()) | set(rewrites.PYTHON_FAMILIES) | set(DEFAULT_RULESETS)
        unknown = [name for name in self.rulesets if name not in known]
        if unknown:
            raise ValueError(f"unknown ruleset(s) {unknown}; shipped: {sorted(known)}")
        if self.extractor not in ("auto", "greedy", "ilp"):
            raise ValueError(f"unknown extractor {self.extractor!r}; choose auto, greedy or ilp")
        from .extract.cost_model import get_profile

        try:
            get_profile(self.profile)
        except KeyError as exc:
            raise ValueError(str(exc)) from None
        self.user_rulesets()  # a missing or broken rule file is the caller's mistake: an error naming it

    def user_rulesets(self) -> list[rewrites.RuleSet]:
        """The rule files, read and checked by egglog (``RuleFileError`` names a bad one)."""
        shipped = rewrites.builtin_rulesets().values()
        loaded = [rewrites.load_rule_file(path) for path in self.rule_files]
        for ruleset in loaded:
            check_ruleset(ruleset, shipped)
        return loaded

    @property
    def limits(self) -> Limits:
        return Limits(self.max_iterations, self.max_enodes, self.time_limit_s)


class OptimizationError(RuntimeError):
    """Raised (with raise_on_error=True) when any phase fails."""


def _op_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def _has_fake_meta(gm: torch.fx.GraphModule) -> bool:
    return any("val" in n.meta or "example_value" in n.meta for n in gm.graph.nodes if n.op == "placeholder")


def _copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph._codegen = gm.graph._codegen
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def _select_rulesets(options: OptimizeOptions) -> list[rewrites.RuleSet]:
    """The egglog families to load (Python families such as batching run separately)."""
    options.validate()  # options built directly, not through from_kwargs, are checked here too
    shipped = rewrites.builtin_rulesets()
    selected = [shipped[name] for name in options.rulesets if name in shipped]
    return selected + [rewrites.load_rule_file(path) for path in options.rule_files]


@contextmanager
def _phase(report: OptimizeReport, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        report.phase_seconds[name] = report.phase_seconds.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector, restoring its state after.

    An optimization builds millions of small objects (e-nodes, term rows, FX
    nodes) that are never cyclic garbage, and each full collection re-scans
    them all: on the 2,000-feature extreme graph collections took about a
    quarter of the optimizer's time (export 3.0 s -> 0.7 s, extraction
    13 s -> 9 s without them, CPU time on a loaded machine). Reference
    counting still frees everything acyclic; cycles wait for the next
    collection after the run.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _predict(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, profile: str) -> tuple[int, float]:
    from .extract.fx_cost import predict_kernels

    kernels = predict_kernels(gm, example_inputs, profile)
    return len(kernels), sum(k.seconds for k in kernels)


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
    report = OptimizeReport(nodes_before=_op_count(gm))
    try:
        with _gc_paused():
            result = _optimize(gm, example_inputs, opts, report)
    except Exception as exc:
        if is_dynamo_signal(exc):
            raise  # a control-flow signal of Dynamo's, not a failure
        if opts.raise_on_error:
            raise OptimizationError(f"optimus_eqsat failed: {exc}") from exc
        log.warning("optimus_eqsat: returning the original graph: %s: %s", type(exc).__name__, exc)
        report.fell_back, report.fallback_reason = True, f"{type(exc).__name__}: {exc}"
        result = _copy_module(gm)
    report.nodes_after = _op_count(result)
    result.meta["optimus_eqsat"] = report
    return result


def _optimize(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, opts: OptimizeOptions,
              report: OptimizeReport) -> torch.fx.GraphModule:
    run = OptimizationRun(gm, example_inputs, opts, report)
    run.saturate()
    run.extract()
    return run.finish()


def _path_to(eg: Any, start: int, target: int | None, depth: int = 3) -> dict[int, int] | None:
    """Node choices leading from class ``start`` to class ``target`` in at most ``depth`` steps
    (a member's Reshape(Slice(batched)) alternative), or None."""
    if target is None:
        return None
    frontier: list[tuple[int, dict[int, int]]] = [(start, {})]
    for _ in range(depth):
        following = []
        for c, picks in frontier:
            for k, node in enumerate(eg.classes[c]):
                if node.ctor in ("Id", "LId"):
                    continue
                if target in node.children:
                    return {**picks, c: k}
                following.extend((ch, {**picks, c: k}) for ch in node.children if ch not in picks)
        frontier = following[:64]  # views only: the path is short and narrow
    return None


# A class whose batched alternative refine forbids keeps these (the member's slice of
# another group's result, a cat of views): only the batched computation itself goes.
_KEPT_WHEN_BANNED = frozenset({"Leaf", "Slice", "Reshape", "Permute", "Expand", "Cat"})

# Batch kinds whose price in the e-graph is least sure come first in refine, which may
# only have time for one or two variants on large graphs: padded linears (whether the
# pads fuse), elementwise batches (whether their stacks are views); then the rest.
_REFINE_FIRST = ("batch-linear_padk", "batch-elementwise")


def _refine_priority(kind: str) -> tuple[int, str]:
    return (_REFINE_FIRST.index(kind) if kind in _REFINE_FIRST else len(_REFINE_FIRST), kind)


class OptimizationRun:
    """One optimization, phase by phase, keeping every intermediate.

    :func:`optimize_graph` runs all phases; the exploration API keeps the
    object to inspect the saturated e-graph and re-extract with other choices.

    Attributes after :meth:`saturate`: ``translation`` (facts and the maps back
    to FX), ``session`` (the live egglog e-graph), ``saturation`` (its report),
    ``egraph`` (the exported e-graph: classes of term nodes), ``cost`` (the
    e-node cost function). After :meth:`extract`: ``graph`` (what the
    extractor read) and ``extraction``.
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None,
                 options: OptimizeOptions | None = None, report: OptimizeReport | None = None):
        self.gm, self.example_inputs = gm, example_inputs
        self.batches = None
        self.options = options or OptimizeOptions()
        self.report = report or OptimizeReport(nodes_before=_op_count(gm))

    def saturate(self) -> None:
        """Translate, load the facts and run the rule sets under the limits."""
        opts, report = self.options, self.report
        rulesets = _select_rulesets(opts)
        with _phase(report, "translate"):
            self.translation = t = translate(self.gm, self.example_inputs)
        report.opaque_nodes = {t.nodes[i].name: why for i, why in t.opaque_reasons.items()}
        with _phase(report, "load"):
            self.session = EGraphSession(rulesets)
            self.session.load(t.facts, fx_nodes=len(t.nodes))
        with _phase(report, "saturate"):
            self.saturation = sat = self.session.saturate(opts.limits, record_eclasses=opts.record_eclasses)
        if "batching" in opts.rulesets:
            # Groups are found on the translated graph; their facts join the e-graph,
            # and a second saturation lets stacks cancel against splits and cats.
            with _phase(report, "batch"):
                self.batches = rewrites.batching.batch_facts(t, opts.profile)
                report.batched = self.batches.members
                self.session.load(self.batches.facts, fx_nodes=len(t.nodes))
            if self.batches.facts:
                with _phase(report, "saturate"):
                    after = Limits(opts.batch_iterations, opts.max_enodes, opts.time_limit_s)
                    sat = self.saturation = self.session.saturate(after, previous=sat,
                                                                  record_eclasses=opts.record_eclasses)
        report.stop_reason, report.iterations, report.enodes = sat.stop_reason.value, sat.iterations, sat.enodes
        report.rules_fired = {k: v for k, v in sorted(sat.rule_matches.items()) if v}
        report.history = sat.history
        with _phase(report, "export"):
            self.egraph = export(self.session.egraph)
        report.eclasses = len(self.egraph.classes)
        self.cost = EGraphCost(self.egraph.shapes, lambda key: t.registry.specs[key].kind, opts.profile,
                               self.egraph.input_classes(), self.egraph.list_lengths())

    @property
    def roots(self) -> list[int]:
        """E-classes extracted together: graph outputs and inputs of kept (opaque) nodes."""
        return [self.egraph.class_of_id[i] for i in self.translation.roots]

    def extract(self, cost: Any = None, extractor: str | None = None, graph: ExtractionGraph | None = None) -> None:
        """Choose one program; ``cost(class, node)`` overrides the e-node prices, or
        ``graph`` gives them already priced."""
        opts = self.options
        name = extractor or opts.extractor
        with _phase(self.report, "extract"):
            self.graph = graph or self.egraph.extraction_graph(self.roots, cost or self.cost)
            options = {"time_limit": opts.ilp_time_limit_s} if name in ("ilp", "auto") else {}
            self.extraction = get_extractor(name, **options).extract(self.graph)
            if self.batches is not None:
                self.extraction, self.report.group_moves = improve_with_groups(
                    self.graph, self.extraction, self.group_moves())
        self._record_extraction()

    def _record_extraction(self) -> None:
        ext = self.extraction
        self.report.extractor, self.report.extraction_cost = ext.extractor, ext.cost
        self.report.optimal, self.report.gap = ext.optimal, ext.gap

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
            propagate_meta(result, self.example_inputs)
        return result

    @property
    def _wants_meta(self) -> bool:
        """Whether a full build propagates fake-tensor meta (Dynamo/export graphs)."""
        return self.example_inputs is None or _has_fake_meta(self.gm)

    def group_moves(self) -> list[GroupMove]:
        """For every batch group: each member's choice of its slice of the batched term."""
        eg, moves = self.egraph, []
        for batched, members in self.batches.groups:
            target = eg.class_of_id.get(batched)
            picks: dict[int, int] = {}
            for m in members:
                path = _path_to(eg, eg.class_of_id[m], target)
                if path is None:
                    break
                picks.update(path)
            else:
                moves.append(GroupMove(f"{self.translation.nodes[members[0]].name}+{len(members) - 1}", picks))
        return moves

    def without_batches(self, kinds: Sequence[str], graph: ExtractionGraph) -> ExtractionGraph:
        """``graph`` with the batched alternatives of ``kinds`` forbidden (their classes
        keep only views and cats). Shares every other class's nodes: re-pricing all of
        them took a second on the 2,000-feature graph."""
        eg, banned = self.egraph, set()
        for kind in kinds:
            banned.update(eg.class_of_id[i] for i in self.batches.outputs.get(kind, ()) if i in eg.class_of_id)
        classes = list(graph.classes)
        for c in banned:
            classes[c] = [node if term.ctor in _KEPT_WHEN_BANNED else ENode(node.op, node.children, math.inf)
                          for node, term in zip(graph.classes[c], eg.classes[c])]
        return ExtractionGraph(classes, graph.roots)

    def _refine(self, result: torch.fx.GraphModule, launches: int, seconds: float) -> tuple:
        """Drop batch kinds that the fusion model says do not pay (e-node costs are additive,
        Inductor's fusion is not). Tries each kind alone and all together, keeps the best.

        ``result`` is the cheap build (no fake-tensor meta) of the current extraction and
        ``launches``, ``seconds`` its prediction. Returns (``result`` or None when a variant
        won and is now ``self.extraction``, its launches, its seconds)."""
        opts, report = self.options, self.report
        chosen = self.extraction.choice
        class_of = self.egraph.class_of_id
        # Only kinds the extraction actually uses: dropping an unused one changes nothing.
        kinds = sorted((k for k, ids in (self.batches.outputs if self.batches else {}).items()
                        if any(class_of.get(i) in chosen for i in ids)), key=_refine_priority)
        if not kinds:
            return result, launches, seconds
        # A variant is a greedy extraction and a build: when the main extraction was
        # greedy, its time says what a variant will take (tens of seconds on the
        # 2,000-feature graph, where starting one would overrun the limit by as much).
        start = time.perf_counter()
        extract_s = report.phase_seconds.get("extract", 0.0) if report.extractor == "greedy" else 0.0
        if extract_s > opts.refine_time_limit_s:
            log.info("optimus_eqsat: no refine: one variant (over %.1f s) exceeds its time limit", extract_s)
            return result, launches, seconds
        # ``result`` is itself a cheap build (finish): a variant costs what it took
        # (rebuild, and one of verify's two predictions) on top of its extraction.
        variant_s = extract_s + report.phase_seconds.get("rebuild", 0.0) + report.phase_seconds.get("verify", 0.0) / 2
        best = (seconds, launches, ())
        main_graph = self.graph
        saved = (self.graph, self.extraction)
        for dropped in [(k,) for k in kinds] + ([tuple(kinds)] if len(kinds) > 1 else []):
            if time.perf_counter() - start + variant_s > opts.refine_time_limit_s:
                log.info("optimus_eqsat: refine stopped: a variant (about %.1f s) would overrun its time limit "
                         "(%.1f s)", variant_s, opts.refine_time_limit_s)
                break
            report.refine_tried.append(list(dropped))
            try:
                self.extract(graph=self.without_batches(dropped, main_graph), extractor="greedy")
                candidate = self.build(meta=False)
            except Exception as exc:  # a kind that cannot be dropped: keep what we have
                log.debug("optimus_eqsat: refine without %s failed: %s", dropped, exc)
                continue
            n, t = _predict(candidate, self.example_inputs, opts.profile)
            if t < best[0] * (1 - 1e-9):
                best, saved = (t, n, dropped), (self.graph, self.extraction)
        self.graph, self.extraction = saved
        self._record_extraction()  # the report describes the kept extraction, not the last variant
        report.dropped_batches = list(best[2])
        return (None if best[2] else result), best[1], best[0]

    def finish(self) -> torch.fx.GraphModule:
        """Rebuild, predict launches before/after, and keep the original if the result is worse."""
        opts, report, gm = self.options, self.report, self.gm
        # With refine, candidates are compared on cheap builds (e-graph shapes, no fake
        # tensors: most of a build's time); only the winner gets full meta.
        refine = opts.refine_batches and self.batches is not None
        with _phase(report, "rebuild"):
            result = self.build(meta=not refine)
        with _phase(report, "verify"):
            report.launches_before, report.cost_before = _predict(gm, self.example_inputs, opts.profile)
            report.launches_after, report.cost_after = _predict(result, self.example_inputs, opts.profile)
        if refine:
            with _phase(report, "refine"):
                result, report.launches_after, report.cost_after = self._refine(
                    result, report.launches_after, report.cost_after)
            with _phase(report, "rebuild"):
                if result is None:  # a variant won: build it, with meta
                    result = self.build()
                elif self._wants_meta:  # the cheap build was kept: only its meta is missing
                    propagate_meta(result, self.example_inputs)
        if opts.never_worse and report.cost_after > report.cost_before * (1 + 1e-9):
            report.fell_back = True
            report.fallback_reason = (
                f"predicted cost rose ({report.cost_before:.3e} s -> {report.cost_after:.3e} s); kept the original"
            )
            log.info("optimus_eqsat: %s", report.fallback_reason)
            report.launches_after, report.cost_after = report.launches_before, report.cost_before
            return _copy_module(gm)
        return result
