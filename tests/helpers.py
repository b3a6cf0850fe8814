"""Assertions shared by the rule and pipeline tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from optimus_eqsat import optimize_graph
from optimus_eqsat.fxvocab import canonical_name


def op_counts(gm: torch.fx.GraphModule) -> Counter:
    """Canonical op names of the call nodes of a graph."""
    return Counter(
        canonical_name(n) or str(n.target)
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    )


def optimize_and_check(
    fn: Callable | torch.nn.Module, *inputs: torch.Tensor, grads: bool = True, **options: Any
) -> torch.fx.GraphModule:
    """symbolic_trace + optimize (raising on error), then compare outputs and gradients with eager."""
    module = fn
    gm = torch.fx.symbolic_trace(fn)
    code_before = gm.code
    optimized = optimize_graph(gm, inputs, raise_on_error=True, **options)
    assert gm.code == code_before, "optimize_graph mutated its input"
    optimized.graph.lint()
    assert_same_numerics(module, optimized, inputs, grads=grads)
    return optimized


def assert_same_numerics(reference: Callable, candidate: Callable, inputs: tuple, grads: bool = True) -> None:
    leaves = [x.detach().clone().requires_grad_(grads and x.is_floating_point()) for x in inputs]
    leaves2 = [x.detach().clone().requires_grad_(grads and x.is_floating_point()) for x in inputs]
    expected, got = reference(*leaves), candidate(*leaves2)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    if grads and any(x.requires_grad for x in leaves):
        seeds = [torch.randn_like(e) for e in expected if e.is_floating_point()]
        outs_e = [e for e in expected if e.is_floating_point()]
        outs_g = [g for g in got if g.is_floating_point()]
        ge = torch.autograd.grad(outs_e, [x for x in leaves if x.requires_grad], seeds, allow_unused=True)
        gg = torch.autograd.grad(outs_g, [x for x in leaves2 if x.requires_grad], seeds, allow_unused=True)
        for a, b in zip(ge, gg):
            if a is None or b is None:
                assert (
                    a is None or torch.count_nonzero(a) == 0 if b is None else b is None or torch.count_nonzero(b) == 0
                )
            else:
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
