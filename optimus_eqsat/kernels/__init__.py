"""Custom kernels used by optimus-eqsat's extracted programs.

Importing this package registers the ``torch.ops.optimus_eqsat.*`` custom ops.
Triton is optional: without it every op runs its PyTorch fallback.

Note: ``optimus_eqsat.kernels.grouped_linear`` is the *function* re-exported
here; the module of the same name is reached with
``from optimus_eqsat.kernels.grouped_linear import ...``.
"""

from __future__ import annotations

from optimus_eqsat.kernels.grouped_linear import (
    OP_NAME as GROUPED_LINEAR_OP_NAME,
)
from optimus_eqsat.kernels.grouped_linear import (
    TRITON_CPU_ENV,
    GroupedLinearOptions,
    grouped_linear,
    options,
    triton_available,
    triton_path_enabled,
)

__all__ = [
    "GROUPED_LINEAR_OP_NAME",
    "TRITON_CPU_ENV",
    "GroupedLinearOptions",
    "grouped_linear",
    "options",
    "triton_available",
    "triton_path_enabled",
]
