"""The options of :func:`~optimus_eqsat.optimize_graph`, checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass, fields
from numbers import Real
from pathlib import Path
from typing import Any

from optimus_eqsat import rewrites
from optimus_eqsat.extract.cost_model import DeviceProfile, get_profile
from optimus_eqsat.objective import MODES
from optimus_eqsat.rulesets import DEFAULT_RULESETS, checked_rule_files, known_families, select_rulesets
from optimus_eqsat.saturate import Limits


@dataclass(frozen=True)
class OptimizeOptions:
    """Options of :func:`optimize_graph` (all keyword arguments).

    Attributes:
        rulesets: rule families to run, by name (unknown names are an error;
            families not shipped yet are skipped). Default: all shipped.
        rule_files: extra egglog rule files, each declaring one ruleset.
        check_rules: test each rule of the rule files on random tensors when the options are
            made (a quick check: few samples, a few seconds at most, cached per file content;
            ``optimus-eqsat check-rules FILE.egg`` is the thorough one) and refuse an unsound
            rule with ``rule_check.UnsoundRuleError`` naming it and the counterexample.
            False skips the test.
        max_iterations, max_enodes: saturation limits (per saturation phase).
        time_limit_s: the wall-clock budget of the whole optimization (default 20 s):
            saturation stops between slices of an iteration where the phases after it
            need the rest (estimated from the translation's time, ``budget.py``); the
            ILP and refine get a share of what is left, never more than their own
            limits. Its stop reason is the report's ``stop_reason`` ("time_limit"); the
            result is the best program extracted from the e-graph so far, or the
            original when the budget runs out before the graph is loaded. Translation,
            export, the rebuild and the cost model's predictions cannot stop early,
            so the budget holds to within about a second on graphs of 10,000 nodes.
        batch_iterations: iterations of the second saturation, after the batch facts join
            (their stacks meet the splits and cats around them within 5 on the benchmark
            models; each later one mostly walks long cat runs again: 1 s apiece at 2,000
            features).
        extractor: "auto" (ILP when small enough, else greedy), "greedy" or "ilp".
        ilp_time_limit_s: the ILP's own time limit (within its share of ``time_limit_s``;
            "auto" extracts greedily when that share is under 2 s).
        profile: device profile of the step-time model: "auto" (the example inputs'
            device), "h100", "h200", "a100", "cpu", or a ``DeviceProfile``.
        mode: "auto" (training when grad mode is on and an input or parameter requires
            grad), "inference" or "training": a training step also prices the backward.
        cached_parameters: in inference, stacks of whole parameters are built once, not every
            step: the backend's parameter cache (:mod:`optimus_eqsat.parameter_cache`) moves
            the parameters into them. Prices that work as free per step, as Inductor's
            ``freezing`` does with all parameter-only work.
            The backend sets it; a graph compiled without that cache should leave it off.
        raise_on_error: raise instead of falling back to the original graph.
        never_worse: return the original when the cost model predicts the result slower,
            or faster by less than ``min_gain``.
        min_gain: with ``never_worse``, the least predicted gain (a fraction of the original's
            predicted step time) worth a different program; 0 (the default) keeps any gain.
            The ``torch.compile`` backend sets 0.01: a smaller gain is within the cost model's
            error and below the 1% margin by which its measured choice must see a program
            faster, so rewriting for it would buy a second compile and a timing on the first
            call for a program the measurement then drops.
        rest_of_step_s: predicted seconds of the rest of the step this graph is a piece of
            (a backward graph's forward): ``min_gain`` is then a fraction of the whole step,
            so a rewrite that saves 2% of a small backward but 0.1% of the step is not worth
            a second program. 0 (the default): the graph is the whole step.
        refine_batches: re-extract without each kind of batch and keep the variant the
            fusion-aware cost model (fx_cost) predicts fastest.
        refine_time_limit_s: a refine variant is started only when it is expected to end
            within this many seconds of refining (and within its share of ``time_limit_s``) (each variant is a greedy extraction and
            a rebuild, expected to take as long as the main one when that was greedy; on
            20,000-node graphs tens of seconds). The report lists the variants tried.
        record_eclasses: count e-classes after every iteration into the saturation
            history (costs a freeze of the e-graph each time; the explorer turns it on).
        persistent_cache: read and write the result on disk (:mod:`optimus_eqsat.disk_cache`),
            keyed by the graph, its inputs' shapes, the options and the package's code, so a
            restarted process does not optimize the same graph again. The environment
            variable ``OPTIMUS_EQSAT_CACHE=0`` turns it off for every call.
    """

    rulesets: tuple[str, ...] = DEFAULT_RULESETS
    rule_files: tuple[str, ...] = ()
    check_rules: bool = True
    max_iterations: int = Limits.max_iterations
    max_enodes: int | None = Limits.max_enodes
    time_limit_s: float = Limits.time_limit_s
    batch_iterations: int = 6
    extractor: str = "auto"
    ilp_time_limit_s: float = 10.0
    profile: Any = "auto"  # str or extract.cost_model.DeviceProfile
    mode: str = "auto"
    cached_parameters: bool = False
    raise_on_error: bool = False
    never_worse: bool = True
    min_gain: float = 0.0
    rest_of_step_s: float = 0.0
    refine_batches: bool = True
    refine_time_limit_s: float = 10.0
    record_eclasses: bool = False
    persistent_cache: bool = True

    @classmethod
    def names(cls) -> set[str]:
        """The option names ``optimize_graph`` takes."""
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, **options: Any) -> OptimizeOptions:
        known = cls.names()
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
        self._check_types()
        known = known_families()
        unknown = [name for name in self.rulesets if name not in known]
        if unknown:
            raise ValueError(f"unknown ruleset(s) {unknown}; shipped: {sorted(known)}")
        if self.extractor not in ("auto", "greedy", "ilp"):
            raise ValueError(f"unknown extractor {self.extractor!r}; choose auto, greedy or ilp")
        if not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"min_gain is a fraction of the step time in [0, 1); got {self.min_gain!r}")
        if not self.rest_of_step_s >= 0.0:
            raise ValueError(f"rest_of_step_s is a predicted time in seconds (>= 0); got {self.rest_of_step_s!r}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose {', '.join(MODES)}")
        try:
            if self.profile != "auto":
                get_profile(self.profile)
        except KeyError as exc:
            raise ValueError(str(exc)) from None
        # a missing, broken or unsound file is the caller's mistake: an error naming it
        checked_rule_files(self.rule_files, check_rules=self.check_rules)

    def _check_types(self) -> None:
        """Numbers, flags and the profile of the right kind ("1" for a time limit once failed
        deep inside the run, and fell back instead of saying so)."""
        for f in fields(self):
            value, kind = getattr(self, f.name), f.type  # (a string: annotations are postponed)
            if kind in ("int", "float", "int | None"):
                if (value is None and kind == "int | None") or (
                    isinstance(value, Real) and not isinstance(value, bool)
                ):
                    continue
                raise ValueError(f"{f.name} must be a number, got {value!r}")
            if kind == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name} must be True or False, got {value!r}")
        if not isinstance(self.profile, (str, DeviceProfile)):
            raise ValueError(f"profile must be 'auto', a profile name or a DeviceProfile, got {self.profile!r}")

    def egglog_rulesets(self) -> list[rewrites.RuleSet]:
        """The egglog programs a run loads (:func:`~optimus_eqsat.rulesets.select_rulesets`)."""
        self.validate()  # options built directly, not through from_kwargs, are checked here too
        return select_rulesets(self.rulesets, self.rule_files)

    @property
    def limits(self) -> Limits:
        return Limits(self.max_iterations, self.max_enodes, self.time_limit_s)
