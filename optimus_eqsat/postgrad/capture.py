"""AOTAutograd's forward and backward aten graphs of a function, without compiling them.

What Inductor's post-grad passes receive, made the way Inductor makes it (its
decomposition table, its joint-graph passes and partitioner), but run eagerly:
each graph first goes through ``graph_pass`` (e.g. :class:`~.graph_pass.PostGradPass`)
and is then executed as an FX module. Tests and the fuzzer check a pass's numerics
this way, forward and backward, in seconds instead of an Inductor compile.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

__all__ = ["aot_eager_with_pass", "aten_graphs"]

GraphPass = Callable[[torch.fx.Graph], None]


def aot_eager_with_pass(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    graph_pass: GraphPass | None = None,
    seen: list[torch.fx.GraphModule] | None = None,
) -> Callable:
    """``gm`` through AOTAutograd (Inductor's decompositions and partitioner); every
    forward and backward graph is handed to ``graph_pass`` (in place) and then run
    eagerly. ``seen`` collects the graphs after the pass."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    # named as AOTAutograd's compiler protocol (AOTDispatchCompiler) names them: ``gm`` here is
    # the aten graph AOTAutograd made, not the module it was made from
    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        if graph_pass is not None:
            graph_pass(gm.graph)
            gm.recompile()
        if seen is not None:
            seen.append(gm)
        return make_boxed_func(gm.forward)

    return aot_module_simplified(
        gm,
        list(example_inputs),
        fw_compiler=compiler,
        bw_compiler=compiler,
        partition_fn=partition_fn,
        decompositions=select_decomp_table(),
    )


def aten_graphs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[torch.fx.GraphModule]:
    """Copies of the forward and backward aten graphs of one training step of ``gm``
    (the backward of the sum of its outputs that require grad)."""
    seen: list[torch.fx.GraphModule] = []
    compiled = aot_eager_with_pass(gm, example_inputs, None, seen)
    out = compiled(*example_inputs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    return [copy.deepcopy(g) for g in seen]
