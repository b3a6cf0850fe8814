"""Models with nothing to batch, written the way torchvision and Hugging Face write them.

Users turn the backend on for every model they train, not only recommendation
models; on these the optimizer finds (almost) nothing to batch and must cost what
Inductor costs. Dependency-free re-implementations of the structure that matters to
the compiler:

- ``resnet18``: torchvision's ResNet-18 (``BasicBlock``: conv3x3 -> BatchNorm2d ->
  ReLU(inplace) -> conv3x3 -> BatchNorm2d, a 1x1 conv + BatchNorm2d downsample where
  the shape changes, the residual add and ReLU; stem conv7x7/2 + max pool, average
  pool and a linear head);
- ``bert``: a BERT encoder (token, position and type embeddings with LayerNorm and
  dropout; per layer self-attention with separate query/key/value linears, an output
  linear, dropout, residual LayerNorm, GELU feed-forward) and a pooled classifier.

``BUILDERS`` maps a name to ``(batch, seed=0) -> (model, inputs)``; models are in
training mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Case = tuple[nn.Module, tuple[Any, ...]]


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's ``resnet18`` layout (layers of two basic blocks: 64, 128, 256, 512 planes)."""

    def __init__(self, num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, inplanes = [], width
        for k, planes in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if k == 0 else 2
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class BertLayer(nn.Module):
    """One BERT encoder layer (Hugging Face's BertSelfAttention / BertOutput structure)."""

    def __init__(self, hidden: int, heads: int, intermediate: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_dropout = nn.Dropout(dropout)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_out_dropout = nn.Dropout(dropout)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.out_dropout = nn.Dropout(dropout)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        ctx = self.attn_dropout(scores.softmax(-1)) @ v
        ctx = ctx.permute(0, 2, 1, 3).reshape(x.shape)
        x = self.attn_norm(x + self.attn_out_dropout(self.attn_out(ctx)))
        h = nn.functional.gelu(self.intermediate(x))
        return self.out_norm(x + self.out_dropout(self.output(h)))


class Bert(nn.Module):
    """A BERT encoder with a pooled classification head."""

    def __init__(
        self,
        vocab: int = 1000,
        hidden: int = 128,
        layers: int = 4,
        heads: int = 4,
        intermediate: int = 512,
        max_len: int = 64,
        dropout: float = 0.1,
        classes: int = 2,
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_len, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.embed_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, intermediate, dropout) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word(ids) + self.position(positions) + self.token_type(torch.zeros_like(ids))
        x = self.embed_dropout(self.embed_norm(x))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def resnet18(batch: int, seed: int = 0, image: int = 64) -> Case:
    """ResNet-18 in training on ``batch`` images of ``image`` x ``image`` pixels."""
    torch.manual_seed(seed)
    return ResNet18(num_classes=100).train(), (torch.randn(batch, 3, image, image),)


def bert(batch: int, seed: int = 0, seq: int = 64) -> Case:
    """A 4-layer BERT encoder in training on ``batch`` sequences of ``seq`` tokens."""
    torch.manual_seed(seed)
    ids = torch.randint(0, 1000, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    return Bert(max_len=seq).train(), (ids, mask)


BUILDERS: dict[str, Callable[..., Case]] = {"resnet18": resnet18, "bert": bert}
