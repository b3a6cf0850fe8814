"""Pricing: what each predicted kernel costs (bytes, FLOPs, seconds).

The fusion simulator (fusion.py and its code generator strategies) decides
which kernels exist: a :class:`KernelPlan` per launch, with its FX nodes, kind,
role and note. :class:`Pricing` turns each plan into :class:`PredictedKernel`
records priced on the device profile's roofline
(:func:`~optimus_eqsat.extract.cost_model.kernel_costs`):

- a fused kernel reads its inputs from outside the group (as used: a slice
  counts its size) and the parameters of its modules, and writes the values
  read outside it;
- an extern call reads all its inputs and parameters and writes its output;
  FLOPs of a matmul are ``2 * out_numel * K``;
- a ConcatKernel's copy kernels share the cat's bytes evenly; a layer norm's
  statistics kernel (rule 8) reads the norm's input once.

Each kernel costs host time (the wrapper's launch or extern call and the buffer
it allocates) and device time (bytes over bandwidth, FLOPs over the throughput of
its dtype; a matmul's from the measured table of its shape where the profile has
one): :func:`~optimus_eqsat.extract.cost_model.kernel_costs`. A step adds them up
(:func:`~optimus_eqsat.extract.cost_model.step_seconds`: serially on a CPU,
overlapped on a GPU) with one call of the compiled graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.fx as fx

from optimus_eqsat.extract.classify import Infos, arg_nodes, mm_form
from optimus_eqsat.extract.cost_model import DeviceProfile, KernelKind, kernel_costs
from optimus_eqsat.fxvocab import GROUPED_OPS, TensorInfo, op_label, target_name

__all__ = ["FLOPS_PER_ELEMENT", "KernelPlan", "PredictedKernel", "Pricing"]

K = KernelKind

# Rough FLOPs per output element (per input element for reductions); default 1.
FLOPS_PER_ELEMENT: dict[str, float] = {
    "gelu": 8,
    "silu": 4,
    "sigmoid": 4,
    "tanh": 4,
    "exp": 2,
    "erf": 6,
    "mish": 8,
    "softmax": 5,
    "_softmax": 5,
    "log_softmax": 6,
    "_log_softmax": 6,
    "layer_norm": 8,
    "native_layer_norm": 8,
    "group_norm": 8,
    "rms_norm": 5,
    "batch_norm": 4,
    "var": 3,
    "var_mean": 3,
    "std": 3,
}

# KernelPlan roles: how a planned launch is priced.
FUSED = "fused"  # generated code of a group of nodes
EXTERN = "extern"  # one extern (library) call of one node; a grouped linear may be several
CAT_COPY = "cat_copy"  # one of a ConcatKernel's ``share`` copy kernels
NORM_STATS = "norm_stats"  # the statistics kernel of an unrolled layer norm


@dataclass(frozen=True)
class KernelPlan:
    """One launch the fusion simulator decided on, not priced yet."""

    kind: KernelKind
    nodes: tuple[fx.Node, ...]
    note: str
    role: str = FUSED
    share: int = 1  # CAT_COPY: how many copy kernels split the cat's bytes


@dataclass(frozen=True)
class PredictedKernel:
    """One predicted launch: its kind, the FX nodes in it, bytes, FLOPs, time.

    ``kind`` of a fused kernel is REDUCTION if it holds one, else POINTWISE
    (CAT / GATHER when it holds only those). ``note`` says e.g. "addmm (bias
    fused)" or which op names were fused.
    """

    kind: KernelKind
    nodes: tuple[fx.Node, ...]
    bytes_moved: int
    flops: float
    seconds: float  # host_s + device_s
    note: str = ""
    host_s: float = 0.0
    device_s: float = 0.0


def _nbytes(infos: list[TensorInfo] | None) -> int:
    return sum(i.nbytes for i in infos or [])


def _numel(infos: list[TensorInfo] | None) -> int:
    return sum(i.numel or 0 for i in infos or [])


def _first(infos: list[TensorInfo] | None) -> TensorInfo | None:
    """The first tensor of ``infos``; None when unknown or there is none."""
    return infos[0] if infos else None


class Pricing:
    """Bytes, FLOPs and seconds of the planned kernels of one graph.

    ``base`` maps each node to the buffer it reads (views resolved, from the
    fusion simulator); ``grouped_per_member``: the code generator runs a grouped
    linear as one F.linear per member (the CPU fallback) instead of one launch.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        kinds: dict[fx.Node, KernelKind],
        infos: Infos,
        base: dict[fx.Node, fx.Node],
        profile: DeviceProfile,
        grouped_per_member: bool = False,
    ):
        self.gm, self.kinds, self.infos, self.base = gm, kinds, infos, base
        self.profile, self.grouped_per_member = profile, grouped_per_member
        self.views = 0  # wrapper views of the graph (wrapper_views), set by fx_cost.plan_kernels

    def price(self, plan: KernelPlan) -> list[PredictedKernel]:
        """The kernels ``plan`` launches, priced (one, except a grouped linear's members)."""
        if plan.role == EXTERN:
            node = plan.nodes[0]
            return self.grouped_linear(node) or [
                self._priced(
                    plan, self.extern_bytes(node), self.node_flops(node), self.matmul_shape(node), self.itemsize(node)
                )
            ]
        if plan.role == CAT_COPY:
            return [self._priced(plan, self.group_bytes(plan.nodes) // plan.share, 0.0)]
        if plan.role == NORM_STATS:
            args = arg_nodes(plan.nodes[0])
            return [self._priced(plan, _nbytes(self.infos.get(args[0])) if args else 0, 0.0)]
        kernel = self._priced(
            plan,
            self.group_bytes(plan.nodes),
            sum(self.node_flops(m) for m in plan.nodes),
            buffers=self.buffers(plan.nodes),
        )
        reductions = [m for m in plan.nodes if self.kinds.get(m) is K.REDUCTION]
        if reductions and (self.profile.reduction_row_s or self.profile.reduction_s):
            # small reductions run far from any roofline (CPU loops): each loop's setup and rows
            extra = (
                len(reductions) * self.profile.reduction_s
                + sum(self.reduction_rows(m) for m in reductions) * self.profile.reduction_row_s
            )
            kernel = dataclasses.replace(kernel, seconds=kernel.seconds + extra, device_s=kernel.device_s + extra)
        return [kernel]

    def reduction_rows(self, node: fx.Node) -> int:
        """Rows a reduction loops over: a normalization's input numel over its last dim, a
        reduction's output numel; 0 for other nodes."""
        if self.kinds.get(node) is not K.REDUCTION:
            return 0
        infos = self.infos.get(node)
        out = _numel(infos[:1] if infos else None)
        args = arg_nodes(node)
        first = _first(self.infos.get(args[0])) if args else None
        if first is not None and first.numel and first.shape and first.shape[-1] and out == first.numel:
            return first.numel // first.shape[-1]  # same shape out as in: a normalization, one row per last dim
        return out

    def _priced(
        self,
        plan: KernelPlan,
        nbytes: int,
        flops: float,
        shape: tuple[int, int, int, int] | None = None,
        itemsize: int = 4,
        buffers: int = 1,
    ) -> PredictedKernel:
        host, device = kernel_costs(self.profile, plan.kind, nbytes, flops, shape, itemsize, buffers)
        return PredictedKernel(plan.kind, plan.nodes, nbytes, flops, host + device, plan.note, host, device)

    def buffers(self, members: Sequence[fx.Node]) -> int:
        """Buffers a generated kernel allocates: one per member read outside it (at least one)."""
        inside = set(members)
        return max(1, sum(1 for m in members if any(self._escapes(m, u, inside) for u in m.users)))

    def wrapper_views(self, concat_cats: Sequence[fx.Node]) -> int:
        """Views of buffers the wrapper materializes (``reinterpret_tensor``): a view an
        extern call reads or the graph returns, and one slot per input of each cat built as
        a ConcatKernel (``concat_cats``). Views read by generated code are index math: free."""
        views: set[fx.Node] = set()
        for node in self.gm.graph.nodes:
            extern = self.kinds.get(node) in (K.MATMUL, K.OPAQUE)
            if extern or node.op == "output":
                views.update(a for a in arg_nodes(node) if self.kinds.get(a) is K.VIEW)
        return len(views) + sum(len(arg_nodes(cat)) for cat in concat_cats)

    def matmul_shape(self, node: fx.Node) -> tuple[int, int, int, int] | None:
        """(batch, M, K, N) of a matmul node, None when unknown (a conv, no shapes)."""
        form = mm_form(self.gm, node, self.infos)
        if form is None:
            return None
        name, m, k, n = form
        out = _first(self.infos.get(node))
        batch = (out.numel // (m * n)) if name == "bmm" and out is not None and out.numel and m * n else 1
        return batch, m, k, n

    def itemsize(self, node: fx.Node) -> int:
        """Element size of a node's (first) output: the dtype the kernel computes in."""
        infos = self.infos.get(node)
        return infos[0].itemsize if infos else 4

    # -- FLOPs -------------------------------------------------------------------
    def node_flops(self, node: fx.Node) -> float:
        kind = self.kinds[node]
        label = op_label(self.gm, node)
        if kind is K.MATMUL:
            return self._matmul_flops(node)
        if kind is K.REDUCTION:
            ins = max((_numel(self.infos.get(i)) for i in arg_nodes(node)), default=0)
            return FLOPS_PER_ELEMENT.get(label.lower(), 1) * ins
        if kind in (K.POINTWISE, K.GATHER):
            return FLOPS_PER_ELEMENT.get(label.lower(), 1) * _numel(self.infos.get(node))
        return 0.0

    def _matmul_flops(self, node: fx.Node) -> float:
        """2 * out_numel * K; K = reduction size (conv: Cin/groups * kernel)."""
        infos = self.infos.get(node)
        out = _numel(infos[:1] if infos else None)
        weight_shape: tuple[int | None, ...] | None = None
        if node.op == "call_module":
            module = self.gm.get_submodule(cast(str, node.target))
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dim() > 2:
                weight_shape = tuple(weight.shape)
        name = op_label(self.gm, node)
        tensors = [i for i in arg_nodes(node) if self.infos.get(i)]
        if weight_shape is None and "conv" in name and len(tensors) > 1:
            weight_shape = cast(list[TensorInfo], self.infos[tensors[1]])[0].shape  # tensors have infos
        if weight_shape is not None and all(d is not None for d in weight_shape):
            k = 1
            for d in cast(tuple[int, ...], weight_shape)[1:]:
                k *= d
            return 2.0 * out * k
        # addmm/baddbmm/addmv/addbmm: the first tensor is the bias.
        lhs_index = 1 if name.startswith("add") or name == "baddbmm" else 0
        if len(tensors) <= lhs_index:
            return 0.0
        shape = cast(list[TensorInfo], self.infos[tensors[lhs_index]])[0].shape
        k = shape[-1] if shape and shape[-1] is not None else 0
        return 2.0 * out * k

    # -- bytes ---------------------------------------------------------------------
    def extern_bytes(self, node: fx.Node) -> int:
        own = _nbytes(self.infos.get(node))
        return sum(_nbytes(self.infos.get(i)) for i in arg_nodes(node)) + own + self.param_bytes(node)

    def param_bytes(self, node: fx.Node) -> int:
        """Bytes of a call_module node's own parameters (read by its kernel).

        A gather reads only the rows it returns, so it is capped at its output.
        """
        if node.op != "call_module":
            return 0
        module = self.gm.get_submodule(cast(str, node.target))
        total = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        if self.kinds[node] is K.GATHER:
            total = min(total, _nbytes(self.infos.get(node)))
        return total

    def group_bytes(self, members: Sequence[fx.Node]) -> int:
        """External reads (as used, so slices count their size) + escaping writes."""
        inside = set(members)
        reads: dict[fx.Node, int] = {}
        for m in members:
            for inp in arg_nodes(m):
                if self.base[inp] not in inside:
                    reads[inp] = _nbytes(self.infos.get(inp))
        writes = sum(self.param_bytes(m) for m in members)
        for m in members:
            if any(self._escapes(m, u, inside) for u in m.users):
                writes += _nbytes(self.infos.get(m))
        return sum(reads.values()) + writes

    def _escapes(self, node: fx.Node, user: fx.Node, inside: set[fx.Node]) -> bool:
        if user.op == "output":
            return True
        if self.kinds[user] is K.VIEW:
            return any(self._escapes(user, u, inside) for u in user.users)
        return user not in inside

    # -- grouped linear --------------------------------------------------------------
    def grouped_linear(self, node: fx.Node) -> list[PredictedKernel]:
        """Kernels of a grouped linear call ``(xs, ws, bs)``; [] for any other node
        and when shapes are unknown (then priced as one plain extern call).

        Triton: one launch (the grouped GEMM), plus the call's host time
        (``profile.grouped_host_s`` and ``grouped_host_s_per_member``). The CPU
        fallback (``grouped_per_member``) runs one F.linear per member inside one
        more op dispatch: a matmul kernel per member.
        """
        if node.op != "call_function" or target_name(node.target) not in GROUPED_OPS or len(node.args) < 2:
            return []
        prof = self.profile
        xs, ws = cast(Sequence[fx.node.Argument], node.args[0]), cast(Sequence[fx.node.Argument], node.args[1])
        bs = cast(
            Sequence[fx.node.Argument],
            node.args[2] if len(node.args) > 2 and node.args[2] is not None else [None] * len(xs),
        )
        # (bytes, flops, (batch, M, K, N), itemsize) per member
        members: list[tuple[int, float, tuple[int, int, int, int], int]] = []
        for x, w, b in zip(xs, ws, bs):
            xi = _first(self.infos.get(x)) if isinstance(x, fx.Node) else None
            wi = _first(self.infos.get(w)) if isinstance(w, fx.Node) else None
            if xi is None or wi is None or xi.numel is None or len(wi.shape) != 2 or None in wi.shape:
                return []
            n_out, k = cast(tuple[int, int], wi.shape)  # two dims, none of them None
            rows = xi.numel // k if k else 0
            bias = _nbytes(self.infos.get(b)) if isinstance(b, fx.Node) else 0
            members.append(
                (
                    xi.nbytes + wi.nbytes + bias + rows * n_out * xi.itemsize,
                    2.0 * rows * n_out * k,
                    (1, rows, k, n_out),
                    xi.itemsize,
                )
            )
        costs = [kernel_costs(prof, K.MATMUL, nbytes, flops, shape, size) for nbytes, flops, shape, size in members]
        if self.grouped_per_member:
            dispatch = prof.launch_s(K.MATMUL)  # the op's own dispatch, around its F.linear calls
            return [
                PredictedKernel(
                    K.MATMUL,
                    (node,),
                    int(nbytes),
                    flops,
                    host + device + (dispatch if i == 0 else 0),
                    f"grouped_linear member {i} (F.linear fallback)",
                    host + (dispatch if i == 0 else 0),
                    device,
                )
                for i, ((nbytes, flops, _, _), (host, device)) in enumerate(zip(members, costs))
            ]
        host = (
            prof.launch_s(K.MATMUL) + prof.alloc_s + prof.grouped_host_s + prof.grouped_host_s_per_member * len(members)
        )
        device = sum(d for _, d in costs)
        return [
            PredictedKernel(
                K.MATMUL,
                (node,),
                int(sum(m[0] for m in members)),
                sum(m[1] for m in members),
                host + device,
                f"grouped_linear ({len(members)} linears, one launch)",
                host,
                device,
            )
        ]

    # -- training: the backward of a forward's kernels -----------------------------
    def backward_costs(self, kernels: Sequence[PredictedKernel], grad: set[fx.Node]) -> list[tuple[float, float]]:
        """(host, device) seconds of the backward kernels AOTAutograd derives from
        ``kernels`` (a per-kernel model, not a trace), in reverse order. ``grad``: the
        nodes whose values need a gradient (:func:`needs_grad`).

        - an extern matmul: one matmul per operand that needs a gradient (dX, dW), each
          with the forward's FLOPs and bytes;
        - a generated kernel holding a node that needs a gradient: one generated kernel
          moving twice its bytes (incoming gradients and saved inputs), with its FLOPs;
          an embedding lookup into a table that needs a gradient also writes the whole
          table's gradient (zero-filled, then scattered into);
        - a copy of values none of which needs a gradient (a stack of frozen weights) has
          no backward; a cat's backward is views of the gradient.
        """
        costs: list[tuple[float, float]] = []
        for kernel in reversed(kernels):
            if not any(n in grad for n in kernel.nodes):
                continue
            if kernel.kind in (K.MATMUL, K.OPAQUE) and len(kernel.nodes) == 1:
                node = kernel.nodes[0]
                operands = self._matmul_operands(node)
                needing = (
                    sum(1 for o in operands if o is True or (isinstance(o, fx.Node) and o in grad)) if operands else 1
                )
                shape, size = self.matmul_shape(node), self.itemsize(node)
                for _ in range(needing):
                    costs.append(kernel_costs(self.profile, kernel.kind, kernel.bytes_moved, kernel.flops, shape, size))
                continue
            if kernel.kind is K.CAT and all(n.op in ("placeholder", "get_attr") for n in self._cat_sources(kernel)):
                continue
            tables = sum(
                _nbytes(self.infos.get(arg_nodes(n)[1]))
                for n in kernel.nodes
                if self.kinds.get(n) is K.GATHER
                and len(arg_nodes(n)) > 1
                and arg_nodes(n)[1] in grad
                and op_label(self.gm, n) == "embedding"
            )
            costs.append(kernel_costs(self.profile, K.POINTWISE, 2 * kernel.bytes_moved + tables, kernel.flops))
        return costs

    def _matmul_operands(self, node: fx.Node) -> tuple[fx.Node | bool, ...]:
        """The operands of a matmul node whose gradients a backward computes: (x, w) nodes,
        or True for a module's own parameters that require grad."""
        args = arg_nodes(node)
        if node.op == "call_module":
            module = self.gm.get_submodule(cast(str, node.target))
            return (*args[:1], any(p.requires_grad for p in module.parameters(recurse=False)))
        label = op_label(self.gm, node)
        if label in ("addmm", "baddbmm", "addbmm", "addmv"):
            return tuple(args[1:3])
        return tuple(args[:2])

    def _cat_sources(self, kernel: PredictedKernel) -> list[fx.Node]:
        """The buffers a copy kernel reads (views resolved)."""
        return [self.base[i] for n in kernel.nodes for i in arg_nodes(n)]


def needs_grad(gm: fx.GraphModule, example_inputs: Sequence | None = None) -> set[fx.Node]:
    """The nodes of ``gm`` whose values need a gradient in a training step: those computed
    from a placeholder whose input (example, else meta value) requires grad, from a
    parameter read by ``get_attr``, or by a module call whose parameters require grad."""
    from optimus_eqsat.fxvocab import fetch_attr, meta_value

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = (
        list(example_inputs)
        if example_inputs is not None and len(example_inputs) == len(placeholders)
        else [meta_value(n) for n in placeholders]
    )
    grad: set[fx.Node] = {n for n, v in zip(placeholders, values) if isinstance(v, torch.Tensor) and v.requires_grad}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = fetch_attr(gm, str(node.target))
            if isinstance(value, torch.Tensor) and value.requires_grad:
                grad.add(node)
        elif node.op == "call_module" and any(p.requires_grad for p in gm.get_submodule(node.target).parameters()):
            grad.add(node)
        elif node.op != "placeholder" and any(a in grad for a in node.all_input_nodes):
            grad.add(node)
    return grad
