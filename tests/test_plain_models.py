"""Models with nothing to batch (a ResNet, a BERT) through the default backend in training.

Users turn the backend on for every model they train: on these (and on blocks as torchvision
writes them: EfficientNet, ConvNeXt, Swin) the optimizer finds
nothing worth a different program, and a training step must equal eager's (outputs,
gradients, batch norms' running statistics). Small versions of
``benchmarks/plain_models.py``'s models (their compile time is that benchmark's). A decoder as
Hugging Face writes Llama (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, a tied
output embedding, the loss inside the forward) has projections that share an input: its
batched program is run and must train as eager does.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

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


def _stochastic_depth(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """torchvision's ``stochastic_depth`` (mode "row"): an in-place Bernoulli draw per sample."""
    if not training or p == 0.0:
        return x
    noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(1 - p)
    return x * noise.div_(1 - p)


class _MBConv(nn.Module):
    """EfficientNet's block as torchvision writes it: expand, depthwise, squeeze-excitation,
    project, stochastic depth on the residual."""

    def __init__(self, c: int, p: float) -> None:
        super().__init__()
        h, self.p = 4 * c, p
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.SiLU(inplace=True))
        self.depthwise = nn.Sequential(
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.SiLU(inplace=True)
        )
        self.squeeze, self.excite = nn.Conv2d(h, 2, 1), nn.Conv2d(2, h, 1)
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(self.expand(x))
        h = h * torch.sigmoid(self.excite(nn.functional.silu(self.squeeze(nn.functional.adaptive_avg_pool2d(h, 1)))))
        return x + _stochastic_depth(self.project(h), self.p, self.training)


class _ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise 7x7, LayerNorm over channels last, an MLP, layer scale."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.dw, self.norm = nn.Conv2d(d, d, 7, padding=3, groups=d), nn.LayerNorm(d, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d, 1, 1), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(nn.functional.gelu(self.fc1(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        return x + self.gamma * y.permute(0, 3, 1, 2)


class _ShiftedWindows(nn.Module):
    """Swin's shifted-window attention: roll, partition into windows, attention, merge, roll back."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.norm, self.qkv, self.proj = nn.LayerNorm(c), nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8, 8, C)
        b, h, w, c = x.shape
        y = torch.roll(self.norm(x), shifts=(-2, -2), dims=(1, 2))
        y = y.view(b, 2, 4, 2, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, c)
        q, k, v = self.qkv(y).reshape(y.shape[0], 16, 3, 2, c // 2).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, 16, c)
        y = self.proj(a).view(b, 2, 2, 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return x + torch.roll(y, shifts=(2, 2), dims=(1, 2))


class Permute(nn.Module):
    """``x.permute(*dims)`` as a module."""

    def __init__(self, *dims: int) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)


def _vision(name: str, p: float = 0.0) -> nn.Module:
    if name == "efficientnet":
        body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), _MBConv(8, p), _MBConv(8, p))
    elif name == "convnext":
        body = nn.Sequential(nn.Conv2d(3, 16, 4, 4), _ConvNeXtBlock(16), _ConvNeXtBlock(16))
    else:
        body = nn.Sequential(nn.Conv2d(3, 16, 4, 4), Permute(0, 2, 3, 1), _ShiftedWindows(), Permute(0, 3, 1, 2))
    return nn.Sequential(body, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LazyLinear(10))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["efficientnet", "convnext", "swin"])
def test_vision_blocks_train_and_serve_as_eager(name: str) -> None:
    """Blocks as torchvision writes them (depthwise convolutions, squeeze-excitation, channels-last
    LayerNorm and layer scale, shifted windows): two SGD steps and eval outputs equal eager's;
    with stochastic depth on, a step runs (its draws are Inductor's, not eager's)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    model = _vision(name)
    model(x)  # (materializes the lazy head)
    ours = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=make_backend(measure_budget_s=0.05))
    sgd = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ours)]
    for step in range(2):
        for run, opt in zip((model, compiled), sgd):
            run(x + step).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for (n, a), b in zip(model.state_dict().items(), ours.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    model.eval()
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    if name == "efficientnet":
        dropped = _vision(name, p=0.5)
        dropped(x)
        torch.compile(dropped, backend=make_backend(measure_budget_s=0.05))(x).sum().backward()
        assert all(p.grad is not None for p in dropped.parameters())


class _RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _DecoderLayer(nn.Module):
    def __init__(self, width: int = 32, heads: int = 4, kv_heads: int = 2, intermediate: int = 64):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.q_proj = nn.Linear(width, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, width, bias=False)
        self.gate_proj = nn.Linear(width, intermediate, bias=False)
        self.up_proj = nn.Linear(width, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, width, bias=False)
        self.input_layernorm, self.post_attention_layernorm = _RMSNorm(width), _RMSNorm(width)

    def _kv(self, proj: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        """(B, kv_heads, S, D) repeated to every query head, as ``repeat_kv`` does (expand + reshape)."""
        b, s, _ = h.shape
        x = proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        groups = self.heads // self.kv_heads
        return x[:, :, None].expand(b, self.kv_heads, groups, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self._kv(self.k_proj, h), self._kv(self.v_proj, h)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class _Decoder(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(_DecoderLayer(width, heads) for _ in range(layers))
        self.norm = _RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied
        head_dim = width // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).float()
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.mark.slow
def test_llama_style_decoder_trains_as_eager_with_its_batched_program() -> None:
    """Two SGD steps of the decoder with the optimizer's batched program (priced for a GPU, not
    timed): losses and every parameter equal eager's, and its projections that read one input
    were batched."""
    torch.manual_seed(0)
    model = _Decoder().train()
    ours = copy.deepcopy(model)
    ids = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(1))
    backend = make_backend(measure=False, profile="h200")
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=backend)
    sgd = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, ours)]
    for _ in range(2):
        losses = []
        for run, opt in zip((model, compiled), sgd):
            loss = run(ids)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (n, a), b in zip(model.state_dict().items(), ours.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert any(r.batched.get("batch-linear_lhs", 0) for r in backend.reports), [r.summary() for r in backend.reports]
    assert not any(r.fell_back for r in backend.reports), [r.fallback_reason for r in backend.reports]
