"""The op keys rules and batch kinds match on by name live in one table (optimus_eqsat.op_keys)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import optimus_eqsat
from optimus_eqsat.op_keys import OP_KEYS
from optimus_eqsat.rule_check.meaning import NAMED_OPS

RULE_FILES = sorted(Path(optimus_eqsat.__file__).parent.glob("rewrites/*.egg")) + [
    Path(optimus_eqsat.__file__).parent / "language.egg"
]
# Terms and facts whose first argument is an op key with a fixed meaning.
KEYED = re.compile(r'\((Binary|Scalar|Unary|MapUnary|Op2|Op3|alg-key|alg-wdim) "([^"]+)"')


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_key_a_shipped_rule_names_is_in_the_table(path: Path):
    named = {key for _, key in KEYED.findall(path.read_text())}
    assert named <= set(OP_KEYS), sorted(named - set(OP_KEYS))


def test_the_rule_checker_gives_meaning_to_table_keys_only():
    for ctor, ops in NAMED_OPS.items():
        assert set(ops) <= set(OP_KEYS), ctor


def test_the_translator_registers_a_table_key_as_the_table_says():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 3))
    from optimus_eqsat.translate import translate

    registry = translate(gm, (torch.randn(2, 4),)).registry
    spec = registry.specs["linear_b"]
    assert (spec.target, len(spec.args), spec.kind) == OP_KEYS["linear_b"].spec()
