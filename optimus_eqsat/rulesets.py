"""Which egglog programs a run loads: shipped rule families by name, then user rule files."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optimus_eqsat import rewrites
from optimus_eqsat.saturate import check_ruleset

DEFAULT_RULESETS = ("splitcat", "algebraic", "batching")


def known_families() -> set[str]:
    """Family names options may give: the shipped egglog and Python families and the
    defaults (a default not shipped yet is skipped, not an error)."""
    return set(rewrites.builtin_rulesets()) | set(rewrites.PYTHON_FAMILIES) | set(DEFAULT_RULESETS)


def checked_rule_files(paths: Iterable[str | Path], check_rules: bool = True) -> list[rewrites.RuleSet]:
    """The rule files, read and checked by egglog (``RuleFileError`` names a bad one), and
    with ``check_rules`` tested on random tensors (quick, cached per file content):
    ``rule_check.UnsoundRuleError`` names an unsound rule and its counterexample."""
    shipped = rewrites.builtin_rulesets().values()
    loaded = [rewrites.load_rule_file(path) for path in paths]
    names = [ruleset.name for ruleset in loaded]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise rewrites.RuleFileError(f"rule files declare the same ruleset more than once: {twice}")
    for ruleset in loaded:
        check_ruleset(ruleset, shipped)
        if check_rules:
            from optimus_eqsat.rule_check import refuse_unsound

            refuse_unsound(ruleset)
    return loaded


def select_rulesets(families: Iterable[str], rule_files: Iterable[str | Path]) -> list[rewrites.RuleSet]:
    """The egglog programs to load: the shipped families named in ``families``, then the
    rule files. Python families (batching) add facts between saturations instead."""
    shipped = rewrites.builtin_rulesets()
    selected = [shipped[name] for name in families if name in shipped]
    return selected + [rewrites.load_rule_file(path) for path in rule_files]
