"""The report of one optimization, reachable as ``result.meta["optimus_eqsat"]``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class OptimizeReport:
    """What :func:`optimus_eqsat.optimize_graph` did.

    Attributes:
        nodes_before / nodes_after: FX call nodes (ops) in the input and the result.
        launches_before / launches_after: kernel launches the cost model predicts.
        cost_before / cost_after: predicted step time (seconds) under the profile and mode.
        mode, profile: what the step time prices ("inference"/"training") and on which device.
        rules_fired: matches per rule name, over the whole saturation.
        phase_seconds: time per phase (translate, load, saturate, export, extract, rebuild, verify).
        stop_reason: why saturation stopped ("saturated", "iteration_limit", ...). "saturated"
            means a step changed nothing with no rule under a backoff ban.
        backoff_bans: rules the backoff scheduler banned (rewrites/schedule.py Backoff), with
            how many times; ``history`` lists the rules left out of each iteration
            (``backoff_banned``).
        iterations, enodes, eclasses: size of the saturated e-graph.
        extractor: which extractor produced the program; optimal / gap as it reported.
        fell_back: True when the original graph was returned; fallback_reason says why.
        inductor_seconds: seconds the backend's Inductor compile of its program took (see
            :meth:`compile_split`, a line of the summary).
        from_cache: the result was read from the persistent cache (an earlier run's, with its
            report; ``phase_seconds`` then holds the lookup alone).
        measured: the backend's measurement of original and optimized step time
            (``guard.GuardResult``: both times, their ratio and which program was kept).
        parameter_packs: stacks of parameters the backend builds once, in inference, with the
            parameters moved into their storage (None when nothing is cached).
        recomputed_masks: bool masks the backend's joint-graph pass has the backward recompute
            instead of saving (training on the CPU; ``postgrad.bool_masks``).
        kept_gradient_inputs: inputs (parameters) the optimized training graph no longer
            needed and reads again through an exact zero, so they still get a (zero) gradient
            (:mod:`optimus_eqsat.keep_gradients`).
        ddp_pieces: under DDP, the pieces DDPOptimizer cut the original graph and the optimized
            program into (their bucket boundaries), as (original, optimized), the original's None
            when it was not cut (only the measured choice cuts and compiles it); None elsewhere
            (:mod:`optimus_eqsat.ddp_whole_graph`).
        batched: nodes given a batched alternative, by kind (batch-linear, batch-elementwise, ...).
        opaque_nodes: nodes kept verbatim, with the reason.
    """

    mode: str | None = None  # "inference" or "training": what the step time prices
    profile: str | None = None  # the device profile's name
    nodes_before: int = 0
    nodes_after: int = 0
    launches_before: int | None = None
    launches_after: int | None = None
    cost_before: float | None = None
    cost_after: float | None = None
    rules_fired: dict[str, int] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    stop_reason: str | None = None
    backoff_bans: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    enodes: int = 0
    eclasses: int = 0
    extractor: str | None = None
    extraction_cost: float | None = None
    optimal: bool | None = None
    gap: float | None = None
    batched: dict[str, int] = field(default_factory=dict)
    dropped_batches: list[str] = field(default_factory=list)
    refine_tried: list[list[str]] = field(default_factory=list)  # batch kinds dropped, per refine variant
    group_moves: list[str] = field(default_factory=list)  # batch groups switched on after extraction
    fell_back: bool = False
    fallback_reason: str | None = None
    opaque_nodes: dict[str, str] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    measured: Any = None  # guard.GuardResult when the backend timed original and optimized
    parameter_packs: int | None = None  # stacks of weights the backend builds once (inference)
    kept_gradient_inputs: list[str] = field(default_factory=list)  # re-read so they get a zero gradient
    recomputed_masks: int = 0  # bool masks the backward recomputes instead of saving (backend, CPU training)
    inductor_seconds: float | None = None  # the backend's Inductor compile of the chosen program (its forward)
    from_cache: bool = False  # read from the persistent cache (program_cache.py), not optimized again
    ddp_pieces: tuple[int | None, int] | None = None  # DDPOptimizer's pieces of (original, optimized)

    def fall_back(self, reason: str) -> None:
        """Record that the original graph is kept, and why."""
        self.fell_back, self.fallback_reason = True, reason

    @property
    def changed(self) -> bool:
        """Whether the result is predicted to run differently from the original (a program
        predicted alike compiles to the same kernels: the backend then compiles the original)."""
        return not self.fell_back and (self.launches_after, self.cost_after) != (self.launches_before, self.cost_before)

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())

    def compile_split(self) -> str:
        """Where the backend's compile went: the optimizer, Inductor per program (forward
        graphs), each program's first step in the measurement (a training backward compiles
        on its first call) and the measured choice's timing."""
        parts = [f"optimizer {self.total_seconds:.2f} s", f"Inductor: ours {self.inductor_seconds or 0.0:.2f} s"]
        measured = self.measured
        if measured is not None:
            parts[-1] += "".join(f", {name} {s:.2f} s" for name, s in measured.compile_s.items())
            if measured.first_step_s:
                firsts = ", ".join(f"{_ours(name)} {s:.2f} s" for name, s in measured.first_step_s.items())
                parts.append(f"first steps (a training backward compiles there) {firsts}")
            parts.append(f"timing {measured.timing_s:.2f} s")
        return "; ".join(parts)

    def record_saturation(self, sat: Any) -> None:
        """Take a saturation's outcome (``saturate.SaturationReport``): why it stopped,
        its size, the rules that fired and the per-iteration history."""
        self.stop_reason, self.iterations, self.enodes = sat.stop_reason.value, sat.iterations, sat.enodes
        self.rules_fired = {k: v for k, v in sorted(sat.rule_matches.items()) if v}
        self.backoff_bans = dict(sorted(sat.times_banned.items()))
        self.history = sat.history

    def record_extraction(self, ext: Any) -> None:
        """Describe the extraction kept (``extract.egraph.Extraction``)."""
        self.extractor, self.extraction_cost = ext.extractor, ext.cost
        self.optimal, self.gap = ext.optimal, ext.gap

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """A few human-readable lines."""
        fired = sorted(self.rules_fired.items(), key=lambda kv: -kv[1])
        lines = [
            f"FX op nodes:        {self.nodes_before} -> {self.nodes_after}",
            f"predicted step:     {_us(self.cost_before)} -> {_us(self.cost_after)} ({self.mode or '?'} on "
            f"{self.profile or '?'}); launches {self.launches_before} -> {self.launches_after}",
            f"saturation:         {self.stop_reason} after {self.iterations} iterations, "
            f"{self.enodes} e-nodes in {self.eclasses} e-classes",
            f"extraction:         {self.extractor} (optimal={self.optimal}, gap={self.gap})",
            f"time:               {self.total_seconds:.3f} s "
            + " ".join(f"{k}={v:.3f}" for k, v in self.phase_seconds.items()),
            "batched:            "
            + (", ".join(f"{k} x{v}" for k, v in self.batched.items()) or "none")
            + (f" (declined by the fusion model: {', '.join(self.dropped_batches)})" if self.dropped_batches else ""),
            "rules fired:        " + (", ".join(f"{k} x{v}" for k, v in fired if v) or "none"),
        ]
        if self.backoff_bans:
            lines.append("backoff bans:       " + ", ".join(f"{k} x{v}" for k, v in self.backoff_bans.items()))
        if self.measured is not None:
            lines.append(f"step time:          {self.measured.summary()}")
        if self.parameter_packs is not None:
            lines.append(
                f"parameter packs:    {self.parameter_packs} stacks of weights built once, the weights moved into them"
            )
        if self.recomputed_masks:
            lines.append(
                f"recomputed masks:   {self.recomputed_masks} bool masks recomputed in the backward, "
                "not saved (postgrad/bool_masks.py)"
            )
        if self.kept_gradient_inputs:
            lines.append(
                "kept in autograd:   "
                + ", ".join(self.kept_gradient_inputs)
                + " (no longer read; an exact zero keeps their gradient)"
            )
        if self.ddp_pieces is not None:
            original, optimized = self.ddp_pieces
            lines.append(
                f"DDP pieces:         optimized program cut into {optimized}"
                + (f", the original into {original}" if original is not None else "")
            )
        if self.inductor_seconds is not None:
            lines.append("compile time:       " + self.compile_split())
        if self.from_cache:
            lines.append("cache:              read from the persistent cache (optimus_eqsat/disk_cache.py)")
        if self.fell_back:
            lines.append(f"FELL BACK to the original graph: {self.fallback_reason}")
        return "\n".join(lines)


def _us(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e6:.1f} us"


def _ours(program: str) -> str:
    """A measured program's name as the compile split writes it (the optimized one is ours)."""
    return "ours" if program == "optimized" else program
