"""Rule sets, one per family (shipped as ``optimus_eqsat.rewrites``).

Each family is an egglog program (``*.egg`` beside this file, plus
rank-dependent rules generated in :mod:`generated`) declaring one ruleset of
the same name. The term language they rewrite is declared in
``optimus_eqsat/term.py`` (constructors) and ``optimus_eqsat/language.egg``
(analyses); how the rulesets are run is ``schedule.py``.

A user rule file is any egglog program that declares ``(ruleset NAME)`` and
adds rules to it; pass it as ``optimize_graph(gm, rule_files=[path])``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from optimus_eqsat.rewrites import generated

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RuleSet:
    """An egglog program that declares and fills one ruleset (a family), and the helper
    rulesets it declares for the schedule (rewrites/schedule.py):

    ``once``: rulesets run once before the saturation loop (rules that push an op into
    a structure and would nest forever with their reverse); ``analyses``: rulesets
    saturated around every step with the shapes (walks such as the cat-run tracker).
    """

    name: str
    program: str
    description: str = ""
    once: tuple[str, ...] = ()
    analyses: tuple[str, ...] = ()

    @property
    def rule_names(self) -> list[str]:
        return re.findall(r':name\s+"([^"]+)"', self.program)


def _read(name: str) -> str:
    return (_HERE / name).read_text()


def shape_rules() -> RuleSet:
    """The shape analysis every other family relies on (always loaded)."""
    return RuleSet("shapes", "\n".join([_read("shapes.egg"), generated.permute_shape_rules()]), "shape analysis")


def builtin_rulesets() -> dict[str, RuleSet]:
    """The rule families shipped with the package, by name."""
    families = [
        RuleSet(
            "splitcat",
            "\n".join(
                [
                    _read("splitcat.egg"),
                    _read("splitcat_runs.egg"),
                    generated.permute_permute_rules(),
                    generated.select_movedim_rules(),
                    generated.slice_as_select_rules(),
                    generated.slice_cat_member_rules(),
                    generated.reshape_trailing_rules(),
                ]
            ),
            "split/cat/view algebra (Inductor split_cat.py)",
            once=("splitcat_once",),
            analyses=("splitcat_analysis",),
        ),
        RuleSet(
            "algebraic",
            _read("algebraic.egg"),
            "algebraic rewrites",
            analyses=("algebraic_analysis", "algebraic_chains"),
        ),
    ]
    return {family.name: family for family in families}


# Families written in Python: they add facts between saturations (see batching/).
PYTHON_FAMILIES = ("batching",)


class RuleFileError(ValueError):
    """A user rule file that cannot be used."""


def load_rule_file(path: str | Path) -> RuleSet:
    """Read a user rule file; it must declare exactly one ``(ruleset NAME)``.

    Raises :class:`RuleFileError` naming the file when it is missing or unreadable
    (whether its egglog is valid is checked by ``saturate.check_ruleset``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read the rule file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RuleFileError(f"{path}: not a text (UTF-8) rule file: {exc.reason} at byte {exc.start}") from None
    names = re.findall(r"\(ruleset\s+([^\s()]+)\s*\)", text)
    if len(names) != 1:
        raise RuleFileError(f"{path}: a rule file declares exactly one (ruleset NAME); found {names or 'none'}")
    return RuleSet(names[0], text, f"user rule file {path}")
