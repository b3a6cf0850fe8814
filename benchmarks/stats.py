"""Statistics of interleaved timing rounds: medians, spreads and paired ratios.

A method's step time in one round is the median of its k steps there. Over
rounds we report the median of those round medians and their spread as the
10th and 90th percentiles (numpy's linear interpolation; with 5 rounds these are
close to the min and max). Ratios to the baseline are paired: computed per
round (both methods timed in the same round, minutes apart at most) and then
summarized, so a machine that slows down for a while slows both sides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

NAN = math.nan
LOW_PCT, HIGH_PCT = 10, 90


@dataclass(frozen=True)
class Spread:
    """Median and 10th / 90th percentiles of a sample (NaN when empty)."""

    median: float
    p10: float
    p90: float
    n: int

    @property
    def rel_width(self) -> float:
        """(p90 - p10) / median: the spread as a fraction of the value; inf when unknown."""
        if self.n == 0 or not self.median or math.isnan(self.median):
            return math.inf
        return (self.p90 - self.p10) / abs(self.median)

    def __str__(self) -> str:
        """``median [p10, p90]`` with two decimals (a ratio's cell in a results table)."""
        return f"{self.median:.2f} [{self.p10:.2f}, {self.p90:.2f}]"


def spread(values: Sequence[float]) -> Spread:
    """The :class:`Spread` of the finite values."""
    data = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if data.size == 0:
        return Spread(NAN, NAN, NAN, 0)
    low, mid, high = np.percentile(data, [LOW_PCT, 50, HIGH_PCT])
    return Spread(float(mid), float(low), float(high), int(data.size))


def paired_ratios(round_ms: Mapping[str, Sequence[float]], baseline: str) -> dict[str, list[float]]:
    """Per-round ratio of every method's round time to the baseline's in the same round.

    Rounds are aligned by index; a method with fewer rounds (it failed part way)
    pairs only the rounds it has. Empty when the baseline has no rounds.
    """
    base = round_ms.get(baseline) or []
    if not base:
        return {}
    return {label: [t / b if b > 0 else NAN for t, b in zip(times, base)] for label, times in round_ms.items()}


def unstable(round_ms: Mapping[str, Sequence[float]], baseline: str | None, target: float) -> list[str]:
    """Methods whose spread is still wider than ``target`` (a fraction, e.g. 0.1).

    With a baseline that has rounds, the spread judged is that of each other
    method's paired ratio; without one (or when the baseline is alone), that of
    each method's own round times.
    """
    ratios = paired_ratios(round_ms, baseline) if baseline else {}
    judged = {k: v for k, v in ratios.items() if k != baseline} or dict(round_ms)
    return [label for label, values in judged.items() if spread(values).rel_width > target]
