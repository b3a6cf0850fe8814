"""optimus-eqsat: equality-saturation optimizer for PyTorch FX graphs.

    >>> from optimus_eqsat import optimize_graph
    >>> opt = optimize_graph(torch.fx.symbolic_trace(model), (x,))
    >>> print(opt.meta["optimus_eqsat"].summary())

or ``torch.compile(model, backend="optimus_eqsat")``.
"""

from __future__ import annotations

from pathlib import Path

# In a development checkout, rewrites/ and extract/ sit at the repository top
# level; a wheel ships them inside this package. Extending __path__ makes
# `optimus_eqsat.rewrites` and `optimus_eqsat.extract` resolve in both cases.
_checkout_top = Path(__file__).resolve().parent.parent
if (_checkout_top / "rewrites" / "__init__.py").exists() and not (
    Path(__file__).resolve().parent / "rewrites"
).exists():
    __path__.append(str(_checkout_top))  # type: ignore[name-defined]

from .api import OptimizationError, OptimizeOptions, optimize_graph  # noqa: E402
from .report import OptimizeReport  # noqa: E402
from .stacking import stack_parameters, unstack_parameters  # noqa: E402

__version__ = "0.1.0"
__all__ = ["optimize_graph", "OptimizeOptions", "OptimizeReport", "OptimizationError", "predicted_launches",
           "stack_parameters", "unstack_parameters"]


def predicted_launches(gm, example_inputs=None, profile: str = "h100") -> int:
    """Kernel launches the cost model predicts for an FX graph (see extract.fx_cost)."""
    from .extract.fx_cost import predicted_launches as _predicted_launches

    return _predicted_launches(gm, example_inputs, profile)
