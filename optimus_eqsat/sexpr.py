"""A small reader for egglog program text: top-level forms with their source spans.

Only what the explorer needs (finding rules, their names and heads, and cutting
a rule out of a program): atoms stay strings (string literals keep their
quotes), comments (``;`` to end of line) are skipped. Iterative, so deep terms
cannot overflow the Python stack.
"""

from __future__ import annotations

from dataclasses import dataclass

SExpr = "str | list[SExpr]"


@dataclass(frozen=True)
class Form:
    """One top-level form: the parsed value and its ``text[start:end]`` span."""

    value: list | str
    start: int
    end: int


def read_forms(text: str) -> list[Form]:
    """All top-level forms of ``text``; raises ValueError on unbalanced parentheses."""
    forms: list[Form] = []
    stack: list[tuple[list, int]] = []  # (open list, its start offset)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == ";":
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if ch.isspace():
            i += 1
            continue
        if ch == "(":
            stack.append(([], i))
            i += 1
            continue
        if ch == ")":
            if not stack:
                raise ValueError(f"unbalanced ')' at offset {i}")
            done, start = stack.pop()
            i += 1
            if stack:
                stack[-1][0].append(done)
            else:
                forms.append(Form(done, start, i))
            continue
        start = i
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            while i < n and not text[i].isspace() and text[i] not in '();"':
                i += 1
        atom = text[start:i]
        if stack:
            stack[-1][0].append(atom)
        else:
            forms.append(Form(atom, start, i))
    if stack:
        raise ValueError(f"unbalanced '(' at offset {stack[-1][1]}")
    return forms


def keyword(form: list, key: str) -> str | None:
    """The atom after ``key`` (e.g. ``:name``) in a form, without string quotes."""
    for a, b in zip(form, form[1:]):
        if a == key and isinstance(b, str):
            return b[1:-1] if b.startswith('"') else b
    return None


def heads(value: list | str) -> set[str]:
    """Every operator (first atom of a list) inside ``value``, iteratively."""
    out: set[str] = set()
    work = [value]
    while work:
        v = work.pop()
        if isinstance(v, list) and v:
            if isinstance(v[0], str):
                out.add(v[0])
            work.extend(x for x in v if isinstance(x, list))
    return out
