"""Small recommendation models written as users and their libraries write them (torchrec's DLRM,
deepctr's DIN with Dice, Hugging Face's stacked-expert MoE, rechub's MMOE with every kind of
batch norm, forward hooks and in-place ops, frozen embeddings, dict outputs, the loss computed in the
forward with buffers it writes, an HSTU-style generative
recommender, torchrec's mixture of low-rank cross-net experts), with batches.
``tests/test_user_shaped_models.py`` trains them through the backend against eager."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16


class DLRM(nn.Module):
    """EmbeddingBags fed (values, offsets, per-sample weights), a bottom MLP, the pairwise dot
    interaction read through triu indices, a top MLP."""

    def __init__(self, tables=(50, 40, 30), dim: int = 8, dense: int = 13):
        super().__init__()
        self.embs = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in tables)
        self.bottom = nn.Sequential(nn.Linear(dense, 32), nn.ReLU(), nn.Linear(32, dim), nn.ReLU())
        features = len(tables) + 1
        rows, cols = torch.triu_indices(features, features, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + features * (features - 1) // 2, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense, ids, offsets, weights):
        x = self.bottom(dense)
        pooled = [e(ids[k], offsets[k], per_sample_weights=weights[k]) for k, e in enumerate(self.embs)]
        t = torch.stack([x] + pooled, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.rows, self.cols]
        return torch.sigmoid(self.top(torch.cat([x, z], 1))).squeeze(1)


def dlrm_batches(n: int = 3, batch: int = BATCH, tables=(50, 40, 30)) -> list[tuple]:
    out = []
    for _ in range(n):
        lengths = [torch.randint(1, 4, (batch,)) for _ in tables]
        ids = [torch.randint(0, t, (int(l.sum()),)) for t, l in zip(tables, lengths)]
        offsets = [torch.cat([torch.zeros(1, dtype=torch.long), l.cumsum(0)[:-1]]) for l in lengths]
        out.append((torch.randn(batch, 13), ids, offsets, [torch.rand(i.shape[0]) for i in ids]))
    return out


class Dice(nn.Module):
    """deepctr's Dice: a batch norm without affine parameters gating the input."""

    def __init__(self, dim: int, eps: float = 1e-9):
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, eps=eps, affine=False)
        self.alpha = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        p = torch.sigmoid(self.bn(x.transpose(1, 2)).transpose(1, 2) if x.dim() == 3 else self.bn(x))
        return self.alpha * (1 - p) * x + p * x


class DIN(nn.Module):
    """Target attention over a zero-padded behaviour sequence (padding_idx 0): masked_fill with
    -inf, softmax, weighted sum; PReLU MLP."""

    def __init__(self, vocab: int = 50, dim: int = 8, act: str = "dice"):
        super().__init__()
        self.item = nn.Embedding(vocab, dim, padding_idx=0)
        self.user = nn.Embedding(20, dim)
        self.att1 = nn.Linear(4 * dim, 16)
        self.att_act = Dice(16) if act == "dice" else nn.PReLU()
        self.att2 = nn.Linear(16, 1)
        self.mlp = nn.Sequential(nn.Linear(3 * dim, 32), nn.PReLU(), nn.Linear(32, 1))

    def forward(self, uid, target, hist):
        mask = hist != 0
        k, q = self.item(hist), self.item(target)
        qe = q.unsqueeze(1).expand(-1, hist.shape[1], -1)
        s = self.att2(self.att_act(self.att1(torch.cat([qe, k, qe - k, qe * k], -1)))).squeeze(-1)
        s = s.masked_fill(~mask, float("-inf")).softmax(-1)
        pooled = (s.unsqueeze(-1) * k).sum(1)
        return torch.sigmoid(self.mlp(torch.cat([self.user(uid), q, pooled], -1))).squeeze(-1)


def din_batches(n: int = 3, batch: int = BATCH, length: int = 7) -> list[tuple]:
    out = []
    for _ in range(n):
        hist = torch.randint(1, 50, (batch, length))
        lengths = torch.randint(1, length + 1, (batch,))
        hist[torch.arange(length)[None] >= lengths[:, None]] = 0
        out.append((torch.randint(0, 20, (batch,)), torch.randint(1, 50, (batch,)), hist))
    return out


class StackedMoE(nn.Module):
    """Hugging Face style: experts' weights stacked in one parameter [E, d, h], top-k routing
    (torch.topk, scatter of the weights) and index_add of each expert's output."""

    def __init__(self, dim: int = 16, hidden: int = 32, experts: int = 4, k: int = 2):
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.norm = nn.LayerNorm(dim)
        self.gate = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) * 0.1)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * 0.1)
        self.head = nn.Linear(dim, 1)
        self.experts, self.k = experts, k

    def forward(self, x):
        h = self.inp(x)
        flat = self.norm(h).reshape(-1, h.shape[-1])
        probs = self.gate(flat).softmax(-1)
        w, idx = torch.topk(probs, self.k, dim=-1)
        routing = torch.zeros_like(probs).scatter(1, idx, w / w.sum(-1, keepdim=True))
        out = torch.zeros_like(flat)
        rows = torch.arange(flat.shape[0], device=flat.device)
        for e in range(self.experts):
            y = F.silu(flat @ self.w1[e]) @ self.w2[e] * routing[:, e : e + 1]
            out = out.index_add(0, rows, y)
        return self.head(h + out.reshape(h.shape)).mean()


def moe_batches(n: int = 3) -> list[tuple]:
    return [(torch.randn(4, 5, 8),) for _ in range(n)]


class NormMMOE(nn.Module):
    """rechub/deepctr MMOE whose experts and towers use one kind of batch norm (``affine=False``,
    ``track_running_stats=False``, or the default), PReLU, a LayerNorm without affine
    parameters; a dict of tasks out."""

    def __init__(self, norm: str = "noaffine", inputs: int = 10, experts: int = 3):
        super().__init__()
        kw = {"noaffine": dict(affine=False), "notrack": dict(track_running_stats=False), "plain": {}}[norm]
        self.experts = nn.ModuleList(
            nn.Sequential(
                nn.Linear(inputs, 16),
                nn.BatchNorm1d(16, **kw),
                nn.PReLU(),
                nn.Linear(16, 8),
                nn.LayerNorm(8, elementwise_affine=False),
                nn.ReLU(),
            )
            for _ in range(experts)
        )
        self.gates = nn.ModuleList(nn.Linear(inputs, experts) for _ in range(2))
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, **kw), nn.ReLU(), nn.Linear(8, 1)) for _ in range(2)
        )

    def forward(self, x):
        ex = torch.stack([e(x) for e in self.experts], 1)
        out = {}
        for t, (gate, tower) in enumerate(zip(self.gates, self.towers)):
            mixed = (ex * gate(x).softmax(-1).unsqueeze(-1)).sum(1)
            out[f"task{t}"] = torch.sigmoid(tower(mixed)).squeeze(-1)
        return out


class HookedMMOE(nn.Module):
    """Forward hooks and pre-hooks on the experts' layers, ReLU(inplace=True), ``h += x`` and
    ``F.relu_``; a tuple of tasks out."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(10, 16), nn.ReLU(inplace=True), nn.Linear(16, 8)) for _ in range(3)
        )
        self.gates = nn.ModuleList(nn.Linear(10, 3) for _ in range(2))
        self.towers = nn.ModuleList(nn.Linear(8, 1) for _ in range(2))
        for e in self.experts:
            e[0].register_forward_hook(lambda m, i, o: o * 0.5)
            e[2].register_forward_pre_hook(lambda m, i: (i[0] + 1.0,))

    def forward(self, x):
        ex = torch.stack([e(x) for e in self.experts], 1)
        outs = []
        for gate, tower in zip(self.gates, self.towers):
            h = (ex * gate(x).softmax(-1).unsqueeze(-1)).sum(1)
            h += x[:, :8]
            outs.append(tower(F.relu_(h)).squeeze(-1))
        return tuple(outs)


def dense_batches(n: int = 3, batch: int = BATCH) -> list[tuple]:
    return [(torch.randn(batch, 10),) for _ in range(n)]


class FrozenTowers(nn.Module):
    """Embeddings with padding_idx, half of them frozen (requires_grad=False), per-feature MLPs,
    a dict of two tasks sliced out of one head."""

    def __init__(self):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(30, 8, padding_idx=0) for _ in range(4))
        for e in self.embs[:2]:
            e.weight.requires_grad_(False)
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)) for _ in range(4))
        self.head = nn.Linear(16, 2)

    def forward(self, ids):
        h = torch.cat([m(e(ids[:, i])) for i, (e, m) in enumerate(zip(self.embs, self.mlps))], 1)
        o = self.head(h)
        return {"ctr": torch.sigmoid(o[:, 0]), "cvr": torch.sigmoid(o[:, 1])}


def id_batches(n: int = 3, batch: int = BATCH) -> list[tuple]:
    return [(torch.randint(0, 30, (batch, 4)),) for _ in range(n)]


class LossInsideTowers(nn.Module):
    """Task towers (Linear -> BatchNorm1d -> ReLU -> Dropout) whose forward takes the labels and
    returns the loss in a dict, as trainers built around ``model(batch)["loss"]`` write it: a
    buffer tracking the labels' running mean and a step counter, both written in place in
    training; one tower shared by two tasks (a tied tower, called twice) and one called a second
    time on a shifted input."""

    def __init__(self, width: int = 10, hidden: int = 32, tasks: int = 4):
        super().__init__()

        def tower() -> nn.Module:
            return nn.Sequential(
                nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.0), nn.Linear(hidden, 1)
            )

        self.shared = tower()
        self.towers = nn.ModuleList(tower() for _ in range(tasks - 2))
        self.register_buffer("label_mean", torch.zeros(tasks))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, labels):
        logits = torch.cat(
            [self.shared(x), self.shared(x * 2)] + [t(x) for t in self.towers] + [self.towers[0](x + 1)], 1
        )[:, : labels.shape[1]]
        if self.training:
            self.label_mean.mul_(0.9).add_(0.1 * labels.mean(0))
            self.steps += 1
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        return {"loss": loss, "ctr": torch.sigmoid(logits[:, 0]), "prior": self.label_mean.sum()}


def labelled_batches(n: int = 3, batch: int = BATCH) -> list[tuple]:
    return [(torch.randn(batch, 10), torch.randint(0, 2, (batch, 4)).float()) for _ in range(n)]


class WideDeep(nn.Module):
    """Wide part accumulated in place (``wide += emb(x)``), deep part with ReLU(inplace=True)."""

    def __init__(self, features: int = 5, vocab: int = 40, dim: int = 8):
        super().__init__()
        self.wide = nn.ModuleList(nn.Embedding(vocab, 1) for _ in range(features))
        self.embs = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(features))
        self.deep = nn.Sequential(
            nn.Linear(features * dim + 3, 64),
            nn.ReLU(inplace=True),
            nn.Linear(64, 32),
            nn.ReLU(inplace=True),
            nn.Linear(32, 1),
        )
        self.linear = nn.Linear(3, 1)

    def forward(self, sparse, dense):
        wide = self.linear(dense)
        for i, e in enumerate(self.wide):
            wide += e(sparse[:, i])
        x = torch.cat([e(sparse[:, i]) for i, e in enumerate(self.embs)] + [dense], 1)
        return torch.sigmoid(wide + self.deep(x)).squeeze(1)


def wide_deep_batches(n: int = 3, batch: int = BATCH) -> list[tuple]:
    return [(torch.randint(0, 40, (batch, 5)), torch.randn(batch, 3)) for _ in range(n)]


class HSTU(nn.Module):
    """A generative recommender in the style of HSTU (Meta's generative-recommenders, torch-rechub's
    ``HSTUModel``): item and position embeddings; per layer a pre-norm, one joint U/V/Q/K linear
    under one SiLU split four ways, per-head scores with a learned relative-position bias,
    ``silu(scores) / n`` under a causal mask in place of a softmax, ``LayerNorm(A V) * U``
    projected back, a residual; logits against the tied item embedding."""

    def __init__(self, items: int = 40, dim: int = 16, heads: int = 2, layers: int = 2, length: int = 6):
        super().__init__()
        self.item = nn.Embedding(items, dim, padding_idx=0)
        self.pos = nn.Embedding(length, dim)
        self.heads, self.length = heads, length
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.uvqk = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(layers))
        self.rab = nn.ParameterList(nn.Parameter(torch.randn(heads, 2 * length - 1) * 0.1) for _ in range(layers))
        self.av_norms = nn.ModuleList(nn.LayerNorm(dim // heads, elementwise_affine=False) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, ids):
        b, n = ids.shape
        x = self.item(ids) + self.pos(torch.arange(n, device=ids.device))
        steps = torch.arange(n, device=ids.device)
        relative = steps[None, :] - steps[:, None] + n - 1  # (n, n) indices into the bias table
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=ids.device))
        for norm, uvqk, rab, av_norm, out in zip(self.norms, self.uvqk, self.rab, self.av_norms, self.out):
            u, v, q, k = F.silu(uvqk(norm(x))).chunk(4, dim=-1)
            u, v, q, k = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in (u, v, q, k))
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + rab[:, relative]
            attn = F.silu(scores) / n * causal
            gated = av_norm(attn @ v) * u
            x = x + out(gated.transpose(1, 2).reshape(b, n, -1))
        return x @ self.item.weight.t()


def hstu_batches(n: int = 3, batch: int = BATCH) -> list[tuple]:
    return [(torch.randint(1, 40, (batch, 6)),) for _ in range(n)]


class MixtureCrossNet(nn.Module):
    """torchrec's ``LowRankMixtureCrossNet`` (DCN-v2's mixture of low-rank experts): per layer,
    experts ``U_e tanh(C_e tanh(V_e x_l))`` read the same ``x_l``, softmax-gated by one linear
    each; ``x_{l+1} = x_0 * (sum_e g_e expert_e + b) + x_l``; an MLP head."""

    def __init__(self, features: int = 24, rank: int = 4, experts: int = 4, layers: int = 2):
        super().__init__()
        self.v = nn.ParameterList(nn.Parameter(torch.randn(features, rank) * 0.2) for _ in range(layers * experts))
        self.c = nn.ParameterList(nn.Parameter(torch.randn(rank, rank) * 0.2) for _ in range(layers * experts))
        self.u = nn.ParameterList(nn.Parameter(torch.randn(rank, features) * 0.2) for _ in range(layers * experts))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(features)) for _ in range(layers))
        self.gates = nn.ModuleList(nn.Linear(features, 1, bias=False) for _ in range(experts))
        self.head = nn.Sequential(nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, 1))
        self.experts, self.layers = experts, layers

    def forward(self, x0):
        x = x0
        for layer in range(self.layers):
            outs, gates = [], []
            for e in range(self.experts):
                i = layer * self.experts + e
                outs.append(torch.tanh(torch.tanh(x @ self.v[i]) @ self.c[i]) @ self.u[i])
                gates.append(self.gates[e](x))
            mixed = (torch.stack(outs, 2) * torch.softmax(torch.stack(gates, 1), 1).transpose(1, 2)).sum(2)
            x = x0 * (mixed + self.bias[layer]) + x
        return torch.sigmoid(self.head(x))


def cross_batches(n: int = 3, batch: int = BATCH) -> list[tuple]:
    return [(torch.randn(batch, 24),) for _ in range(n)]
