"""Checking the rules of a program by testing: verdicts, counterexamples, the quick check.

For each rule (each direction of a birewrite) the query becomes a goal
(:mod:`.logic`); each sample unfolds its relation atoms, draws its free
variables and evaluates the matched side (:mod:`.instance`); a sample the
e-graph could not hold is discarded; on a valid one every union of the
actions must relate equal values and every ``set`` of shape/ldim/lsize must
state the value's own (:mod:`.compare`). Testing, not proof: ``sound`` means
no counterexample in the instances tried.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from optimus_eqsat.rewrites import RuleFileError, RuleSet, builtin_rulesets, shape_rules
from optimus_eqsat.rule_check.compare import describe, difference, dtype_name, kind
from optimus_eqsat.rule_check.instance import Instance
from optimus_eqsat.rule_check.logic import Call, Goal, Node, Scope, Solver
from optimus_eqsat.rule_check.meaning import TV, Invalid, ListVal, NotCheckable
from optimus_eqsat.rule_check.program import (
    IGNORED_ACTIONS,
    ROOT,
    SEMANTIC_FUNCTIONS,
    Program,
    Rule,
    environment,
    read_program,
)
from optimus_eqsat.rule_check.sampling import SampleSpace
from optimus_eqsat.run_support import single_thread
from optimus_eqsat.term import CTORS

log = logging.getLogger("optimus_eqsat")

SOUND, UNSOUND, NOT_CHECKED = "sound", "unsound", "not checked"


@dataclass(frozen=True)
class Counterexample:
    """A valid instance of a rule's match on which its two sides differ."""

    direction: str  # "->" / "<-" for a birewrite, "" otherwise
    values: tuple[tuple[str, str], ...]  # (variable, printed value)
    matched: str  # the value of the matched side
    rewritten: str  # the value of the new side, or the error it raised
    problem: str

    def __str__(self) -> str:
        lines = [f"  {name} = {value}" for name, value in self.values]
        way = f" ({'left to right' if self.direction == '->' else 'right to left'})" if self.direction else ""
        lines += [f"  matched side{way}: {self.matched}", f"  rewritten side: {self.rewritten}", f"  {self.problem}"]
        return "\n".join(lines)


@dataclass(frozen=True)
class RuleVerdict:
    """What testing found about one rule: sound (no counterexample in ``instances``), unsound
    (with a counterexample), or not checked (``reason`` says why)."""

    rule: str  # its :name, else its position
    text: str
    status: str
    reason: str
    instances: int = 0
    counterexample: Counterexample | None = None

    @property
    def unsound(self) -> bool:
        return self.status == UNSOUND

    def __str__(self) -> str:
        head = f"{self.rule}: {self.status}" + (f": {self.reason}" if self.reason else "")
        if self.counterexample is None:
            return head
        return f"{head}\n  rule: {' '.join(self.text.split())}\n{self.counterexample}"


class UnsoundRuleError(RuleFileError):
    """A user rule file holds a rule that testing found unsound (the message names it and the counterexample)."""


def shipped_programs() -> list[str]:
    """The programs whose relations and facts a rule may read: language, shapes, shipped families."""
    from optimus_eqsat.saturate import LANGUAGE

    return [LANGUAGE, shape_rules().program, *(r.program for r in builtin_rulesets().values())]


def check_rules(
    source: str | Path | RuleSet,
    samples: int = 100,
    seed: int = 0,
    time_limit_s: float | None = None,
    rule_time_limit_s: float | None = None,
    mixed_dtypes: bool = True,
    only: Iterable[str] | None = None,
) -> list[RuleVerdict]:
    """Test every rule of a rule file (a path, or a :class:`RuleSet`) on random instances.

    Each rule is tried until ``samples`` valid instances passed, a counterexample turned
    up, ``rule_time_limit_s`` passed for it or ``time_limit_s`` for the whole file (what
    is left is then split among the remaining rules); a rule with no valid instance is
    "not checked". ``mixed_dtypes=False`` draws one dtype per instance (by default some
    instances mix float dtypes, and type promotion makes several shipped rules unsound
    there: the e-graph tracks no dtypes). ``only``: the names of the rules to check (all
    by default). Raises RuleFileError when the file cannot be read.
    """
    if isinstance(source, RuleSet):
        text = source.program
    else:
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise RuleFileError(f"{source}: cannot read the rule file: {exc.strerror or exc}") from None
    return check_program(text, samples, seed, time_limit_s, rule_time_limit_s, mixed_dtypes, only)


def check_program(
    text: str,
    samples: int = 100,
    seed: int = 0,
    time_limit_s: float | None = None,
    rule_time_limit_s: float | None = None,
    mixed_dtypes: bool = True,
    only: Iterable[str] | None = None,
) -> list[RuleVerdict]:
    """:func:`check_rules` on egglog program text."""
    try:
        program = read_program(text)
    except ValueError as exc:
        raise RuleFileError(f"cannot read the rule program: {exc}") from None
    if only is not None:
        wanted = set(only)
        program.rules = [r for r in program.rules if r.label in wanted]
        missing = wanted - {r.label for r in program.rules}
        if missing:
            raise RuleFileError(f"no rule named {', '.join(sorted(missing))}")
    env = environment([*shipped_programs(), text])
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    verdicts = []
    with single_thread():  # tiny tensors (see run_support.single_thread)
        for k, rule in enumerate(program.rules):
            budget = rule_time_limit_s
            if deadline is not None:
                share = max(deadline - time.monotonic(), 0.0) / (len(program.rules) - k)
                budget = share if budget is None else min(budget, share)
            verdicts.append(check_rule(rule, env, samples, seed, budget, mixed_dtypes))
    return verdicts


def check_rule(
    rule: Rule,
    env: Program,
    samples: int = 100,
    seed: int = 0,
    time_limit_s: float | None = None,
    mixed_dtypes: bool = True,
) -> RuleVerdict:
    """Test one rule (both directions of a birewrite)."""
    rng = random.Random(f"{seed}:{rule.label}:{rule.text}")
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    tested = 0
    try:
        for direction, query, actions in rule.directions():
            outcome = _check_direction(rule, direction, query, actions, env, samples, rng, deadline, mixed_dtypes)
            if isinstance(outcome, RuleVerdict):
                return outcome
            if isinstance(outcome, str):
                return _verdict(rule, NOT_CHECKED, outcome)
            tested = outcome if not tested else min(tested, outcome)
    except NotCheckable as exc:
        return _verdict(rule, NOT_CHECKED, str(exc))
    except _Analysis as exc:
        return _verdict(rule, NOT_CHECKED, str(exc))
    note = f"{tested} instances" if tested >= samples else f"{tested} of {samples} instances (time or tries ran out)"
    return _verdict(rule, SOUND, note, tested)


class _Analysis(Exception):
    """The rule only derives facts of relations (it is checked where a rule reads them)."""


def _verdict(
    rule: Rule, status: str, reason: str, instances: int = 0, counterexample: Counterexample | None = None
) -> RuleVerdict:
    return RuleVerdict(rule.label, rule.text, status, reason, instances, counterexample)


def _prepare(solver: Solver, query: tuple, actions: tuple) -> tuple[Goal, Scope, list]:
    """The rule's own query atoms as a goal, and its checkable actions as terms."""
    scope, goal = Scope(), Goal()
    for atom in query:
        if not solver.atom(atom, scope, goal, 0):
            raise NotCheckable("the query can never match (it equates different constructors)")
    bound, compiled, derives = set(scope), [], []
    for action in actions:
        if not isinstance(action, list) or not action or not isinstance(action[0], str):
            continue
        head = action[0]
        if head == "let" and len(action) == 3:
            scope[action[1]] = solver.term(action[2], scope, goal, 0)
            bound.add(action[1])
        elif head == "union" and len(action) == 3:
            compiled.append(("union", solver.term(action[1], scope, goal, 0), solver.term(action[2], scope, goal, 0)))
        elif head == "set" and isinstance(action[1], list) and action[1][0] in SEMANTIC_FUNCTIONS:
            fn = action[1][0]
            args = tuple(solver.term(a, scope, goal, 0) for a in action[1][1:])
            compiled.append(("set", Call(fn, args), solver.term(action[2], scope, goal, 0)))
        elif head == "set" and isinstance(action[1], list):
            derives.append(action[1][0])
        elif head not in IGNORED_ACTIONS and head not in CTORS:
            derives.append(head)
    unbound = sorted(set(scope) - bound)
    if unbound:
        raise NotCheckable(f"the actions use variables the query does not bind: {', '.join(unbound)}")
    if not compiled and not derives:
        raise NotCheckable("its actions relate no values (no union, no shape/ldim/lsize)")
    if not compiled:
        what = ", ".join(dict.fromkeys(derives))
        raise _Analysis(f"an analysis rule: it derives {what} (checked through the rules that read it)")
    return goal, scope, compiled


def _check_direction(
    rule: Rule,
    direction: str,
    query: tuple,
    actions: tuple,
    env: Program,
    samples: int,
    rng: random.Random,
    deadline: float | None,
    mixed_dtypes: bool,
) -> int | str | RuleVerdict:
    """Valid instances tested, why none was found, or the unsound verdict."""
    solver = Solver(env, rng)
    base, scope, compiled = _prepare(solver, query, actions)
    valid, tries, max_tries = 0, 0, max(200, 40 * samples)
    while valid < samples and tries < max_tries:
        if deadline is not None and time.monotonic() > deadline and tries >= 1:
            break
        tries += 1
        goal = solver.solve(base.copy())
        if goal is None:
            continue
        instance = Instance(goal, SampleSpace(random.Random(rng.getrandbits(64)), mixed_dtypes))
        try:
            instance.match()
        except Invalid:
            continue
        valid += 1
        for action in compiled:
            found = _test_action(instance, action)
            if found is not None:
                example = _counterexample(instance, scope, direction, *found)
                return _verdict(rule, UNSOUND, example.problem, valid, example)
    if valid == 0:
        way = f" ({direction})" if direction else ""
        return (
            f"no valid instance{way} in {tries} tries (none the e-graph could hold passed the query; "
            f"it may never match a well-formed e-graph)"
        )
    return valid


def _test_action(instance: Instance, action: tuple) -> tuple[object, object, str] | None:
    """(matched value, new value or None when it raised, what is wrong) when the action
    relates different values; None when it holds on this instance."""
    kind, target, new = action
    if kind == "set":  # the analysis value the rule states vs the value's own
        try:
            claimed = instance.value(new, matched=False)
            actual = instance.value(target, matched=False)
        except Invalid as exc:
            return instance.known(target.args[0]), None, f"stating {target.fn} raised: {exc}"
        problem = difference(actual, claimed)
        return None if problem is None else (actual, claimed, f"{target.fn} stated {describe(claimed)}: {problem}")
    matched = instance.value(target, matched=True)
    try:
        value = instance.value(new, matched=False)
    except Invalid as exc:
        return matched, None, f"the rewritten side raised: {exc}"
    problem = difference(matched, value, instance.float_eps(matched, value))
    return None if problem is None else (matched, value, problem)


def _counterexample(
    instance: Instance, scope: Scope, direction: str, matched: object, new: object, problem: str
) -> Counterexample:
    values = []
    for name, term in scope.items():
        if name != ROOT:
            value = instance.known(term)
            values.append((name, describe(value) if value is not None else _render(instance, term)))
    values += [(f"(Leaf {i})", describe(v)) for i, v in sorted(instance.leaves.items())]
    dtypes = sorted(dtype_name(d) for d in instance.space.dtypes_drawn)
    if len(dtypes) > 1:  # type promotion: say so, the e-graph tracks no dtypes
        problem += f" (this instance mixes dtypes: {', '.join(dtypes)})"
    return Counterexample(
        direction, tuple(values), describe(matched), "(raised)" if new is None else describe(new), problem
    )


def _render(instance: Instance, term: object, depth: int = 0) -> str:
    """A term not evaluated in this instance, with the values of its parts that were."""
    term = instance.goal.resolve(term)
    value = instance.known(term)
    if value is not None:
        return describe(value) if depth == 0 or not isinstance(value, (TV, ListVal)) else f"<{kind(value)}>"
    if isinstance(term, (Node, Call)) and depth < 6:
        head = term.ctor if isinstance(term, Node) else term.fn
        return f"({head} {' '.join(_render(instance, a, depth + 1) for a in term.args)})"
    return "?" if depth else "(not computed)"


# ---------------------------------------------------------------- quick check of user files

QUICK_SAMPLES = 12
QUICK_TIME_LIMIT_S = 4.0


@functools.lru_cache(maxsize=64)
def _quick(text: str) -> tuple[RuleVerdict, ...]:
    return tuple(check_program(text, QUICK_SAMPLES, seed=0, time_limit_s=QUICK_TIME_LIMIT_S))


def refuse_unsound(ruleset: RuleSet) -> list[RuleVerdict]:
    """The quick check a run makes of a user rule file (few samples, time-bounded, cached per
    file content): raise :class:`UnsoundRuleError` naming the first unsound rule and its
    counterexample; return the verdicts otherwise."""
    verdicts = list(_quick(ruleset.program))
    for verdict in verdicts:
        if verdict.unsound:
            raise UnsoundRuleError(
                f"{ruleset.description or ruleset.name}: rule {verdict.rule} is unsound "
                f"(found by testing it on random tensors; pass check_rules=False to use it anyway):\n{verdict}"
            )
    skipped = [v.rule for v in verdicts if v.status == NOT_CHECKED]
    if skipped:
        log.info("%s: rules not checked: %s", ruleset.description or ruleset.name, ", ".join(skipped))
    return verdicts


def verdict_table(verdicts: Iterable[RuleVerdict]) -> str:
    """A plain-text table of verdicts, counterexamples below it."""
    verdicts = list(verdicts)
    rows = [("rule", "verdict", "instances", "note")]
    rows += [(v.rule, v.status, str(v.instances), v.reason) for v in verdicts]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 4)
    for v in verdicts:
        if v.counterexample is not None:
            lines += ["", str(v)]
    counts = {s: sum(v.status == s for v in verdicts) for s in (SOUND, UNSOUND, NOT_CHECKED)}
    lines += ["", ", ".join(f"{n} {s}" for s, n in counts.items())]
    return "\n".join(lines)
