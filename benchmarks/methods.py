"""The compared methods: how each one turns a model into a callable.

- ``eager``: the model itself.
- ``inductor``: ``torch.compile`` with Inductor's defaults (the baseline of every ratio).
- ``inductor_optimus``: Inductor with its own Optimus passes switched on
  (:data:`OPTIMUS_PRE_GRAD`, :data:`OPTIMUS_POST_GRAD`).
- ``optimus_eqsat``: the optimus_eqsat Dynamo backend (``make_backend``:
  optimize_graph, then Inductor's compile_fx), configured by rule sets /
  extractor / profile.

CUDA only (:data:`CUDA_METHODS`):

- ``inductor_cudagraphs``: ``torch.compile(mode="reduce-overhead")``, i.e. the
  very Inductor wrapper that mode builds (``triton.cudagraphs=True``, CUDA graph trees).
- ``optimus_eqsat_cudagraphs``: the optimus_eqsat backend with the same mode
  options patched around its compile and steps (what
  ``torch.compile(model, backend="optimus_eqsat", mode="reduce-overhead")`` does):
  the ``compile_fx`` it calls reads ``triton.cudagraphs`` when it compiles and
  wraps the result in CUDA graph trees.
- ``inductor_combo``: Inductor with ``combo_kernels=True`` (horizontal fusion of
  independent kernels into one launch), a baseline that also cuts launches.

Every compiled method runs Dynamo through a recording wrapper so the Dynamo
graph is observed before any pass mutates it. CUDA graph methods mark a new
step before each call (``torch.compiler.cudagraph_mark_step_begin``): methods
take turns, and without the mark the graph trees would take another method's
call for a continuation of the last one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.instrument import CompileRecord

# Inductor's Optimus passes that run on CPU in torch 2.13 (all names of
# group_batch_fusion.py and split_cat.py except fbgemm-only group_linear and the
# GPU-oriented decompose_mm/pad_mm). Checked on the zoo: they fire on CPU
# (e.g. dynamic_schema: batch_linear, batch_layernorm, merge_splits,
# unbind_stack, batch_aten_relu/mul).
OPTIMUS_PRE_GRAD: dict[str, dict[str, Any]] = {
    name: {}
    for name in (
        "normalization_pass",  # runs first regardless of order (pre_grad.py)
        "batch_linear",
        "batch_linear_lhs",
        "batch_layernorm",
        "batch_tanh",
        "batch_sigmoid",
        "batch_relu",
        "batch_detach",
        "batch_nan_to_num",
        "batch_clamp",
        "batch_dropout",
        "remove_split_with_size_one_pass",
        "merge_getitem_cat_pass",
        "merge_stack_tahn_unbind_pass",  # (sic) Inductor's spelling
        "merge_splits_pass",
        "mutate_cat_pass",
        "split_cat_pass",
        "unbind_stack_pass",
        "split_cat_to_slices_pass",
        "unbind_cat_to_view_pass",
        "split_stack_to_cats_pass",
        "unbind_stack_to_slices_pass",
        "move_reshape_out_of_split_stack_pass",
    )
}
OPTIMUS_POST_GRAD: dict[str, dict[str, Any]] = {
    name: {}
    for name in (
        "batch_linear_post_grad",
        "batch_aten_add",
        "batch_aten_sub",
        "batch_aten_mul",
        "batch_aten_div",
        "batch_aten_tanh",
        "batch_aten_sigmoid",
        "batch_aten_relu",
        "normalization_aten_pass",
        "split_cat_aten_pass",
        "select_cat_aten_pass",
        "unbind_stack_aten_pass",
        "move_view_after_cat_aten_pass",
    )
}

CPU_METHODS = ("eager", "inductor", "inductor_optimus", "optimus_eqsat")
CUDA_METHODS = ("inductor_cudagraphs", "optimus_eqsat_cudagraphs", "inductor_combo")
METHOD_NAMES = CPU_METHODS + CUDA_METHODS
BASELINE = "inductor"  # every ratio is to this method, measured in the same run


def default_methods(device: str) -> list[str]:
    """Every method the device can run."""
    return list(METHOD_NAMES if device.startswith("cuda") else CPU_METHODS)


def reduce_overhead_inductor() -> Callable:
    """The Inductor backend ``torch.compile(mode="reduce-overhead")`` builds.

    Built through torch's own wrapper so its side effects come too (it turns
    off CUPTI teardown, which crashes profiling of CUDA graphs on some CUDA
    versions); its ``config`` holds the mode's options.
    """
    return torch._TorchCompileInductorWrapper("reduce-overhead", None, None)


@dataclass(frozen=True)
class EqsatOptions:
    """Ablation knobs passed to ``optimus_eqsat.backend.make_backend``; None = its default."""

    rulesets: tuple[str, ...] | None = None
    extractor: str | None = None
    profile: str | None = None
    measure: bool | None = None  # the backend's measured choice (False: always the optimized program)

    def kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}

    def label(self) -> dict[str, str]:
        """Row labels: the knob values, or "default"."""
        return {
            "rulesets": "+".join(self.rulesets) if self.rulesets else "default",
            "extractor": self.extractor or "default",
            "profile": self.profile or "default",
            "measure": "default" if self.measure is None else ("on" if self.measure else "off"),
        }


@dataclass(frozen=True)
class Method:
    """A way to run a model. ``inductor_config`` is patched around compile and
    the first (compiling) step; ``observe_pre_grad`` takes Inductor's pre-grad
    output as the method's optimized graph (where Optimus passes act);
    ``cudagraphs``: the compiled callable replays CUDA graphs."""

    name: str
    inductor_config: dict[str, Any] = field(default_factory=dict)
    eqsat: EqsatOptions | None = None
    observe_pre_grad: bool = False
    cudagraphs: bool = False

    @property
    def compiled(self) -> bool:
        return self.name != "eager"

    @property
    def uses_eqsat(self) -> bool:
        return self.eqsat is not None

    @property
    def label(self) -> str:
        """Unique within a run: the name, plus the ablation variant when not the default."""
        knobs = (self.eqsat or EqsatOptions()).label()
        measure = knobs.pop("measure")
        variant = "/".join(knobs.values()) + ("" if measure == "default" else f"/measure={measure}")
        return self.name if variant == "default/default/default" else f"{self.name}[{variant}]"

    def prepare(self, model: torch.nn.Module, record: CompileRecord) -> Callable:
        """The callable to benchmark; compiles lazily on its first call. The
        inner backend is kept on ``record.backend`` (its ``reports``, if any)."""
        if not self.compiled:
            return model
        inner = self.inner_backend()
        record.backend = inner

        def recording_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            record.observe_input(gm, example_inputs)
            return inner(gm, example_inputs)

        compiled = torch.compile(model, backend=recording_backend)
        if not self.cudagraphs:
            return compiled

        def new_step_then_call(*args: Any) -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*args)

        return new_step_then_call

    def inner_backend(self) -> Callable:
        """A fresh Dynamo backend for this method (before our recording wrapper)."""
        if self.uses_eqsat:
            return eqsat_backend(self.eqsat or EqsatOptions())
        if self.cudagraphs:
            return reduce_overhead_inductor()
        from torch._inductor.compile_fx import compile_fx

        return compile_fx


def eqsat_backend(options: EqsatOptions) -> Callable:
    """``make_backend(**options)``: the one entry point of the optimizer the harness uses.

    Raises (ImportError, ...) while the backend does not exist; the harness
    records the message in the row.
    """
    from optimus_eqsat.backend import make_backend

    return make_backend(**options.kwargs())


def make_methods(names: list[str], eqsat_variants: list[EqsatOptions], device: str = "cpu") -> list[Method]:
    """Methods by name; each optimus_eqsat method expands to one per ablation variant.

    CUDA-only methods on another device raise ValueError (they would measure nothing).
    """
    methods: list[Method] = []
    for name in names:
        if name in CUDA_METHODS and not device.startswith("cuda"):
            raise ValueError(f"method {name!r} needs --device cuda")
        if name in ("eager", "inductor"):
            methods.append(Method(name))
        elif name == "inductor_optimus":
            config = {
                "pre_grad_fusion_options": OPTIMUS_PRE_GRAD,
                "post_grad_fusion_options": OPTIMUS_POST_GRAD,
            }
            methods.append(Method(name, inductor_config=config, observe_pre_grad=True))
        elif name == "inductor_combo":
            methods.append(Method(name, inductor_config={"combo_kernels": True}))
        elif name == "inductor_cudagraphs":
            methods.append(Method(name, inductor_config=dict(reduce_overhead_inductor().config), cudagraphs=True))
        elif name in ("optimus_eqsat", "optimus_eqsat_cudagraphs"):
            cudagraphs = name == "optimus_eqsat_cudagraphs"
            config = dict(reduce_overhead_inductor().config) if cudagraphs else {}
            methods.extend(
                Method(name, inductor_config=config, eqsat=variant, cudagraphs=cudagraphs) for variant in eqsat_variants
            )
        else:
            raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHOD_NAMES)}")
    return methods
