"""The fusion model: which kernels Inductor launches for an FX graph, in what order.

A simplification of Inductor's scheduler over classified FX nodes
(classify.py). What every code generator shares lives here; where Triton
(GPU) and C++ (CPU) code generation differ, the core calls its
:class:`FusionStrategy` (fusion_triton.py, fusion_cpp.py).

Fusion rules modelled
---------------------
1. Views (slice, view/reshape, permute, getitem, ...) launch nothing; a
   consumer of a view of X is treated as a consumer of X.
2. Vertical fusion: a POINTWISE / REDUCTION / CAT / GATHER node joins the
   group of each fusible producer (union-find), if the iteration ranges are
   compatible (per code generator: ``FusionStrategy.merge_range``) and the
   merge keeps the group graph acyclic (no path that leaves the group and
   comes back).
3. Horizontal fusion: fusible groups reading the same data are merged under
   the same two conditions (Inductor only fuses nodes that share data). "Same
   data" is Inductor's shared MemoryDep (buffer and index): a whole buffer or
   one and the same subset view; two different slices of one buffer do not
   share data (but see the C++ strategy's approximation for graph inputs).
4. MATMUL (mm/addmm/bmm/linear/conv) and OPAQUE ops are extern calls: one
   launch each, never fused. A linear with bias is one ``addmm`` (bias fused).
5. CAT: lowered per code generator (rule 5 in fusion_cpp.py, rules 9 and 10
   in fusion_triton.py).
6. Small matmuls Inductor decomposes into generated code: classify.py, with
   each code generator's ``decomposed_mm`` table.
7. Placement and rules 8-11: per code generator.

Launching units are the fused groups the strategy keeps (minus free cats and
inlined groups) and the extern calls; they are scheduled as Inductor's
``topological_sort_schedule`` does: by first node (or where the strategy
places them), then a depth-first topological sort. The strategy turns each
unit into planned kernels (:class:`~.pricing.KernelPlan`); pricing.py prices them.

Approximations: Inductor's memory-driven reordering
(``reorder_for_peak_memory``, which for example moves an expert's last relu
up next to its addmm so that it splits the run of extern calls: the model
then predicts a few kernels too few on MMoE/PLE-style expert stacks) and
post-grad ``reorder_for_locality``, ``max_fusion_size``,
pointwise-cat input limits, realization heuristics, epilogue/template fusion
(max-autotune) and the C++ backend's argument-count flush are not modelled;
shapes that are unknown are treated as compatible (optimistic fusion).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch.fx as fx

from optimus_eqsat.extract.classify import DecomposedMM, Infos, arg_nodes, has_bias
from optimus_eqsat.extract.cost_model import FUSIBLE_KINDS, KernelKind
from optimus_eqsat.extract.pricing import EXTERN, KernelPlan
from optimus_eqsat.fxvocab import WHOLE_VIEW_OPS, op_label, target_name

__all__ = ["Fusion", "FusionStrategy", "Groups", "Range", "kind_of_group", "whole_view"]

K = KernelKind
Range = tuple[int, int]  # (outer numel, reduction numel); r == 1 for pointwise


class Groups:
    """Union-find of fusible nodes with members, first position and range."""

    def __init__(self, pos: dict[fx.Node, int]):
        self.pos = pos
        self.parent: dict[fx.Node, fx.Node] = {}
        self.members: dict[fx.Node, list[fx.Node]] = {}
        self.range: dict[fx.Node, Range | None] = {}
        self.min_pos: dict[fx.Node, int] = {}
        # Inputs from outside the group, kept per root so cycle checks cost the
        # group's boundary, not its size (long fused chains were quadratic).
        self.external: dict[fx.Node, set[fx.Node]] = {}

    def add(self, node: fx.Node, rng: Range | None) -> None:
        self.parent[node] = node
        self.members[node] = [node]
        self.range[node] = rng
        self.min_pos[node] = self.pos[node]
        self.external[node] = set(arg_nodes(node)) - {node}

    def find(self, node: fx.Node) -> fx.Node:
        root = node
        while self.parent[root] is not root:
            root = self.parent[root]
        while self.parent[node] is not root:  # path compression
            self.parent[node], node = root, self.parent[node]
        return root

    def union(self, a: fx.Node, b: fx.Node, rng: Range | None) -> fx.Node:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return ra
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra].extend(self.members.pop(rb))
        self.min_pos[ra] = min(self.min_pos[ra], self.min_pos.pop(rb))
        joined = self.external[ra] | self.external.pop(rb)
        self.external[ra] = {p for p in joined if p not in self.parent or self.find(p) is not ra}
        self.range[ra] = rng
        self.range.pop(rb, None)
        return ra


def kind_of_group(kinds: Iterable[KernelKind]) -> KernelKind:
    """The kind of a fused kernel: REDUCTION if it holds one, else POINTWISE
    (GATHER / CAT when it holds only those)."""
    kinds = set(kinds) & FUSIBLE_KINDS
    for kind in (K.REDUCTION, K.POINTWISE, K.GATHER, K.CAT):
        if kind in kinds and (kind is not K.GATHER or kinds <= {K.GATHER, K.CAT}):
            return kind
    return K.POINTWISE


def whole_view(gm: fx.GraphModule, inp: fx.Node, base: fx.Node) -> bool:
    """True when ``inp`` is ``base`` or a chain of whole views of it (no subset, same order)."""
    node = inp
    while node is not base:
        if op_label(gm, node) not in WHOLE_VIEW_OPS:
            return False  # slice / select / permute ...: a strided subset
        node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
    return True


class FusionStrategy:
    """What one code generator decides; the hooks :class:`Fusion` calls.

    One instance per prediction (strategies keep per-graph state). A
    strategy gives ``merge_range``; the other hooks default to the plain rules
    of this module (no lowering decisions, every group launches one kernel).
    """

    # Rule 6: form ("mm", "addmm", "bmm") -> predicate on (M, K, N).
    decomposed_mm: DecomposedMM = {}
    # A grouped linear runs as one F.linear per member (priced per member).
    grouped_per_member = False
    # Rule 3: subsets of a graph input (placeholder) count as shared data.
    input_subsets_shared = False
    # Cycle check: a consumer reading a member through a view reads it directly.
    views_read_directly = False
    # Schedule generated units where they are realized (their first reader).
    lazy_placement = False
    # Isolated cats join the readers of the inputs they copy horizontally.
    cat_copies_join = False

    def merge_range(self, a: Range | None, b: Range | None) -> tuple[bool, Range | None]:
        """(compatible, merged range) of two iteration ranges (None: unknown)."""
        raise NotImplementedError

    def lower(self, fusion: Fusion) -> None:
        """Lowering decisions made before fusion (may force merges)."""

    def isolated(self, fusion: Fusion) -> set[fx.Node]:
        """Nodes that never fuse with their producers or consumers."""
        return set()

    def keeps_apart(self, fusion: Fusion, producer: fx.Node, node: fx.Node) -> bool:
        """True when ``node`` must not join ``producer``'s group vertically."""
        return False

    def launches(self, fusion: Fusion, members: list[fx.Node]) -> bool:
        """Whether a fused group launches code (False: free, or inlined into its readers)."""
        return True

    def generated(self, fusion: Fusion, members: list[fx.Node]) -> list[KernelPlan]:
        """The kernels of one scheduled generated unit."""
        return [fusion.fused_plan(members)]

    def flush(self, fusion: Fusion) -> list[KernelPlan]:
        """Kernels of generated code still pending (before an extern call, at the end)."""
        return []

    def concat_kernels(self, fusion: Fusion) -> set[fx.Node]:
        """The cats built as a ConcatKernel (a buffer whose input slots the wrapper names)."""
        return set()


class Fusion:
    """Groups fusible nodes of one graph into generated kernels, and schedules them."""

    def __init__(self, gm: fx.GraphModule, kinds: dict[fx.Node, KernelKind], infos: Infos, strategy: FusionStrategy):
        self.nodes = list(gm.graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self.gm, self.kinds, self.infos, self.strategy = gm, kinds, infos, strategy
        self.base: dict[fx.Node, fx.Node] = {}
        self.groups = Groups(self.pos)
        # Groups that launch nothing: recomputed inside their readers (strategy's choice).
        self.inlined: set[fx.Node] = set()
        self._consumers: dict[fx.Node, list[fx.Node]] = {}

    # -- data flow through views -------------------------------------------
    def _view_source(self, node: fx.Node) -> fx.Node | None:
        """The node a view reads (its first tensor argument); None when ``node`` is no view."""
        if self.kinds[node] is not K.VIEW:
            return None
        src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if src is None and node.all_input_nodes:
            src = node.all_input_nodes[0]
        return src

    def _resolve_views(self) -> None:
        # Walks each view chain down to its base rather than trusting node order: graphs
        # after Inductor's own post-grad passes need not list a view after its source.
        for node in self.nodes:
            chain, n = [], node
            while n not in self.base:
                src = self._view_source(n)
                if src is None:
                    self.base[n] = n
                    break
                chain.append(n)
                n = src
            for viewed in chain:
                self.base[viewed] = self.base[n]

    def read_key(self, inp: fx.Node) -> fx.Node:
        """What reading ``inp`` touches: its base buffer when ``inp`` is (a whole
        view of) it, else the subset view itself (a slice, select, ...)."""
        if self.strategy.input_subsets_shared and self.base[inp].op == "placeholder":
            return self.base[inp]
        node = inp
        while node is not self.base[inp]:
            if target_name(node.target) not in WHOLE_VIEW_OPS and node.op != "call_module":
                return inp
            node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else node.all_input_nodes[0]
        return node

    def producers(self, node: fx.Node) -> list[fx.Node]:
        """Buffers ``node`` reads (views resolved), in argument order."""
        seen: dict[fx.Node, None] = {}
        for inp in arg_nodes(node):
            seen.setdefault(self.base[inp], None)
        return list(seen)

    def consumers(self, node: fx.Node) -> list[fx.Node]:
        """Non-view users of ``node``, views looked through (the output node included).

        Memoized: cat planning asks again for every cat reading a node, and a batched
        tensor can have thousands of view users (seconds per prediction at 2,000 features).
        """
        if node in self._consumers:
            return self._consumers[node]
        out: list[fx.Node] = []
        self._consumers[node] = out
        stack = list(node.users)
        seen: set[fx.Node] = set()
        while stack:
            user = stack.pop()
            if user in seen:
                continue
            seen.add(user)
            if self.kinds.get(user) is K.VIEW:
                stack.extend(user.users)
            else:
                out.append(user)
        return out

    def realizes_into_cat(self, inp: fx.Node) -> bool:
        """True when cat input ``inp`` needs no copy: it is (a whole view of) a
        buffer computed by generated code, not itself a cat (ConcatKernel
        ``can_realize_into_without_copy``: FlexibleLayout, not extern output)."""
        base = self.base[inp]
        if base not in self.groups.parent or self.kinds[base] is K.CAT:
            return False
        return whole_view(self.gm, inp, base)

    def _range(self, node: fx.Node) -> Range | None:
        """(outer, r) iteration range; a reduction's r = biggest input / output."""
        out = self.infos.get(node)
        if not out or out[0].numel is None:
            return None
        numel = out[0].numel
        if self.kinds[node] is not K.REDUCTION:
            return (numel, 1)
        ins = [info.numel for i in arg_nodes(node) for info in (self.infos.get(i) or [])]
        biggest = max((n for n in ins if n is not None), default=0)
        if numel == 0 or biggest <= numel:
            return (numel, 1)
        return (numel, biggest // numel)

    # -- acyclicity ----------------------------------------------------------
    def _creates_cycle(self, roots: Iterable[fx.Node]) -> bool:
        """Would contracting the groups ``roots`` into one make a cycle?

        True when a path leaves the union and comes back into it; searched
        upward from the union's external inputs, pruned below its first node.
        """
        roots = set(roots)
        groups = self.groups
        floor = min(groups.min_pos[r] for r in roots)
        stack = [p for r in roots for p in groups.external[r]]
        if self.strategy.views_read_directly:
            stack = [self.base[p] for p in stack]
        stack = [p for p in stack if p not in groups.parent or groups.find(p) not in roots]
        seen: set[fx.Node] = set()
        while stack:
            node = stack.pop()
            if node in seen or self.pos[node] < floor:
                continue
            seen.add(node)
            if node in groups.parent:  # a whole group moves as one unit
                root = groups.find(node)
                if root in roots:
                    return True
                for m in groups.members[root]:
                    seen.add(m)
                stack.extend(groups.external[root])
            else:
                stack.extend(arg_nodes(node))
        return False

    def try_merge(self, a: fx.Node, b: fx.Node) -> bool:
        """Merge the groups of ``a`` and ``b`` if their ranges fit and no cycle results."""
        ra, rb = self.groups.find(a), self.groups.find(b)
        if ra is rb:
            return True
        ok, rng = self.strategy.merge_range(self.groups.range[ra], self.groups.range[rb])
        if not ok or self._creates_cycle((ra, rb)):
            return False
        self.groups.union(ra, rb, rng)
        return True

    def force_merge(self, prod: fx.Node, into: fx.Node) -> bool:
        """Merge ``prod``'s group into ``into``'s whatever their numel (``into``'s
        range is kept), unless a reduction's range is in the way or a cycle results."""
        ra, rb = self.groups.find(prod), self.groups.find(into)
        if ra is rb:
            return True
        if any(rng is not None and rng[1] > 1 for rng in (self.groups.range[ra], self.groups.range[rb])):
            return self.try_merge(prod, into)
        if self._creates_cycle((ra, rb)):
            return False
        self.groups.union(ra, rb, self.groups.range[rb])
        return True

    # -- passes ----------------------------------------------------------------
    def run(self) -> Groups:
        """Group the fusible nodes (rules 1-3 and the strategy's lowering decisions)."""
        self._resolve_views()
        for node in self.nodes:
            if self.kinds[node] in FUSIBLE_KINDS:
                self.groups.add(node, self._range(node))
        self.strategy.lower(self)
        isolated = self.strategy.isolated(self)
        # Vertical: join each fusible producer's group.
        for node in self.nodes:
            if node not in self.groups.parent or node in isolated:
                continue
            for prod in self.producers(node):
                if prod not in self.groups.parent or prod in isolated:
                    continue
                if self.strategy.keeps_apart(self, prod, node):
                    continue
                self.try_merge(prod, node)
        # Horizontal: consumers of one buffer that share the read.
        # The read must be the same elements (Inductor's shared MemoryDep:
        # buffer and index), so two different slices of one buffer do not count.
        # An isolated cat copies the inputs it cannot realize in place; where the
        # strategy says so, those copies share reads with the inputs' other readers.
        readers: dict[fx.Node, list[fx.Node]] = {}
        for node in self.nodes:
            if node not in self.groups.parent:
                continue
            inputs = arg_nodes(node)
            if node in isolated:
                if not self.strategy.cat_copies_join:
                    continue
                inputs = [i for i in inputs if not self.realizes_into_cat(i)]
            for inp in dict.fromkeys(self.read_key(i) for i in inputs):
                readers.setdefault(inp, []).append(node)
        for group in readers.values():
            for other in group[1:]:
                self.try_merge(group[0], other)
        return self.groups

    # -- kernels -----------------------------------------------------------------
    def fused_plan(self, members: Sequence[fx.Node]) -> KernelPlan:
        """One generated kernel holding ``members``."""
        labels = dict.fromkeys(op_label(self.gm, m) for m in members)
        return KernelPlan(kind_of_group(self.kinds[m] for m in members), tuple(members), "fused: " + "+".join(labels))

    def _extern_plan(self, node: fx.Node) -> KernelPlan:
        label = op_label(self.gm, node)
        kind = self.kinds[node]
        note = f"{label} -> addmm (bias fused)" if kind is K.MATMUL and has_bias(self.gm, node, label) else label
        return KernelPlan(kind, (node,), note, EXTERN)

    def _is_extern(self, members: list[fx.Node]) -> bool:
        return len(members) == 1 and self.kinds[members[0]] in (K.MATMUL, K.OPAQUE)

    def kernel_plans(self) -> list[KernelPlan]:
        """The kernels Inductor is predicted to launch, in schedule order (not priced)."""
        groups = self.run()
        units: list[list[fx.Node]] = []
        for node in self.nodes:
            if node in groups.parent and groups.find(node) is node:
                members = sorted(groups.members[node], key=self.pos.__getitem__)
                if self.strategy.launches(self, members):
                    units.append(members)
            elif self.kinds[node] in (K.MATMUL, K.OPAQUE):
                units.append([node])
        unit_of = {m: i for i, members in enumerate(units) for m in members}
        plans: list[KernelPlan] = []
        for idx in self._schedule(units, unit_of):
            members = units[idx]
            if self._is_extern(members):
                plans.extend(self.strategy.flush(self))
                plans.append(self._extern_plan(members[0]))
            else:
                plans.extend(self.strategy.generated(self, members))
        plans.extend(self.strategy.flush(self))
        return plans

    def _units_behind(self, buf: fx.Node, unit_of: dict[fx.Node, int]) -> set[int]:
        """Units producing ``buf``: its own, or for a free cat (an inlined
        pointwise group) those of its inputs."""
        if buf in unit_of:
            return {unit_of[buf]}
        if self.kinds[buf] is not K.CAT and buf not in self.inlined:
            return set()
        return {u for p in self.producers(buf) for u in self._units_behind(p, unit_of)}

    def realized_at(self, members: Sequence[fx.Node]) -> int:
        """Position where Inductor materializes a generated group: lowering keeps
        a pointwise result unrealized (inlined into its readers) until a reader
        needs a buffer, so the group's code lands at its first reader outside
        the group (views and cats looked through; the graph output is the end)."""
        inside = set(members)
        best = None
        stack = [u for m in members for u in m.users]
        seen: set[fx.Node] = set()
        while stack:
            user = stack.pop()
            if user in seen or user in inside:
                continue
            seen.add(user)
            if self.kinds.get(user) is K.VIEW:
                stack.extend(user.users)
                continue
            pos = self.pos[user]
            best = pos if best is None else min(best, pos)
        return best if best is not None else max(self.pos[m] for m in members)

    def _schedule(self, units: list[list[fx.Node]], unit_of: dict[fx.Node, int]) -> list[int]:
        """Inductor-like order: units by first node (``lazy_placement``: generated
        units at the reader that realizes them, see :meth:`realized_at`), then a
        depth-first topological sort visiting dependencies in that order
        (iterative: graphs are deep)."""
        lazy = self.strategy.lazy_placement

        def key(members: list[fx.Node]) -> int:
            if lazy and not self._is_extern(members):
                return self.realized_at(members)
            return min(self.pos[m] for m in members)

        first = [key(members) for members in units]
        deps: list[list[int]] = []
        for idx, members in enumerate(units):
            found = {u for m in members for b in self.producers(m) for u in self._units_behind(b, unit_of)}
            found.discard(idx)
            deps.append(sorted(found, key=lambda u: first[u]))
        order: list[int] = []
        state = [0] * len(units)  # 0 new, 1 open, 2 done
        for start in sorted(range(len(units)), key=lambda u: first[u]):
            stack = [(start, 0)]
            while stack:
                unit, i = stack.pop()
                if state[unit] == 2:
                    continue
                state[unit] = 1
                while i < len(deps[unit]) and state[deps[unit][i]] != 0:
                    i += 1
                if i < len(deps[unit]):
                    stack.append((unit, i + 1))
                    stack.append((deps[unit][i], 0))
                else:
                    state[unit] = 2
                    order.append(unit)
        return order
