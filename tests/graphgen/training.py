"""Builders of training-time state and randomness: batch norms, dropouts, checkpoint regions.

- ``b_batch_norm``: a training-mode batch norm over a (N, C) or (N, C, L) value, as a
  ``BatchNorm1d`` submodule (``call_module``; momentum 0.1, 0.3 or None, affine or not)
  (momentum None: a cumulative average counted by ``num_batches_tracked``; never in a
  program for Dynamo, which cannot capture it: see the builder) or as
  ``F.batch_norm`` with running statistics registered as buffers of the root
  (``get_attr``); either writes its running statistics when the program runs.
- ``b_dropout``: a dropout of probability ``_Builder.dropout_p`` (0 unless a flavour asks
  for more), as an ``nn.Dropout`` submodule, ``F.dropout`` or ``torch.dropout``.
- ``b_checkpoint``: 2-3 sibling "experts" (Linear -> [BatchNorm1d] -> activation ->
  Dropout) on one input, each called through ``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)`` inside a submodule, their results concatenated or kept apart:
  under Dynamo each becomes a ``tag_activation_checkpoint`` region.
- ``b_state_regions``: 2-4 sibling experts (Linear -> activation) on one input, some run
  inside a grad-mode or autocast region (a frozen branch under ``torch.no_grad()``, a bf16
  ``torch.autocast`` branch, or a region that sets the state already in force), beside
  plain ones the optimizer would batch them with: under Dynamo the regions are
  ``_set_grad_enabled`` / ``_enter_autocast`` nodes around the experts' ops.

Numerical care: a batch norm is only applied where every channel's variance over the
reduced dims is at least ``_MIN_VAR`` (a near-constant channel makes its output and
gradient ill-conditioned). Random care: the builder's modules are initialised under
``torch.random.fork_rng`` and from the builder's own generator, so the global stream
the dropouts draw from sees, at build time, the very draws a run of the finished
program sees after ``torch.manual_seed(RNG_SEED)`` (the driver seeds it before
building), and the margins other builders check on concrete values hold at run time.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .builder import _Builder

_MIN_VAR = 1e-2


class CheckpointedExpert(nn.Module):
    """``inner(x)`` through non-reentrant activation checkpointing (the backward recomputes it)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


class StateRegion(nn.Module):
    """``inner(x)`` inside a grad-mode or autocast region (``kind``, one of ``KINDS``), as float32;
    ``detach``: no region, ``inner(x)`` detached (a stop-gradient branch, whose parameters get
    no gradient however the edges reach an output)."""

    KINDS = ("no_grad", "enable_grad", "autocast_bf16", "autocast_off", "detach")

    def __init__(self, inner: nn.Module, kind: str) -> None:
        super().__init__()
        self.inner, self.kind = inner, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "detach":
            return self.inner(x).detach()
        if self.kind == "no_grad":
            region: contextlib.AbstractContextManager = torch.no_grad()
        elif self.kind == "enable_grad":
            region = torch.enable_grad()
        else:
            region = torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.kind == "autocast_bf16")
        with region:  # (a float32 island reads its input as float32, as users write it)
            out = self.inner(x.float() if self.kind == "autocast_off" else x)
        return out.float()


def _redraw(b: _Builder, module: nn.Module) -> nn.Module:
    """``module``'s linears and batch norms redrawn from ``b.gen`` (a batch norm's scale and running
    variance kept positive and its statistics away from the defaults); returns it."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                for t in (m.weight, m.bias):
                    if t is not None:
                        t.copy_(b.rand(t.shape, m.in_features**-0.5))
            elif isinstance(m, nn.BatchNorm1d):
                for t, positive in ((m.weight, True), (m.bias, False), (m.running_mean, False), (m.running_var, True)):
                    if t is not None:
                        t.copy_(0.5 + b.rand(t.shape).abs() if positive else b.rand(t.shape, 0.3))
    return module


def _register(b: _Builder, prefix: str, module: nn.Module) -> str:
    """``module`` (redrawn) as a fresh submodule of the root; its name."""
    name = f"{prefix}{sum(1 for _ in b.root.children())}"
    b.root.add_module(name, _redraw(b, module))
    return name


def _new_module(make: type[nn.Module], *args: object, **kwargs: object) -> nn.Module:
    """A module built without drawing from the global random stream."""
    with torch.random.fork_rng():
        return make(*args, **kwargs)


def _normalizable(t: torch.Tensor) -> bool:
    """A (N, C) or (N, C, L) value whose every channel has a variance of at least _MIN_VAR."""
    if t.dim() not in (2, 3) or t.shape[0] < 2 or t.shape[1] < 1:
        return False
    dims = [0] if t.dim() == 2 else [0, 2]
    return bool(t.var(dim=dims, unbiased=False).min() >= _MIN_VAR)


def b_batch_norm(b: _Builder) -> bool:
    x = b.pick(_normalizable)
    if x is None:
        return False
    channels = b.shape(x)[1]
    momentum: float | None = b.choice([0.1, 0.3, None])
    if momentum is None and b.dynamo:
        # A cumulative average divides by ``float(num_batches_tracked)``, a lifted buffer input
        # under Dynamo: a data-dependent guard it cannot capture in one graph. Drawn all the same
        # (the rest of the program stays the one its seed gives), it becomes an exponential average.
        momentum = 0.1
    if b.coin(0.6):
        affine = b.coin(0.8)
        name = _register(b, "bn", _new_module(nn.BatchNorm1d, channels, momentum=momentum, affine=affine).train())
        b.tag(
            "train:batch_norm_module",
            *([] if affine else ["train:batch_norm_noaffine"]),
            *(["train:batch_norm_cumulative"] if momentum is None else []),
        )
        node = b.emit("call_module", name, (x,))
    else:
        mean, var = b.buffer((channels,), "running_mean"), b.buffer((channels,), "running_var")
        weight = b.param((channels,)) if b.coin(0.8) else None
        bias = b.param((channels,)) if weight is not None and b.coin(0.8) else None
        b.tag("train:batch_norm_fn")
        node = b.fn(F.batch_norm, x, mean, var, weight, bias, True, momentum or 0.1, 1e-5)
    b.keep(node)
    return True


def b_dropout(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return False
    p = b.dropout_p
    kind = b.choice(["module", "fn", "torch"])
    b.tag(f"train:dropout_{kind}")
    if kind == "module":
        node = b.emit("call_module", _register(b, "drop", nn.Dropout(p)), (x,))
    elif kind == "fn":
        node = b.fn(F.dropout, x, p, True) if b.coin() else b.fn(F.dropout, x, p=p, training=True)
    else:
        node = b.fn(torch.dropout, x, p, True)
    b.keep(node)
    return True


def b_checkpoint(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() == 2 and t.shape[0] >= 2)
    if x is None:
        return False
    channels, hidden = b.shape(x)[1], b.choice([2, 4, 6])
    outs = []
    for _ in range(b.rng.randint(2, 3)):
        linear = _redraw(b, _new_module(nn.Linear, channels, hidden))
        layers: list[nn.Module] = [linear]
        with torch.no_grad():
            normalizable = _normalizable(linear(b.t(x)))
        if normalizable and b.coin(0.7):
            layers.append(_redraw(b, _new_module(nn.BatchNorm1d, hidden)))
            b.tag("train:checkpoint_batch_norm")
        layers += [b.choice([nn.ReLU, nn.Sigmoid, nn.Tanh])(), nn.Dropout(b.dropout_p)]
        outs.append(b.emit("call_module", _register(b, "ckpt", CheckpointedExpert(nn.Sequential(*layers))), (x,)))
    b.tag("train:checkpoint")
    if b.coin():
        b.tag("train:checkpoint_cat")
        b.keep(b.fn(torch.cat, outs, 1))
    else:
        for node in outs:
            b.keep(node)
    return True


def b_state_regions(b: _Builder) -> bool:
    x = b.pick(lambda t: t.dim() == 2 and t.shape[0] >= 2)
    if x is None:
        return False
    channels, hidden, n = b.shape(x)[1], b.choice([2, 4, 6]), b.rng.randint(2, 4)
    kinds = [b.choice(StateRegion.KINDS) for _ in range(n - 1)] + ["plain"]  # one plain expert at least
    b.rng.shuffle(kinds)
    outs = []
    for kind in kinds:
        expert: nn.Module = nn.Sequential(
            _redraw(b, _new_module(nn.Linear, channels, hidden)), b.choice([nn.ReLU, nn.Sigmoid, nn.Tanh])()
        )
        if kind != "plain":
            expert = StateRegion(expert, kind)
            b.tag(f"train:state_{kind}")
        outs.append(b.emit("call_module", _register(b, "state", expert), (x,)))
    if b.coin():
        b.keep(b.fn(torch.cat, outs, 1))
    else:
        for node in outs:
            b.keep(node)
    return True


def fresh_statistics(b: _Builder, module: nn.Module) -> None:
    """Redraw every running statistic of ``module`` in place (counters set to 3).

    Building and the driver's own runs fed the batch norms the example inputs, so their
    statistics may already equal those inputs' (a cumulative average of one batch seen
    twice is that batch's): a step would then leave them as they are whatever its momentum,
    and a program updating them wrongly could not be told from a right one."""
    with torch.no_grad():
        for name, t in module.named_buffers():
            if t.is_floating_point():
                t.copy_(0.5 + b.rand(t.shape).abs() if "var" in name.rsplit(".", 1)[-1] else b.rand(t.shape, 0.3))
            else:
                t.fill_(3)
