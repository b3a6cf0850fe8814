"""Linears of any shapes (one dtype) -> one ``optimus_eqsat::grouped_linear`` call.

Inductor's group_linear (28) needs fbgemm; this calls our Triton grouped GEMM
(optimus_eqsat/kernels/), one launch on CUDA, and its members are getitems. The
term language has only fixed-arity ops (Op1-Op3), so the call's 3N operands
travel in a chain of packing terms that no rule matches and no kernel runs::

    item_i = Op2 "gl_item" x_i w_i | Op3 "gl_item_b" x_i w_i b_i
    chain  = Op1 "gl_list" item_1, then Op2 "gl_cons" chain item_i
    call   = Op1 "grouped_linear" chain           (a Python list of N tensors)
    y_i    = Op1 "gl_get:i" call                   (operator.getitem: a view)

The call's OpSpec emits ``grouped_linear([x..], [w..], [b..])`` straight from the
chain's operands and erases the chain's FX nodes, so the rebuilt graph holds one
call and N getitems, just as hand-written code would. Members are getitems of a
list rather than slices of one concatenated tensor: concatenating would cost a
copy of every output (the kernel writes N separate buffers), and a flat tensor
would need equal leading dims. Rules cannot see through the call (its outputs
are only getitems), which is fine: nothing simplifies there.

The call is host-bound (about 0.3 ms a call plus 17 us a member on an H200)
and on the CPU profile runs one F.linear per member, so it is only built where
:meth:`GroupedLinear.can_pay` under the profile.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, cast

import torch.fx

from optimus_eqsat.kernels.batched_ops import gl_cons, gl_item, gl_list, grouped_linear_packed
from optimus_eqsat.kernels.grouped_linear import grouped_linear
from optimus_eqsat.op_keys import LINEAR_B
from optimus_eqsat.opspec import GROUPED_MATMUL, GROUPED_MEMBER, PACK, OpSpec, Slot
from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate
from optimus_eqsat.rewrites.batching.kinds import BatchContext, BatchKind, register
from optimus_eqsat.rewrites.batching.linear import is_2d_linear
from optimus_eqsat.term import Id, Op1, Op2, Op3, Union
from optimus_eqsat.translate import Translation


@dataclass(frozen=True)
class GroupedLinearSpec(OpSpec):
    """Emits the grouped call from the packing chain's operands, then drops the chain."""

    def emit(self, graph: torch.fx.Graph, operands: list[torch.fx.Node], name: str | None = None) -> torch.fx.Node:
        # The chain's links and items are FX nodes: the packing ops' operands are tensors.
        chain: list[torch.fx.Node] = []
        items: list[torch.fx.Node] = []
        node = operands[0]
        while node.op == "call_function" and node.target is gl_cons:
            chain.append(node)
            items.append(cast(torch.fx.Node, node.args[1]))
            node = cast(torch.fx.Node, node.args[0])
        if not (node.op == "call_function" and node.target is gl_list):
            return graph.call_function(grouped_linear_packed, (operands[0],), name=name)  # not a chain: still correct
        chain.append(node)
        items.append(cast(torch.fx.Node, node.args[0]))
        items.reverse()
        if not all(i.op == "call_function" and i.target is gl_item for i in items):
            return graph.call_function(grouped_linear_packed, (operands[0],), name=name)
        xs = [i.args[0] for i in items]
        ws = [i.args[1] for i in items]
        bs = [i.args[2] if len(i.args) > 2 else None for i in items]
        new = graph.call_function(grouped_linear, (xs, ws, bs), name=name)
        for dead in [*chain, *dict.fromkeys(items)]:  # last link first: each is then unused
            if not dead.users:
                graph.erase_node(dead)
        return new


def group_linear_can_pay(profile: Any, n: int) -> bool:
    """Whether one grouped call for ``n`` linears can cost less than their ``n`` launches
    under ``profile`` (None: assume it can). A necessary condition only, checked before
    building: the measured host time of the call makes it fail on the shipped GPU
    profiles, and the CPU fallback runs every member anyway."""
    if profile is None:
        return True
    from optimus_eqsat.extract.cost_model import KernelKind, get_profile

    p = get_profile(profile)
    if p.codegen != "triton":
        return False
    return p.grouped_host_s + n * p.grouped_host_s_per_member < (n - 1) * p.launch_s(KernelKind.MATMUL)


@register
class GroupedLinear(BatchKind):
    """linear_i(x_i, w_i, b_i) -> getitem(grouped_linear(xs, ws, bs), i): one extern call on GPUs."""

    name = "group_linear"

    def key(self, t: Translation, c: Candidate) -> tuple | None:
        if not is_2d_linear(t, c):
            return None
        dtype = t.dtypes.get(c.node)
        if dtype is None or not all(t.dtypes.get(o) == dtype for o in c.operands):
            return None
        return ("group_linear", dtype)

    def can_pay(self, context: BatchContext, n: int) -> bool:
        return group_linear_can_pay(context.profile, n)

    def build(self, b: BatchBuilder, group: list[Candidate]) -> bool:
        reg = b.t.registry
        item = reg.add_named("gl_item", OpSpec("call_function", gl_item, (Slot(0), Slot(1)), (), GROUPED_MEMBER))
        item_b = reg.add_named(
            "gl_item_b", OpSpec("call_function", gl_item, (Slot(0), Slot(1), Slot(2)), (), GROUPED_MEMBER)
        )
        first = reg.add_named("gl_list", OpSpec("call_function", gl_list, (Slot(0),), (), PACK))
        cons = reg.add_named("gl_cons", OpSpec("call_function", gl_cons, (Slot(0), Slot(1)), (), PACK))
        call = reg.add_named(
            "grouped_linear", GroupedLinearSpec("call_function", grouped_linear_packed, (Slot(0),), (), GROUPED_MATMUL)
        )
        chain: Id | None = None
        for c in group:
            ids = [Id(o) for o in c.operands]
            packed = b.new(Op3(item_b, *ids) if c.key == LINEAR_B else Op2(item, *ids))
            chain = b.new(Op1(first, packed) if chain is None else Op2(cons, chain, packed))
        assert chain is not None  # a group has at least MIN_GROUP members
        y = b.new(Op1(call, chain))
        b.record(y, [c.node for c in group])
        for k, c in enumerate(group):
            get = reg.add_named(f"gl_get:{k}", OpSpec("call_function", operator.getitem, (Slot(0), k), (), PACK))
            b.facts.append(Union(Id(c.node), Op1(get, y)))
        return True
