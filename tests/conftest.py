"""Shared test helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# benchmarks/ (the model zoo, synthetic graphs) is importable from tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
