"""Fusion strategy of Inductor's C++ code generator (the CPU profile, codegen "cpp").

C++ kernels can hold several loop nests, so iteration ranges always fit;
moreover the C++ backend appends every generated group to one kernel until an
extern call flushes it, so consecutive groups in schedule order (extern calls
at their node, generated groups where they are realized (rule 7), then a
depth-first topological sort, as Inductor's ``topological_sort_schedule``)
form one kernel.

Rule 3 approximation: subsets of a graph input (placeholder) still count as
shared data; this stands in for Inductor's locality reordering, which lines up
e.g. layer norms on slices of one input ahead of the extern calls. The fusion
cycle check treats a read through a view as a path leaving the group (the
stricter check these counts were calibrated with).

5. CAT: Inductor's CPU lowering always builds a ConcatKernel
   (``lowering.cat``: pointwise cat is off on CPU), so a cat never fuses
   with its producers or consumers. It is free when every input is a whole
   view (view/reshape/unsqueeze/...) of a generated, non-cat buffer not
   already written into an earlier cat; otherwise it is one copy node, which
   joins readers of the same data horizontally (rule 3).
6. Small matmuls decomposed into generated code (``decomposed_mm``): bmm
   with M == 1 or N == 1, whatever K (``tuned_bmm``: "decompose to small ops
   when memory bound"); addmm/mm per ``torch/_inductor/decomposition.py``.
7. Placement: lowering keeps a pointwise result unrealized (inlined into its
   readers) until a reader needs a buffer, so a generated group is scheduled
   at its first reader outside the group (views looked through; an extern
   call, a cat, the graph output), not where its first node is.
"""

from __future__ import annotations

import torch.fx as fx

from optimus_eqsat.extract.classify import arg_nodes
from optimus_eqsat.extract.cost_model import KernelKind
from optimus_eqsat.extract.fusion import Fusion, FusionStrategy, Range
from optimus_eqsat.extract.pricing import KernelPlan

__all__ = ["CppStrategy"]

K = KernelKind


class CppStrategy(FusionStrategy):
    """Cats isolated (free when realized in place), lazy placement, and one
    kernel of all generated code between two extern calls."""

    decomposed_mm = {
        "mm": lambda m, k, n: (m == 1 and n == 1) or (k == 1 and m != 1 and n != 1 and m + n <= 32),
        "addmm": lambda m, k, n: m == 1 and (n == 1 or (k <= 16 and n <= 16)),
        "bmm": lambda m, k, n: k == 1 or m == 1 or n == 1,
    }
    grouped_per_member = True  # the grouped linear's fallback runs one F.linear per member
    input_subsets_shared = True
    lazy_placement = True
    cat_copies_join = True

    def __init__(self) -> None:
        self.claimed: set[fx.Node] = set()  # buffers already realized into an earlier cat
        self.pending: list[fx.Node] = []  # generated code waiting for a flush

    def merge_range(self, a: Range | None, b: Range | None) -> tuple[bool, Range | None]:
        return True, a or b  # C++ kernels hold any mix of loop nests

    def isolated(self, fusion: Fusion) -> set[fx.Node]:
        return {n for n in fusion.groups.parent if fusion.kinds[n] is K.CAT}  # rule 5

    def concat_kernels(self, fusion: Fusion) -> set[fx.Node]:
        return self.isolated(fusion)  # rule 5: every cat

    def launches(self, fusion: Fusion, members: list[fx.Node]) -> bool:
        return not self._is_free_cat(fusion, members)

    def _is_free_cat(self, fusion: Fusion, members: list[fx.Node]) -> bool:
        """A cat (a singleton group) is free when each input is a whole view of a
        generated, non-cat buffer not already realized into an earlier cat: the
        producers write straight into the output slices (ConcatKernel)."""
        if any(fusion.kinds[m] is not K.CAT for m in members):
            return False
        inputs = [i for m in members for i in arg_nodes(m)]
        bases = [fusion.base[i] for i in inputs]
        free = (
            bool(inputs)
            and len(set(bases)) == len(bases)
            and all(fusion.realizes_into_cat(i) and fusion.base[i] not in self.claimed for i in inputs)
        )
        self.claimed.update(bases)
        return free

    def generated(self, fusion: Fusion, members: list[fx.Node]) -> list[KernelPlan]:
        self.pending.extend(members)  # joins the kernel the next extern call flushes
        return []

    def flush(self, fusion: Fusion) -> list[KernelPlan]:
        if not self.pending:
            return []
        plan = fusion.fused_plan(self.pending)
        self.pending = []
        return [plan]
