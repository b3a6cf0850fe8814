"""Backoff bans of family rules (``schedule.Backoff``) and the egglog rulesets that leave them out.

egglog runs a ruleset whole. To leave one rule out of a family's round, each
rule of a family is loaded into a ruleset of its own and the family's name
becomes their combined ruleset (egglog's ``unstable-combined-ruleset``: one
round of it matches all its rules on one state, then applies them, as one
ruleset does); a round without some rules runs another combined ruleset of the
others (:meth:`SplitFamily.without`, declared on first use).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from optimus_eqsat.rewrites.schedule import Backoff


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


_RULE_FORMS = ("rule", "rewrite", "birewrite")


@dataclass(frozen=True)
class _Form:
    """A top-level form of an egglog program: its text span, head, and its own keyword
    arguments (``:ruleset``, ``:name``) with the span of each value."""

    start: int
    end: int
    head: str
    keywords: dict[str, tuple[str, int, int]]


def _forms(program: str) -> list[_Form]:
    """The top-level forms of ``program`` (comments and strings skipped).

    egglog's parser gives the same forms, but reading a parsed rule back through the
    Python bindings costs about 5 ms (its spans carry the whole source): over a second
    for the split/cat family, on the first optimization of every process."""
    forms: list[_Form] = []
    keywords: dict[str, tuple[str, int, int]]
    pending: str | None
    depth, start, head, keywords, pending, i, n = 0, 0, "", {}, None, 0, len(program)
    while i < n:
        ch = program[i]
        if ch == ";":
            i = program.find("\n", i)
            i = n if i < 0 else i
            continue
        if ch.isspace():
            i += 1
            continue
        if ch == "(":
            if depth == 0:
                start, head, keywords = i, "", {}
            pending = None  # a keyword's value that is a list (:when (...)) is not kept
            depth += 1
            i += 1
            continue
        if ch == ")":
            depth -= 1
            if depth == 0:
                forms.append(_Form(start, i + 1, head, keywords))
            i += 1
            continue
        if ch == '"':  # a string, with backslash escapes
            j = i + 1
            while j < n and program[j] != '"':
                j += 2 if program[j] == "\\" else 1
            j += 1
        else:
            j = i
            while j < n and not program[j].isspace() and program[j] not in '();"':
                j += 1
        token = program[i:j]
        if depth == 1:
            if not head:
                head = token
            elif pending is not None:
                keywords[pending], pending = (token, i, j), None
            elif token.startswith(":"):
                pending = token
        i = j
    return forms


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


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1])


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def split_family(program: str, family: str) -> tuple[str, SplitFamily]:
    """``program`` (a family's egglog text) with every rule of ``family`` in a ruleset of its
    own (``family@k``) and ``family`` declared, where it was, as their combined ruleset.
    An unnamed rule is named ``family#k`` (egglog would name it by its text, which holds
    the ruleset's name), a second rule of one name ``name#k``."""
    forms = _forms(program)
    ours = [f for f in forms if f.head in _RULE_FORMS and f.keywords.get(":ruleset", ("",))[0] == family]
    names: list[str] = []
    for k, form in enumerate(ours):
        name = _unquote(form.keywords[":name"][0]) if ":name" in form.keywords else f"{family}#{k}"
        names.append(name if name not in names else f"{name}#{k}")  # a ban needs one rule per name
    rulesets = {name: f"{family}@{k}" for k, name in enumerate(names)}
    reported = {}
    for form, name in zip(ours, names):
        for shown in [f"{name}=>", f"{name}<="] if form.head == "birewrite" else [name]:
            reported[shown] = name
    declarations = "\n".join(
        [
            *(f"(ruleset {rs})" for rs in rulesets.values()),
            f"(unstable-combined-ruleset {family} {' '.join(rulesets.values())})",
        ]
    )
    declared = re.compile(rf"\(\s*ruleset\s+{re.escape(family)}\s*\)")
    edits = [(f.start, f.end, declarations) for f in forms if declared.fullmatch(program, f.start, f.end)]
    for form, name in zip(ours, names):
        _, i, j = form.keywords[":ruleset"]
        edits.append((i, j, rulesets[name]))
        if ":name" in form.keywords:
            _, i, j = form.keywords[":name"]
            edits.append((i, j, _quote(name)))
        else:
            edits.append((form.end - 1, form.end - 1, f" :name {_quote(name)}"))
    for i, j, text in sorted(edits, reverse=True):
        program = program[:i] + text + program[j:]
    return program, SplitFamily(family, rulesets, reported)
