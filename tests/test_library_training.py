"""Training numerics of library-style recommendation models (issue 26).

The models of ``tests/library_style.py`` (torch-rechub and deepctr-torch style MLPs,
MMOE and PLE, with training batch norms, dropouts and checkpointed experts) trained
for two SGD steps through ``torch.compile`` with our backend, against eager:

- dropout p=0: outputs, parameter gradients and running statistics (running_mean,
  running_var, num_batches_tracked) after every step equal eager's;
- dropout p>0 under ``fallback_random=True`` and one seed: Inductor draws eager's random
  stream, so the outputs and gradients equal eager's too;
- dropout p>0 otherwise: the stream is Inductor's, so the dropout outputs are checked by
  their statistics: a fraction p of the values dropped, the kept ones scaled by
  1/(1-p), each expert's mask drawn independently of the others' and of the last step's.

A checkpointed model's running statistics are compared with the same model's eager
step *without* checkpointing: eager's recomputation in the backward updates them a
second time, and every ``torch.compile`` backend (aot_eager and Inductor alike) updates
them once (:func:`test_compiled_checkpoint_updates_running_statistics_once`).

The fast tests use small models; ``slow`` ones run every model of
``library_style.BUILDERS`` through our backend with and without the measured choice.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from optimus_eqsat.backend import make_backend
from tests.library_style import (
    BUILDERS,
    DEEPCTR_TRAINING,
    DeepctrMMOE,
    DeepctrPLE,
    RechubMLP,
    RechubMMOE,
    RechubPLE,
    batch_norms,
    deepctr_inputs,
    rechub_inputs,
    set_dropout,
)

Inputs = tuple[Any, ...]
STEPS = 2


@dataclass
class Step:
    """What one training step leaves: its outputs, the parameters' gradients, the buffers after it."""

    outputs: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    buffers: dict[str, torch.Tensor]


def _loss(out: torch.Tensor) -> torch.Tensor:
    """A fixed random weighting of the outputs (a plain sum would give every output one cotangent)."""
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    return (out * weights).sum()


def train(
    model: nn.Module, inputs: list[Inputs], run: Callable[..., torch.Tensor] | None = None, seed: int | None = None
) -> list[Step]:
    """One SGD step (lr 0.1) per entry of ``inputs`` on ``model`` through ``run`` (the model
    itself by default), re-seeding the global generator with ``seed`` before each forward."""
    run = model if run is None else run
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for args in inputs:
        opt.zero_grad(set_to_none=True)
        if seed is not None:
            torch.manual_seed(seed)
        out = run(*args)
        _loss(out).backward()
        steps.append(
            Step(
                out.detach().clone(),
                {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
                {n: b.clone() for n, b in model.named_buffers()},
            )
        )
        opt.step()
    return steps


def _check(
    got: torch.Tensor,
    want: torch.Tensor,
    exact: torch.Tensor | None,
    atol: float,
    what: str,
    inductor: torch.Tensor | None = None,
) -> None:
    """``got`` close to eager's ``want``; or, failing that, at most 4 times as far from ``exact`` (the
    same steps in float64) as eager (or Inductor alone, ``inductor``) is, plus ``atol``: deepctr's
    linear weights of std 1e-4 under batch norm leave eager's own float32 gradients of such a model
    15% off float64, and another order of float32 sums (Inductor's) lands elsewhere in that error;
    the next step inherits it."""
    try:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=atol, msg=lambda m: f"{what}: {m}")
    except AssertionError:
        if exact is None:
            raise
        ours_err = (got.double() - exact.double()).abs().max().item()
        ref_err = (want.double() - exact.double()).abs().max().item()
        if inductor is not None:
            ref_err = max(ref_err, (inductor.double() - exact.double()).abs().max().item())
        assert ours_err <= 4 * ref_err + atol, f"{what}: {ours_err:.3g} from float64, eager/Inductor {ref_err:.3g}"


def assert_same_steps(
    got: list[Step],
    want: list[Step],
    buffers: list[Step] | None = None,
    exact: list[Step] | None = None,
    inductor: list[Step] | None = None,
) -> None:
    """Outputs, gradients (within 1e-5 of the step's largest gradient: a bias before a batch norm
    has a gradient of float noise around zero) and buffers (of ``buffers``, ``want`` by default)
    equal, step by step, or arbitrated by the float64 steps ``exact`` and Inductor's own steps
    ``inductor`` (:func:`_check`)."""
    for k, (g, w, b) in enumerate(zip(got, want, buffers or want)):
        x = exact[k] if exact is not None else None
        i = inductor[k] if inductor is not None else None
        _check(
            g.outputs,
            w.outputs,
            None if x is None else x.outputs,
            1e-5,
            f"step {k} outputs",
            None if i is None else i.outputs,
        )
        scale = max(t.abs().max().item() for t in w.grads.values() if t is not None)
        for name, grad in w.grads.items():
            other = g.grads[name]
            assert (other is None) == (grad is None), f"step {k}: gradient of {name} missing on one side"
            if grad is not None:
                _check(
                    other,
                    grad,
                    None if x is None else x.grads[name],
                    1e-5 * scale,
                    f"step {k} grad {name}",
                    None if i is None else i.grads[name],
                )
        assert g.buffers.keys() == b.buffers.keys()
        for name, buf in b.buffers.items():
            _check(
                g.buffers[name],
                buf,
                None if x is None else x.buffers[name],
                1e-6,
                f"step {k} buffer {name}",
                None if i is None else i.buffers[name],
            )


def _double(x: Any) -> Any:
    """``x`` (a tensor, or a dict or tuple of them) with its floating tensors in float64."""
    if isinstance(x, dict):
        return {k: _double(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_double(v) for v in x)
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def step_inputs(build: Callable[..., tuple[nn.Module, Inputs]], batch: int) -> list[Inputs]:
    """``STEPS`` batches for ``build``'s model, drawn with seeds 0, 1, ..."""
    return [build(batch, seed=k)[1] for k in range(STEPS)]


def compiled(model: nn.Module, backend: Any) -> Callable[..., torch.Tensor]:
    torch._dynamo.reset()
    return torch.compile(model, backend=backend)


def check_against_eager(
    build: Callable[..., tuple[nn.Module, Inputs]], backend: Any, batch: int = 16, p: float = 0.0
) -> None:
    """Two steps of ``build``'s model with dropout ``p`` through ``backend`` against eager (and the
    buffers of a checkpointed model against eager without checkpointing, see the module docstring).
    Where they differ, float64 arbitrates, with Inductor alone's steps as a second float32 reference
    (computed only then: ill-conditioned models, see :func:`_check`)."""
    model, _ = build(batch)
    set_dropout(model, p)
    inputs = step_inputs(build, batch)
    seed = 1 if p else None
    want = train(copy.deepcopy(model), inputs, seed=seed)
    plain = copy.deepcopy(model)
    _set_checkpoint(plain, False)  # a checkpointed model's statistics are the plain model's (above)
    buffers = train(copy.deepcopy(plain), inputs, seed=seed) if _checkpointed(model) else None
    ours = copy.deepcopy(model)
    got = train(ours, inputs, compiled(ours, backend), seed=seed)
    exact = train(plain.double(), [_double(x) for x in inputs], seed=seed)
    try:
        assert_same_steps(got, want, buffers, exact)
    except AssertionError:
        alone = copy.deepcopy(model)
        inductor = train(alone, inputs, compiled(alone, "inductor"), seed=seed)
        assert_same_steps(got, want, buffers, exact, inductor)


def _checkpointed(model: nn.Module) -> bool:
    return any(getattr(m, "checkpoint_experts", False) for m in model.modules())


def _set_checkpoint(model: nn.Module, on: bool) -> None:
    for m in model.modules():
        if hasattr(m, "checkpoint_experts"):
            m.checkpoint_experts = on


# -- small models for the fast tests ---------------------------------------------------


def small_rechub_mmoe(checkpoint_experts: bool = False) -> Callable[..., tuple[nn.Module, Inputs]]:
    def build(batch: int, seed: int = 0) -> tuple[nn.Module, Inputs]:
        torch.manual_seed(0)
        model = RechubMMOE(
            n_expert=3,
            expert_dims=(16, 8),
            tower_dims=(4,),
            n_sparse=3,
            n_dense=2,
            vocab=20,
            embed_dim=4,
            checkpoint_experts=checkpoint_experts,
        ).train()
        return model, (rechub_inputs(batch, n_sparse=3, n_dense=2, vocab=20, seed=seed),)

    return build


def _small_deepctr(cls: type[nn.Module], batch: int, seed: int, **sizes: Any) -> tuple[nn.Module, Inputs]:
    """A deepctr multi-task model, small, its weights drawn with std 0.05 (deepctr's ``init_std``;
    its default 1e-4 leaves eager's float32 gradients 15% off float64, see :func:`_check`)."""
    torch.manual_seed(0)
    model = cls(
        expert_dnn_hidden_units=(16, 8),
        gate_dnn_hidden_units=(8,),
        tower_dnn_hidden_units=(8,),
        init_std=0.05,
        **sizes,
        **DEEPCTR_TRAINING,
    ).train()
    return model, (deepctr_inputs(batch, seed=seed),)


def small_deepctr_mmoe(batch: int, seed: int = 0) -> tuple[nn.Module, Inputs]:
    """deepctr's MMOE of three experts, small (:func:`_small_deepctr`)."""
    return _small_deepctr(DeepctrMMOE, batch, seed, num_experts=3)


def small_deepctr_ple(batch: int, seed: int = 0) -> tuple[nn.Module, Inputs]:
    """deepctr's PLE, small: two levels of one shared and one specific expert per task."""
    return _small_deepctr(DeepctrPLE, batch, seed)


def test_small_deepctr_mmoe_steps_equal_eager() -> None:
    """Batch norms in every layer, dropouts at p=0, the prediction layer's in-place bias."""
    check_against_eager(small_deepctr_mmoe, make_backend(measure=False))


def test_small_checkpointed_rechub_mmoe_steps_equal_eager() -> None:
    """Experts in checkpoint regions: the backward recomputes them (batch norms included)."""
    check_against_eager(small_rechub_mmoe(checkpoint_experts=True), make_backend(measure=False))


def test_compiled_checkpoint_updates_running_statistics_once() -> None:
    """Why a checkpointed model's buffers are compared with the eager step without checkpointing:
    eager's recomputation updates a batch norm's statistics twice, a compiled step once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).train()

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = copy.deepcopy(model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)

    x = torch.randn(8, 4)
    eager, comp = Checkpointed(), Checkpointed()
    eager(x).sum().backward()
    compiled(comp, "aot_eager")(x).sum().backward()
    assert eager.inner[1].num_batches_tracked.item() == 2
    assert comp.inner[1].num_batches_tracked.item() == 1


# -- dropout p > 0 ---------------------------------------------------------------------


class DropoutProbe(nn.Module):
    """Parallel experts' first layers (Linear -> BatchNorm1d -> ReLU) and their dropouts, returning
    each dropout's input and output, so a compiled step's dropouts can be checked by their values."""

    def __init__(self, layers: list[tuple[nn.Module, nn.Dropout]]) -> None:
        super().__init__()
        self.pre = nn.ModuleList(pre for pre, _ in layers)
        self.drop = nn.ModuleList(drop for _, drop in layers)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = []
        for pre, drop in zip(self.pre, self.drop):
            h = pre(x)
            outs += [h, drop(h)]
        return tuple(outs)


def rechub_probe(p: float, n: int = 4, dim: int = 64, width: int = 20) -> DropoutProbe:
    """The first layer and dropout of each of ``n`` rechub MLP experts."""
    experts = [RechubMLP(width, output_layer=False, dims=[dim], dropout=p) for _ in range(n)]
    return DropoutProbe([(e.mlp[:3], e.mlp[3]) for e in experts]).train()


def assert_dropout_statistics(outs: tuple[torch.Tensor, ...], p: float) -> torch.Tensor:
    """Every (input, output) pair of a dropout: kept values are the inputs scaled by 1/(1-p), the
    fraction dropped (of the nonzero inputs) is p within 5 standard deviations, and two members'
    masks are independent (both dropped in a fraction p^2). Returns the masks (True: dropped)."""
    masks = []
    for h, y in zip(outs[::2], outs[1::2]):
        live = h != 0
        kept = y != 0
        torch.testing.assert_close(y[kept], h[kept] / (1 - p), rtol=1e-5, atol=1e-6)
        assert not (kept & ~live).any()
        n = int(live.sum())
        dropped = (live & ~kept).sum().item() / n
        assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / n), (dropped, p, n)
        masks.append((live, live & ~kept))
    (live_a, drop_a), (live_b, drop_b) = masks[0], masks[1]
    both = live_a & live_b
    joint = (drop_a & drop_b & both).sum().item() / int(both.sum())
    assert abs(joint - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / int(both.sum())), (joint, p * p)
    return torch.stack([d for _, d in masks])


@pytest.mark.parametrize("p", [0.3])
def test_dropout_statistics_without_fallback_random(p: float) -> None:
    """Inductor's own random stream: the statistics of each expert's dropout, and a new mask each step."""
    torch.manual_seed(0)
    probe = rechub_probe(p)
    run = compiled(probe, make_backend(measure=False))
    x = torch.randn(128, 20)
    first = assert_dropout_statistics(run(x), p)
    second = assert_dropout_statistics(run(x), p)
    assert not torch.equal(first, second), "the same dropout mask twice"
    probe(x)  # eager draws as well (the probe's structure is sound eagerly)


def test_dropout_under_fallback_random_equals_eager() -> None:
    """With ``fallback_random`` Inductor draws from eager's stream: same seed, same masks."""
    with torch._inductor.config.patch(fallback_random=True):
        check_against_eager(small_deepctr_mmoe, make_backend(measure=False), p=0.2)


# -- every library-style model (slow) --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILDERS))
def test_library_model_steps_equal_eager(name: str) -> None:
    """Dropout p=0, measured choice off: our optimizer's program."""
    check_against_eager(BUILDERS[name], make_backend(measure=False))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rechub.MMOE", "deepctr.PLE", "rechub.PLE+ckpt", "fuxictr.DCNv2"])
def test_library_model_steps_equal_eager_default_backend(name: str) -> None:
    """Dropout p=0 through ``backend="optimus_eqsat"``: the measured choice times steps on the first
    call and must leave the running statistics (and the gradients) as eager's single step does."""
    check_against_eager(BUILDERS[name], "optimus_eqsat")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rechub.PLE", "deepctr.PLE", "deepctr.MMOE+ckpt", "fuxictr.DCNv2"])
def test_library_model_dropout_under_fallback_random_equals_eager(name: str) -> None:
    """Dropout p=0.1 with ``fallback_random``: eager's masks, so eager's outputs and gradients."""
    with torch._inductor.config.patch(fallback_random=True):
        check_against_eager(BUILDERS[name], make_backend(measure=False), p=0.1)


@pytest.mark.slow
def test_fuxictr_cross_experts_are_batched_and_train_as_eager() -> None:
    """FuxiCTR's DCN-Mix in training: its low-rank cross experts (a gating linear each, matmuls
    of slices of stacked parameters) are batched, and the batched program's steps are eager's."""
    backend = make_backend(measure=False)
    check_against_eager(BUILDERS["fuxictr.DCNv2"], backend)
    report = backend.reports[0]
    assert report.changed and report.launches_after < report.launches_before, report.summary()
    assert "batch-linear" in report.batched, report.summary()


@pytest.mark.slow
def test_deepctr_dropout_statistics_without_fallback_random() -> None:
    """deepctr's DNN experts (one Dropout module per DNN, batch norm on): the same statistics."""
    torch.manual_seed(0)
    p = 0.1
    model = DeepctrPLE(**{**DEEPCTR_TRAINING, "dnn_dropout": p}, expert_dnn_hidden_units=(64,))
    experts = [model.specific_experts[0][i][0] for i in range(2)] + [model.shared_experts[0][0][0]]
    probe = DropoutProbe(
        [(nn.Sequential(e.linears[0], e.bn[0], e.activation_layers[0]), e.dropout) for e in experts]
    ).train()
    x = torch.randn(256, model.input_dim)
    assert_dropout_statistics(compiled(probe, make_backend(measure=False))(x), p)
    assert len(list(batch_norms(probe))) == 3


def test_models_have_the_libraries_training_layers() -> None:
    """What the optimizer meets: batch norms in training and dropouts in every MLP layer."""
    for name in ("rechub.PLE", "deepctr.MMOE"):
        model, _ = BUILDERS[name](4)
        assert model.training and len(list(batch_norms(model))) >= 10
        assert any(isinstance(m, nn.Dropout) for m in model.modules())
    assert all(m.p == 0.1 for m in BUILDERS["deepctr.PLE"](4)[0].modules() if isinstance(m, nn.Dropout))
    assert RechubPLE().cgc_layers[0].gate_shared.mlp[2].dim == 1  # rechub's gates: softmax as the activation


@pytest.mark.slow
def test_models_match_the_libraries_where_installed() -> None:
    """Faithful re-implementations: the library's state dict loads into ours (same module names and
    shapes), and one training step in eager gives the same outputs, gradients and statistics.
    Skipped where torch-rechub or deepctr-torch is not installed (neither is a dependency)."""
    pytest.importorskip("torch_rechub")
    pytest.importorskip("deepctr_torch")
    from benchmarks.training_library import builders

    real = builders("library")
    for name in ("rechub.MMOE", "rechub.PLE", "deepctr.MMOE", "deepctr.PLE"):
        theirs, _ = real[name](16)
        for checkpoint_experts in (False, True):
            ours, inputs = BUILDERS[name + ("+ckpt" if checkpoint_experts else "")](16)
            ours.load_state_dict(theirs.state_dict(), strict=True)
            reference = copy.deepcopy(theirs).train()
            set_dropout(reference, 0.0)
            set_dropout(ours, 0.0)
            got, want = train(ours, [inputs]), train(reference, [inputs])
            if checkpoint_experts:  # eager's recomputation updates the statistics twice
                got[0].buffers = want[0].buffers
            assert_same_steps(got, want)


def test_autocasts_casts_leave_the_egraph_the_size_of_float32s() -> None:
    """Under bf16 autocast every linear's input, weight and bias is cast; the casts are not
    batched (Inductor fuses them into their readers), which had grown rechub's MMOE's e-graph
    2.5x, and its PLE's 7x, past the backend's time budget (no batch kept)."""
    from optimus_eqsat import optimize_graph
    from optimus_eqsat.inductor_count import capture_dynamo_graph

    sizes = {}
    for autocast in (False, True):
        torch.manual_seed(0)
        model, inputs = BUILDERS["rechub.MMOE"](32)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            gm, example = capture_dynamo_graph(model.train(), inputs)
            report = optimize_graph(gm, mode="training").meta["optimus_eqsat"]
        assert not report.fell_back and report.launches_after < report.launches_before, report.summary()
        sizes[autocast] = report.enodes
    assert sizes[True] <= 1.2 * sizes[False], sizes
