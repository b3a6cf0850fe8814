"""Pins and forbids: a cost function that steers extraction without re-saturating.

``pin(c, k)`` prices every other e-node of class ``c`` at infinity, so an
extractor that needs class ``c`` must take node ``k``; ``forbid(c, k)`` prices
node ``k`` at infinity. Nodes are remembered as :class:`TermNode` values, so a
steering stays meaningful while the e-graph stays the same (re-saturating
renumbers classes; the explorer clears steering then).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from optimus_eqsat.egraph_export import ExportedEGraph, TermNode

Cost = Callable[[int, TermNode], float]


@dataclass
class Steering:
    """The user's pins (class -> node index) and forbids (class -> node indices)."""

    pins: dict[int, int] = field(default_factory=dict)
    forbids: dict[int, set[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.pins) or any(self.forbids.values())

    def pin(self, c: int, k: int) -> None:
        self.pins[c] = k

    def forbid(self, c: int, k: int) -> None:
        self.forbids.setdefault(c, set()).add(k)

    def clear(self, c: int | None = None) -> None:
        """Drop all steering, or only that of class ``c``."""
        if c is None:
            self.pins.clear()
            self.forbids.clear()
        else:
            self.pins.pop(c, None)
            self.forbids.pop(c, None)

    def state(self, c: int, k: int) -> str:
        """ "pinned", "forbidden", "excluded by pin" or ""."""
        if self.pins.get(c) == k:
            return "pinned"
        if k in self.forbids.get(c, ()):
            return "forbidden"
        if c in self.pins:
            return "excluded by pin"
        return ""

    def cost(self, egraph: ExportedEGraph, base: Cost) -> Cost:
        """``base`` with steered nodes priced at infinity."""
        banned: set[tuple[int, TermNode]] = set()
        for c, k in self.pins.items():
            banned.update((c, n) for i, n in enumerate(egraph.classes[c]) if i != k)
        for c, ks in self.forbids.items():
            banned.update((c, egraph.classes[c][k]) for k in ks)

        def steered(c: int, node: TermNode) -> float:
            return math.inf if (c, node) in banned else base(c, node)

        return steered

    def table_rows(self) -> list[dict]:
        rows = [{"eclass": c, "node": k, "action": "pin"} for c, k in sorted(self.pins.items())]
        rows += [
            {"eclass": c, "node": k, "action": "forbid"} for c, ks in sorted(self.forbids.items()) for k in sorted(ks)
        ]
        return rows
