"""Timing methods side by side in interleaved rounds until their ratios are stable.

One process runs every method of a case. Timing them one after the other
lets the machine's drift (other jobs, thermal state, caches) fall on one method
more than another; interleaving gives every method the same conditions on
average, and pairing each method's round with the baseline's round of the same
index cancels slow drift in the ratio.

Schedule: ``warmup`` steps per method (interleaved), then rounds. In each round
every method takes its turn in an order that changes from round to round
(:func:`round_order`); a turn is ``round_warmup`` untimed steps (to refill the
caches the previous method evicted) and ``steps`` timed ones, whose median is the
method's time in that round; a method whose steps are short gets more of them
(enough for ``min_turn_ms`` at its fastest warm-up step's speed), so a turn outlasts the
hiccups of a shared machine. After ``min_rounds``, rounds are added until every
method's paired ratio has a relative spread ((p90 - p10) / median) within
``target_spread``, or until ``max_rounds`` / ``max_seconds``.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from benchmarks import stats

TimedStep = Callable[[], float]  # runs one step, returns its milliseconds
ORDERS = ("rotate", "shuffle")


@dataclass(frozen=True)
class RoundPlan:
    """How to time one case (see the module docstring)."""

    min_rounds: int = 5
    max_rounds: int = 30
    steps: int = 5  # timed steps per method per round (k), at least
    min_turn_ms: float = 20.0  # more timed steps for fast methods, so a turn lasts this long
    warmup: int = 3  # steps per method before the first round
    round_warmup: int = 1  # untimed steps at the start of each turn
    target_spread: float = 0.10  # (p90 - p10) / median of the paired ratio
    max_seconds: float = 120.0  # no round is started after this (min_rounds always run)
    order: str = "rotate"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"unknown order {self.order!r}; choose from {', '.join(ORDERS)}")
        if not 1 <= self.min_rounds <= self.max_rounds or self.steps < 1:
            raise ValueError("need 1 <= min_rounds <= max_rounds and steps >= 1")


def round_order(labels: list[str], index: int, policy: str = "rotate", seed: int = 0) -> list[str]:
    """The order of the methods' turns in round ``index``.

    ``rotate``: the list rotated by ``index``, reversed on every other cycle of
    ``len(labels)`` rounds, so over two cycles every method takes every
    position equally often and follows each other method as often as it precedes
    it. ``shuffle``: a random permutation seeded by (seed, index).
    """
    n = len(labels)
    if n == 0:
        return []
    if policy == "shuffle":
        order = list(labels)
        random.Random(seed * 1_000_003 + index).shuffle(order)
        return order
    cycle, offset = divmod(index, n)
    base = list(labels) if cycle % 2 == 0 else list(reversed(labels))
    return base[offset:] + base[:offset]


@dataclass
class RoundsResult:
    """Round medians per method, the orders used, why timing stopped, and errors."""

    round_ms: dict[str, list[float]]
    orders: list[list[str]] = field(default_factory=list)
    stop: str = ""  # "stable", "max_rounds", "time_limit" or "no_methods"
    unstable: list[str] = field(default_factory=list)  # methods still above the target
    errors: dict[str, str] = field(default_factory=dict)  # method -> first line of its exception
    steps: dict[str, int] = field(default_factory=dict)  # timed steps per turn, per method
    seconds: float = 0.0

    @property
    def rounds(self) -> int:
        return len(self.orders)

    def ratios(self, baseline: str) -> dict[str, list[float]]:
        return stats.paired_ratios(self.round_ms, baseline)


def run_rounds(
    steps: Mapping[str, TimedStep],
    plan: RoundPlan,
    baseline: str | None = "inductor",
    clock: Callable[[], float] = time.perf_counter,
) -> RoundsResult:
    """Time every method in interleaved rounds (see the module docstring).

    A method whose step raises is dropped from later rounds; its error is kept.
    """
    live = list(steps)
    result = RoundsResult(round_ms={label: [] for label in live})
    start = clock()

    def attempt(label: str, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as exc:  # a method that breaks mid-run must not stop the others
            result.errors[label] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            live.remove(label)

    warm_ms: dict[str, list[float]] = {label: [] for label in live}
    for _ in range(plan.warmup):
        for label in list(live):
            attempt(label, lambda label=label: warm_ms[label].append(steps[label]()))
    result.steps = {label: _steps_per_turn(warm_ms[label], plan) for label in live}
    while live:
        order = round_order(live, len(result.orders), plan.order, plan.seed)
        for label in order:
            attempt(label, lambda label=label: _turn(steps[label], result.steps[label], plan, result.round_ms[label]))
        result.orders.append(order)
        rounds = len(result.orders)
        if rounds < plan.min_rounds:
            continue
        active = {label: result.round_ms[label] for label in live}
        result.unstable = stats.unstable(active, baseline if baseline in live else None, plan.target_spread)
        if not result.unstable:
            result.stop = "stable"
        elif rounds >= plan.max_rounds:
            result.stop = "max_rounds"
        elif clock() - start >= plan.max_seconds:
            result.stop = "time_limit"
        if result.stop:
            break
    result.stop = result.stop or "no_methods"
    result.seconds = clock() - start
    return result


MAX_STEPS_PER_TURN = 1000


def _steps_per_turn(warm_ms: list[float], plan: RoundPlan) -> int:
    """``plan.steps``, or more if the warm-up steps were short (see ``min_turn_ms``).
    The fastest warm-up step stands for the steady state: the first ones after a
    compile, or a hiccup, are slow."""
    typical = min(warm_ms, default=0.0)
    if typical <= 0:
        return plan.steps
    return max(plan.steps, min(MAX_STEPS_PER_TURN, math.ceil(plan.min_turn_ms / typical)))


def _turn(step: TimedStep, count: int, plan: RoundPlan, sink: list[float]) -> None:
    """One method's turn in a round: untimed steps, then the median of ``count`` timed ones."""
    for _ in range(plan.round_warmup):
        step()
    sink.append(statistics.median(step() for _ in range(count)))
