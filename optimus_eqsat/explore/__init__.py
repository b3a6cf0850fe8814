"""Jupyter exploration of rewrite choices (see :class:`Explorer`).

    >>> from optimus_eqsat.explore import Explorer
    >>> ex = Explorer(torch.fx.symbolic_trace(model), (x,), extractor="greedy")
    >>> ex.history(); ex.rewritten(); ex.alternatives("towers_0")
    >>> ex.pin("towers_0", 1).compare(); gm = ex.export()

Modules: ``explorer`` (the entry point), ``history`` (saturation tables and
plots), ``rules`` (rule catalogue, banning), ``terms`` (e-nodes as text,
original terms), ``steering`` (pins/forbids as a cost function), ``fx_view``
and ``egraph_view`` (pictures), ``display`` (offline SVG/HTML), ``verify``.
"""

from __future__ import annotations

from optimus_eqsat.explore.display import Picture, dot_binary
from optimus_eqsat.explore.explorer import Explorer, ExportMismatch, Replacement, SteeringError

__all__ = ["Explorer", "Replacement", "SteeringError", "ExportMismatch", "Picture", "dot_binary"]
