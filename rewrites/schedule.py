"""The saturation schedule, in one place: egglog run-schedules composed for the loaded families.

Each iteration of the loop in ``optimus_eqsat/saturate.py`` runs ``step``::

    settle        shapes, then each family's analyses (e.g. splitcat_analysis, the
                  cat-run walk), each saturated on its own, all repeated until
                  nothing changes: rules that need a shape or a walk see it. Each
                  analysis saturates on its own so that a walk along a long list
                  (one cell per round) pays a round of its own few rules, not of
                  every shape rule too.
    families      each family once, in load order (splitcat, algebraic, user files):
                  one match-and-apply round each, so no family starves the others
    settle

and the first iteration of a phase (before batching, and after it) runs ``first``
before that: ``settle``, each family's ``once`` rulesets one round (rules that
push an op into a structure and would nest forever with their reverse, e.g.
splitcat_once's unary-cat), ``settle``. The loop stops when a step changes
nothing (saturated) or at the first exhausted limit (``saturate.Limits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import RuleSet


@dataclass(frozen=True)
class Schedule:
    """The egglog commands of one saturation phase."""

    first: str | None  # run once before the first step of a phase; None: no family has `once` rulesets
    step: str  # run every iteration


def compose(rulesets: Sequence[RuleSet]) -> Schedule:
    """The schedule for ``rulesets`` (the shape analysis is always part of it)."""
    analyses = " ".join(f"(saturate (run {name}))" for name in ["shapes", *(n for r in rulesets for n in r.analyses)])
    settle = f"(saturate (seq {analyses}))"
    once = " ".join(f"(run {name})" for r in rulesets for name in r.once)
    families = " ".join(f"(run {r.name})" for r in rulesets)
    return Schedule(first=f"(run-schedule {settle} (seq {once}) {settle})" if once else None,
                    step=f"(run-schedule {settle} (seq {families}) {settle})")
