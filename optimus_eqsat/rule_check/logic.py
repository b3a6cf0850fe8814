"""A rule's query as a unification problem: which term structures it matches.

The query atoms of a rule (``(= t (Slice x d a b))``, ``(= x (Cat l))``,
``(alg-rows l k w r)``, ``(< d 3)``) are turned into one :class:`Goal`:
variables bound to constructor structures (unified, so shared sub-terms stay
shared), variables bound to computed expressions (``(= s (shape x))``),
constraints to test once values exist, and the structures the e-graph must
hold (``roots``: they must be valid programs). A relation atom is unfolded
into one randomly chosen derivation of it (a fact, or a deriving rule's query
with its inserted tuple unified with the atom), recursively to a bounded
depth: a sampled instance is then one the rules could have derived.
Variables left free are drawn later, with their values (:mod:`.instance`).
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field
from typing import cast

from optimus_eqsat.rule_check.meaning import PRIMITIVES, NotCheckable
from optimus_eqsat.rule_check.program import SEMANTIC_FUNCTIONS, Derivation, Program
from optimus_eqsat.term import CTORS

_INT = re.compile(r"-?\d+$")
_FLOAT = re.compile(r"-?(\d+\.\d*|\d*\.\d+|\d+)([eE][-+]?\d+)?$|-?(inf|NaN)$")


class Var:
    """A logic variable; ``sort`` (egglog sort) where a position tells it."""

    __slots__ = ("name", "sort")

    def __init__(self, name: str, sort: str | None = None):
        self.name, self.sort = name, sort

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    """A literal: int (i64), float (f64), str (String), bool."""

    value: object


@dataclass(frozen=True, eq=False)
class Node:
    """A constructor of the term language applied to terms."""

    ctor: str
    args: tuple


@dataclass(frozen=True, eq=False)
class Call:
    """A primitive or a semantic function (shape, ldim, lsize) applied to terms."""

    fn: str
    args: tuple


Term = "Var | Lit | Node | Call"


@dataclass
class Goal:
    """A (partly) solved query: bindings, structures to evaluate, constraints, pending relation atoms."""

    bindings: dict = field(default_factory=dict)
    roots: list = field(default_factory=list)
    constraints: list = field(default_factory=list)  # ("eq", a, b) | ("true", call)
    pending: list = field(default_factory=list)  # (relation, args, depth); depth None: derivation complete
    solved: list = field(default_factory=list)  # (relation, args) whose derivation is complete

    def copy(self) -> Goal:
        return Goal(
            dict(self.bindings), list(self.roots), list(self.constraints), list(self.pending), list(self.solved)
        )

    def resolve(self, t: object) -> object:
        """Follow variable bindings to a structure, a literal, a call or a free variable."""
        while isinstance(t, Var):
            bound = self.bindings.get(t)
            if bound is None:
                return t
            t = bound
        return t


def literal(atom: str) -> Lit | None:
    """The literal an atom spells, or None for a variable name."""
    if atom.startswith('"'):
        return Lit(atom[1:-1])
    if atom in ("true", "false"):
        return Lit(atom == "true")
    if _INT.match(atom):
        return Lit(int(atom))
    if _FLOAT.match(atom):
        return Lit(float(atom))
    return None


def _occurs(v: Var, t: object, goal: Goal, through_calls: bool) -> bool:
    """Does ``v`` occur in ``t`` (inside structures; inside calls too with ``through_calls``)?"""
    work, seen = [t], set()
    while work:
        t = goal.resolve(work.pop())
        if t is v:
            return True
        if (isinstance(t, Node) or (through_calls and isinstance(t, Call))) and id(t) not in seen:
            seen.add(id(t))  # through calls, structures may refer back to themselves
            work.extend(t.args)
    return False


def unify(goal: Goal, a: object, b: object) -> bool:
    """Make ``a`` and ``b`` equal in ``goal``; False when no structure can (different constructors)."""
    work = [(a, b)]
    while work:
        a, b = work.pop()
        a, b = goal.resolve(a), goal.resolve(b)
        if a is b:
            continue
        if isinstance(b, Var) and not isinstance(a, Var):
            a, b = b, a
        if isinstance(a, Var):
            if _occurs(a, b, goal, through_calls=False):
                return False  # a finite structure cannot contain itself
            if isinstance(b, Call) and _occurs(a, b, goal, through_calls=True):
                goal.constraints.append(("eq", a, b))  # x = f(.. x ..): a condition, not a definition
            else:
                # (a value inside b's calls may still need a's: the list dim (= d (ldim l)) of
                # l = (TCons (Slice x d ..) ..); evaluation breaks such loops where it can)
                goal.bindings[a] = b
                if isinstance(b, Var) and b.sort is None:
                    b.sort = a.sort
        elif isinstance(a, Node) and isinstance(b, Node):
            if a.ctor != b.ctor or len(a.args) != len(b.args):
                return False
            work.extend(zip(a.args, b.args))
        elif isinstance(a, Lit) and isinstance(b, Lit):
            if type(a.value) is not type(b.value) or a.value != b.value:
                return False
        elif isinstance(a, Node) != isinstance(b, Node) and (isinstance(a, Lit) or isinstance(b, Lit)):
            return False
        else:
            goal.constraints.append(("eq", a, b))  # a computed value: tested once values exist
    return True


class Solver:
    """Builds goals for the rules of ``env``'s language; unfolds relation atoms at random."""

    def __init__(self, env: Program, rng: random.Random, max_depth: int = 4, budget: int = 300):
        self.env, self.rng, self.max_depth, self.budget = env, rng, max_depth, budget
        self._fresh = itertools.count()

    # ---------------------------------------------------------------- terms
    def term(self, sexpr: object, scope: dict, goal: Goal, depth: int, sort: str | None = None) -> object:
        """The logic term of an s-expression; derived functions inside it become pending atoms."""
        if isinstance(sexpr, str):
            lit = literal(sexpr)
            if lit is not None:
                return lit
            var = scope.get(sexpr)
            if var is None:
                var = scope[sexpr] = Var(sexpr + getattr(scope, "suffix", ""))
            if isinstance(var, Var) and var.sort is None:
                var.sort = sort
            return var
        sexpr = cast(list, sexpr)  # not an atom: a list
        if not sexpr or not isinstance(sexpr[0], str):
            raise NotCheckable(f"cannot read {sexpr!r}")
        head, args = sexpr[0], sexpr[1:]
        info = CTORS.get(head)
        if info is not None:
            if len(args) != len(info.sorts):
                raise NotCheckable(f"{head} takes {len(info.sorts)} arguments, not {len(args)}")
            return Node(head, tuple(self.term(a, scope, goal, depth, s) for a, s in zip(args, info.sorts)))
        if head in self.env.constructors:
            raise NotCheckable(
                f"constructor {head} has no torch meaning (it is declared by a rule file, not in optimus_eqsat/term.py)"
            )
        if head in SEMANTIC_FUNCTIONS or head in PRIMITIVES:
            return Call(head, tuple(self.term(a, scope, goal, depth) for a in args))
        if self.env.derived(head):
            out = Var(f"{head}#{next(self._fresh)}", self.env.functions.get(head, ((), None))[1])
            goal.pending.append((head, self._columns(head, args, scope, goal, depth) + (out,), depth))
            return out
        raise NotCheckable(f"unknown function {head}")

    def _columns(self, name: str, args: list, scope: dict, goal: Goal, depth: int) -> tuple:
        sorts = self.env.relations.get(name) or self.env.functions.get(name, ((),))[0]
        return tuple(self.term(a, scope, goal, depth, sorts[i] if i < len(sorts) else None) for i, a in enumerate(args))

    def atom(self, sexpr: object, scope: dict, goal: Goal, depth: int) -> bool:
        """Add one query atom to ``goal``; False when it cannot hold."""
        if not isinstance(sexpr, list) or not sexpr or not isinstance(sexpr[0], str):
            raise NotCheckable(f"cannot read query atom {sexpr!r}")
        head = sexpr[0]
        if head == "=" and len(sexpr) == 3:
            a = self.term(sexpr[1], scope, goal, depth)
            b = self.term(sexpr[2], scope, goal, depth, getattr(a, "sort", None))
            if isinstance(a, Var) and a.sort is None and isinstance(b, Var):
                a.sort = b.sort
            goal.roots.extend(t for t in (a, b) if isinstance(t, Node))
            return unify(goal, a, b)
        if head in CTORS:  # a term that must exist
            goal.roots.append(self.term(sexpr, scope, goal, depth))
            return True
        if self.env.derived(head):
            if head in self.env.relations:
                goal.pending.append((head, self._columns(head, sexpr[1:], scope, goal, depth), depth))
            else:  # a function call as an atom: its value exists
                self.term(sexpr, scope, goal, depth)
            return True
        goal.constraints.append(("true", self.term(sexpr, scope, goal, depth)))
        return True

    # ---------------------------------------------------------------- unfolding
    def solve(self, goal: Goal) -> Goal | None:
        """Unfold every pending relation atom (depth-first, random order); None when none fits."""
        self._steps = 0
        return self._search(goal)

    def _search(self, goal: Goal) -> Goal | None:
        """Depth first: an atom's derivation is complete before the next atom is unfolded, so
        an atom may reuse the tuple of a completed one (never its own ancestors: no cycles)."""
        if not goal.pending:
            return goal
        name, args, depth = goal.pending[0]
        if depth is None:  # the marker after a completed derivation
            g = goal.copy()
            g.pending.pop(0)
            g.solved.append((name, args))
            return self._search(g)
        options: list = [("fact", f) for f in self.env.facts.get(name, [])]
        for d in self.env.derivations.get(name, []):
            if depth < self.max_depth or not self.env.recursive(d):
                options.append(("rule", d))
        self.rng.shuffle(options)
        # Mostly first: the tuple of a completed atom of the relation, the latest first
        # (runmax s x d a = e and run s l x d a e are one run: the run just derived, not one
        # inside its derivation); two independent derivations rarely fit together.
        same = [("same", a) for n, a in reversed(goal.solved) if n == name]
        options = same + options if self.rng.random() < 0.8 else options + same
        for kind, option in options:
            self._steps += 1
            if self._steps > self.budget:
                return None
            g = goal.copy()
            rest = g.pending[1:]
            g.pending = []
            if kind == "same":
                ok = all(unify(g, x, y) for x, y in zip(args, option))
            else:
                ok = self._apply(g, args, kind, option, depth + 1)
            g.pending = g.pending + [(name, args, None)] + rest  # its derivation first, then the marker
            if ok:
                solved = self._search(g)
                if solved is not None:
                    return solved
        return None

    def _apply(self, goal: Goal, args: tuple, kind: str, option: object, depth: int) -> bool:
        """Unify a relation atom's ``args`` with a fact, or with a derivation's inserted tuple
        (its variables fresh) and add that derivation's query."""
        tuple_args = cast(tuple, option) if kind == "fact" else cast(Derivation, option).args
        if len(tuple_args) != len(args):
            return False
        scope = Scope(f"#{next(self._fresh)}")
        for name, sexpr in getattr(option, "lets", ()):
            scope[name] = self.term(sexpr, scope, goal, depth)
        inserted = [self.term(a, scope, goal, depth) for a in tuple_args]
        if not all(unify(goal, x, y) for x, y in zip(args, inserted)):
            return False
        if kind == "rule":
            derivation = cast(Derivation, option)
            return all(self.atom(a, scope, goal, depth) for a in derivation.query)
        return True


class Scope(dict):
    """Variable name -> term; new variables get ``suffix`` (a derivation's variables are fresh)."""

    def __init__(self, suffix: str = ""):
        super().__init__()
        self.suffix = suffix
