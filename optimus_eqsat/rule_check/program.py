"""Rule programs as the checker reads them: declarations, facts, rules, derivations.

A program is egglog text (a user rule file, a shipped family, language.egg).
The checker needs, besides the rules to test, what the relations a rule's
query reads can hold: their top-level facts (``(alg-wdim "linear" 0)``) and
the rules that derive them (``(rule (Q...) ((alg-rows l k w r)))``). A
derived relation means whatever its deriving rules can produce, so the checker
samples a relation atom by unfolding one of them (see :mod:`.logic`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from optimus_eqsat.sexpr import keyword, read_forms
from optimus_eqsat.term import CTORS

RULE_FORMS = ("rewrite", "birewrite", "rule")
# Functions of language.egg that are facts about values, computed from them.
SEMANTIC_FUNCTIONS = frozenset({"shape", "ldim", "lsize"})
# The variable a rewrite's matched term is bound to (not a legal egglog name).
ROOT = "%matched"
# Actions with no meaning for values: they remove or hide facts, or stop the run.
IGNORED_ACTIONS = frozenset({"delete", "subsume", "panic", "extract"})
ACTION_COMMANDS = IGNORED_ACTIONS | {"let", "set", "union"}
# Top-level commands that are not facts.
COMMANDS = frozenset(
    {
        "ruleset",
        "sort",
        "datatype",
        "datatype*",
        "function",
        "relation",
        "constructor",
        "rewrite",
        "birewrite",
        "rule",
        "run",
        "run-schedule",
        "push",
        "pop",
        "check",
        "extract",
        "let",
        "union",
        "include",
        "input",
        "output",
        "print-size",
        "print-function",
        "print-overall-statistics",
        "fail",
        "set-option",
        "delete",
        "subsume",
        "unstable-combined-ruleset",
    }
)


@dataclass(frozen=True)
class Rule:
    """One rule form of a program, with its query and actions as s-expressions."""

    kind: str  # "rewrite" | "birewrite" | "rule"
    name: str | None
    index: int  # 1-based position among the program's rules
    line: int
    text: str
    query: tuple = ()
    actions: tuple = ()
    lhs: object = None
    rhs: object = None
    when: tuple = ()

    @property
    def label(self) -> str:
        """The rule's ``:name``, else its position."""
        return self.name or f"rule {self.index} (line {self.line})"

    def directions(self) -> list[tuple[str, tuple, tuple]]:
        """(direction, query atoms, actions) to check: a birewrite is checked both ways."""
        if self.kind == "rule":
            return [("", self.query, self.actions)]
        forward = ((["=", ROOT, self.lhs], *self.when), (["union", ROOT, self.rhs],))
        if self.kind == "rewrite":
            return [("", *forward)]
        return [("->", *forward), ("<-", (["=", ROOT, self.rhs], *self.when), (["union", ROOT, self.lhs],))]


@dataclass(frozen=True)
class Derivation:
    """How tuples of a relation (or of a function, value last) arise: a rule's query,
    the ``let`` bindings of its actions before the insert, and the inserted arguments."""

    relation: str
    query: tuple
    lets: tuple  # ((name, sexpr), ...)
    args: tuple
    text: str


@dataclass
class Program:
    """Declarations, facts, derivations and rules of one or more egglog programs."""

    relations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    functions: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    constructors: set[str] = field(default_factory=set)  # declared by a program, not in term.py
    facts: dict[str, list[tuple]] = field(default_factory=dict)
    derivations: dict[str, list[Derivation]] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)

    def derived(self, name: str) -> bool:
        """A relation or non-semantic function whose tuples come from facts or rules."""
        return name in self.relations or (name in self.functions and name not in SEMANTIC_FUNCTIONS)

    def recursive(self, derivation: Derivation) -> bool:
        """Its query reads a relation that rules derive (unfolding it may go on)."""
        return any(_reads(atom, self) for atom in derivation.query)

    def merge(self, other: Program) -> None:
        """Add ``other``'s declarations, facts and derivations (not its rules)."""
        self.relations.update(other.relations)
        self.functions.update(other.functions)
        self.constructors |= other.constructors
        for name, facts in other.facts.items():
            mine = self.facts.setdefault(name, [])
            mine.extend(f for f in facts if f not in mine)  # facts are small tuples of atoms
        for name, derivations in other.derivations.items():
            known = self.derivations.setdefault(name, [])
            seen = {(d.text, repr(d.args)) for d in known}
            known.extend(d for d in derivations if (d.text, repr(d.args)) not in seen)


def _reads(atom: object, program: Program) -> bool:
    if not isinstance(atom, list) or not atom:
        return False
    head = atom[0]
    if isinstance(head, str) and head in program.derivations:
        return True
    return any(_reads(a, program) for a in atom[1:])


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _options(form: list, start: int) -> dict[str, object]:
    """``:key value`` pairs from position ``start`` on."""
    out: dict[str, object] = {}
    for key, value in zip(form[start::2], form[start + 1 :: 2]):
        if isinstance(key, str) and key.startswith(":"):
            out[key] = value
    return out


def read_program(text: str) -> Program:
    """Parse egglog text (raises ValueError on unbalanced parentheses)."""
    program = Program()
    for form in read_forms(text):
        value = form.value
        if not isinstance(value, list) or not value or not isinstance(value[0], str):
            continue
        head = value[0]
        if head == "relation" and len(value) >= 3:
            program.relations[value[1]] = tuple(value[2])
        elif head == "function" and len(value) >= 4:
            program.functions[value[1]] = (tuple(value[2]), value[3])
        elif head == "constructor" and len(value) >= 2 and value[1] not in CTORS:
            program.constructors.add(value[1])
        elif head == "datatype":
            program.constructors |= {v[0] for v in value[2:] if isinstance(v, list) and v and v[0] not in CTORS}
        elif head in RULE_FORMS:
            rule = _rule(value, len(program.rules) + 1, _line(text, form.start), text[form.start : form.end])
            program.rules.append(rule)
            if rule.kind == "rule":
                _add_derivations(program, rule)
        elif head == "set" and len(value) == 3 and isinstance(value[1], list) and value[1]:
            program.facts.setdefault(value[1][0], []).append((*value[1][1:], value[2]))
        elif head not in COMMANDS and head not in CTORS:  # a fact of a relation (declared here or elsewhere)
            program.facts.setdefault(head, []).append(tuple(value[1:]))
    return program


def _rule(value: list, index: int, line: int, text: str) -> Rule:
    kind = value[0]
    name = keyword(value, ":name")
    if kind == "rule":
        query = value[1] if len(value) > 1 and isinstance(value[1], list) else []
        actions = value[2] if len(value) > 2 and isinstance(value[2], list) else []
        return Rule(kind, name, index, line, text, tuple(query), tuple(actions))
    when = _options(value, 3).get(":when", [])
    return Rule(
        kind, name, index, line, text, lhs=value[1], rhs=value[2], when=tuple(when) if isinstance(when, list) else ()
    )


def _add_derivations(program: Program, rule: Rule) -> None:
    lets: list[tuple[str, object]] = []
    for action in rule.actions:
        if not isinstance(action, list) or not action:
            continue
        head = action[0]
        if head == "let" and len(action) == 3:
            lets.append((action[1], action[2]))
        elif head == "set" and len(action) == 3 and isinstance(action[1], list) and action[1]:
            fn = action[1][0]
            if fn not in SEMANTIC_FUNCTIONS:
                program.derivations.setdefault(fn, []).append(
                    Derivation(fn, rule.query, tuple(lets), (*action[1][1:], action[2]), rule.text)
                )
        elif isinstance(head, str) and head not in ACTION_COMMANDS and head not in CTORS:
            program.derivations.setdefault(head, []).append(
                Derivation(head, rule.query, tuple(lets), tuple(action[1:]), rule.text)
            )


def environment(texts: Iterable[str]) -> Program:
    """The declarations, facts and derivations of several programs together."""
    env = Program()
    seen: set[str] = set()
    for text in texts:
        if text not in seen:
            seen.add(text)
            env.merge(read_program(text))
    return env
