"""Shared test helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# benchmarks/ (the model zoo, synthetic graphs) is importable from tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Every test optimizes afresh (reports, phase times and fallbacks are what they check): the
# persistent cache is off unless a test turns it on (tests/test_program_cache.py). Child
# processes (the distributed tests) inherit it.
os.environ["OPTIMUS_EQSAT_CACHE"] = "0"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
