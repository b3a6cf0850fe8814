"""Predict the kernels Inductor launches for an FX graph, and their time.

Works on any ``torch.fx.GraphModule``: ``symbolic_trace`` output
(``call_module`` nodes resolved with ``gm.get_submodule``), Dynamo graphs
(torch functions and Tensor methods, shapes in ``meta["example_value"]``) and
torch.export / aten graphs (``torch.ops.aten.*``, shapes in ``meta["val"]``).
Shapes come from node meta; where meta is missing and ``example_inputs`` are
given, from one run of them.

The prediction, module by module:

- classify.py: each node's tensors and kernel kind (the op tables are the
  vocabulary's, :mod:`optimus_eqsat.fxvocab`);
- fusion.py: the fusion model (views, vertical and horizontal fusion, extern
  calls, schedule; rules 1-4), which decides which kernels exist;
- fusion_triton.py / fusion_cpp.py: what each code generator does its own way
  (rules 5-11), chosen by ``profile.codegen``;
- pricing.py: bytes, FLOPs and seconds of each predicted kernel.

:func:`plan_kernels` stops between the last two: the kernels decided, not
priced, and the pricing for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch.fx as fx

from optimus_eqsat.extract.classify import classify_node, graph_infos, node_kinds
from optimus_eqsat.extract.cost_model import DeviceProfile, get_profile, step_seconds
from optimus_eqsat.extract.fusion import Fusion, FusionStrategy
from optimus_eqsat.extract.fusion_cpp import CppStrategy
from optimus_eqsat.extract.fusion_triton import MAX_POINTWISE_CAT_INPUTS, TritonStrategy
from optimus_eqsat.extract.pricing import KernelPlan, PredictedKernel, Pricing, needs_grad
from optimus_eqsat.fxvocab import TensorInfo, node_tensor_infos

__all__ = [
    "MAX_POINTWISE_CAT_INPUTS",
    "PredictedKernel",
    "TensorInfo",
    "classify_node",
    "node_tensor_infos",
    "plan_kernels",
    "predict_kernels",
    "predicted_launches",
    "predicted_step_time",
    "predicted_time",
    "strategy_for",
]

# profile.codegen -> the fusion strategy of that code generator
STRATEGIES: dict[str, type[FusionStrategy]] = {"triton": TritonStrategy, "cpp": CppStrategy}


def strategy_for(codegen: str) -> FusionStrategy:
    """A fresh fusion strategy for ``codegen`` ("triton" or "cpp")."""
    if codegen not in STRATEGIES:
        raise ValueError(f"unknown code generator {codegen!r}; known: {sorted(STRATEGIES)}")
    return STRATEGIES[codegen]()


def plan_kernels(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> tuple[list[KernelPlan], Pricing]:
    """The kernels the fusion model decides Inductor launches for ``gm`` (in schedule
    order, not priced yet), and the :class:`Pricing` that prices them on ``profile``."""
    prof = get_profile(profile)
    strategy = strategy_for(prof.codegen)
    infos = graph_infos(gm, example_inputs)
    kinds = node_kinds(gm, infos, strategy.decomposed_mm)
    fusion = Fusion(gm, kinds, infos, strategy)
    plans = fusion.kernel_plans()
    pricing = Pricing(gm, kinds, infos, fusion.base, prof, strategy.grouped_per_member)
    pricing.views = pricing.wrapper_views(sorted(strategy.concat_kernels(fusion), key=fusion.pos.__getitem__))
    return plans, pricing


def predict_kernels(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> list[PredictedKernel]:
    """The kernels Inductor is predicted to launch for ``gm``, in schedule order, priced.

    ``profile`` sets the device numbers and the fusion flavour
    (``profile.codegen``: "triton" or "cpp"); see fusion.py and its strategies.
    """
    plans, pricing = plan_kernels(gm, example_inputs, profile)
    return [kernel for plan in plans for kernel in pricing.price(plan)]


def predicted_launches(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> int:
    """Number of kernels Inductor is predicted to launch for ``gm``."""
    return len(predict_kernels(gm, example_inputs, profile))


def predicted_time(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
) -> float:
    """Predicted seconds of one inference call of ``gm`` (see :func:`predicted_step_time`)."""
    return predicted_step_time(gm, example_inputs, profile, training=False)


def predicted_step_time(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    profile: str | DeviceProfile = "h100",
    training: bool = False,
) -> float:
    """Predicted wall-clock seconds of one step of ``gm`` compiled by Inductor: its kernels'
    host and device time and one call of the compiled graph (cost_model.step_seconds); in
    training also the backward graph's kernels (pricing.Pricing.backward_costs) and call."""
    prof = get_profile(profile)
    plans, pricing = plan_kernels(gm, example_inputs, prof)
    kernels = [kernel for plan in plans for kernel in pricing.price(plan)]
    costs = [(k.host_s, k.device_s) for k in kernels]
    inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    forward = step_seconds(prof, costs) + inputs * prof.input_s + pricing.views * prof.view_s
    if not training:
        return forward
    grad = needs_grad(gm, example_inputs)
    trained = sum(1 for n in grad if n.op in ("placeholder", "get_attr")) + sum(
        1
        for n in grad
        if n.op == "call_module"
        for p in gm.get_submodule(cast(str, n.target)).parameters()
        if p.requires_grad
    )
    backward = pricing.backward_costs(kernels, grad)
    return forward + step_seconds(prof, backward) + trained * prof.trained_input_s
