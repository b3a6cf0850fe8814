"""The table of batch kinds: one small class per kind of batching.

A kind says which candidates may be batched together (its fusion key: equal
keys may share one batched term), how a group is built (facts that add the
batched term and union each member with its part of it), and whether it can
pay under a device profile at all (checked before building). The cost model
then prices the batched alternative like any other term, and the extractor
decides. To add a kind: subclass :class:`BatchKind` in a module of this
package, decorate it with :func:`register`, and import the module in
``__init__.py`` (registration order is the order keys are computed in, which
fixes the order groups are built in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate
from optimus_eqsat.translate import Translation


@dataclass(frozen=True)
class BatchContext:
    """What a kind may ask before building: the device profile (None: assume anything can
    pay) and whether parameters are frozen (inference under Inductor's freezing: work on
    parameters alone, such as a stack of weights, is done once at compile time)."""

    profile: Any = None
    frozen: bool = False


class BatchKind:
    """One kind of batching. Reported as ``batch-<name>`` (report.batched, refine)."""

    name: ClassVar[str]

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        """Candidates with equal keys may be batched together; None: not this kind."""
        raise NotImplementedError

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        """Add the group's batched alternative to ``b``; False when the kind declines the group."""
        raise NotImplementedError

    def can_pay(self, context: BatchContext, n: int) -> bool:
        """Whether a group of ``n`` can cost less than its members (a necessary condition
        only, checked before building)."""
        return True


KINDS: list[BatchKind] = []


def register(cls: type[BatchKind]) -> type[BatchKind]:
    """Add a kind to the table (one instance; kinds hold no state)."""
    KINDS.append(cls())
    return cls
