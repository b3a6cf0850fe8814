"""Recommendation models shaped as users write them, trained through the backend against eager.

Each model (``tests/user_models.py``) trains three SGD steps compiled with the optimizer forced
to act as for a GPU (``measure=False, profile="h200"``: its batched program is run, not timed
and maybe dropped) and eagerly from the same weights and batches: outputs, gradients, updated
parameters and batch norms' running statistics must agree, then eval-mode serving under
``torch.no_grad`` (the parameter cache moves weights into stacks) must give eager's outputs.
Shapes covered here and nowhere else: EmbeddingBag with offsets and per-sample weights,
triu-index interactions, masked softmax over padded sequences, Dice (an affine-free batch norm
on a transposed 3-d input), stacked expert parameters with topk / scatter / index_add, batch
norms without affine parameters or running statistics, LayerNorm without affine parameters,
forward hooks and pre-hooks, in-place ``+=`` / ``relu_``, frozen embeddings, dict and tuple
outputs, the loss computed inside the forward (labels as an input, a label-statistics buffer and a
step counter written in place, a tower called twice), a train -> serve -> train cycle, a dynamic batch size, an HSTU-style generative
recommender (joint U/V/Q/K linear, relative-position bias, SiLU attention, tied output
embedding) and torchrec's mixture of low-rank cross-net experts (experts reading one input).
"""

from __future__ import annotations

import copy

import pytest
import torch

from optimus_eqsat.backend import make_backend
from tests import user_models as um

RTOL, ATOL = 1e-4, 1e-5


def _loss(out) -> torch.Tensor:
    if isinstance(out, dict):
        out = tuple(out.values())
    if isinstance(out, tuple):
        return sum(_loss(o) * (i + 1) for i, o in enumerate(out))
    return (out.float() ** 2).mean() if out.dim() else out


def _detach(out):
    if isinstance(out, dict):
        return {k: v.detach().clone() for k, v in out.items()}
    if isinstance(out, tuple):
        return tuple(o.detach().clone() for o in out)
    return out.detach().clone()


def _train(model: torch.nn.Module, run, batches: list[tuple]) -> tuple[list, list[dict]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    outs, grads = [], []
    for batch in batches:
        out = run(*batch)
        _loss(out).backward()
        outs.append(_detach(out))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad()
    return outs, grads


def _close(got, want, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _assert_same_state(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, want), got in zip(reference.state_dict().items(), model.state_dict().values()):
        _close(got, want, name)


def _forced() -> object:
    return make_backend(measure=False, profile="h200")


SLOW = pytest.mark.slow  # 15-50 s each on two CPU cores; no crash regression among them
CASES = {
    "dlrm": (um.DLRM, um.dlrm_batches),
    "din_dice": (um.DIN, um.din_batches),
    "din_prelu": (lambda: um.DIN(act="prelu"), um.din_batches),
    "stacked_moe": (um.StackedMoE, um.moe_batches),
    "mmoe_bn_affine_false": (lambda: um.NormMMOE("noaffine"), um.dense_batches),
    "mmoe_bn_no_running_stats": (lambda: um.NormMMOE("notrack"), um.dense_batches),
    "hooks_and_inplace": (um.HookedMMOE, um.dense_batches),
    "frozen_embeddings_dict": (um.FrozenTowers, um.id_batches),
    "loss_inside_tied_towers": (um.LossInsideTowers, um.labelled_batches),
    "wide_deep_inplace": (um.WideDeep, um.wide_deep_batches),
    "hstu_generative": (um.HSTU, um.hstu_batches),
    "mixture_cross_net": (um.MixtureCrossNet, um.cross_batches),
}
FAST = {"din_prelu", "hooks_and_inplace", "frozen_embeddings_dict", "wide_deep_inplace"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else SLOW) for n in CASES])
def test_trains_and_serves_as_eager(name: str) -> None:
    make_model, make_batches = CASES[name]
    model = make_model().train()
    reference = copy.deepcopy(model)
    batches = make_batches()
    torch._dynamo.reset()
    backend = _forced()
    got_outs, got_grads = _train(model, torch.compile(model, backend=backend), batches)
    want_outs, want_grads = _train(reference, reference, batches)
    for step, (got, want) in enumerate(zip(got_outs, want_outs)):
        _close(got, want, f"output of step {step}")
    for step, (got, want) in enumerate(zip(got_grads, want_grads)):
        assert got.keys() == want.keys()
        for n in want:
            _close(got[n], want[n], f"gradient of {n} at step {step}")
    _assert_same_state(model, reference)
    assert backend.reports and not any(r.fell_back and "rror" in (r.fallback_reason or "") for r in backend.reports)

    model.eval()
    reference.eval()
    torch._dynamo.reset()
    serve = torch.compile(model, backend=_forced())
    with torch.no_grad():
        for batch in batches[:2]:
            _close(serve(*batch), reference(*batch), "eval output")


@SLOW
def test_train_serve_train_cycle_keeps_the_weights_eager_trains() -> None:
    """Serving under no_grad moves the weights into cached stacks (``p.data = stack[k]``);
    training after it must still update the very tensors the optimizer holds."""
    model = um.NormMMOE("plain")
    reference = copy.deepcopy(model)
    batches = um.dense_batches(4)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=_forced())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, reference)]
    for _ in range(2):
        for m, run, opt in zip((model, reference), (compiled, reference), optimizers):
            m.train()
            for batch in batches[:2]:
                _loss(run(*batch)).backward()
                opt.step()
                opt.zero_grad()
            m.eval()
        with torch.no_grad():
            for batch in batches[2:]:
                _close(compiled(*batch), reference(*batch), "served output")
    _assert_same_state(model, reference)
    model.load_state_dict(reference.state_dict())
    with torch.no_grad():
        _close(compiled(*batches[0]), reference(*batches[0]), "served output after load_state_dict")


@SLOW
def test_dynamic_batch_size_trains_as_eager() -> None:
    """torch.compile(dynamic=True), the batch size changing every step (the last batch of an epoch)."""
    model = um.DIN()
    reference = copy.deepcopy(model)
    batches = [um.din_batches(1, batch=b)[0] for b in (16, 24, 8)]
    torch._dynamo.reset()
    got, _ = _train(model, torch.compile(model, backend=_forced(), dynamic=True), batches)
    want, _ = _train(reference, reference, batches)
    for step, (g, w) in enumerate(zip(got, want)):
        _close(g, w, f"output of step {step}")
    _assert_same_state(model, reference)


def test_default_backend_trains_dlrm_as_eager() -> None:
    """The measured choice (the default) on DLRM: whichever program it keeps trains as eager."""
    model = um.DLRM()
    reference = copy.deepcopy(model)
    batches = um.dlrm_batches(2)
    torch._dynamo.reset()
    backend = make_backend(measure_budget_s=0.05)
    got, got_grads = _train(model, torch.compile(model, backend=backend), batches)
    want, want_grads = _train(reference, reference, batches)
    for g, w in zip(got, want):
        _close(g, w, "output")
    _assert_same_state(model, reference)
    # (the second batch's ids differ in length: its recompile has symbolic sizes, and a graph of
    # those that no pass of ours rewrites is compiled once, with nothing to measure)
    assert backend.reports[0].measured is not None
    assert all(r.measured is not None or not r.changed for r in backend.reports)
    assert not any("measurement failed" in (r.fallback_reason or "") for r in backend.reports)
