"""Count the kernels TorchInductor really emits for a model.

The ground truth the cost model (:mod:`optimus_eqsat.extract.fx_cost`) is
calibrated against. A model is compiled fresh with ``torch.compile``, run once
under :func:`torch._inductor.utils.run_and_get_code`, and the generated output
code (one module per compiled graph: forward, and backward when training) is
scanned:

- *generated* kernels: calls of Inductor-generated kernels in the ``call``
  function: C++ ``cpp_fused_*`` kernels on CPU, ``@triton.jit`` kernels
  (``triton_*.run(``) on GPU. If no ``call`` function is found the kernel
  definitions are counted instead.
- *extern* kernels: ``extern_kernels.*(`` calls (mm/addmm/bmm/conv, ...),
  aten fallbacks (``torch.ops.aten.X.Y(`` / ``aten.X.Y(``) and custom-op
  fallbacks (``torch.ops.ns.op.overload(``, e.g. our grouped linear) in ``call``.

Inductor's own Optimus passes can be switched on with ``fusion_options``
(``{"batch_linear": {}, "split_cat_pass": {}, ...}``); names are routed to
``pre_grad_fusion_options`` or ``post_grad_fusion_options`` by Inductor's own
registries.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "InductorKernelCount",
    "count_inductor_kernels",
    "capture_dynamo_graph",
    "capture_dynamo_graphs",
    "count_kernels_in_code",
    "split_fusion_options",
]


@dataclass(frozen=True)
class InductorKernelCount:
    """Kernels in Inductor's output code, summed over all compiled graphs.

    ``generated``: Inductor-generated kernel launches (C++ or Triton);
    ``extern``: extern/fallback kernel calls; ``total`` = both;
    ``code``: the output code, one string per compiled graph.
    """

    generated: int
    extern: int
    code: list[str] = field(repr=False, default_factory=list)
    total: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.generated + self.extern)


# Kernel definitions: `cpp_fused_relu_0 = async_compile.cpp_pybinding(` on CPU,
# `triton_poi_fused_relu_0 = async_compile.triton(` on GPU.
_KERNEL_DEF = re.compile(r"^(\w+)\s*=\s*async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.M)
_EXTERN_CALL = re.compile(r"\bextern_kernels\.\w+\(")
# Aten fallbacks; `torch.ops.inductor._alloc_from_pool` etc. are allocations.
_ATEN_CALL = re.compile(r"(?<![\w.])(?:torch\.ops\.)?aten\.\w+(?:\.\w+)?\(")
# Custom-op fallbacks (our optimus_eqsat::grouped_linear, any library's op): one launch each.
_CUSTOM_OP_CALL = re.compile(r"(?<![\w.])torch\.ops\.(?!aten\.|inductor\.|prims\.)\w+\.\w+(?:\.\w+)?\(")


def _call_body(code: str) -> str | None:
    """The text of the wrapper's ``call`` function (None if absent)."""
    match = re.search(r"^( *)def call\(self, args\):\n|^( *)def call\(args\):\n", code, re.M)
    if match is None:
        return None
    indent = len(match.group(1) or match.group(2) or "")
    lines = []
    for line in code[match.end() :].splitlines():
        stripped = line.strip()
        if stripped and len(line) - len(line.lstrip()) <= indent:
            break
        lines.append(line)
    return "\n".join(lines)


def count_kernels_in_code(code: str) -> tuple[int, int]:
    """(generated, extern) kernel counts of one Inductor output-code module."""
    names = _KERNEL_DEF.findall(code)
    body = _call_body(code)
    if body is None:
        return len(names), len(_EXTERN_CALL.findall(code))
    # Count launches, not definitions: a kernel called twice launches twice.
    generated = sum(len(re.findall(rf"\b{re.escape(name)}(?:\.run)?\(", body)) for name in names)
    code_lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("#")]
    text = "\n".join(code_lines)
    extern = len(_EXTERN_CALL.findall(text)) + len(_ATEN_CALL.findall(text)) + len(_CUSTOM_OP_CALL.findall(text))
    return generated, extern


def split_fusion_options(
    fusion_options: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Route Optimus pass names to (pre_grad, post_grad) option dicts.

    Post-grad names are those Inductor registers as post-grad fusions or
    split/cat aten passes; everything else is pre-grad.
    """
    from torch._inductor.fx_passes import group_batch_fusion, split_cat

    post_names = set(group_batch_fusion.POST_GRAD_FUSIONS) | set(split_cat.POST_GRAD_PATTERNS)
    post_names.add("decompose_mm_pass")
    pre: dict[str, dict[str, Any]] = {}
    post: dict[str, dict[str, Any]] = {}
    for name, opts in fusion_options.items():
        (post if name in post_names else pre)[name] = dict(opts)
    return pre, post


def _as_tuple(example_inputs: Any) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    return tuple(example_inputs)


def _run_training(compiled: Callable, inputs: tuple) -> Any:
    """Forward, then backward of the sum of all float outputs."""
    out = compiled(*inputs)
    leaves = out if isinstance(out, (tuple, list)) else [out]
    loss = sum(t.float().sum() for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    return out


def count_inductor_kernels(
    model_or_fn: Callable,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    training: bool = False,
    options: Mapping[str, Any] | None = None,
    fusion_options: Mapping[str, Mapping[str, Any]] | None = None,
    backend: str | Callable = "inductor",
) -> InductorKernelCount:
    """Compile ``model_or_fn`` fresh and count the kernels Inductor emits.

    Args:
        model_or_fn: an ``nn.Module`` or a callable.
        example_inputs: positional inputs (a tensor or a sequence).
        training: run forward + backward (module in train mode, parameters
            requiring grad) and count both graphs; else eval under no_grad.
        options: ``torch._inductor.config`` entries to patch, e.g.
            ``{"pre_grad_fusion_options": {"batch_linear": {}}}``.
        fusion_options: Inductor Optimus pass names -> options, routed to
            pre/post-grad automatically (see :func:`split_fusion_options`).
        backend: "inductor" or a backend callable that ends in Inductor.
    """
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    patch: dict[str, Any] = dict(options or {})
    if fusion_options:
        pre, post = split_fusion_options(fusion_options)
        patch["pre_grad_fusion_options"] = {**patch.get("pre_grad_fusion_options", {}), **pre}
        patch["post_grad_fusion_options"] = {**patch.get("post_grad_fusion_options", {}), **post}

    inputs = _as_tuple(example_inputs)
    if isinstance(model_or_fn, torch.nn.Module):
        model_or_fn.train(training)

    torch._dynamo.reset()  # fresh: no cached graphs from earlier calls
    try:
        with inductor_config.patch(patch):
            compiled = torch.compile(model_or_fn, backend=backend)
            if training:
                _, codes = run_and_get_code(_run_training, compiled, inputs)
            else:
                with torch.no_grad():
                    _, codes = run_and_get_code(compiled, *inputs)
    finally:
        torch._dynamo.reset()
    generated = extern = 0
    for code in codes:
        g, e = count_kernels_in_code(code)
        generated, extern = generated + g, extern + e
    return InductorKernelCount(generated=generated, extern=extern, code=list(codes))


def _capture(
    model_or_fn: Callable, example_inputs: Sequence[Any] | torch.Tensor, fullgraph: bool
) -> list[tuple[torch.fx.GraphModule, list]]:
    """(graph, example inputs) for every graph Dynamo hands to the backend, under no_grad."""
    captured: list[tuple[torch.fx.GraphModule, list]] = []

    def record(gm: torch.fx.GraphModule, inputs: Any) -> Callable:
        captured.append((gm, list(inputs)))
        return gm.forward

    inputs = _as_tuple(example_inputs)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model_or_fn, backend=record, fullgraph=fullgraph)(*inputs)
    finally:
        torch._dynamo.reset()
    return captured


def capture_dynamo_graphs(
    model_or_fn: Callable, example_inputs: Sequence[Any] | torch.Tensor
) -> list[torch.fx.GraphModule]:
    """The FX graphs Dynamo hands to the backend (what Inductor compiles),
    shapes in ``node.meta["example_value"]``; more than one on graph breaks."""
    return [gm for gm, _ in _capture(model_or_fn, example_inputs, fullgraph=False)]


def capture_dynamo_graph(
    model_or_fn: Callable, example_inputs: Sequence[Any] | torch.Tensor
) -> tuple[torch.fx.GraphModule, list]:
    """Dynamo's one graph of the forward (``fullgraph=True``, no_grad) and the example
    inputs it was given: parameters lifted to inputs arrive as ``nn.Parameter``."""
    ((gm, inputs),) = _capture(model_or_fn, example_inputs, fullgraph=True)
    return gm, inputs
