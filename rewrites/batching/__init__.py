"""Batching (horizontal fusion): one batched alternative per group of same-shaped ops.

Batching is a multi-pattern over n independent nodes, so it is not an egglog
rule (pairwise merges would build n^2 terms, subsets 2^n). Instead, after the
first saturation, candidates are grouped by a fusion key (op, operand shapes,
constants, dtype), then split greedily into groups whose members do not
depend on each other (one pass in graph order carrying, per node, the highest
group of each key among its ancestors: ``candidates.independent_groups``), so a
group never builds a cycle through its own members. Each
group gains one batched term over stacked operands, and each member is
unioned with its slice of that term. Saturation then runs again: the stacks
cancel against surrounding splits and cats (a stack of slices of one tensor
is a view of it), and the extractor decides whether the batched program pays.
Runs of other groups' members and of evenly spaced slices are stacked as views
from the start, and every cat of such runs gains a view-built alternative
(views.py); groups are built in dependency order for that (build_order).

Covers Inductor's group_batch_fusion.py (numbered as in the coverage table of rewrites/README.md):
  batch_linear (22, 27)        same-shaped linears  -> one bmm over stacked operands
  batch_linear_lhs (23)        linears sharing one input -> one linear on concatenated weights (any widths)
  batch_layernorm (24)         same layer_norm      -> one layer_norm, stacked affine
  batch_tanh/sigmoid/relu (25, 30), batch_detach/nan_to_num/clamp/dropout (26),
  batch_aten_add/sub/mul/div (29): any elementwise op (Unary/Scalar/Binary, and where/fma/*_backward
                               of backward graphs) of equal shapes; operands all members share broadcast
  batch_linear_post_grad       aten mm/addmm of a transposed weight are linears (normalize.py): as above
  (not in Inductor)            aten mm of equal shapes (weight gradients) -> one bmm, or one mm when the
                               right operand is shared
  (not in Inductor)            reductions over given dims (bias gradients, var_mean, amax) of equal
                               shapes -> one reduction of the stack
  group_linear (28)            linears of any shapes (one dtype) -> one optimus_eqsat::grouped_linear
                               call (Triton grouped GEMM on CUDA, no fbgemm); members are getitems
  (not in Inductor)            plain embedding lookups into tables of one width and dtype -> one
                               lookup into the row-concatenated tables with shifted indices
  (not in Inductor)            linears of one output width and any input widths -> one bmm over
                               inputs and weights zero-padded to the widest input (padk)

A linear is a candidate for several kinds at once (bmm, padk, lhs, group_linear): every
alternative is unioned with it and the cost model picks. group_linear is one
extern launch on GPU profiles, but its host time (about 0.3 ms a call plus 17 us a
member on an H200) exceeds the launches it saves, and on the CPU profile
it runs one F.linear per member; so it is only built where
``group_linear_can_pay`` under the profile (a cheap-host profile, in tests).
Same-shaped linears whose stacks are free take the bmm.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from optimus_eqsat.rewrites.batching.builder import BatchBuilder
from optimus_eqsat.rewrites.batching.candidates import Candidate, build_order, independent_groups, parse_candidate
from optimus_eqsat.rewrites.batching.kinds import KINDS, BatchContext, BatchKind
from optimus_eqsat.rewrites.batching.views import cat_alternatives
from optimus_eqsat.term import Fact
from optimus_eqsat.translate import Translation

# The table of kinds, in the order their keys are computed (see kinds.py); importing
# each module registers its kinds.
# isort: off
from optimus_eqsat.rewrites.batching import elementwise, linear, layer_norm, grouped_linear  # noqa: E402,F401
from optimus_eqsat.rewrites.batching import embedding, matmul, reduction  # noqa: E402,F401

# isort: on
from optimus_eqsat.rewrites.batching.grouped_linear import group_linear_can_pay  # noqa: E402

MIN_GROUP = 2  # the cost model, not a threshold, decides whether a group pays

__all__ = [
    "Batches",
    "BatchKind",
    "KINDS",
    "MIN_GROUP",
    "batch_facts",
    "build_order",
    "group_linear_can_pay",
    "Candidate",
    "parse_candidate",
]


@dataclass
class Batches:
    """What batching added: the facts, members per kind, and the batched terms' ids per kind."""

    facts: list[Fact]
    members: dict[str, int]
    outputs: dict[str, list[int]]
    groups: list[tuple[int, list[int]]]  # (batched term id, member node ids)


def batch_facts(t: Translation, profile: Any = None, frozen: bool = False) -> Batches:
    """Facts adding one batched alternative per group, with what they batch.

    ``profile`` (a cost-model profile or its name) lets kinds that cannot pay on
    that device be skipped before they are built (group_linear); None builds all.
    ``frozen``: parameters are constants (frozen inference), so stacking them is
    done once, not every step (the embedding kind builds only then).
    """
    context = BatchContext(profile, frozen)
    keyed: dict[tuple, list[Candidate]] = defaultdict(list)
    kind_of: dict[tuple, BatchKind] = {}
    # Side effects keep only the order of effects on the same memory (translate.py): groups
    # need members independent in the data graph plus those edges (independent_groups).
    for i, term in t.terms.items():
        candidate = parse_candidate(i, term)
        if candidate is None:
            continue
        for kind in KINDS:
            key = kind.key(t, candidate)
            if key is not None:
                keyed[(kind.name, key)].append(candidate)
                kind_of[(kind.name, key)] = kind
    keyed = {k: v for k, v in keyed.items() if len(v) >= MIN_GROUP}
    builder = BatchBuilder(t)
    stats: dict[str, int] = defaultdict(int)
    outputs: dict[str, list[int]] = defaultdict(list)
    groups = [
        (kind_of[key], group)
        for key, key_groups in independent_groups(t, keyed).items()
        for group in key_groups
        if len(group) >= MIN_GROUP
    ]
    for kind, group in (groups[k] for k in build_order([g for _, g in groups])):
        if not kind.can_pay(context, len(group)) or not kind.build(builder, group):
            continue
        stats[f"batch-{kind.name}"] += len(group)
        outputs[f"batch-{kind.name}"].append(builder.outputs[-1])
    t.batch_members.update((batched, tuple(members)) for batched, members in builder.groups)
    if builder.groups and (views := cat_alternatives(t, builder.slot_of, builder.facts.append)):
        stats["cat-views"] = views
    return Batches(builder.facts, dict(stats), dict(outputs), builder.groups)
