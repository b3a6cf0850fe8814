"""Batch norms, dropouts and in-place ops of ``torch.export`` graphs (aten overloads) written as
the torch calls a Dynamo graph holds.

``torch.export.export(model).module()`` records a library MLP layer as
``aten.batch_norm.default``, ``aten.relu_.default`` (``nn.ReLU(inplace=True)``) and
``aten.dropout.default``, and a training norm's count as ``aten.add_.Tensor(count, 1)``;
Dynamo's graph of the same code holds ``F.batch_norm``, ``x.relu_()``, ``F.dropout`` and
``count.add_(1)``. The batch-norm decompositions, the private in-place rewrite and the dropouts'
shared draws (:mod:`.decompose`, :mod:`.dropout_draws`) read the latter form: in an exported
model every in-place activation after a norm stayed a write into memory the rest of the layer
reads, so little batched (deepctr-style MMOE at batch 64, H200 profile: 30 -> 27 predicted
launches in inference and 42 -> 39 in training, against 31 -> 23 and 43 -> 29 for its Dynamo
graph; rewritten, 30 -> 24 and 42 -> 30). :func:`torch_calls` rewrites those nodes, on a copy:

- ``aten.batch_norm.default(x, w, b, mean, var, training, momentum, eps, cudnn)`` ->
  ``F.batch_norm(x, mean, var, w, b, training, momentum, eps)`` (``F.batch_norm`` calls that
  op; the cuDNN flag only picks the kernel);
- ``aten.dropout.default(x, p, train)`` -> ``F.dropout(x, p, train)`` (which calls it);
- an in-place overload ``aten.<name>_.<overload>`` that is a tensor method (but ``copy_``) ->
  the method call ``x.<name>_(...)``, which dispatches to the same op.

Each new node keeps the old node's meta.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from optimus_eqsat.fx_graphs import copy_module

__all__ = ["torch_calls"]

_ATEN = torch.ops.aten


def _inplace_method(target: Any) -> str | None:
    """The tensor method an in-place aten overload is (``"relu_"`` for ``aten.relu_.default``)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    name = target._schema.name.split("::")[-1]
    # (copy_ is AOTAutograd's write-back of a mutated input, the one in-place op of the
    # functional aten graphs our post-grad pass optimizes: those stay as Inductor gave them)
    if not name.endswith("_") or name.startswith("_") or name == "copy_" or not hasattr(torch.Tensor, name):
        return None
    first = target._schema.arguments[0] if target._schema.arguments else None
    return name if first is not None and first.name == "self" and first.alias_info is not None else None


def _rewritable(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in (_ATEN.batch_norm.default, _ATEN.dropout.default):
        return not node.kwargs and len(node.args) == len(node.target._schema.arguments)  # type: ignore[union-attr]
    return _inplace_method(node.target) is not None


def torch_calls(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` itself when it holds none of the aten calls above, else a copy (sharing ``gm``'s
    parameters, buffers and submodules) with each written as the torch call Dynamo traces."""
    if not any(_rewritable(n) for n in gm.graph.nodes):
        return gm
    out = copy_module(gm)
    for node in [n for n in out.graph.nodes if _rewritable(n)]:
        args = node.args
        with out.graph.inserting_before(node):
            if node.target is _ATEN.batch_norm.default:
                x, weight, bias, mean, var, training, momentum, eps, _ = args
                new = out.graph.call_function(F.batch_norm, (x, mean, var, weight, bias, training, momentum, eps))
            elif node.target is _ATEN.dropout.default:
                new = out.graph.call_function(F.dropout, args)
            else:
                new = out.graph.call_method(str(_inplace_method(node.target)), args, dict(node.kwargs))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        out.graph.erase_node(node)
    out.graph.lint()
    out.recompile()
    return out
