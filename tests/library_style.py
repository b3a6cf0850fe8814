"""Recommendation models written the way torch-rechub and deepctr-torch write them (and, in
``fuxictr_style``, FuxiCTR's DCNv2 with its mixture of low-rank cross experts).

Small, dependency-free re-implementations of the training-time structure of those
libraries' multi-task models, so the optimizer's handling of training batch norms,
dropouts and activation checkpointing can be tested (and benchmarked) without
installing them:

- torch-rechub: ``MLP`` (every layer ``Linear -> BatchNorm1d -> activation ->
  Dropout``, ``dropout=0`` and a final ``Linear(*, 1)`` by default; ReLU in place),
  ``MMOE`` and ``PLE`` (one embedding table per sparse feature, the embeddings and the
  dense values concatenated into one input; experts and softmax gates are ``MLP``s,
  towers ``MLP``s with a sigmoid head); inputs are a dict of per-feature tensors.
- deepctr-torch: ``DNN`` (``Linear -> [BatchNorm1d] -> ReLU(inplace) -> Dropout``,
  weights drawn with std ``init_std``), ``MMOE`` and ``PLE`` (gates are a ``DNN``, a
  bias-free linear and a softmax; experts mixed by ``matmul``; towers a ``DNN`` and a
  bias-free linear, then ``PredictionLayer``'s in-place bias and sigmoid); the input is
  one float tensor holding the sparse ids and the dense values side by side.

Module and attribute names follow the libraries', so a state dict of the library's
model loads into these (``load_state_dict``) and outputs can be compared one to one
where the library is installed. ``checkpoint_experts=True`` calls every expert through
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, the way a user trims
activation memory (Dynamo hands such a call over as a ``tag_activation_checkpoint``
region).

``BUILDERS`` maps a name to a builder ``(batch, seed=0) -> (model, inputs)`` with the sizes of
``benchmarks/library_models.py`` (6 sparse features of 8 dims and 3 dense values;
rechub MLPs of 32 and 16, towers of 8; deepctr's default hidden units), models in
training mode with seeded weights and inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.fuxictr_style import DCNv2 as FuxictrDCNv2
from tests.fuxictr_style import dcnv2_inputs as fuxictr_inputs

Case = tuple[nn.Module, tuple[Any, ...]]  # a model and its positional inputs

N_SPARSE, N_DENSE, EMBED_DIM = 6, 3, 8
RECHUB_VOCAB, DEEPCTR_VOCAB = 100, 50


def _call_expert(expert: nn.Module, x: torch.Tensor, use_checkpoint: bool) -> torch.Tensor:
    """``expert(x)``, through non-reentrant activation checkpointing when asked."""
    if use_checkpoint:
        return checkpoint(expert, x, use_reentrant=False)
    return expert(x)


# -- torch-rechub ---------------------------------------------------------------------


def rechub_activation(name: str) -> nn.Module:
    """rechub's ``activation_layer``: ReLU in place, softmax over dim 1."""
    layers: dict[str, Callable[[], nn.Module]] = {
        "relu": lambda: nn.ReLU(inplace=True),
        "sigmoid": nn.Sigmoid,
        "prelu": nn.PReLU,
        "softmax": lambda: nn.Softmax(dim=1),
        "leakyrelu": nn.LeakyReLU,
    }
    return layers[name.lower()]()


class RechubMLP(nn.Module):
    """rechub's ``MLP``: per hidden dim ``Linear -> BatchNorm1d -> activation -> Dropout(dropout)``,
    then ``Linear(*, 1)`` when ``output_layer``."""

    def __init__(
        self,
        input_dim: int,
        output_layer: bool = True,
        dims: Sequence[int] | None = None,
        dropout: float = 0.0,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for dim in dims or []:
            layers += [
                nn.Linear(input_dim, dim),
                nn.BatchNorm1d(dim),
                rechub_activation(activation),
                nn.Dropout(p=dropout),
            ]
            input_dim = dim
        if output_layer:
            layers.append(nn.Linear(input_dim, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class RechubEmbedding(nn.Module):
    """rechub's ``EmbeddingLayer`` with ``squeeze_dim=True``: each sparse feature looked up in its
    own table (weights ~ N(0, 1e-4)) as ``(B, 1, D)``, concatenated on dim 1 and flattened, then
    the dense values (``(B,)`` each, as ``(B, 1)``) concatenated after them."""

    def __init__(self, sparse: Sequence[str], dense: Sequence[str], vocab: int, embed_dim: int) -> None:
        super().__init__()
        self.sparse, self.dense = list(sparse), list(dense)
        self.embed_dict = nn.ModuleDict({name: nn.Embedding(vocab, embed_dim) for name in self.sparse})
        for table in self.embed_dict.values():
            nn.init.normal_(table.weight, 0.0, 0.0001)

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        sparse_emb = torch.cat([self.embed_dict[name](x[name].long()).unsqueeze(1) for name in self.sparse], dim=1)
        dense_values = torch.cat(
            [x[name].float() if x[name].float().dim() > 1 else x[name].float().unsqueeze(1) for name in self.dense],
            dim=1,
        )
        return torch.cat((sparse_emb.flatten(start_dim=1), dense_values), dim=1)


class RechubPrediction(nn.Module):
    """rechub's ``PredictionLayer`` for classification: a sigmoid."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


def _rechub_features(n_sparse: int, n_dense: int) -> tuple[list[str], list[str]]:
    return [f"s{i}" for i in range(n_sparse)], [f"d{i}" for i in range(n_dense)]


class RechubMMOE(nn.Module):
    """rechub's ``MMOE``: ``n_expert`` expert MLPs (no output layer), one gate per task (an MLP of
    one layer of ``n_expert`` units with a softmax activation, so Linear -> BatchNorm1d -> Softmax ->
    Dropout(0)), the experts mixed by each gate (``mul`` and ``sum`` over experts), a tower MLP and a
    sigmoid per task; the task outputs concatenated."""

    def __init__(
        self,
        n_expert: int = 4,
        expert_dims: Sequence[int] = (32, 16),
        tower_dims: Sequence[int] = (8,),
        n_task: int = 2,
        dropout: float = 0.0,
        n_sparse: int = N_SPARSE,
        n_dense: int = N_DENSE,
        vocab: int = RECHUB_VOCAB,
        embed_dim: int = EMBED_DIM,
        checkpoint_experts: bool = False,
    ) -> None:
        super().__init__()
        sparse, dense = _rechub_features(n_sparse, n_dense)
        self.checkpoint_experts = checkpoint_experts
        self.embedding = RechubEmbedding(sparse, dense, vocab, embed_dim)
        input_dims = n_sparse * embed_dim + n_dense
        expert = {"dims": list(expert_dims), "dropout": dropout}
        self.experts = nn.ModuleList(RechubMLP(input_dims, output_layer=False, **expert) for _ in range(n_expert))
        self.gates = nn.ModuleList(
            RechubMLP(input_dims, output_layer=False, dims=[n_expert], activation="softmax") for _ in range(n_task)
        )
        self.towers = nn.ModuleList(
            RechubMLP(expert_dims[-1], dims=list(tower_dims), dropout=dropout) for _ in range(n_task)
        )
        self.predict_layers = nn.ModuleList(RechubPrediction() for _ in range(n_task))

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        embed_x = self.embedding(x)
        expert_outs = torch.cat(
            [_call_expert(e, embed_x, self.checkpoint_experts).unsqueeze(1) for e in self.experts], dim=1
        )
        gate_outs = [gate(embed_x).unsqueeze(-1) for gate in self.gates]
        ys = []
        for gate_out, tower, predict_layer in zip(gate_outs, self.towers, self.predict_layers):
            expert_pooling = torch.sum(torch.mul(gate_out, expert_outs), dim=1)
            ys.append(predict_layer(tower(expert_pooling)))
        return torch.cat(ys, dim=1)


class RechubCGC(nn.Module):
    """rechub's ``CGC`` (one PLE level): task-specific and shared experts, a softmax gate per task
    over its own and the shared experts, and below the last level a shared gate over all experts."""

    def __init__(
        self,
        cur_level: int,
        n_level: int,
        n_task: int,
        n_expert_specific: int,
        n_expert_shared: int,
        input_dims: int,
        expert_params: dict[str, Any],
        checkpoint_experts: bool = False,
    ) -> None:
        super().__init__()
        self.cur_level, self.n_level, self.n_task = cur_level, n_level, n_task
        self.n_expert_specific, self.n_expert_shared = n_expert_specific, n_expert_shared
        self.checkpoint_experts = checkpoint_experts
        n_all = n_expert_specific * n_task + n_expert_shared
        input_dims = input_dims if cur_level == 1 else expert_params["dims"][-1]
        self.experts_specific = nn.ModuleList(
            RechubMLP(input_dims, output_layer=False, **expert_params) for _ in range(n_task * n_expert_specific)
        )
        self.experts_shared = nn.ModuleList(
            RechubMLP(input_dims, output_layer=False, **expert_params) for _ in range(n_expert_shared)
        )
        self.gates_specific = nn.ModuleList(
            RechubMLP(input_dims, output_layer=False, dims=[n_expert_specific + n_expert_shared], activation="softmax")
            for _ in range(n_task)
        )
        if cur_level < n_level:
            self.gate_shared = RechubMLP(input_dims, output_layer=False, dims=[n_all], activation="softmax")

    def forward(self, x_list: list[torch.Tensor]) -> list[torch.Tensor]:
        k, cp = self.n_expert_specific, self.checkpoint_experts
        specific = []
        for i in range(self.n_task):
            specific += [
                _call_expert(e, x_list[i], cp).unsqueeze(1) for e in self.experts_specific[i * k : (i + 1) * k]
            ]
        shared = [_call_expert(e, x_list[-1], cp).unsqueeze(1) for e in self.experts_shared]
        gate_outs = [gate(x_list[i]).unsqueeze(-1) for i, gate in enumerate(self.gates_specific)]
        cgc_outs = []
        for i, gate_out in enumerate(gate_outs):
            expert_concat = torch.cat(specific[i * k : (i + 1) * k] + shared, dim=1)
            cgc_outs.append(torch.sum(torch.mul(gate_out, expert_concat), dim=1))
        if self.cur_level < self.n_level:
            gate_shared_out = self.gate_shared(x_list[-1]).unsqueeze(-1)
            expert_concat = torch.cat(specific + shared, dim=1)
            cgc_outs.append(torch.sum(torch.mul(gate_shared_out, expert_concat), dim=1))
        return cgc_outs


class RechubPLE(nn.Module):
    """rechub's ``PLE``: ``n_level`` CGC levels on the embedded input (each task and the shared
    branch start from the same input), then a tower MLP and a sigmoid per task."""

    def __init__(
        self,
        n_level: int = 2,
        n_expert_specific: int = 2,
        n_expert_shared: int = 1,
        expert_dims: Sequence[int] = (32, 16),
        tower_dims: Sequence[int] = (8,),
        n_task: int = 2,
        dropout: float = 0.0,
        n_sparse: int = N_SPARSE,
        n_dense: int = N_DENSE,
        vocab: int = RECHUB_VOCAB,
        embed_dim: int = EMBED_DIM,
        checkpoint_experts: bool = False,
    ) -> None:
        super().__init__()
        sparse, dense = _rechub_features(n_sparse, n_dense)
        self.n_task, self.n_level = n_task, n_level
        input_dims = n_sparse * embed_dim + n_dense
        self.embedding = RechubEmbedding(sparse, dense, vocab, embed_dim)
        expert = {"dims": list(expert_dims), "dropout": dropout}
        self.cgc_layers = nn.ModuleList(
            RechubCGC(
                i + 1, n_level, n_task, n_expert_specific, n_expert_shared, input_dims, expert, checkpoint_experts
            )
            for i in range(n_level)
        )
        self.towers = nn.ModuleList(
            RechubMLP(expert_dims[-1], dims=list(tower_dims), dropout=dropout) for _ in range(n_task)
        )
        self.predict_layers = nn.ModuleList(RechubPrediction() for _ in range(n_task))

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        ple_inputs = [self.embedding(x)] * (self.n_task + 1)
        for level in self.cgc_layers:
            ple_inputs = level(ple_inputs)
        ys = [predict(tower(out)) for out, tower, predict in zip(ple_inputs, self.towers, self.predict_layers)]
        return torch.cat(ys, dim=1)


def rechub_inputs(
    batch: int, n_sparse: int = N_SPARSE, n_dense: int = N_DENSE, vocab: int = RECHUB_VOCAB, seed: int = 0
) -> dict[str, torch.Tensor]:
    """rechub's inputs: a ``(B,)`` id tensor per sparse feature and a ``(B,)`` float per dense one."""
    gen = torch.Generator().manual_seed(seed)
    sparse, dense = _rechub_features(n_sparse, n_dense)
    return {
        **{name: torch.randint(0, vocab, (batch,), generator=gen) for name in sparse},
        **{name: torch.randn(batch, generator=gen) for name in dense},
    }


# -- deepctr-torch --------------------------------------------------------------------


class DeepctrDNN(nn.Module):
    """deepctr's ``DNN``: per hidden unit count ``Linear -> [BatchNorm1d] -> ReLU(inplace) ->
    Dropout(dropout_rate)``, one Dropout module shared by all layers, linear weights ~ N(0, init_std)."""

    def __init__(
        self,
        inputs_dim: int,
        hidden_units: Sequence[int],
        dropout_rate: float = 0.0,
        use_bn: bool = False,
        init_std: float = 0.0001,
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout_rate)
        self.use_bn = use_bn
        units = [inputs_dim, *hidden_units]
        self.linears = nn.ModuleList(nn.Linear(units[i], units[i + 1]) for i in range(len(units) - 1))
        if use_bn:
            self.bn = nn.ModuleList(nn.BatchNorm1d(units[i + 1]) for i in range(len(units) - 1))
        self.activation_layers = nn.ModuleList(nn.ReLU(inplace=True) for _ in range(len(units) - 1))
        for name, tensor in self.linears.named_parameters():
            if "weight" in name:
                nn.init.normal_(tensor, mean=0, std=init_std)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        deep_input = inputs
        for i in range(len(self.linears)):
            fc = self.linears[i](deep_input)
            if self.use_bn:
                fc = self.bn[i](fc)
            fc = self.activation_layers[i](fc)
            deep_input = self.dropout(fc)
        return deep_input


class DeepctrPrediction(nn.Module):
    """deepctr's ``PredictionLayer`` for a binary task: a bias added in place, then a sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros((1,)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = x
        output += self.bias
        return torch.sigmoid(output)


class DeepctrBase(nn.Module):
    """What deepctr's ``BaseModel`` gives its multi-task models: an embedding table per sparse
    feature (~ N(0, init_std)) and the dnn input, each sparse id column of ``X`` looked up as
    ``(B, 1, D)``, concatenated on the last dim and flattened, the dense columns after them."""

    def __init__(
        self, n_sparse: int, n_dense: int, vocab: int, embed_dim: int, n_task: int, init_std: float = 0.0001
    ) -> None:
        super().__init__()
        self.n_sparse, self.n_dense = n_sparse, n_dense
        self.embedding_dict = nn.ModuleDict({f"s{i}": nn.Embedding(vocab, embed_dim) for i in range(n_sparse)})
        for table in self.embedding_dict.values():
            nn.init.normal_(table.weight, mean=0, std=init_std)
        self.out = nn.ModuleList(DeepctrPrediction() for _ in range(n_task))
        self.input_dim = n_sparse * embed_dim + n_dense

    def dnn_input(self, X: torch.Tensor) -> torch.Tensor:
        sparse = [self.embedding_dict[f"s{i}"](X[:, i : i + 1].long()) for i in range(self.n_sparse)]
        dense = [X[:, self.n_sparse + j : self.n_sparse + j + 1] for j in range(self.n_dense)]
        sparse_dnn_input = torch.flatten(torch.cat(sparse, dim=-1), start_dim=1)
        dense_dnn_input = torch.flatten(torch.cat(dense, dim=-1), start_dim=1)
        return torch.cat([sparse_dnn_input, dense_dnn_input], dim=-1)


class DeepctrMMOE(DeepctrBase):
    """deepctr's ``MMOE``: expert DNNs stacked on dim 1; per task a gate DNN, a bias-free linear to
    ``num_experts`` logits, ``softmax(1)`` and a ``matmul`` with the stacked experts; a tower DNN, a
    bias-free linear to one logit and ``PredictionLayer``; the task outputs concatenated."""

    def __init__(
        self,
        num_experts: int = 3,
        expert_dnn_hidden_units: Sequence[int] = (256, 128),
        gate_dnn_hidden_units: Sequence[int] = (64,),
        tower_dnn_hidden_units: Sequence[int] = (64,),
        dnn_dropout: float = 0.0,
        dnn_use_bn: bool = False,
        n_task: int = 2,
        n_sparse: int = N_SPARSE,
        n_dense: int = N_DENSE,
        vocab: int = DEEPCTR_VOCAB,
        embed_dim: int = EMBED_DIM,
        init_std: float = 0.0001,
        checkpoint_experts: bool = False,
    ) -> None:
        super().__init__(n_sparse, n_dense, vocab, embed_dim, n_task, init_std)
        self.num_tasks, self.num_experts, self.checkpoint_experts = n_task, num_experts, checkpoint_experts

        def dnn(inputs_dim: int, units: Sequence[int]) -> DeepctrDNN:
            return DeepctrDNN(inputs_dim, units, dropout_rate=dnn_dropout, use_bn=dnn_use_bn, init_std=init_std)

        self.expert_dnn = nn.ModuleList(dnn(self.input_dim, expert_dnn_hidden_units) for _ in range(num_experts))
        self.gate_dnn = nn.ModuleList(dnn(self.input_dim, gate_dnn_hidden_units) for _ in range(n_task))
        self.gate_dnn_final_layer = nn.ModuleList(
            nn.Linear(gate_dnn_hidden_units[-1], num_experts, bias=False) for _ in range(n_task)
        )
        self.tower_dnn = nn.ModuleList(dnn(expert_dnn_hidden_units[-1], tower_dnn_hidden_units) for _ in range(n_task))
        self.tower_dnn_final_layer = nn.ModuleList(
            nn.Linear(tower_dnn_hidden_units[-1], 1, bias=False) for _ in range(n_task)
        )

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        dnn_input = self.dnn_input(X)
        expert_outs = torch.stack([_call_expert(e, dnn_input, self.checkpoint_experts) for e in self.expert_dnn], 1)
        mmoe_outs = []
        for i in range(self.num_tasks):
            gate_dnn_out = self.gate_dnn_final_layer[i](self.gate_dnn[i](dnn_input))
            mmoe_outs.append(torch.matmul(gate_dnn_out.softmax(1).unsqueeze(1), expert_outs).squeeze(1))
        task_outs = [
            self.out[i](self.tower_dnn_final_layer[i](self.tower_dnn[i](mmoe_outs[i]))) for i in range(self.num_tasks)
        ]
        return torch.cat(task_outs, -1)


class DeepctrPLE(DeepctrBase):
    """deepctr's ``PLE``: ``num_levels`` CGC levels, each with task-specific and shared expert DNNs
    and, per task and for the shared branch, a gate DNN, a bias-free linear, ``softmax(1)`` and a
    ``matmul`` with the stacked experts (the shared gate at every level, the last included); then a
    tower per task as in MMOE. (deepctr sizes ``shared_experts`` by ``specific_expert_num``; the
    defaults, one of each, make that moot.)"""

    def __init__(
        self,
        shared_expert_num: int = 1,
        specific_expert_num: int = 1,
        num_levels: int = 2,
        expert_dnn_hidden_units: Sequence[int] = (256, 128),
        gate_dnn_hidden_units: Sequence[int] = (64,),
        tower_dnn_hidden_units: Sequence[int] = (64,),
        dnn_dropout: float = 0.0,
        dnn_use_bn: bool = False,
        n_task: int = 2,
        n_sparse: int = N_SPARSE,
        n_dense: int = N_DENSE,
        vocab: int = DEEPCTR_VOCAB,
        embed_dim: int = EMBED_DIM,
        init_std: float = 0.0001,
        checkpoint_experts: bool = False,
    ) -> None:
        super().__init__(n_sparse, n_dense, vocab, embed_dim, n_task, init_std)
        self.num_tasks, self.num_levels, self.checkpoint_experts = n_task, num_levels, checkpoint_experts
        self.specific_expert_num, self.shared_expert_num = specific_expert_num, shared_expert_num
        last = expert_dnn_hidden_units[-1]

        def dnn(inputs_dim: int, units: Sequence[int]) -> DeepctrDNN:
            return DeepctrDNN(inputs_dim, units, dropout_rate=dnn_dropout, use_bn=dnn_use_bn, init_std=init_std)

        def per_level(tasks: int, count: int, units: Sequence[int]) -> nn.ModuleList:
            return nn.ModuleList(
                nn.ModuleList(
                    nn.ModuleList(dnn(self.input_dim if level == 0 else last, units) for _ in range(count))
                    for _ in range(tasks)
                )
                for level in range(num_levels)
            )

        self.specific_experts = per_level(n_task, specific_expert_num, expert_dnn_hidden_units)
        self.shared_experts = per_level(1, shared_expert_num, expert_dnn_hidden_units)
        self.specific_gate_dnn = per_level(n_task, 1, gate_dnn_hidden_units)
        self.specific_gate_dnn_final_layer = nn.ModuleList(
            nn.ModuleList(
                nn.Linear(gate_dnn_hidden_units[-1], specific_expert_num + shared_expert_num, bias=False)
                for _ in range(n_task)
            )
            for _ in range(num_levels)
        )
        self.shared_gate_dnn = nn.ModuleList(
            dnn(self.input_dim if level == 0 else last, gate_dnn_hidden_units) for level in range(num_levels)
        )
        self.shared_gate_dnn_final_layer = nn.ModuleList(
            nn.Linear(gate_dnn_hidden_units[-1], n_task * specific_expert_num + shared_expert_num, bias=False)
            for _ in range(num_levels)
        )
        self.tower_dnn = nn.ModuleList(dnn(last, tower_dnn_hidden_units) for _ in range(n_task))
        self.tower_dnn_final_layer = nn.ModuleList(
            nn.Linear(tower_dnn_hidden_units[-1], 1, bias=False) for _ in range(n_task)
        )

    def cgc_net(self, inputs: list[torch.Tensor], level_num: int) -> list[torch.Tensor]:
        cp, k = self.checkpoint_experts, self.specific_expert_num
        specific = [
            _call_expert(self.specific_experts[level_num][i][j], inputs[i], cp)
            for i in range(self.num_tasks)
            for j in range(k)
        ]
        shared = [
            _call_expert(self.shared_experts[level_num][0][j], inputs[-1], cp) for j in range(self.shared_expert_num)
        ]
        cgc_outs = []
        for i in range(self.num_tasks):
            experts = torch.stack(specific[i * k : (i + 1) * k] + shared, 1)
            gate = self.specific_gate_dnn_final_layer[level_num][i](self.specific_gate_dnn[level_num][i][0](inputs[i]))
            cgc_outs.append(torch.matmul(gate.softmax(1).unsqueeze(1), experts).squeeze(1))
        experts = torch.stack(specific + shared, 1)
        gate = self.shared_gate_dnn_final_layer[level_num](self.shared_gate_dnn[level_num](inputs[-1]))
        cgc_outs.append(torch.matmul(gate.softmax(1).unsqueeze(1), experts).squeeze(1))
        return cgc_outs

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        ple_outputs = [self.dnn_input(X)] * (self.num_tasks + 1)
        for level in range(self.num_levels):
            ple_outputs = self.cgc_net(ple_outputs, level)
        task_outs = [
            self.out[i](self.tower_dnn_final_layer[i](self.tower_dnn[i](ple_outputs[i]))) for i in range(self.num_tasks)
        ]
        return torch.cat(task_outs, -1)


def deepctr_inputs(
    batch: int, n_sparse: int = N_SPARSE, n_dense: int = N_DENSE, vocab: int = DEEPCTR_VOCAB, seed: int = 0
) -> torch.Tensor:
    """deepctr's input ``X``: the sparse ids as floats, then the dense values, one row per sample."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, n_sparse), generator=gen).float()
    return torch.cat([ids, torch.randn(batch, n_dense, generator=gen)], dim=1)


# -- builders -------------------------------------------------------------------------

#: deepctr's settings the issue targets: batch norm in every DNN layer and a dropout of 0.1
DEEPCTR_TRAINING = {"dnn_use_bn": True, "dnn_dropout": 0.1}


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make().train()


def _rechub_mlp(batch: int, seed: int = 0) -> Case:
    dims = N_SPARSE * EMBED_DIM + N_DENSE
    model = _seeded(lambda: RechubMLP(dims, dims=[32, 16]))
    return model, (torch.randn(batch, dims, generator=torch.Generator().manual_seed(seed)),)


def _deepctr_dnn(batch: int, seed: int = 0) -> Case:
    dims = N_SPARSE * EMBED_DIM + N_DENSE
    model = _seeded(lambda: DeepctrDNN(dims, (256, 128), dropout_rate=0.1, use_bn=True))
    return model, (torch.randn(batch, dims, generator=torch.Generator().manual_seed(seed)),)


def _fuxictr_dcnv2(batch: int, seed: int = 0) -> Case:
    return _seeded(FuxictrDCNv2), (fuxictr_inputs(batch, seed=seed),)


def _rechub(cls: type[nn.Module], checkpoint_experts: bool) -> Callable[..., Case]:
    def build(batch: int, seed: int = 0) -> Case:
        return _seeded(lambda: cls(checkpoint_experts=checkpoint_experts)), (rechub_inputs(batch, seed=seed),)

    return build


def _deepctr(cls: type[nn.Module], checkpoint_experts: bool) -> Callable[..., Case]:
    def build(batch: int, seed: int = 0) -> Case:
        model = _seeded(lambda: cls(**DEEPCTR_TRAINING, checkpoint_experts=checkpoint_experts))
        return model, (deepctr_inputs(batch, seed=seed),)

    return build


#: name -> builder ``(batch, seed=0) -> (model in training mode, positional inputs)``; the model's
#: weights are the same for every ``seed``, the inputs drawn from it
BUILDERS: dict[str, Callable[..., Case]] = {
    "rechub.MLP": _rechub_mlp,
    "rechub.MMOE": _rechub(RechubMMOE, False),
    "rechub.PLE": _rechub(RechubPLE, False),
    "deepctr.DNN": _deepctr_dnn,
    "deepctr.MMOE": _deepctr(DeepctrMMOE, False),
    "deepctr.PLE": _deepctr(DeepctrPLE, False),
    "rechub.MMOE+ckpt": _rechub(RechubMMOE, True),
    "rechub.PLE+ckpt": _rechub(RechubPLE, True),
    "deepctr.MMOE+ckpt": _deepctr(DeepctrMMOE, True),
    "deepctr.PLE+ckpt": _deepctr(DeepctrPLE, True),
    "fuxictr.DCNv2": _fuxictr_dcnv2,
}


def dropouts(model: nn.Module) -> Iterator[nn.Dropout]:
    """The model's dropout modules."""
    return (m for m in model.modules() if isinstance(m, nn.Dropout))


def set_dropout(model: nn.Module, p: float) -> nn.Module:
    """Every dropout of ``model`` set to drop with probability ``p`` (the model, for chaining)."""
    for m in dropouts(model):
        m.p = p
    return model


def batch_norms(model: nn.Module) -> Iterator[nn.BatchNorm1d]:
    """The model's batch norms."""
    return (m for m in model.modules() if isinstance(m, nn.BatchNorm1d))


__all__ = [
    "BUILDERS",
    "DEEPCTR_TRAINING",
    "Case",
    "DeepctrDNN",
    "DeepctrMMOE",
    "DeepctrPLE",
    "RechubMLP",
    "RechubMMOE",
    "RechubPLE",
    "batch_norms",
    "deepctr_inputs",
    "dropouts",
    "rechub_inputs",
    "set_dropout",
]
