"""Rule sets, one per family (shipped as ``optimus_eqsat.rewrites``).

Each family is an egglog program (``*.egg`` beside this file, plus
rank-dependent rules generated in :mod:`generated`) declaring one ruleset of
the same name. The term language they rewrite is ``optimus_eqsat/language.egg``.

A user rule file is any egglog program that declares ``(ruleset NAME)`` and
adds rules to it; pass it as ``optimize_graph(gm, rule_files=[path])``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import generated

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RuleSet:
    """An egglog program that declares and fills one ruleset."""

    name: str
    program: str
    description: str = ""

    @property
    def once_rulesets(self) -> list[str]:
        """Rulesets named ``<name>_once``: run once, before the saturation loop."""
        return re.findall(rf"\(ruleset\s+({re.escape(self.name)}_once)\s*\)", self.program)

    @property
    def analysis_rulesets(self) -> list[str]:
        """Rulesets named ``<name>_analysis``: saturated after every step, with the shapes."""
        return re.findall(rf"\(ruleset\s+({re.escape(self.name)}_analysis)\s*\)", self.program)

    @property
    def rule_names(self) -> list[str]:
        return re.findall(r':name\s+"([^"]+)"', self.program)


def _read(name: str) -> str:
    return (_HERE / name).read_text()


def _family(name: str, description: str, *extra: str) -> RuleSet:
    return RuleSet(name, "\n".join([_read(f"{name}.egg"), *extra]), description)


def shape_rules() -> RuleSet:
    """The shape analysis every other family relies on (always loaded)."""
    return _family("shapes", "shape analysis", generated.permute_shape_rules())


def builtin_rulesets() -> dict[str, RuleSet]:
    """The rule families shipped with the package, by name."""
    families = [
        _family(
            "splitcat",
            "split/cat/view algebra (Inductor split_cat.py)",
            generated.permute_permute_rules(),
            generated.select_movedim_rules(),
            generated.cat_run_rules(),
            generated.slice_as_select_rules(),
            generated.slice_cat_member_rules(),
            generated.reshape_trailing_rules(),
        ),
    ]
    for optional in ("algebraic",):
        if (_HERE / f"{optional}.egg").exists():
            families.append(_family(optional, f"{optional} rewrites"))
    return {family.name: family for family in families}


# Families written in Python: they add facts between saturations (see batching.py).
PYTHON_FAMILIES = ("batching",)


class RuleFileError(ValueError):
    """A user rule file that cannot be used."""


def load_rule_file(path: str | Path) -> RuleSet:
    """Read a user rule file; it must declare exactly one ``(ruleset NAME)``.

    Raises :class:`RuleFileError` naming the file when it is missing or unreadable
    (whether its egglog is valid is checked by ``saturate.check_ruleset``)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read the rule file: {exc.strerror or exc}") from None
    names = re.findall(r"\(ruleset\s+([^\s()]+)\s*\)", text)
    if len(names) != 1:
        raise RuleFileError(f"{path}: a rule file declares exactly one (ruleset NAME); found {names or 'none'}")
    return RuleSet(names[0], text, f"user rule file {path}")
