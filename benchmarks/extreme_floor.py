"""Hand-written programs of the ragged generator: its floor of predicted launches.

The extreme study (benchmarks/extreme_study.py) compares our optimizer's program of
the ragged dynamic-schema generator (benchmarks/zoo/dynamic_schema.py) with the
fewest kernels a program can have under the cost model (the argument is in
benchmarks/README.md, "Extreme study"). This module writes those programs by
hand, as models computing the generator's function from its own parameters
(:func:`check` compares outputs), so the floor is predicted by the same fusion
model (``fx_cost.predict_kernels``) that prices ours, at any feature count:

- ``per_width``: what the optimizer's batching vocabulary can express: one group
  per feature width (4, 8, 16), each parameter group stacked once; a layer norm
  per width over a strided view of the dense input, the normalized features
  zero-padded to width 16 and projected by one bmm (``linear_padk``), activation,
  gain and shift per width, and the head's input (features, the passthrough
  blocks as three strided views, the sequence and its tanh) one cat of at most 8
  inputs, so the epilogue fuses into the kernel writing it;
- ``block_diagonal``: features taken in triples (widths 4, 8, 16: one 28-column
  stretch of the input); the three layer norms write one (triples, B, 28) buffer
  that one bmm with block-diagonal 28 x 24 weights projects, so no padding kernel
  is left. Not in the optimizer's vocabulary; its weights are built from the
  parameters every call, so it is a floor for frozen inference only.

Both read the dense input through one zero-padding to whole triples and whole
passthrough periods, so every gather is a view.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.zoo.dynamic_schema import BLOCK, PROJ, SEQ_DIM, SEQ_LEN, WIDTHS, DynamicSchema

CLASSES = len(WIDTHS)
STARTS = [sum(WIDTHS[:c]) for c in range(CLASSES)]  # each width's columns within a triple
PERIOD = sum(WIDTHS)  # columns of one triple of features (4 + 8 + 16)
PASS_PERIOD = BLOCK * PERIOD  # a passthrough block every third block of 8: every 24 features
FAMILIES = ("per_width", "padded", "block_diagonal")


class RaggedFloor(nn.Module):
    """The ragged generator's function, hand-batched (see the module docstring).

    Reads the parameters of ``model`` (a :class:`DynamicSchema`), so gradients
    reach them as in the original; ``family``: "per_width" or "block_diagonal".
    """

    def __init__(self, model: DynamicSchema, family: str = "padded") -> None:
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")
        n = len(model.widths)
        if n < CLASSES or model.widths != [WIDTHS[i % CLASSES] for i in range(n)]:
            raise ValueError("the floor programs need the generator's width cycle 4, 8, 16, at least once")
        self.model, self.family = model, family
        self.counts = [len(range(c, n, CLASSES)) for c in range(CLASSES)]  # features per width
        self.triples = self.counts[0]
        self.blocks = len(model.blocks[::3])  # passthrough blocks; the last may be partial
        self.columns = max(self.triples * PERIOD, self.blocks * PASS_PERIOD)

    def _stack(self, c: int | str | None, name: str) -> torch.Tensor:
        """One parameter of several features, stacked (one foreach copy kernel unfrozen):
        ``c`` a width's features, None every feature in feature order, "widths" every feature
        width by width. "proj.weight" stacks to (count, PROJ, w). block_diagonal pads a
        width's stack with zero members to whole triples."""
        module, attr = name.rsplit(".", 1) if "." in name else ("", name)
        n, f = len(self.model.widths), self.model.features  # indexed: a ModuleList slice is a new module
        members = (
            range(n)
            if c is None
            else [i for k in range(CLASSES) for i in range(k, n, CLASSES)]
            if c == "widths"
            else range(c, n, CLASSES)
        )
        stack = torch.stack([getattr(f[i].get_submodule(module) if module else f[i], attr) for i in members])
        if self.family == "block_diagonal" and isinstance(c, int):
            stack = F.pad(stack, (0, 0) * (stack.dim() - 1) + (0, self.triples - len(members)))
        return stack

    def forward(self, dense: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        b = dense.shape[0]
        padded = F.pad(dense, (0, self.columns - dense.shape[1]))  # every gather below is a view
        triples = padded[:, : self.triples * PERIOD].reshape(b, self.triples, PERIOD)
        counts = self.counts if self.family != "block_diagonal" else [self.triples] * CLASSES
        normed = [
            F.layer_norm(triples[:, : counts[c], STARTS[c] : STARTS[c] + w], (w,)) * self._stack(c, "norm.weight")
            + self._stack(c, "norm.bias")
            for c, w in enumerate(WIDTHS)
        ]  # (B, count, w) per width
        parts = self._project(normed)  # (count, B, PROJ) per width
        acts = [torch.relu(parts[0]), torch.sigmoid(parts[1]), torch.tanh(parts[2])]
        gain, shift = self._stack(None, "gain"), self._stack(None, "shift")  # one stack each, all features
        outs = [a * gain[c::CLASSES].unsqueeze(1) + shift[c::CLASSES].unsqueeze(1) for c, a in enumerate(acts)]
        flat_seq = seq.reshape(b, SEQ_LEN * SEQ_DIM)
        head_in = torch.cat([*self._interleave(outs), self._passthrough(padded), flat_seq, torch.tanh(flat_seq)], 1)
        return torch.sigmoid(self.model.head(head_in))

    def _project(self, normed: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every feature's Linear(w, PROJ): a (count, B, PROJ) tensor per width."""
        if self.family == "per_width":  # one bmm per width
            biases = torch.split(self._stack("widths", "proj.bias"), self.counts, 0)
            return [
                torch.bmm(n.permute(1, 0, 2), self._stack(c, "proj.weight").transpose(1, 2)) + bias.unsqueeze(1)
                for c, (n, bias) in enumerate(zip(normed, biases))
            ]
        if self.family == "padded":  # one bmm over inputs and weights zero-padded to width 16
            top = max(WIDTHS)
            x = torch.cat([F.pad(n, (0, top - n.shape[-1])) for n in normed], 1).permute(1, 0, 2)  # (N, B, 16)
            w = torch.cat(
                [F.pad(self._stack(c, "proj.weight"), (0, top - width)) for c, width in enumerate(WIDTHS)]
            )  # (N, PROJ, 16)
            y = torch.bmm(x, w.transpose(1, 2)) + self._stack("widths", "proj.bias").unsqueeze(1)
            return list(torch.split(y, self.counts, 0))  # (N, B, PROJ) width by width
        # block-diagonal: whole triples, the tail's missing features zero
        x = torch.cat(normed, 2).permute(1, 0, 2)  # (t, B, 28)
        blocks = [
            F.pad(self._stack(c, "proj.weight").transpose(1, 2), (c * PROJ, (CLASSES - 1 - c) * PROJ))
            for c in range(CLASSES)
        ]  # (t, w, 3 * PROJ): the width's block of columns
        bias = torch.cat([self._stack(c, "proj.bias") for c in range(CLASSES)], 1)
        y = torch.bmm(x, torch.cat(blocks, 1)) + bias.unsqueeze(1)  # (t, B, 3 * PROJ)
        return [y[: self.counts[c], :, c * PROJ : (c + 1) * PROJ] for c in range(CLASSES)]  # the real features

    def _interleave(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The features' outputs in feature order, (B, PROJ * N), as few cat inputs as can be:
        the whole triples interleaved by one stack, then the tail features."""
        q, b = self.counts[-1], outs[0].shape[1]
        pieces = [torch.stack([o[:q] for o in outs], 2).permute(1, 0, 2, 3).reshape(b, q * CLASSES * PROJ)]
        return pieces + [outs[c][q] for c in range(CLASSES) if self.counts[c] > q]

    def _passthrough(self, padded: torch.Tensor) -> torch.Tensor:
        """Every third block of 8 features with its first two pieces swapped: three strided
        views of the (padded) input; a partial last block is a prefix of a whole one's order."""
        b, widths = padded.shape[0], self.model.widths
        blocks = padded[:, : self.blocks * PASS_PERIOD].reshape(b, self.blocks, PASS_PERIOD)
        size = sum(WIDTHS[i % CLASSES] for i in range(BLOCK))
        order = torch.cat([blocks[:, :, 4:12], blocks[:, :, 0:4], blocks[:, :, 12:size]], 2).reshape(b, -1)
        last = self.model.blocks[::3][-1]
        if len(last) == 1:  # a one-feature block is not a prefix of the swapped order
            start = sum(widths[: last[0]])
            return torch.cat([order[:, : (self.blocks - 1) * size], padded[:, start : start + widths[last[0]]]], 1)
        return order[:, : sum(self.model.block_sizes[::3])]


def check(model: DynamicSchema, floor: RaggedFloor, inputs: tuple[torch.Tensor, ...]) -> float:
    """Largest |floor - model| over the outputs of ``inputs`` (the programs compute one function)."""
    with torch.no_grad():
        return (floor(*inputs) - model(*inputs)).abs().max().item()


def floor_kernels(
    model: DynamicSchema, inputs: tuple[torch.Tensor, ...], family: str, variants: tuple[str, ...]
) -> dict[str, Any]:
    """Predicted h200 kernels of the floor program per variant ("inf", "frozen", "train"):
    ``{variant: count, f"{variant}_notes": text, "max_abs_diff": float}``."""
    from benchmarks.extreme_study import kernel_notes, kernels
    from optimus_eqsat.inductor_count import capture_dynamo_graph

    floor = RaggedFloor(model, family).eval()
    out: dict[str, Any] = {"max_abs_diff": check(model, floor, inputs)}
    gm, ex = capture_dynamo_graph(floor, inputs)
    for variant in variants:
        predicted = kernels(gm, ex, variant)
        out[variant], out[f"{variant}_notes"] = len(predicted), kernel_notes(predicted)
    return out
