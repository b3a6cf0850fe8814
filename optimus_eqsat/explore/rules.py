"""The rule catalogue of a run: every named rule, its ruleset, what it builds.

Read from the rule programs' text (the same text egglog ran). ``builds`` is the
set of constructors a rule's right-hand side / actions mention: a rule that
builds ``Slice`` is a candidate for having produced a ``Slice`` e-node. This is
a static over-approximation, not a proof (see :mod:`.explorer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from optimus_eqsat.rewrites import RuleSet
from optimus_eqsat.sexpr import heads, keyword, read_forms

_RULE_FORMS = ("rewrite", "birewrite", "rule")


@dataclass(frozen=True)
class RuleInfo:
    """One named rule: ``family`` is the program it came from (a RuleSet name)."""

    name: str
    family: str
    ruleset: str
    kind: str  # "rewrite" | "birewrite" | "rule"
    builds: frozenset[str]  # constructors in the rhs / actions
    merges: bool  # its actions union existing classes (e.g. "slice-full": t = x)
    text: str


def _constructors(value) -> set[str]:
    return {h for h in heads(value) if h[:1].isupper()}


def _split_rule(value: list) -> tuple[list, list, bool]:
    """(left side, right side, merges?) of a rewrite or rule form."""
    kind = value[0]
    if kind in ("rewrite", "birewrite"):
        lhs, rhs = value[1], value[2]
        return [lhs], [rhs], not isinstance(rhs, list)
    body = value[1] if len(value) > 1 and isinstance(value[1], list) else []
    actions = value[2] if len(value) > 2 and isinstance(value[2], list) else []
    return body, actions, "union" in heads(actions)


def rules_of(ruleset: RuleSet) -> list[RuleInfo]:
    """The named rules of one rule program, in source order."""
    out = []
    for form in read_forms(ruleset.program):
        value = form.value
        if not (isinstance(value, list) and value and value[0] in _RULE_FORMS):
            continue
        name = keyword(value, ":name")
        if name is None:
            continue
        lhs, rhs, merges = _split_rule(value)
        built = _constructors(rhs) | (_constructors(lhs) if value[0] == "birewrite" else set())
        out.append(
            RuleInfo(
                name,
                ruleset.name,
                keyword(value, ":ruleset") or "",
                value[0],
                frozenset(built),
                merges,
                ruleset.program[form.start : form.end],
            )
        )
    return out


def catalogue(rulesets: list[RuleSet]) -> dict[str, RuleInfo]:
    """Rule name -> RuleInfo over several programs (later names win on clashes)."""
    return {r.name: r for rs in rulesets for r in rules_of(rs)}


def without_rules(ruleset: RuleSet, banned: set[str]) -> RuleSet:
    """The same program with every top-level rule named in ``banned`` cut out."""
    text = ruleset.program
    cuts = [
        (f.start, f.end)
        for f in read_forms(text)
        if isinstance(f.value, list) and f.value and f.value[0] in _RULE_FORMS and keyword(f.value, ":name") in banned
    ]
    if not cuts:
        return ruleset
    pieces, last = [], 0
    for start, end in cuts:
        pieces.append(text[last:start])
        pieces.append(
            f";; (banned by the explorer: {keyword(next(cast(list, f.value) for f in read_forms(text[start:end])), ':name')})"
        )
        last = end
    pieces.append(text[last:])
    return RuleSet(ruleset.name, "".join(pieces), ruleset.description)
