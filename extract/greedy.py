"""Fast greedy DAG extraction, acyclic by construction.

One *pass* picks a node per class bottom-up over the strongly connected
components of the class graph (children first). Outside cyclic components any
choice is acyclic; inside one, classes are finalized one at a time in the
order of Knuth's generalization of Dijkstra, and a node is eligible only once
all its children are finalized, so choices can never close a cycle whatever
the costs. Each pass is O(E log E).

A pass values a class as ``w[n] + sum(value[child] / share[child])``. The
extractor runs a few passes and keeps the cheapest by true DAG cost:

* ``tree``: plain tree cost (optimal for trees; egglog's built-in behaviour);
* ``amortized``: a child's value is split among the classes that could use it,
  so a batched node shared by F slices costs each slice 1/F of it;
* rounds of ``reuse`` (:func:`reuse_sweep`: switch a used class to a cheaper
  node over classes the program already computes) and ``paid`` passes (classes
  the best program computes are free inputs), while they improve. These recover the
  sharing that tree cost misses.
"""

from __future__ import annotations

import heapq
import math
import time

from optimus_eqsat.extract.egraph import CompactGraph, Extraction, ExtractionGraph, compact

__all__ = ["GreedyDagExtractor", "greedy_pass"]


def greedy_pass(
    cg: CompactGraph,
    comps: list[list[int]],
    cyclic: list[bool],
    labels: list[int],
    w: list[float],
    share: list[float],
    free: bytearray | None = None,
) -> list[int]:
    """One bottom-up pass; returns the chosen compact node per compact class.

    ``w``: per-node own cost for this pass (>= 0); ``share``: per-class divisor
    (>= 1) applied to a class's value when a parent uses it; ``free``: classes
    a parent may use at no cost (already computed by the current program).
    """
    free = free or bytearray(cg.n_classes)
    nodes_of, children_of, class_of = cg.class_nodes, cg.node_children, cg.node_class
    best = [-1] * cg.n_classes
    part = [0.0] * cg.n_classes  # value[c] / share[c], what a parent pays for c
    for members, is_cyclic in zip(comps, cyclic):
        if not is_cyclic:
            c = members[0]
            bv, bn = math.inf, -1
            for n in nodes_of[c]:
                v = w[n]
                for ch in children_of[n]:
                    v += part[ch]  # children live in earlier components: all chosen
                if bn < 0 or v < bv:
                    bv, bn = v, n
            best[c] = bn
            part[c] = 0.0 if free[c] else bv / share[c]
            continue
        # Cyclic component: Knuth/Dijkstra finalization keeps choices acyclic.
        label = labels[members[0]]
        heap: list[tuple[float, int]] = []
        partial: dict[int, float] = {}
        pending: dict[int, int] = {}
        waiting: dict[int, list[int]] = {}
        for c in members:
            for n in nodes_of[c]:
                v, cnt = w[n], 0
                for ch in children_of[n]:
                    if labels[ch] == label:
                        cnt += 1
                        waiting.setdefault(ch, []).append(n)
                    else:
                        v += part[ch]
                if cnt:
                    partial[n], pending[n] = v, cnt
                else:
                    heap.append((v, n))
        heapq.heapify(heap)
        while heap:
            v, n = heapq.heappop(heap)
            c = class_of[n]
            if best[c] >= 0:
                continue
            best[c] = n
            part[c] = 0.0 if free[c] else v / share[c]
            for m in waiting.get(c, ()):
                partial[m] += part[c]
                pending[m] -= 1
                if pending[m] == 0 and best[class_of[m]] < 0:
                    heapq.heappush(heap, (partial[m], m))
    return best


def _potential_fanin(cg: CompactGraph) -> list[float]:
    """Per class: how many other classes have a node that uses it (+1 for a root)."""
    users: list[set[int]] = [set() for _ in range(cg.n_classes)]
    for r in cg.roots:
        users[r].add(-1)  # the output is a user too
    for n, chs in enumerate(cg.node_children):
        p = cg.node_class[n]
        for ch in chs:
            if ch != p:
                users[ch].add(p)
    return [float(max(1, len(u))) for u in users]


class GreedyDagExtractor:
    """Greedy, sharing-aware, acyclic extractor for large e-graphs.

    Options: ``paid_rounds`` (default 3): maximum refinement rounds (reuse
    sweeps and paid passes); stops early at the first round that does not
    improve. 0 gives tree + amortized passes only.
    """

    name = "greedy"

    def __init__(self, paid_rounds: int = 3) -> None:
        self.paid_rounds = paid_rounds

    def extract(self, graph: ExtractionGraph) -> Extraction:
        """Extract all roots of ``graph`` together; raises ``ExtractionError``."""
        t0 = time.perf_counter()
        cg = compact(graph)
        ext = self.extract_compact(cg)
        ext.seconds = time.perf_counter() - t0
        return ext

    def extract_compact(self, cg: CompactGraph) -> Extraction:
        """Same as :meth:`extract` on an already pruned graph."""
        comps, cyclic, labels = cg.components()
        cost = cg.node_cost
        ones = [1.0] * cg.n_classes
        fanin = _potential_fanin(cg)
        best: list[int] = []
        best_cost, best_name = math.inf, ""

        def consider(name: str, picked: list[int]) -> bool:
            nonlocal best, best_cost, best_name
            c = _cost(cg, picked)
            if not best or c < best_cost:
                best, best_cost, best_name = picked, c, name
                return True
            return False

        consider("tree", greedy_pass(cg, comps, cyclic, labels, cost, ones))
        shared = any(x > 1.0 for x in fanin)  # without sharing, tree cost is exact
        if shared:
            consider("amortized", greedy_pass(cg, comps, cyclic, labels, cost, fanin))
        for r in range(self.paid_rounds if shared else 0):
            improved = consider(f"reuse{r}", reuse_sweep(cg, best))
            improved |= consider(f"reuse{r}-flipped", reuse_sweep(cg, best, flip=True))
            # Re-run the passes with what the best program computes as free inputs.
            used = bytearray(cg.n_classes)
            for c in _post_order(cg, best):
                used[c] = 1
            improved |= consider(f"paid{r}", greedy_pass(cg, comps, cyclic, labels, cost, ones, used))
            improved |= consider(f"paid{r}-amortized", greedy_pass(cg, comps, cyclic, labels, cost, fanin, used))
            if not improved:
                break
        choice, _ = cg.to_choice(best)
        return Extraction(
            choice,
            best_cost,
            "greedy",
            optimal=False,
            gap=None,
            info={"pass": best_name, "classes": cg.n_classes, "nodes": cg.n_nodes},
        )


def reuse_sweep(cg: CompactGraph, best: list[int], free_limit: int = 64, flip: bool = False) -> list[int]:
    """Local search: re-choose each used class given what the program computes.

    Classes are visited children-first in a topological order of the current
    program. A class switches to another node whose children are all used
    classes earlier in that order (so the order stays valid and the program
    acyclic) when that is cheaper: its own cost against the current node's
    cost plus what the switch frees (classes nobody else uses; explored up to
    ``free_limit`` classes, a lower bound on the saving). ``flip`` walks
    roots and children in reverse, giving another valid order to try.
    """
    order = _post_order(cg, best, flip)
    pos = {c: i for i, c in enumerate(order)}
    new = list(best)
    cost, children_of = cg.node_cost, cg.node_children
    refs = [0] * cg.n_classes  # users in the current program (+1 per root)
    for c in order:
        for ch in children_of[new[c]]:
            refs[ch] += 1
    for r in cg.roots:
        refs[r] += 1

    def freed(n: int) -> list[int]:
        """Classes freed if node n (chosen now) were dropped; bounded."""
        dec: dict[int, int] = {}
        out: list[int] = []
        stack = list(children_of[n])
        while stack and len(out) < free_limit:
            ch = stack.pop()
            dec[ch] = d = dec.get(ch, 0) + 1
            if d == refs[ch]:
                out.append(ch)
                stack.extend(children_of[new[ch]])
        return out

    for c in order:
        if refs[c] == 0:
            continue  # freed by an earlier switch
        here, cur = pos[c], new[c]
        lost: list[int] | None = None
        best_n, best_delta = cur, 0.0
        for n in cg.class_nodes[c]:
            if n == cur or not all(refs[ch] and pos[ch] < here for ch in children_of[n]):
                continue
            delta = cost[n] - cost[cur]
            if delta >= best_delta:
                if lost is None:
                    lost = freed(cur)
                if any(ch in lost for ch in children_of[n]):
                    continue  # n would keep part of it alive: not worth the bookkeeping
                delta -= math.fsum(cost[new[k]] for k in lost)
            if delta < best_delta:
                best_n, best_delta = n, delta
        if best_n != cur:
            for ch in children_of[best_n]:
                refs[ch] += 1
            stack = list(children_of[cur])
            while stack:
                ch = stack.pop()
                refs[ch] -= 1
                if refs[ch] == 0:
                    stack.extend(children_of[new[ch]])
            new[c] = best_n
    return new


def _post_order(cg: CompactGraph, best: list[int], flip: bool = False) -> list[int]:
    """Classes reachable from the roots through ``best``, children first (iterative)."""
    state = bytearray(cg.n_classes)  # 0 new, 1 seen
    order: list[int] = []
    children_of = cg.node_children
    if flip:
        children_of = [chs[::-1] for chs in children_of]
    for root in cg.roots[::-1] if flip else cg.roots:
        if state[root]:
            continue
        state[root] = 1
        stack = [root]
        index = [0]
        while stack:
            c = stack[-1]
            chs = children_of[best[c]]
            i = index[-1]
            while i < len(chs) and state[chs[i]]:
                i += 1
            if i < len(chs):
                index[-1] = i + 1
                ch = chs[i]
                state[ch] = 1
                stack.append(ch)
                index.append(0)
            else:
                order.append(c)
                stack.pop()
                index.pop()
    return order


def _cost(cg: CompactGraph, best: list[int]) -> float:
    """DAG cost of an acyclic per-class choice (reachable nodes, once each)."""
    seen = bytearray(cg.n_classes)
    stack = list(cg.roots)
    for r in stack:
        seen[r] = 1
    total: list[float] = []
    cost, children_of = cg.node_cost, cg.node_children
    while stack:
        n = best[stack.pop()]
        total.append(cost[n])
        for ch in children_of[n]:
            if not seen[ch]:
                seen[ch] = 1
                stack.append(ch)
    return math.fsum(total)
