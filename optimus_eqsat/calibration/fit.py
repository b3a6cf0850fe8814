"""Per-call host costs by linear regression over programs with known counts.

The model: ``time(program) = call_s + sum_c count_c(program) * cost_c`` over the
count columns (generated kernels, extern calls, custom-op calls, allocations).
Least squares on the per-program medians gives the costs, weighted by 1/median
(timing noise is relative: a preempted 200 us program is off by more
microseconds than a 20 us one, and should not outvote it); the same regression
on each round's times gives per-round estimates whose interquartile range is
the reported spread. A cost that comes out negative but within its spread is
zero within the noise (on a CPU a generated kernel is a plain function call,
a fraction of a microsecond): the fit is redone with every cost held
non-negative. A cost negative beyond its spread means the programs did not
separate the columns (or the machine was too noisy): the fit is refused
(:class:`NonsenseFitError`; a caller may time again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from optimus_eqsat.calibration.programs import CalibrationError, Counts
from optimus_eqsat.calibration.timing import iqr

__all__ = ["HostFit", "fit_host_costs", "COUNT_COLUMNS", "NonsenseFitError"]

# Count column -> profile field it estimates.
COUNT_COLUMNS = {
    "generated": "generated_kernel_s",
    "extern": "extern_call_s",
    "custom": "custom_op_s",
    "alloc": "alloc_s",
}


class NonsenseFitError(CalibrationError):
    """The fit gave a per-call cost negative beyond its per-round spread."""


@dataclass(frozen=True)
class HostFit:
    """Fitted seconds per occurrence (``call_s`` is the intercept), their spread
    (IQR over per-round fits) and the residual of the fit on the medians."""

    costs: dict[str, float]
    spread: dict[str, float]
    residual_rms_s: float
    residual_rel: float  # rms of residual / median, over programs
    columns: tuple[str, ...]


def _design(counts: Sequence[Counts], columns: Sequence[str]) -> np.ndarray:
    return np.array([[1.0, *(float(getattr(c, col)) for col in columns)] for c in counts])


def fit_host_costs(counts: Sequence[Counts], times: np.ndarray, field_prefix: str = "") -> HostFit:
    """Fit per-call costs from ``counts`` (one per program) and ``times``
    (rounds x programs, seconds per call). Columns that never vary are left out
    (their cost is not identifiable); ``field_prefix`` renames the fields
    (e.g. ``"cudagraph_"``). Raises :class:`CalibrationError` on a singular design
    or a negative cost."""
    times = np.atleast_2d(np.asarray(times, dtype=float))
    if times.shape[1] != len(counts):
        raise ValueError(f"{len(counts)} programs but times for {times.shape[1]}")
    columns = tuple(col for col in COUNT_COLUMNS if len({getattr(c, col) for c in counts}) > 1)
    design = _design(counts, columns)
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise CalibrationError(f"calibration programs do not separate the costs {columns}: singular design")
    medians = np.median(times, axis=0)
    weights = 1.0 / medians
    weighted = design * weights[:, None]
    coef, *_ = np.linalg.lstsq(weighted, medians * weights, rcond=None)
    per_round = np.array([np.linalg.lstsq(weighted, row * weights, rcond=None)[0] for row in times])
    names = [f"{field_prefix}call_s", *(field_prefix + COUNT_COLUMNS[col] for col in columns)]
    spread = iqr(per_round)
    significant = {name: cost for name, cost, width in zip(names, coef, spread) if cost < 0 and -cost > width}
    if significant:
        raise NonsenseFitError(
            "nonsense fit, negative per-call costs: "
            + ", ".join(f"{name} = {cost * 1e6:.3g} us" for name, cost in significant.items())
            + " (beyond their per-round spread); the machine may be too noisy: rerun"
        )
    if (coef < 0).any():  # zero within the noise: the best fit with every cost >= 0
        coef, _ = nnls(weighted, medians * weights)
    residual = design @ coef - medians
    return HostFit(
        costs=dict(zip(names, map(float, coef))),
        spread=dict(zip(names, map(float, spread))),
        residual_rms_s=float(np.sqrt(np.mean(residual**2))),
        residual_rel=float(np.sqrt(np.mean((residual / medians) ** 2))),
        columns=columns,
    )
