"""FuxiCTR's DCNv2 with the low-rank mixture of cross experts, written the way FuxiCTR writes it.

A dependency-free re-implementation of the library's training-time structure (its
``MLP_Block``, ``CrossNetMix`` and the model zoo's ``DCNv2`` in the parallel layout), so the
optimizer meets its shapes without the library installed:

- ``MLP_Block``: per hidden layer ``Linear -> [BatchNorm1d] -> activation -> [Dropout]``
  (the dropout only where its rate is above 0), then an optional output ``Linear``;
- ``CrossNetMix`` (DCN-Mix): per cross layer, per expert a bias-free gating ``Linear`` to one
  score, and a low-rank expert: ``matmul`` of a slice of a stacked ``(experts, d, r)``
  parameter (transposed) with the ``(B, d, 1)`` state, ``tanh``, an ``(r, r)`` matmul,
  ``tanh``, back to ``d``, a bias, a Hadamard product with the input; the experts stacked
  and mixed by the softmax of the scores (a batched ``matmul``), a residual add; the result
  ``squeeze()``-d as the library does;
- ``DCNv2``: one embedding per feature (a table for a categorical one, a bias-free
  ``Linear(1, D)`` for a numeric one), stacked and flattened; the cross network and an
  ``MLP_Block`` side by side, concatenated, a ``Linear(*, 1)`` and a sigmoid.

Inputs are a dict of per-feature ``(B,)`` tensors, as FuxiCTR's data loaders give them.
"""

from __future__ import annotations

import torch
from torch import nn

SPARSE, DENSE, EMBED_DIM, VOCAB = 6, 3, 8, 100


class MLPBlock(nn.Module):
    """FuxiCTR's ``MLP_Block``; the layers live in ``self.mlp`` as in the library."""

    def __init__(
        self,
        input_dim: int,
        hidden_units: list[int],
        output_dim: int | None = None,
        dropout_rate: float = 0.0,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        dims = [input_dim, *hidden_units]
        for i in range(len(hidden_units)):
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if batch_norm:
                layers.append(nn.BatchNorm1d(dims[i + 1]))
            layers.append(nn.ReLU())
            if dropout_rate > 0:
                layers.append(nn.Dropout(p=dropout_rate))
        if output_dim is not None:
            layers.append(nn.Linear(dims[-1], output_dim))
        self.mlp = nn.Sequential(*layers)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.mlp(inputs)


class CrossNetMix(nn.Module):
    """FuxiCTR's ``CrossNetMix``: low-rank cross experts mixed by per-expert gates."""

    def __init__(self, in_features: int, layer_num: int = 2, low_rank: int = 8, num_experts: int = 4) -> None:
        super().__init__()
        self.layer_num, self.num_experts = layer_num, num_experts

        def stacked(*shape: int) -> nn.ParameterList:
            return nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(torch.empty(*shape))) for _ in range(layer_num))

        self.U_list = stacked(num_experts, in_features, low_rank)
        self.V_list = stacked(num_experts, in_features, low_rank)
        self.C_list = stacked(num_experts, low_rank, low_rank)
        self.gating = nn.ModuleList(nn.Linear(in_features, 1, bias=False) for _ in range(num_experts))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(in_features, 1)) for _ in range(layer_num))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x_0 = inputs.unsqueeze(2)  # (B, d, 1)
        x_l = x_0
        for i in range(self.layer_num):
            output_of_experts, gating_score_of_experts = [], []
            for expert_id in range(self.num_experts):
                gating_score_of_experts.append(self.gating[expert_id](x_l.squeeze(2)))
                v_x = torch.tanh(torch.matmul(self.V_list[i][expert_id].t(), x_l))  # (B, r, 1)
                v_x = torch.tanh(torch.matmul(self.C_list[i][expert_id], v_x))
                uv_x = torch.matmul(self.U_list[i][expert_id], v_x)  # (B, d, 1)
                output_of_experts.append((x_0 * (uv_x + self.bias[i])).squeeze(2))
            experts = torch.stack(output_of_experts, 2)  # (B, d, E)
            scores = torch.stack(gating_score_of_experts, 1)  # (B, E, 1)
            x_l = torch.matmul(experts, scores.softmax(1)) + x_l
        return x_l.squeeze()


class FeatureEmbedding(nn.Module):
    """FuxiCTR's ``FeatureEmbedding``: a table per categorical feature, a bias-free
    ``Linear(1, D)`` per numeric one, stacked to ``(B, F, D)``."""

    def __init__(self, sparse: list[str], dense: list[str], vocab: int, embed_dim: int) -> None:
        super().__init__()
        self.sparse, self.dense = sparse, dense
        self.embedding_layers = nn.ModuleDict(
            {
                **{name: nn.Embedding(vocab, embed_dim) for name in sparse},
                **{name: nn.Linear(1, embed_dim, bias=False) for name in dense},
            }
        )

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        embeddings = [self.embedding_layers[name](x[name].long()) for name in self.sparse]
        # (the library casts with .float(); the loaders' values are float already, and without
        # the cast the model runs in float64 too, the tests' exact reference)
        embeddings += [self.embedding_layers[name](x[name].view(-1, 1)) for name in self.dense]
        return torch.stack(embeddings, dim=1)


def features() -> tuple[list[str], list[str]]:
    """The categorical and numeric feature names."""
    return [f"c{i}" for i in range(SPARSE)], [f"n{i}" for i in range(DENSE)]


class DCNv2(nn.Module):
    """The model zoo's ``DCNv2`` with ``model_structure="parallel"`` and
    ``use_low_rank_mixture=True``."""

    def __init__(
        self, dnn_hidden_units: tuple[int, ...] = (64, 32), net_dropout: float = 0.1, batch_norm: bool = True
    ) -> None:
        super().__init__()
        sparse, dense = features()
        self.embedding_layer = FeatureEmbedding(sparse, dense, VOCAB, EMBED_DIM)
        input_dim = (SPARSE + DENSE) * EMBED_DIM
        self.crossnet = CrossNetMix(input_dim, layer_num=2, low_rank=8, num_experts=4)
        self.parallel_dnn = MLPBlock(input_dim, list(dnn_hidden_units), dropout_rate=net_dropout, batch_norm=batch_norm)
        self.fc = nn.Linear(input_dim + dnn_hidden_units[-1], 1)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        feature_emb = self.embedding_layer(inputs).flatten(start_dim=1)
        cross_out = self.crossnet(feature_emb)
        dnn_out = self.parallel_dnn(feature_emb)
        return torch.sigmoid(self.fc(torch.cat([cross_out, dnn_out], dim=-1)))


def dcnv2_inputs(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A ``(B,)`` id tensor per categorical feature and a ``(B,)`` float per numeric one."""
    gen = torch.Generator().manual_seed(seed)
    sparse, dense = features()
    return {
        **{name: torch.randint(0, VOCAB, (batch,), generator=gen) for name in sparse},
        **{name: torch.randn(batch, generator=gen) for name in dense},
    }
