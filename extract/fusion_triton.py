"""Fusion strategy of Inductor's Triton code generator (GPU profiles, codegen "triton").

Each fused group is one kernel. Ranges: pointwise ranges must have equal
numel; a reduction ``(outer, r)`` fuses with pointwise of numel ``outer`` or
``outer * r``; two reductions only if their ranges are equal. Slices of a
graph input do not share data (rule 3; GPU dumps: dcnv2's 16 lookups on
columns of one index input are 16 kernels, dynamic_schema's 20 layer norms on
slices of one input are 20). A consumer reading a producer through a view is
a direct read in the fusion cycle check.

Rule 6 on GPU (``decomposed_mm``): mm/addmm with K == 1 (M, N > 1) are
pointwise products; a dot-shaped bmm (M == N == 1, K <= 32, float dtypes
assumed) stays generated code (kernel/bmm.py ``tuned_bmm``).

Rules calibrated on Inductor's CUDA output code (torch 2.11, H200;
benchmarks/results/gpu/code/, dcnv2 and dynamic_schema under Inductor,
Inductor+Optimus and optimus_eqsat graphs):

8. A layer norm over fewer than 8 elements (``unroll_reductions_threshold``)
   is two kernels: a statistics kernel over the rows and an output kernel
   over all elements, which cannot fuse with the norm's input producer (the
   statistics sit between). Evidence: dynamic_schema's width-4 norms are
   ``triton_poi_..._layer_norm`` (32) + ``triton_poi_..._layer_norm`` (128);
   widths 8 and 16 are one ``triton_per_`` kernel.
9. A cat with more than 8 inputs (``max_pointwise_cat_inputs``), or one that
   rule 10 does not make pointwise, is a ConcatKernel: it never fuses; a whole
   view of a generated buffer is computed straight into its slice (free);
   copies of graph inputs (placeholders, parameters) are one foreach kernel
   (``triton_for_fused``, ``register_operation_list``); every other input (a
   slice of a generated buffer, an extern output) is one copy kernel of its
   own. Evidence: dcnv2's 17-input cat (one dense copy, lookups write their
   slices); our dynamic_schema graph's 20-input parameter cats (one
   ``triton_for_fused`` each) and its 20-input cat of narrows (20 kernels).
10. A cat with at most 8 inputs is one pointwise kernel when (some input
   needs a copy and every reader is pointwise or a cat) or (every input needs
   a copy and none reads a reduction); "needs a copy": an unrealized
   pointwise value, or a graph input / extern output. The pointwise cat
   inlines its unrealized inputs and, recursively, their unrealized
   producers read only by them, whatever their numel. "Unrealized": a
   pointwise value (incl. gathers, one-element sums, pointwise cats) with at
   most 8 accumulated reads and a small inner function (30 ops, a cat input
   counted as 5), and if read more than once at most 4 reads
   (``realize_acc_reads_threshold``, ``realize_opcount_threshold``,
   ``realize_reads_threshold``). Evidence: dcnv2's last cat
   (``triton_poi_fused_add_addmm_cat_mul_relu``), dynamic_schema's per-block
   cats (one kernel for 8 linear epilogues), unbind->stack with tanh.
11. A pointwise group whose outputs are all read by generated code that
   inlines them (no extern call, not the graph output, not realized into a
   ConcatKernel slice) launches nothing. Evidence: our dynamic_schema graph's
   batched add+relu / add+sigmoid / tanh read through 20 narrows are
   recomputed in the 20 copy kernels.

Not modelled: the GPU post-grad pass that turns addmm into mm + a bias add
fused into pointwise readers (count-neutral in these dumps), the Optimus
post-grad batching passes (one extra ``unbind`` copy kernel in
dynamic_schema's Inductor+Optimus dump), combo kernels (off by default).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from optimus_eqsat.extract.classify import arg_nodes
from optimus_eqsat.extract.cost_model import FUSIBLE_KINDS, KernelKind
from optimus_eqsat.extract.fusion import Fusion, FusionStrategy, Range, whole_view
from optimus_eqsat.extract.pricing import CAT_COPY, NORM_STATS, KernelPlan
from optimus_eqsat.fxvocab import LAYER_NORM_OPS, NORM_MODULE_LABELS, NORM_OPS, op_label

__all__ = ["MAX_POINTWISE_CAT_INPUTS", "TritonStrategy"]

K = KernelKind

# Inductor constants of these rules (torch/_inductor/config.py).
UNROLL_REDUCTIONS_THRESHOLD = 8  # unroll_reductions_threshold: r < 8 becomes pointwise code
MAX_POINTWISE_CAT_INPUTS = 8  # max_pointwise_cat_inputs
REALIZE_ACC_READS = 8  # realize_acc_reads_threshold: more reads, the value is realized
REALIZE_READS = 4  # realize_reads_threshold: a reused value with more reads is realized
REALIZE_OPCOUNT = 30  # realize_opcount_threshold: a bigger inner function is realized
CAT_OPS_PER_INPUT = 5  # ops of one pointwise-cat input (bounds check, mask, masked load, where)

_UNROLLED_NORM_LABELS = LAYER_NORM_OPS | {"LayerNorm"}  # rule 8: functions and the module
_NORM_LABELS = NORM_OPS | NORM_MODULE_LABELS  # lowercased labels of normalizations


def _norm_size(node: fx.Node) -> int | None:
    """Elements one functional layer norm reduces over (its normalized_shape), if known."""
    shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
    if node.op == "call_module":
        return None  # LayerNorm modules: read from the module, see TritonStrategy.lower
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list)) and all(isinstance(d, int) for d in shape):
        total = 1
        for d in shape:
            total *= d
        return total
    return None


class TritonStrategy(FusionStrategy):
    """Rules 8-11: unrolled norms, pointwise vs ConcatKernel cats, concat copies,
    inlined groups and realization."""

    decomposed_mm = {
        "mm": lambda m, k, n: k == 1 and m != 1 and n != 1,
        "addmm": lambda m, k, n: k == 1 and m != 1 and n != 1,
        "bmm": lambda m, k, n: k == 1 or (m == 1 and n == 1 and k <= 32),
    }
    views_read_directly = True

    def __init__(self) -> None:
        self.unrolled: set[fx.Node] = set()  # layer norms whose reduction Inductor unrolls (rule 8)
        self.pw_cats: set[fx.Node] = set()  # cats lowered as one pointwise kernel (rule 10)
        self.concat_cats: set[fx.Node] = set()  # cats lowered as a ConcatKernel (rule 9)
        self.absorbed: dict[fx.Node, list[fx.Node]] = {}  # pointwise cat -> producers it inlines
        self.unrealized: dict[fx.Node, bool] = {}  # pointwise values kept inlined in their readers
        self.acc_reads: dict[fx.Node, set[fx.Node]] = {}
        self.copies: dict[fx.Node, int] = {}  # ConcatKernel -> its copy kernels

    def merge_range(self, a: Range | None, b: Range | None) -> tuple[bool, Range | None]:
        if a is None or b is None:
            return True, a or b
        (na, ra), (nb, rb) = a, b
        if ra == 1 and rb == 1:
            return na == nb, a
        if ra > 1 and rb > 1:
            return a == b, a
        red, pw = (a, b) if ra > 1 else (b, a)
        return pw[0] in (red[0], red[0] * red[1]), red

    # -- lowering decisions (before fusion) ------------------------------------
    def _pointwise_like(self, fusion: Fusion, node: fx.Node) -> bool:
        """An Inductor ``Pointwise`` at lowering: elementwise ops, gathers
        (embedding is an indirect load), reductions over one element, pointwise cats."""
        kind = fusion.kinds[node]
        if node in self.pw_cats or kind in (K.POINTWISE, K.GATHER):
            return True
        if kind is not K.REDUCTION or op_label(fusion.gm, node).lower() in _NORM_LABELS:
            return False
        rng = fusion.groups.range.get(node) if node in fusion.groups.parent else None
        return rng is not None and rng[1] == 1  # a sum over one element

    def lower(self, fusion: Fusion) -> None:
        """Decide, in graph order, which nodes stay unrealized (inlined into
        their readers) and how each cat is lowered (lowering.py ``cat``); then
        merge each pointwise cat with the producers it inlines (rule 10)."""
        reads_reduction: dict[fx.Node, bool] = {}
        opcount: dict[fx.Node, int] = {}
        for node in fusion.nodes:
            kind = fusion.kinds[node]
            if kind is K.REDUCTION and op_label(fusion.gm, node) in _UNROLLED_NORM_LABELS:
                r = _norm_size(node)
                if node.op == "call_module":
                    shape = getattr(fusion.gm.get_submodule(node.target), "normalized_shape", None)
                    r = None if shape is None else int(torch.Size(shape).numel())
                if r is not None and 1 < r < UNROLL_REDUCTIONS_THRESHOLD:
                    self.unrolled.add(node)
            if kind is K.CAT and node in fusion.groups.parent:
                self._plan_cat(fusion, node, reads_reduction)
            if not self._pointwise_like(fusion, node):
                continue
            acc: set[fx.Node] = set()
            red = False
            inputs = arg_nodes(node)
            # inner-function size: a masked load per cat input, one op per node
            ops = CAT_OPS_PER_INPUT * len(inputs) if node in self.pw_cats else 1
            for inp in inputs:
                b = fusion.base[inp]
                if self.unrealized.get(b):
                    acc |= self.acc_reads[b]
                    red = red or reads_reduction[b]
                    ops += opcount[b]
                else:
                    acc.add(fusion.read_key(inp))
                    red = red or (fusion.kinds[b] is K.REDUCTION and not self._pointwise_like(fusion, b))
            self.acc_reads[node] = acc
            reads_reduction[node] = red
            opcount[node] = ops
            # realize_acc_reads_threshold (8), realize_opcount_threshold (30);
            # on reuse, realize_reads_threshold (4)
            self.unrealized[node] = (
                len(acc) <= REALIZE_ACC_READS
                and ops <= REALIZE_OPCOUNT
                and (len(node.users) <= 1 or len(acc) <= REALIZE_READS)
            )
        # A pointwise cat inlines its unrealized inputs first (rule 10).
        for cat in fusion.nodes:
            for prod in self.absorbed.get(cat, ()):
                fusion.force_merge(prod, cat)

    def _plan_cat(self, fusion: Fusion, cat: fx.Node, reads_reduction: dict[fx.Node, bool]) -> None:
        inputs = [i for i in arg_nodes(cat) if fusion.infos.get(i) != []]
        if not inputs or len(inputs) > MAX_POINTWISE_CAT_INPUTS:
            self.concat_cats.add(cat)
            return
        needs_copy, reduction = [], []
        for inp in inputs:
            b = fusion.base[inp]
            unrealized = bool(self.unrealized.get(b))
            needs_copy.append(unrealized or b not in fusion.groups.parent)
            reduction.append(
                (fusion.kinds[b] is K.REDUCTION and not self._pointwise_like(fusion, b))
                or (unrealized and reads_reduction.get(b, False))
            )
        users = fusion.consumers(cat)
        pointwise_uses = bool(users) and all(fusion.kinds.get(u) in (K.POINTWISE, K.CAT) for u in users)
        if (any(needs_copy) and pointwise_uses) or (all(needs_copy) and not any(reduction)):
            self.pw_cats.add(cat)
            # Inlined: each unrealized input read only here, and, recursively,
            # the unrealized producers read only by an inlined node.
            absorbed = [
                fusion.base[i]
                for i in inputs
                if self.unrealized.get(fusion.base[i]) and len(fusion.consumers(fusion.base[i])) == 1
            ]
            stack = list(absorbed)
            while stack:
                for inp in arg_nodes(stack.pop()):
                    prod = fusion.base[inp]
                    if self.unrealized.get(prod) and prod not in absorbed and len(fusion.consumers(prod)) == 1:
                        absorbed.append(prod)
                        stack.append(prod)
            self.absorbed[cat] = absorbed
        else:
            self.concat_cats.add(cat)

    # -- fusion hooks --------------------------------------------------------------
    def isolated(self, fusion: Fusion) -> set[fx.Node]:
        return set(self.concat_cats)  # rule 9: a ConcatKernel never fuses

    def concat_kernels(self, fusion: Fusion) -> set[fx.Node]:
        return set(self.concat_cats)

    def keeps_apart(self, fusion: Fusion, producer: fx.Node, node: fx.Node) -> bool:
        return node in self.unrolled and fusion.kinds[producer] in FUSIBLE_KINDS  # rule 8: stats between

    # -- launching units -------------------------------------------------------------
    def launches(self, fusion: Fusion, members: list[fx.Node]) -> bool:
        root = fusion.groups.find(members[0])
        if root in self.concat_cats:
            self.copies[root] = self._concat_copies(fusion, root)
            return bool(self.copies[root])
        if self._is_inlined(fusion, members):
            fusion.inlined.update(members)
            return False
        return True

    def _concat_copies(self, fusion: Fusion, cat: fx.Node) -> int:
        """Copy kernels of a cat lowered as a ConcatKernel (rule 9).

        A whole view of a generated buffer is realized into its slice (free).
        Copies of graph inputs (placeholders, parameters) are registered as one
        operation list and run as one foreach kernel (``triton_for_fused``).
        Every other input (a slice of a generated buffer, an extern call's
        output) is one copy kernel of its own.
        """
        inputs = [i for i in arg_nodes(cat) if fusion.infos.get(i) != []]
        graph_inputs, others = 0, 0
        for inp in inputs:
            base = fusion.base[inp]
            if base.op in ("placeholder", "get_attr"):
                graph_inputs += 1
            elif base in fusion.groups.parent and base not in self.concat_cats and whole_view(fusion.gm, inp, base):
                continue
            else:
                others += 1
        return (1 if graph_inputs else 0) + others

    def _is_inlined(self, fusion: Fusion, members: list[fx.Node]) -> bool:
        """Rule 11: a group of unrealized pointwise nodes whose every reader
        outside it is generated code that inlines it (not an extern call, not the
        graph output, not a ConcatKernel realizing it into a slice) launches nothing."""
        inside = set(members)
        escaped = False
        for m in members:
            if fusion.kinds[m] is not K.POINTWISE or m in self.pw_cats:
                return False
            outside = [u for u in fusion.consumers(m) if u not in inside]
            if not outside:
                continue
            if not self.unrealized.get(m):
                return False
            for user in outside:
                if user.op == "output" or user not in fusion.groups.parent:
                    return False
                if user in self.concat_cats and any(
                    fusion.base[i] is m and whole_view(fusion.gm, i, m) for i in arg_nodes(user)
                ):
                    return False
            escaped = True
        return escaped

    def generated(self, fusion: Fusion, members: list[fx.Node]) -> list[KernelPlan]:
        """A ConcatKernel's copy kernels (rule 9), or the group's kernel, after the
        statistics kernel of each unrolled layer norm in it (rule 8)."""
        if members[0] in self.copies:
            n = self.copies[members[0]]
            return [
                KernelPlan(K.CAT, tuple(members), f"cat copy {i + 1}/{n} (ConcatKernel)", CAT_COPY, n) for i in range(n)
            ]
        plans = [
            KernelPlan(K.REDUCTION, (m,), "layer_norm statistics (unrolled, r < 8)", NORM_STATS)
            for m in members
            if m in self.unrolled
        ]
        plans.append(fusion.fused_plan(members))
        return plans
