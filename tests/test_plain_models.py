"""Models with nothing to batch (a ResNet, a BERT) through the default backend in training.

Users turn the backend on for every model they train: on these the optimizer finds
nothing worth a different program, and a training step must equal eager's (outputs,
gradients, batch norms' running statistics). Small versions of
``benchmarks/plain_models.py``'s models (their compile time is that benchmark's).
"""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.plain_models import Bert, ResNet18
from optimus_eqsat.backend import make_backend


def _step(model: torch.nn.Module, run, inputs) -> tuple[torch.Tensor, dict, dict]:
    out = run(*inputs)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, {n: b.clone() for n, b in model.named_buffers()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_training_step_equals_eager(name: str) -> None:
    torch.manual_seed(0)
    if name == "resnet":
        model, inputs = ResNet18(num_classes=10, width=8).train(), (torch.randn(4, 3, 32, 32),)
    else:
        model = Bert(vocab=50, hidden=32, layers=2, heads=2, intermediate=64, max_len=8, dropout=0.0).train()
        inputs = (torch.randint(0, 50, (4, 8)), torch.ones(4, 8, dtype=torch.long))
    ours = copy.deepcopy(model)
    backend = make_backend(measure_budget_s=0.05)
    torch._dynamo.reset()
    got = _step(ours, torch.compile(ours, backend=backend), inputs)
    want = _step(model, model, inputs)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert got[1].keys() == want[1].keys()
    scale = max(g.abs().max().item() for g in want[1].values())
    for n, g in want[1].items():
        torch.testing.assert_close(got[1][n], g, rtol=1e-3, atol=1e-4 * scale, msg=lambda m, n=n: f"grad {n}: {m}")
    for n, b in want[2].items():
        torch.testing.assert_close(got[2][n], b, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"buffer {n}: {m}")
    # the measured choice decided (at these toy sizes it may time a rewrite; at real sizes it
    # compiles once: benchmarks/nothing_to_batch.py) and never failed
    assert backend.reports and all(r.measured is not None for r in backend.reports)
    assert not any("measurement failed" in (r.fallback_reason or "") for r in backend.reports)
