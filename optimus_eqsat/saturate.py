"""The saturation driver: load the language, rule sets and facts; run under limits.

What runs in one iteration is the schedule (rewrites/schedule.py), less the
rules under a backoff ban (rewrites/backoff.py). The loop stops when nothing
changes while no rule is banned (saturated) or at the first exhausted limit,
and says which in :class:`StopReason`; a step that changes nothing while rules
are banned brings their bans forward and the loop goes on, so a phase is never
called saturated while a banned rule could still fire.

The time limit holds inside an iteration too: a step runs as slices (one egglog
call each: a few rounds of one analysis, or one family round) and the loop
checks the clock between them. egglog cannot be stopped inside a call, so a
single round is the smallest unit that can overrun. A step cut short leaves a
sound e-graph (every union is an equality); its new terms get their shapes
before the loop returns.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from optimus_eqsat.rewrites import RuleFileError, RuleSet, shape_rules
from optimus_eqsat.rewrites.backoff import BackoffScheduler, SplitFamily, split_family
from optimus_eqsat.rewrites.schedule import Backoff, compose
from optimus_eqsat.term import Fact, egglog_declarations

# Facts are parsed in small batches: egglog's parse time grows faster than
# linearly with program length (1,000 facts: 0.43 s; 100: 0.007 s), and one
# command per call pays Python overhead. 20 was the fastest measured here.
FACT_BATCH = 20

# The language: constructors declared in term.py, then analyses and loading (language.egg).
LANGUAGE = egglog_declarations() + "\n" + resources.files("optimus_eqsat").joinpath("language.egg").read_text()


class StopReason(str, enum.Enum):
    """Why saturation stopped."""

    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration_limit"
    NODE_LIMIT = "node_limit"
    TIME_LIMIT = "time_limit"


# A slice is one egglog call. An analysis runs up to ``rounds`` rounds per call, doubled
# (up to MAX_ROUNDS) while a call takes under a quarter of SLICE_S and halved when it takes
# longer: slices stay short where a round is slow, and cheap rounds (a walk along a chain
# takes one per position) do not pay a call each (about 0.4 ms of Python and parsing).
SLICE_S = 0.05
MAX_ROUNDS = 256
# A slice is not started where its forecast (the last round's time, grown with the e-graph
# since at this power: _Step._forecast) would end past the deadline.
FORECAST_POWER = 4


class TimeLimitReached(Exception):
    """The time budget ran out before the e-graph held the whole program (while loading facts)."""


# The e-node budget grows with the graph: rewrites add a bounded number of
# alternatives per node (~10-20 on the benchmark models), 50 leaves headroom.
ENODES_PER_FX_NODE = 50
MIN_ENODE_LIMIT = 200_000


@dataclass(frozen=True)
class Limits:
    """Saturation limits. Defaults keep a 10,000-node graph within a few seconds."""

    # Per phase (before and after batching). The zoo's tangles are settled within
    # ~9; more iterations mostly add equal-cost view variants for the extractor.
    max_iterations: int = 12
    max_enodes: int | None = None  # None: ENODES_PER_FX_NODE per FX node, at least MIN_ENODE_LIMIT
    time_limit_s: float = 20.0  # this phase and the ones before it on the e-graph, together
    backoff: Backoff = Backoff()  # per-rule bans (rewrites/schedule.py); the first phase's holds for the e-graph
    # time.perf_counter() by which saturation stops whatever time_limit_s leaves (the run's
    # budget, optimus_eqsat/budget.py: the phases after saturation need their share); None: none
    deadline: float | None = None


@dataclass
class SaturationReport:
    """What one saturation run did."""

    stop_reason: StopReason
    iterations: int
    enodes: int
    seconds: float
    load_seconds: float
    rule_matches: Counter = field(default_factory=Counter)
    rule_seconds: Counter = field(default_factory=Counter)
    # per iteration: enodes, seconds, matches, and "backoff_banned": the rules left out of it
    history: list[dict] = field(default_factory=list)
    backoff_bans: list = field(default_factory=list)  # every backoff.Ban, in order

    @property
    def times_banned(self) -> Counter:
        """Backoff bans per rule."""
        return Counter(ban.rule for ban in self.backoff_bans)


def _bindings():
    """egglog's bindings, imported on the first e-graph: a compile the persistent cache answers
    never builds one, and the import costs about 0.15 s."""
    import egglog.bindings

    return egglog.bindings


class _PreparedEGraphs:
    """E-graphs holding the language and a choice of rule sets and nothing else, reused.

    Declaring the language and the rule sets costs about 0.35 s per e-graph, and a
    backend compile builds three (the Dynamo graph, the forward and the backward aten
    graphs): a third of the optimizer's time on a graph with nothing to rewrite. A session
    takes a prepared e-graph and marks it (egglog's ``push``, a copy of a few ms); giving it
    back restores the mark (``pop``: facts, unions and rule runs gone, as in a fresh one).
    An e-graph taken is held by one session only; a run that fails, or that hands its
    session to the caller (the explorer), never gives it back: it is dropped with the session.

    egglog's e-graphs belong to the thread that made them (using or dropping one in another
    thread panics in its Rust code), so each thread keeps its own pool: a model compiled in
    a serving thread after another compiled in the main thread builds its own.
    """

    MAX_IDLE = 2  # prepared e-graphs kept per choice of rule sets
    MAX_CHOICES = 8  # choices of rule sets kept (least recently used dropped)

    def __init__(self) -> None:
        self._local = threading.local()

    def _idle(self) -> OrderedDict[tuple, list]:
        """This thread's idle e-graphs by choice of rule sets."""
        if not hasattr(self._local, "idle"):
            self._local.idle = OrderedDict()
        return self._local.idle

    def take(self, programs: tuple[tuple[str, str], ...]) -> Any:
        idle = self._idle().get(programs)
        egraph = idle.pop() if idle else None
        if egraph is None:
            egraph = _language_egraph()
            for program, name in programs:
                egraph.run_program(*_parsed_split(program, name)[0])
        egraph.run_program(*_parsed("(push)"))
        return egraph

    def give_back(self, programs: tuple[tuple[str, str], ...], egraph: Any) -> None:
        pool = self._idle()
        idle = pool.setdefault(programs, [])
        pool.move_to_end(programs)
        while len(pool) > self.MAX_CHOICES:
            pool.popitem(last=False)
        if len(idle) >= self.MAX_IDLE:
            return  # (dropped: restoring it would be wasted work)
        egraph.run_program(*_parsed("(pop)"))
        idle.append(egraph)


_PREPARED = _PreparedEGraphs()


def _language_egraph() -> Any:
    """A new e-graph holding the language and the shape rules, no rule set."""
    egraph = _bindings().EGraph()
    for program in [LANGUAGE, shape_rules().program]:
        egraph.run_program(*_parsed(program))
    return egraph


@functools.lru_cache(maxsize=64)
def _parsed(program: str) -> tuple:
    """Parsed commands of a static program (language, rule sets), reused across e-graphs."""
    return tuple(_bindings().EGraph().parse_program(program))


@functools.lru_cache(maxsize=1024)
def _run_command(ruleset: str, rounds: int) -> tuple:
    """Parsed ``(run ruleset rounds)`` (a cache of its own: slices must not evict the language)."""
    return tuple(_bindings().EGraph().parse_program(f"(run {ruleset} {rounds})"))


@functools.lru_cache(maxsize=64)
def _parsed_split(program: str, family: str) -> tuple[tuple, SplitFamily]:
    """A family's program parsed with one ruleset per rule (so backoff can leave rules out)."""
    text, split = split_family(program, family)
    return _parsed(text), split


def check_ruleset(ruleset: RuleSet, builtin: Iterable[RuleSet] = ()) -> None:
    """Load ``ruleset`` into a scratch e-graph beside the language and ``builtin`` families;
    raise ``RuleFileError`` with its description (the file) and egglog's message when
    egglog refuses it (syntax, unknown constructor, a ruleset name already taken)."""
    scratch = _language_egraph()
    for builtin_ruleset in builtin:
        scratch.run_program(*_parsed(builtin_ruleset.program))
    try:
        scratch.run_program(*scratch.parse_program(ruleset.program))
    except Exception as exc:  # egglog's EggSmolError: "In line:col-col: text\nwhat is wrong"
        raise RuleFileError(f"{ruleset.description or ruleset.name}: egglog refused it: {exc}") from None


class EGraphSession:
    """An egglog e-graph holding one program's facts, and the rule sets loaded into it."""

    def __init__(self, rulesets: Iterable[RuleSet]):
        self.fx_nodes = 0
        self.rulesets = list(rulesets)
        self.backoff: BackoffScheduler | None = None  # made by the first saturate
        self.analysis_rounds: dict[str, int] = {}  # rounds per slice of each analysis (_Step)
        # per rule set: seconds per round of its last slice and the e-nodes then (_Step's forecast)
        self.round_costs: dict[str, tuple[float, int]] = {}
        self.enodes_seen = 0  # the e-graph's size after the last iteration
        self._programs = tuple((r.program, r.name) for r in self.rulesets)
        self.egraph = _PREPARED.take(self._programs)
        self.families: list[SplitFamily] = []
        for ruleset in self.rulesets:
            _, split = _parsed_split(ruleset.program, ruleset.name)
            self.families.append(SplitFamily(split.family, split.rulesets, split.reported))  # its own cache

    def release(self) -> None:
        """Hand the e-graph back for a later session of the same rule sets (its facts and every
        rule run dropped); this session cannot be used after. For owners that know nothing else
        holds it (:func:`~optimus_eqsat.api.optimize_graph` after a run)."""
        egraph, self.egraph = self.egraph, None
        if egraph is not None:
            _PREPARED.give_back(self._programs, egraph)

    def _declare_combined(self, name: str, rulesets: list[str]) -> None:
        self._run(f"(unstable-combined-ruleset {name} {' '.join(rulesets)})")

    def _run(self, program: str) -> list:
        return self.egraph.run_program(*self.egraph.parse_program(program))

    def load(self, facts: Sequence[Fact], fx_nodes: int = 0, deadline: float | None = None) -> float:
        """Add facts; ``fx_nodes`` (the graph's size) scales the default e-node limit.

        ``Union`` facts are loaded as alias rows and unioned together at the end
        (language.egg): a union per command costs ten times an insert. Past
        ``deadline`` (a ``time.perf_counter()`` value) raises :class:`TimeLimitReached`:
        an e-graph holding part of the program has nothing to extract.
        """
        self.fx_nodes = fx_nodes
        start = time.perf_counter()
        rendered = [f.render() for f in facts]
        for i in range(0, len(rendered), FACT_BATCH):
            # the clock is read every 50 batches (1,000 facts, a few ms): not per batch
            if deadline is not None and i % (50 * FACT_BATCH) == 0 and time.perf_counter() > deadline:
                raise TimeLimitReached(f"time limit reached loading the graph ({i} of {len(rendered)} facts)")
            self._run("\n".join(rendered[i : i + FACT_BATCH]))
        self._run("(run-schedule (saturate (run aliases)))")
        return time.perf_counter() - start

    def enode_count(self) -> int:
        # egglog logs every print-size result at INFO; that is noise for our users
        egglog_log = logging.getLogger("egglog")
        level = egglog_log.level
        egglog_log.setLevel(logging.WARNING)
        try:
            (sizes,) = self._run("(print-size)")
        finally:
            egglog_log.setLevel(level)
        return sum(n for name, n in sizes.sizes if name[:1].isupper())

    def eclass_count(self) -> int:
        """E-classes of tensors and lists (freezes the e-graph: for exploration, not hot paths)."""
        frozen = self.egraph.freeze()
        return len(
            {
                row.output
                for function in frozen.functions.values()
                if function.output_sort in ("Tensor", "TList")
                for row in function.rows
            }
        )

    def saturate(
        self, limits: Limits, previous: SaturationReport | None = None, record_eclasses: bool = False
    ) -> SaturationReport:
        """Run the schedule until saturated or a limit is hit.

        With ``previous``, continue its report: iterations, time and matches add
        up; the iteration and e-node limits apply to this phase, the time limit
        to the total (and ``limits.deadline`` to the clock). Backoff bans carry over
        from phase to phase (one scheduler per e-graph, made with the first phase's
        ``limits.backoff``). The time limit is checked between slices of a step; an
        iteration cut short is in the history with ``"cut": True``.
        """
        if self.backoff is None:
            self.backoff = BackoffScheduler(limits.backoff, self.fx_nodes)
        report = previous or SaturationReport(StopReason.SATURATED, 0, 0, 0.0, 0.0)
        first_iteration = report.iterations
        max_enodes = limits.max_enodes or max(MIN_ENODE_LIMIT, ENODES_PER_FX_NODE * self.fx_nodes)
        start = time.perf_counter() - report.seconds
        deadline = start + limits.time_limit_s
        if limits.deadline is not None:
            deadline = min(deadline, limits.deadline)
        while True:
            if report.iterations - first_iteration >= limits.max_iterations:
                report.stop_reason = StopReason.ITERATION_LIMIT
                break
            if time.perf_counter() >= deadline:
                report.stop_reason = StopReason.TIME_LIMIT
                break
            t0 = time.perf_counter()
            iteration = report.iterations + 1
            banned = self.backoff.banned(iteration)
            plan = compose(self.rulesets, {f.family: f.without(banned, self._declare_combined) for f in self.families})
            step = _Step(self, deadline, report.rule_seconds)
            if iteration == first_iteration + 1 and plan.once:
                step.run(plan.analyses, plan.once)
                step.updated = False  # the step proper says whether the e-graph is saturated
            before_step = Counter(step.matches)
            if not step.stopped:
                step.run(plan.analyses, plan.families)
            report.rule_matches.update(step.matches)
            report.iterations = iteration
            if not step.stopped:
                step_matches = step.matches - before_step  # only the step's rounds count toward a ban
                for family in self.families:
                    report.backoff_bans += self.backoff.record(iteration, family.matches(step_matches))
            else:
                self._run("(run-schedule (saturate (run shapes)))")  # the new terms' shapes
            enodes = self.enodes_seen = self.enode_count()
            report.history.append(
                {
                    "iteration": iteration,
                    "enodes": enodes,
                    "seconds": time.perf_counter() - t0,
                    "matches": dict(step.matches),
                    "backoff_banned": sorted(banned),
                }
            )
            if step.stopped:
                report.history[-1]["cut"] = True
                report.stop_reason = StopReason.TIME_LIMIT
                break
            if record_eclasses:
                report.history[-1]["eclasses"] = self.eclass_count()
            # A step that changed nothing while rules were banned is not saturation:
            # bring_forward ends a ban and the loop goes on.
            if not step.updated and not self.backoff.bring_forward(iteration):
                report.stop_reason = StopReason.SATURATED
                break
            if enodes > max_enodes:
                report.stop_reason = StopReason.NODE_LIMIT
                break
            if time.perf_counter() - start > limits.time_limit_s:
                report.stop_reason = StopReason.TIME_LIMIT
                break
        report.enodes = self.enode_count()
        report.seconds = time.perf_counter() - start
        return report


class _Step:
    """One schedule step run as slices (one egglog call each), stopping at ``deadline``:
    settle (each analysis saturated in turn until a pass changes nothing), one round of
    each ruleset of ``rounds``, settle; as ``schedule.compose``'s one-program ``step``."""

    def __init__(self, session: EGraphSession, deadline: float, rule_seconds: Counter):
        self.session, self.deadline, self.rule_seconds = session, deadline, rule_seconds
        self.matches: Counter = Counter()
        self.updated = False  # some slice changed the e-graph
        self.stopped = False  # the deadline passed before the step ended

    def run(self, analyses: Sequence[str], rounds: Sequence[str]) -> None:
        self._settle(analyses)
        for name in rounds:
            self._slice(name, 1)
        self._settle(analyses)

    def _forecast(self, name: str, rounds: int) -> tuple[float, int]:
        """Seconds ``rounds`` rounds of ``name`` should take now, and the e-nodes now: its last
        round's time grown with the fourth power of the e-graph's growth since. Rounds can
        grow that fast: an analysis round on unary_runs_splitcat took 7.9 s at 370,000 e-nodes,
        11.5 s at 460,000 and 31 s at 625,000 (the first round after new terms costs the most,
        so fitting a power to two sizes was tried and forecast 17 s). The e-nodes are counted
        (0.1 ms) only before a slow slice; otherwise the last iteration's count stands in.
        0 s when it never ran."""
        seconds, then = self.session.round_costs.get(name, (0.0, 0))
        if seconds * rounds < SLICE_S:
            return seconds * rounds, self.session.enodes_seen
        now = self.session.enode_count()
        growth = max(1.0, now / then) if then else 1.0  # (then: 0 before the first iteration ended)
        return seconds * rounds * growth**FORECAST_POWER, now

    def _slice(self, name: str, rounds: int):
        """``rounds`` rounds of ruleset ``name`` in one call (fewer when it saturates); its
        run report, or None when the deadline has passed or the slice is forecast to end past
        it (then nothing runs: an egglog call cannot be interrupted, and one round of an
        analysis on 625,000 e-nodes took 31 s)."""
        if self.stopped:
            return None
        forecast, enodes = self._forecast(name, rounds)
        t0 = time.perf_counter()
        if t0 + forecast > self.deadline:
            self.stopped = True
            return None
        (output,) = self.session.egraph.run_program(*_run_command(name, rounds))
        run = output.report
        per_round = (time.perf_counter() - t0) / max(1, len(run.iterations))
        self.session.round_costs[name] = (per_round, enodes)
        self.matches.update(run.num_matches_per_rule)
        for rule, spent in run.search_and_apply_time_per_rule.items():
            self.rule_seconds[rule] += spent.total_seconds()
        self.updated |= run.updated
        return run

    def _saturate(self, name: str) -> bool:
        """Run analysis ``name`` until a round changes nothing; whether anything changed."""
        rounds, changed = self.session.analysis_rounds.get(name, 1), False
        while True:
            t0 = time.perf_counter()
            run = self._slice(name, rounds)
            if run is None or not run.updated:
                break
            changed = True
            if len(run.iterations) < rounds:  # egglog stopped at a round that changed nothing
                break
            took = time.perf_counter() - t0
            if took < SLICE_S / 4:
                rounds = min(2 * rounds, MAX_ROUNDS)
            elif took > SLICE_S:
                rounds = max(1, rounds // 2)
        self.session.analysis_rounds[name] = rounds
        return changed

    def _settle(self, analyses: Sequence[str]) -> None:
        changed = True
        while changed and not self.stopped:
            changed = False
            for name in analyses:
                changed |= self._saturate(name)
