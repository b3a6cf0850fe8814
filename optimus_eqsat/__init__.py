"""optimus-eqsat: equality-saturation optimizer for PyTorch FX graphs."""

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

__version__ = "0.1.0"
