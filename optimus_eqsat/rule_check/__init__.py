"""Checked user rules: test each rule of an egglog rule file on random tensors.

    >>> from optimus_eqsat.rule_check import check_rules
    >>> for verdict in check_rules("my_rules.egg", samples=100, seed=0):
    ...     print(verdict)

Both sides of every rule are evaluated on random instances of its match
(random shapes, dtypes, tensors, dims, bounds and constants that the query's
conditions accept) and compared; a rule is ``unsound`` when some instance
gives different results (the verdict carries the counterexample), ``sound``
when none did (testing, not proof), ``not checked`` when the checker cannot
give it a meaning or found no valid instance. ``optimize_graph`` runs a quick
version on every user rule file (``check_rules=False`` skips it). Command
line: ``optimus-eqsat check-rules FILE.egg``.
"""

from optimus_eqsat.rule_check.check import (
    Counterexample,
    RuleVerdict,
    UnsoundRuleError,
    check_program,
    check_rules,
    refuse_unsound,
    verdict_table,
)

__all__ = [
    "check_rules",
    "check_program",
    "refuse_unsound",
    "RuleVerdict",
    "Counterexample",
    "UnsoundRuleError",
    "verdict_table",
]
