"""The saturation schedule, in one place: egglog run-schedules composed for the loaded families.

Each iteration of the loop in ``optimus_eqsat/saturate.py`` runs ``step``::

    settle        shapes, then each family's analyses (e.g. splitcat_analysis, the
                  cat-run walk), each saturated on its own, all repeated until
                  nothing changes: rules that need a shape or a walk see it. Each
                  analysis saturates on its own so that a walk along a long list
                  (one cell per round) pays a round of its own few rules, not of
                  every shape rule too.
    families      each family once, in load order (splitcat, algebraic, user files):
                  one match-and-apply round each, so no family starves the others;
                  a rule under a backoff ban (below) is left out of its family's round
    settle

and the first iteration of a phase (before batching, and after it) runs ``first``
before that: ``settle``, each family's ``once`` rulesets one round (rules that
push an op into a structure and would nest forever with their reverse, e.g.
splitcat_once's unary-cat), ``settle``. The loop stops when a step changes
nothing while no rule is banned (saturated) or at the first exhausted limit
(``saturate.Limits``).

The saturation loop runs these in slices (``Schedule.analyses``, ``once``, ``families``):
each analysis a few rounds per egglog call (``(run NAME k)``), each family round a call of
its own, so it can check its time limit between calls. egglog cannot stop inside a call,
and one ``run-schedule`` of the whole step can take minutes on a graph of some 12,500
nodes, far past a time limit of seconds. ``first`` and ``step`` are the same schedules as one
program each (for reading, and for callers without a time limit).

Backoff (:class:`Backoff`, egg's BackoffScheduler): a rule of a family whose
matches in one iteration exceed its match limit is banned (left out of the
family's round) for a few iterations, and its limit and ban length grow each
time. So one rule that matches without end (a chain it regroups every way, a
view it rewrites back and forth) cannot starve the others nor fill the e-graph.
egglog applies a round's matches as it finds them, so the ban starts after the
iteration that went over the limit. A step that changes nothing while rules are
banned is not saturation: the bans are brought forward (the earliest ends now,
the others as much earlier) and the loop goes on. The analyses are not banned:
they are walks saturated inside every step, fed by the family rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from optimus_eqsat.rewrites import RuleSet


@dataclass(frozen=True)
class Schedule:
    """The egglog commands of one saturation phase."""

    first: str | None  # run once before the first step of a phase; None: no family has `once` rulesets
    step: str  # run every iteration
    # the same, by ruleset: settle = saturate each of ``analyses`` in turn until a pass changes nothing
    analyses: tuple[str, ...] = ()
    once: tuple[str, ...] = ()  # first: settle, one round of each, settle
    families: tuple[str, ...] = ()  # step: settle, one round of each, settle


@dataclass(frozen=True)
class Backoff:
    """Per-rule backoff of the family rules (not the analyses), as egg's BackoffScheduler.

    A rule may match ``match_limit(fx_nodes) * growth ** bans`` times in one
    iteration, where ``bans`` is how often it was banned before; above that it
    is left out of the next ``ban_length * growth ** bans`` iterations.

    Defaults: the zoo's busiest family rule matches at most 3.6 times per FX
    node in one iteration (reshape-reshape: 295 matches on mmoe's 81-node
    traced graph, 586 on dynamic_schema's 198), so 10 per node, and at least
    1,000 (egg's default) on small graphs, never bans a rule there. A ban lasts 3 iterations
    (egg: 5): a phase has only 12 (6 after batching), and a rule banned for 5
    of them would miss most of its own work. Limit and ban length double (egg's
    growth) with each ban.
    """

    matches_per_fx_node: float = 10.0
    min_match_limit: int = 1_000
    ban_length: int = 3
    growth: int = 2
    enabled: bool = True

    def match_limit(self, fx_nodes: int, bans: int = 0) -> int:
        """Matches one iteration may bring a rule banned ``bans`` times before, on a graph of ``fx_nodes``."""
        return int(max(self.min_match_limit, self.matches_per_fx_node * fx_nodes)) * self.growth**bans

    def ban_iterations(self, bans: int = 0) -> int:
        """Iterations of the ban of a rule banned ``bans`` times before."""
        return self.ban_length * self.growth**bans


def compose(rulesets: Sequence[RuleSet], runs: Mapping[str, str | None] | None = None) -> Schedule:
    """The schedule for ``rulesets`` (the shape analysis is always part of it).

    ``runs`` replaces a family's round: the ruleset to run instead (its rules
    not banned), or None to skip the family (all its rules banned).
    """
    runs = runs or {}
    analysis_names = ("shapes", *(n for r in rulesets for n in r.analyses))
    once_names = tuple(name for r in rulesets for name in r.once)
    family_names = cast(
        tuple[str, ...], tuple(runs.get(r.name, r.name) for r in rulesets if runs.get(r.name, r.name) is not None)
    )
    settle = f"(saturate (seq {' '.join(f'(saturate (run {name}))' for name in analysis_names)}))"
    once = " ".join(f"(run {name})" for name in once_names)
    families = " ".join(f"(run {name})" for name in family_names)
    return Schedule(
        first=f"(run-schedule {settle} (seq {once}) {settle})" if once else None,
        step=f"(run-schedule {settle} (seq {families}) {settle})",
        analyses=analysis_names,
        once=once_names,
        families=family_names,
    )
