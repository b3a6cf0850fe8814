"""What one optimization minimizes: the step time on one device, in one mode.

Resolved once per run from the options and the graph's inputs:

- the device profile (``profile="auto"`` follows the example inputs' device:
  the GPU by name, else this machine's calibrated CPU profile);
- the mode (``mode="auto"``: a training step when grad mode is on and an input,
  a parameter lifted to an input, or a module parameter requires grad; the
  backend passes the mode of the compile it serves);
- whether parameters are frozen (inference under Inductor's ``freezing``, or
  with the backend's parameter cache: work on parameters alone is done once,
  so a stack of weights costs nothing per step; otherwise it is paid every step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from optimus_eqsat.extract.cost_model import DeviceProfile, get_profile, profile_for_inputs

MODES = ("auto", "inference", "training")


def training_mode(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None) -> bool:
    """Whether a step of ``gm`` on ``example_inputs`` is a training step (mode "auto")."""
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs or ()):
        return True
    return any(p.requires_grad for p in gm.parameters())


def freezing_enabled() -> bool:
    """Inductor's ``freezing`` config (parameters folded as constants in inference)."""
    from torch._inductor import config

    return bool(getattr(config, "freezing", False))


@dataclass(frozen=True)
class Objective:
    """The profile and mode a run prices programs with."""

    profile: DeviceProfile
    training: bool
    frozen: bool = False  # inference under Inductor's freezing
    cached: bool = False  # inference behind the backend's parameter cache

    @property
    def parameter_work_once(self) -> bool:
        """Whether work on parameters alone is done once, not every step (frozen or cached)."""
        return self.frozen or self.cached

    @property
    def mode(self) -> str:
        return "training" if self.training else "inference"

    @classmethod
    def resolve(
        cls,
        profile: Any,
        mode: str,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any] | None,
        cached_parameters: bool = False,
    ) -> Objective:
        """The objective for ``gm`` under the ``profile``, ``mode`` and ``cached_parameters`` options."""
        name = profile_for_inputs(example_inputs) if isinstance(profile, str) and profile == "auto" else profile
        training = training_mode(gm, example_inputs) if mode == "auto" else mode == "training"
        return cls(
            get_profile(name),
            training,
            frozen=not training and freezing_enabled(),
            cached=not training and cached_parameters,
        )


def predict(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None, objective: Objective) -> tuple[int, float]:
    """Kernel launches and step seconds the fusion-aware cost model (fx_cost) predicts for
    ``gm`` under ``objective`` (an :class:`Objective`: profile and mode). Frozen inference
    is predicted on the graph with its parameter-only work folded (extract/freezing.py); cached
    inference with the work the backend's parameter cache keeps folded (parameter_cache.py)."""
    from optimus_eqsat.extract.freezing import fold_parameters
    from optimus_eqsat.extract.fx_cost import predict_kernels, predicted_step_time
    from optimus_eqsat.parameter_cache import packable_nodes

    if objective.frozen and example_inputs is not None:
        gm = fold_parameters(gm, example_inputs)
    elif objective.cached and example_inputs is not None:
        gm = fold_parameters(gm, example_inputs, packable_nodes)
    launches = len(predict_kernels(gm, example_inputs, objective.profile))
    return launches, predicted_step_time(gm, example_inputs, objective.profile, objective.training)
