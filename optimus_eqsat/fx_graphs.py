"""Small facts about FX GraphModules that the pipeline and the explorer share:
op counts, whether shapes came as fake tensors, a fresh copy, the state a rebuilt module keeps."""

from __future__ import annotations

import types

import torch
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule

_OPS = ("call_function", "call_method", "call_module")


def op_count(gm: torch.fx.GraphModule) -> int:
    """FX call nodes (ops) of ``gm``: what the report counts before and after."""
    return sum(1 for n in gm.graph.nodes if n.op in _OPS)


def has_fake_meta(gm: torch.fx.GraphModule) -> bool:
    """Whether the inputs carry fake-tensor meta (Dynamo's ``example_value``, export's ``val``)."""
    return any("val" in n.meta or "example_value" in n.meta for n in gm.graph.nodes if n.op == "placeholder")


# What Dynamo attaches to the GraphModule it hands a backend, beyond the graph: which
# placeholders are parameters, buffers and their sources. Inductor reads it (a copy
# without it compiled deepctr's DNN training step to one kernel more than the original).
_DYNAMO_MODULE_ATTRIBUTES = ("_param_name_to_source", "_source_to_user_stacks", "shape_env", "compile_subgraph_reason")


def carry_dynamo_attributes(source: torch.fx.GraphModule, target: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``target`` with what Dynamo attached to ``source`` (its meta, the module attributes
    above and each placeholder's ``_dynamo_source``, matched by name): a graph built from
    Dynamo's compiles as Dynamo's own would; and with ``torch.export``'s refusal of mode
    switches. Returns ``target``."""
    for key, value in source.meta.items():
        target.meta.setdefault(key, value)
    for name in _DYNAMO_MODULE_ATTRIBUTES:
        if name in source.__dict__ and name not in target.__dict__:
            setattr(target, name, source.__dict__[name])
    sources = {
        n.name: n._dynamo_source for n in source.graph.nodes if n.op == "placeholder" and hasattr(n, "_dynamo_source")
    }
    for node in target.graph.nodes:
        if node.op == "placeholder" and node.name in sources and not hasattr(node, "_dynamo_source"):
            node._dynamo_source = sources[node.name]
    for name in ("train", "eval"):
        # an exported module (``ep.module()``) refuses .train() / .eval(): its graph is one
        # mode's, so a switch would silently run the mode it was exported in
        method = source.__dict__.get(name)
        if isinstance(method, types.MethodType) and name not in target.__dict__:
            setattr(target, name, types.MethodType(method.__func__, target))
    return target


def copy_module(gm: torch.fx.GraphModule, lazy: bool = False) -> torch.fx.GraphModule:
    """A new GraphModule with a copy of ``gm``'s graph and what Dynamo attached to it (the
    fallback result: the input is never returned). ``lazy`` defers generating its Python code
    to the first call or ``.code`` (torch's ``_LazyGraphModule``): a fallback that must return
    within its time limit skips the 3 s that code takes at 100,000 nodes."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    graph._codegen = gm.graph._codegen
    cls = _LazyGraphModule if lazy else torch.fx.GraphModule
    return carry_dynamo_attributes(gm, cls(gm, graph, class_name=type(gm).__name__))


def keep_unread_state(source: torch.fx.GraphModule, target: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``target`` with every entry of ``source``'s state dict that its graph no longer reads
    (registered as in ``source``: parameter or persistent buffer, same tensor), so the
    optimized module's ``state_dict()`` has the source's keys and a checkpoint of the model
    loads into it strictly. A ``GraphModule`` copies only the attributes its graph reads: an
    eval-mode batch norm written out as ``F.batch_norm`` no longer reads its
    ``num_batches_tracked``, and a batched program may read none of a parameter. Returns
    ``target``."""
    kept = target.state_dict(keep_vars=True)
    for name in source.state_dict(keep_vars=True):
        if name in kept:
            continue
        path, _, leaf = name.rpartition(".")
        owner, home = source.get_submodule(path), module_at(target, path)
        if leaf in owner._parameters:
            home.register_parameter(leaf, owner._parameters[leaf])
        else:
            home.register_buffer(leaf, owner._buffers[leaf])
    return target


def module_at(root: torch.nn.Module, path: str) -> torch.nn.Module:
    """The submodule of ``root`` at the dotted ``path`` (``""``: ``root``), plain modules added
    where the path has none, as a ``GraphModule`` makes the path of a ``get_attr`` target."""
    home = root
    for part in path.split(".") if path else ():
        if not isinstance(getattr(home, part, None), torch.nn.Module):
            home.add_module(part, torch.nn.Module())
        home = getattr(home, part)
    return home
