"""Shared test helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# benchmarks/ (the model zoo, synthetic graphs) is importable from tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
