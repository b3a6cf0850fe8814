"""Backoff bans of family rules (``schedule.Backoff``) and the egglog rulesets that leave them out.

egglog runs a ruleset whole. To leave one rule out of a family's round, each
rule of a family is loaded into a ruleset of its own and the family's name
becomes their combined ruleset (egglog's ``unstable-combined-ruleset``: one
round of it matches all its rules on one state, then applies them, as one
ruleset does); a round without some rules runs another combined ruleset of the
others (:meth:`SplitFamily.without`, declared on first use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import egglog.bindings as eb

from .schedule import Backoff


@dataclass(frozen=True)
class Ban:
    """One ban: ``rule`` matched ``matches`` times (over ``limit``) in ``iteration``;
    it sits out the iterations before ``until``."""

    rule: str
    iteration: int
    matches: int
    limit: int
    until: int


class BackoffScheduler:
    """Which family rules are banned in which iteration (iterations are counted from 1,
    over all phases of one e-graph)."""

    def __init__(self, backoff: Backoff, fx_nodes: int):
        self.backoff, self.fx_nodes = backoff, fx_nodes
        self.bans: list[Ban] = []  # every ban, in order
        self._until: dict[str, int] = {}  # rule -> first iteration it runs again
        self._times: dict[str, int] = {}  # rule -> bans so far

    def banned(self, iteration: int) -> set[str]:
        """The rules left out of ``iteration``."""
        return {rule for rule, until in self._until.items() if until > iteration}

    def record(self, iteration: int, matches: Mapping[str, int]) -> list[Ban]:
        """Ban the rules whose ``matches`` in ``iteration`` went over their limit; return the new bans."""
        if not self.backoff.enabled:
            return []
        new = []
        for rule, n in matches.items():
            times = self._times.get(rule, 0)
            limit = self.backoff.match_limit(self.fx_nodes, times)
            if n > limit:
                until = iteration + 1 + self.backoff.ban_iterations(times)
                new.append(Ban(rule, iteration, n, limit, until))
                self._until[rule], self._times[rule] = until, times + 1
        self.bans += new
        return new

    def bring_forward(self, iteration: int) -> bool:
        """After ``iteration`` changed nothing: end the earliest ban now and bring the
        others as much forward (egg's ``can_stop``). False when no rule was banned in
        ``iteration`` or after it (then the e-graph is saturated)."""
        waiting = {rule: until for rule, until in self._until.items() if until > iteration}
        if not waiting:
            return False
        delta = min(waiting.values()) - (iteration + 1)
        for rule, until in waiting.items():
            self._until[rule] = until - delta
        return True

    @property
    def times_banned(self) -> dict[str, int]:
        return dict(self._times)


def _ruleset_of(command: Any) -> str | None:
    if isinstance(command, eb.RuleCommand):
        return command.rule.ruleset
    if isinstance(command, (eb.RewriteCommand, eb.BiRewriteCommand)):
        return command.name
    return None


def _moved(command: Any, ruleset: str, name: str) -> Any:
    """``command`` declaring its rule(s) in ``ruleset``, named ``name``."""
    if isinstance(command, eb.RuleCommand):
        r = command.rule
        return eb.RuleCommand(eb.Rule(r.span, r.head, r.body, name, ruleset))
    w = command.rewrite
    rewrite = eb.Rewrite(w.span, w.lhs, w.rhs, w.conditions, name)
    if isinstance(command, eb.BiRewriteCommand):
        return eb.BiRewriteCommand(ruleset, rewrite)
    return eb.RewriteCommand(ruleset, rewrite, command.subsume)


def _rule_name(command: Any) -> str:
    return command.rule.name if isinstance(command, eb.RuleCommand) else command.rewrite.name


@dataclass
class SplitFamily:
    """A family loaded one ruleset per rule; ``family`` runs them all."""

    family: str
    rulesets: dict[str, str]  # rule -> its own ruleset, in load order
    reported: dict[str, str]  # name in egglog's match reports -> rule (a birewrite reports two)
    _without: dict[frozenset, str] = field(default_factory=dict)

    def matches(self, reported: Mapping[str, int]) -> dict[str, int]:
        """Matches per rule of this family from egglog's matches per reported name."""
        out: dict[str, int] = {}
        for name, n in reported.items():
            rule = self.reported.get(name)
            if rule is not None:
                out[rule] = out.get(rule, 0) + n
        return out

    def without(self, banned: Iterable[str], declare: Callable[[str, list[str]], None]) -> str | None:
        """The ruleset to run for this family without ``banned`` rules: the family itself
        when none of its rules is banned, None when all are; ``declare(name, rulesets)``
        declares a combined ruleset the first time one is needed."""
        left_out = frozenset(self.rulesets.keys() & set(banned))
        if not left_out:
            return self.family
        if left_out == self.rulesets.keys():
            return None
        if left_out not in self._without:
            name = f"{self.family}__without{len(self._without) + 1}"
            declare(name, [rs for rule, rs in self.rulesets.items() if rule not in left_out])
            self._without[left_out] = name
        return self._without[left_out]


def split_family(commands: Sequence[Any], family: str) -> tuple[list[Any], SplitFamily]:
    """``commands`` (a parsed family program) with every rule of ``family`` in a ruleset of
    its own and ``family`` declared as their combined ruleset, where it was declared.
    An unnamed rule is named ``family#k`` (egglog would name it by its text, which holds
    the ruleset's name), a second rule of one name ``name#k``."""
    ours = [c for c in commands if _ruleset_of(c) == family]
    names: list[str] = []
    for k, command in enumerate(ours):
        name = _rule_name(command) or f"{family}#{k}"
        names.append(name if name not in names else f"{name}#{k}")  # a ban needs one rule per name
    rulesets = {name: f"{family}@{k}" for k, name in enumerate(names)}
    reported = {}
    for command, name in zip(ours, names):
        for shown in ([f"{name}=>", f"{name}<="] if isinstance(command, eb.BiRewriteCommand) else [name]):
            reported[shown] = name
    out, k = [], 0
    for command in commands:
        if isinstance(command, eb.AddRuleset) and command.name == family:
            out += [eb.AddRuleset(command.span, rs) for rs in rulesets.values()]
            out.append(eb.UnstableCombinedRuleset(command.span, family, list(rulesets.values())))
        elif _ruleset_of(command) == family:
            out.append(_moved(command, rulesets[names[k]], names[k]))
            k += 1
        else:
            out.append(command)
    return out, SplitFamily(family, rulesets, reported)
