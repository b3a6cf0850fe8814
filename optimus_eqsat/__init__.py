"""optimus-eqsat: equality-saturation optimizer for PyTorch FX graphs.

    >>> from optimus_eqsat import optimize_graph
    >>> opt = optimize_graph(torch.fx.symbolic_trace(model), (x,))
    >>> print(opt.meta["optimus_eqsat"].summary())

or ``torch.compile(model, backend="optimus_eqsat")``.
"""

from __future__ import annotations

from optimus_eqsat.api import OptimizationError, OptimizeOptions, optimize_graph
from optimus_eqsat.report import OptimizeReport
from optimus_eqsat.stacking import stack_parameters, unstack_parameters

__version__ = "0.1.0"
__all__ = [
    "optimize_graph",
    "OptimizeOptions",
    "OptimizeReport",
    "OptimizationError",
    "predicted_launches",
    "stack_parameters",
    "unstack_parameters",
]


def predicted_launches(gm, example_inputs=None, profile: str = "h100") -> int:
    """Kernel launches the cost model predicts for an FX graph (see extract.fx_cost)."""
    from optimus_eqsat.extract.fx_cost import predicted_launches as _predicted_launches

    return _predicted_launches(gm, example_inputs, profile)
