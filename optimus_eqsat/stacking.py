"""Stacked parameters for training: the weights a batched program reads, stored stacked.

A batched program reads its weights stacked: ``stack([w_1, ..., w_n])`` feeds one batched
matmul. In inference the backend's parameter cache builds that stack once and moves the
weights into it (:mod:`optimus_eqsat.parameter_cache`); a training step cannot, since the
weights are the leaves autograd and the optimizer work on. So every training step stacks
the n weights (a copy), the backward splits the stack's gradient into n gradients,
AccumulateGrad runs n times and the optimizer updates n tensors.

:func:`stack_parameters` changes where the weights live instead, as Hugging Face's
mixture-of-experts blocks, TorchRec's fused embedding collections and FBGEMM's
table-batched embeddings do by hand. It runs the optimizer on the model's training graph,
takes the stacks (and dim-0 cats) of whole parameters its program builds, and registers
each such group as one leaf ``nn.Parameter`` on the members' closest common parent module.
Each original parameter becomes a view of its slot (``stack[k]``, or ``stack[a:b]`` for a
cat), computed when the attribute is read, so ``module.weight`` reads the same values and
shape and the model's code runs unchanged, eager or compiled. Traced by Dynamo, the
batched program's ``stack(stack[0], ..., stack[n-1])`` is the stack itself (the e-graph's
view rules fold it), so the compiled step copies no weight, produces one gradient per
group and the optimizer updates one tensor.

Checkpoints keep the original layout: ``state_dict()`` has the original keys, shapes and
order (each stacked entry a view of its slot), ``load_state_dict`` of a checkpoint of the
original model copies each entry into its slot, and :func:`unstack_parameters` gives the
original layout back. Parameters tied to another module's, or sharing storage with another
tensor of the model, are left alone, with every group they belong to.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
import torch.fx as fx
from torch import nn

from optimus_eqsat.fxvocab.names import canonical_name
from optimus_eqsat.parameter_cache import Pack, packable_work

log = logging.getLogger(__name__)

__all__ = ["StackedGroup", "planned_groups", "stack_groups", "stack_parameters", "stacked_groups", "unstack_parameters"]

STACK_PREFIX = "_optimus_stack"

# Per-instance attributes of a stacked member (kept in its __dict__, not registered).
_SLOTS = "_optimus_slots"  # attribute name -> (module holding the stack, stack name, index, transposed)
_ORDER = "_optimus_parameter_order"  # the member's parameter names before stacking
_CLASS = "_optimus_original_class"
# Per-instance attribute of an owner: stack name -> StackedGroup, and its hook handles.
_STACKS = "_optimus_stacks"
_HANDLES = "_optimus_stack_hooks"


@dataclass(frozen=True)
class StackedGroup:
    """One stacked parameter: ``owner.name`` (``owner`` a module path, "" for the root)
    holds ``members`` (original parameter paths, in slot order) stacked along a new dim 0
    (``kind="stack"``) or concatenated along dim 0 (``kind="cat"``). ``transposed``: the
    stack holds each (2-D) member transposed, ``(n, b, a)`` for ``(a, b)`` members."""

    owner: str
    name: str
    members: tuple[str, ...]
    kind: str
    transposed: bool = False  # the stack holds each member transposed (see _last_dims_swapped)

    @property
    def path(self) -> str:
        """The stacked parameter's path (a key of ``named_parameters()``)."""
        return f"{self.owner}.{self.name}" if self.owner else self.name


# ----------------------------------------------------------------------------- planning


def _training_graphs(model: nn.Module, example_inputs: Sequence[Any]) -> list[tuple[fx.GraphModule, list[Any]]]:
    """Dynamo's graphs of one training forward of ``model``, with their example inputs (the
    model's parameters among them, lifted to inputs). The forward runs once, with the
    model's buffers (a batch norm's running statistics) and the RNG state put back after."""
    graphs: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, inputs: Sequence[Any]) -> Callable:
        graphs.append((gm, list(inputs)))
        return gm.forward

    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            torch.compile(model, backend=capture, dynamic=False)(*example_inputs)
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    # Dynamo's cache keeps ``capture`` (and what it closes over) alive: emptied, the list no
    # longer holds the parameters, which stacking then replaces.
    found = list(graphs)
    graphs.clear()
    return found


def planned_groups(model: nn.Module, example_inputs: Sequence[Any], **options: Any) -> list[tuple[str, list[str]]]:
    """The groups :func:`stack_parameters` would stack: ``(kind, parameter paths)`` per stack
    or dim-0 cat of whole parameters in the optimizer's program for a training step of
    ``model`` (``options`` go to :func:`optimus_eqsat.optimize_graph`), before tied or
    aliased parameters are left out. ``kind``: "cat", "stack", or "stack-t" for a stack of
    2-D parameters that the program only reads with its last two dims swapped."""
    from optimus_eqsat.backend import BACKEND_MIN_GAIN

    options = {"mode": "training", "min_gain": BACKEND_MIN_GAIN, **options}
    names = {id(p): n for n, p in model.named_parameters()}
    groups: list[tuple[str, list[str]]] = []
    for gm, inputs in _training_graphs(model, example_inputs):
        program = _program_with_stored_stacks(gm, inputs, options)
        if program is None:
            continue
        placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
        value = dict(zip(placeholders, inputs))
        for pack in packable_work(program, inputs).packs:
            if _reads_a_member_detached(pack):
                continue
            kind = canonical_name(pack.node)
            if (
                kind == "stack"
                and value[pack.params[0]].ndim == 2
                and pack.node.users
                and all(map(_last_dims_swapped, pack.node.users))
            ):
                kind = "stack-t"
            paths = [names.get(id(value[p])) for p in pack.params]
            if None not in paths:  # (kind: a stack or cat has a canonical name)
                groups.append((cast(str, kind), cast("list[str]", paths)))
    return groups


def _program_with_stored_stacks(
    gm: fx.GraphModule, inputs: list[Any], options: dict[str, Any]
) -> fx.GraphModule | None:
    """The optimizer's program for a training step of ``gm``, with every stack or dim-0 cat of
    whole parameters priced as free, as it is once stacking has made it the parameters'
    storage (the objective of cached inference, ``Objective.cached``, in training). Priced as
    a copy every step, those stacks keep the optimizer from batching what would pay once
    stored (it then picks fewer and smaller groups). None when the optimizer fails or keeps
    the original; the compile of the stacked model then prices its own program, where
    reading a stack is a view, and the backend measures it."""
    from optimus_eqsat.api import OptimizationRun
    from optimus_eqsat.fxvocab.symbolic import DeclinedGraph
    from optimus_eqsat.objective import Objective
    from optimus_eqsat.options import OptimizeOptions
    from optimus_eqsat.run_support import gc_paused

    opts = OptimizeOptions.from_kwargs(**options)
    run = OptimizationRun(gm, inputs, opts)
    run.objective = Objective(run.objective.profile, training=True, cached=True)
    try:
        with gc_paused():
            program = run.optimize()
    except DeclinedGraph as exc:  # (a graph the optimizer leaves as it is: nothing to plan)
        log.info("optimus_eqsat: stack_parameters: graph declined: %s", exc)
        return None
    except Exception as exc:
        if opts.raise_on_error:
            raise
        log.warning("optimus_eqsat: stack_parameters: no plan for a graph: %s: %s", type(exc).__name__, exc)
        return None
    if run.report.fell_back:
        log.info("optimus_eqsat: stack_parameters: %s", run.report.fallback_reason)
        return None
    return program


def _reads_a_member_detached(pack: Pack) -> bool:
    """Whether the program reads a member of ``pack`` through a ``detach`` (a frozen layer's, in
    a no-grad region or a stop-gradient branch, which eager gives no gradient): stacked, it
    would take the stack's gradient, and weight decay and optimizer state with it."""
    for member in cast("list[fx.Node]", pack.node.args[0]):  # (a pack's stack or cat lists nodes)
        while isinstance(member, fx.Node) and member not in pack.params:
            if canonical_name(member) == "detach":
                return True
            member = cast(fx.Node, member.args[0])  # (a whole view's input, down to the parameter)
    return False


def _last_dims_swapped(node: fx.Node) -> bool:
    """Whether ``node`` swaps the last two dims of a 3-D input (a batched linear reads its
    stacked weights so: ``bmm(x, W.permute(0, 2, 1))``). The gradient of such a stack comes
    out of the backward's ``bmm`` with those dims swapped in memory, and AccumulateGrad would
    copy it into a new tensor of the stack's layout every step (time, and the stack's size
    again at the step's peak). A stack of the members transposed, read as
    ``stack.transpose(1, 2)[k]``, is what the program reads, so it takes its gradient as it comes."""
    name = canonical_name(node)
    args = [*node.args[1:], *node.kwargs.values()]
    flat = [d for a in args for d in (a if isinstance(a, (list, tuple)) else [a])]
    if not all(isinstance(d, int) for d in flat):
        return False
    dims = cast("list[int]", flat)
    if name == "permute":
        return [d % 3 for d in dims] == [0, 2, 1]
    if name == "transpose":  # (canonical: swapaxes and swapdims too)
        return sorted(d % 3 for d in dims) == [1, 2]
    return False


def _shared(model: nn.Module) -> set[str]:
    """Paths of parameters that are tied (one parameter under two names) or share storage
    with another tensor of the model (a parameter or buffer aliasing another)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    storages: dict[tuple[str, int], set[int]] = {}
    tensors = [
        *(p for _, p in model.named_parameters(remove_duplicate=False)),
        *(b for _, b in model.named_buffers(remove_duplicate=False)),
    ]
    for t in tensors:
        if t.device.type != "meta":
            storages.setdefault((str(t.device), t.untyped_storage().data_ptr()), set()).add(id(t))
    shared = {n for names in by_id.values() if len(names) > 1 for n in names}
    aliased = {i for ids in storages.values() if len(ids) > 1 for i in ids}
    shared |= {n for i, names in by_id.items() if i in aliased for n in names}
    return shared


# ----------------------------------------------------------------------------- the layout


def _slot_property(name: str) -> property:
    """A member's parameter ``name``, read as a view of its slot of its owner's stack."""

    def read(self: nn.Module) -> torch.Tensor:
        slots = cast("dict[str, tuple[nn.Module, str, Any, bool]]", self._optimus_slots)
        owner, stack_name, index, transposed = slots[name]
        stack = getattr(owner, stack_name)
        # (transposed as a whole, then sliced: a batched program's stack of the members is
        # then a stack of slices of one tensor, which the e-graph folds to that tensor)
        return stack.transpose(1, 2)[index] if transposed else stack[index]

    return property(read, doc=f"``{name}``: a view of its slot of a stacked parameter (optimus_eqsat.stacking)")


class _StackedMember:
    """Mixed into a stacked member's class: its state dict holds each stacked parameter
    under its own key, as a view of its slot, in the original order, and loading copies
    each such entry into its slot. Pickled (``torch.save(model)``) and copied by its
    original class and slot names, as the made class has no importable name."""

    def __reduce_ex__(self, protocol: Any) -> tuple:
        state = self.__dict__
        return _member_instance, (state[_CLASS], tuple(sorted(state[_SLOTS]))), state

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        own: OrderedDict[str, Any] = OrderedDict()
        super()._save_to_state_dict(own, prefix, keep_vars)  # type: ignore[misc]
        slots = self.__dict__[_SLOTS]
        for name in self.__dict__[_ORDER]:
            key = prefix + name
            if name in slots:
                value = getattr(self, name)
                destination[key] = value if keep_vars else value.detach()
            elif key in own:
                destination[key] = own.pop(key)
        destination.update(own)

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        super()._load_from_state_dict(  # type: ignore[misc]  # (a mixin: nn.Module at run time)
            state_dict,
            prefix,
            local_metadata,
            strict,
            missing_keys,
            unexpected_keys,
            error_msgs,
        )
        for name in self.__dict__[_SLOTS]:
            key = prefix + name
            if key in unexpected_keys:
                unexpected_keys.remove(key)
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value, slot = state_dict[key], getattr(self, name)
            if not isinstance(value, torch.Tensor):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected torch.Tensor or '
                    f"Tensor-like object from checkpoint but received {type(value)}"
                )
            elif value.shape != slot.shape:
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {value.shape} from "
                    f"checkpoint, the shape in current model is {slot.shape}."
                )
            else:
                with torch.no_grad():
                    slot.copy_(value)


_CLASSES: dict[tuple[type, tuple[str, ...]], type] = {}


def _member_class(cls: type, names: tuple[str, ...]) -> type:
    """``cls`` with :class:`_StackedMember` mixed in and a slot property per name in ``names``
    (one class per (class, names), so models built alike share them)."""
    key = (cls, names)
    if key not in _CLASSES:
        body: dict[str, Any] = {name: _slot_property(name) for name in names}
        body["__module__"] = cls.__module__
        _CLASSES[key] = type(f"Stacked{cls.__name__}", (_StackedMember, cls), body)
    return _CLASSES[key]


def _member_instance(cls: type, names: tuple[str, ...]) -> nn.Module:
    """An empty instance of ``cls``'s stacked class for ``names`` (unpickling, deepcopy)."""
    return object.__new__(_member_class(cls, names))


def _save_hook(owner: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """The owner's state dict without its stacks (their members' entries stand for them)."""
    for name in owner.__dict__.get(_STACKS, {}):
        state_dict.pop(prefix + name, None)


def _load_post_hook(owner: nn.Module, incompatible: Any) -> None:
    """A checkpoint holds the members, not the owner's stacks: they are not missing."""
    stacks = owner.__dict__.get(_STACKS, {})
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k.rpartition(".")[2] not in stacks]


def _split(path: str) -> tuple[str, str]:
    module, _, name = path.rpartition(".")
    return module, name


def _common_parent(paths: Sequence[str]) -> str:
    """The deepest module path that holds every one of ``paths`` (parameters' module paths)."""
    parts = [_split(p)[0].split(".") if _split(p)[0] else [] for p in paths]
    common: list[str] = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _stack_name(owner: nn.Module, members: Sequence[str]) -> str:
    """A new parameter name on ``owner``: the prefix, a number, and the members' attribute
    name when they share one (``_optimus_stack0_weight``), so name-based rules such as
    "no weight decay on biases" still read it."""
    attrs = {_split(m)[1] for m in members}
    suffix = attrs.pop() if len(attrs) == 1 else "params"
    taken = set(owner._parameters) | set(owner.__dict__.get(_STACKS, {}))
    k = 0
    while f"{STACK_PREFIX}{k}_{suffix}" in taken:
        k += 1
    return f"{STACK_PREFIX}{k}_{suffix}"


def _stack_group(model: nn.Module, kind: str, members: list[str]) -> StackedGroup:
    """Register ``members`` (parameter paths) as one parameter on their common parent and
    make each a view of its slot."""
    params = [model.get_parameter(m) for m in members]
    owner_path = _common_parent(members)
    owner = model.get_submodule(owner_path)
    with torch.no_grad():
        if kind == "stack-t":  # (a, b) members as one (n, b, a) stack: each member a slot's transpose
            data = torch.stack([p.detach().t() for p in params])
        elif kind == "stack":
            data = torch.stack([p.detach() for p in params])
        else:
            data = torch.cat([p.detach() for p in params])
    name = _stack_name(owner, members)
    owner.register_parameter(name, nn.Parameter(data, requires_grad=params[0].requires_grad))
    offset = 0
    for k, (path, p) in enumerate(zip(members, params)):
        module_path, attr = _split(path)
        module = model.get_submodule(module_path)
        if kind != "cat":
            index: Any = k
        else:
            index = slice(offset, offset + p.shape[0])
            offset += p.shape[0]
        state = module.__dict__
        if _SLOTS not in state:
            state[_ORDER] = list(module._parameters)
            state[_SLOTS] = {}
            state[_CLASS] = type(module)
        state[_SLOTS][attr] = (owner, name, index, kind == "stack-t")
        del module._parameters[attr]
        module.__class__ = _member_class(state[_CLASS], tuple(sorted(state[_SLOTS])))
    if _STACKS not in owner.__dict__:
        owner.__dict__[_STACKS] = {}
        owner.__dict__[_HANDLES] = [
            owner.register_state_dict_post_hook(_save_hook),
            owner.register_load_state_dict_post_hook(_load_post_hook),
        ]
    group = StackedGroup(owner_path, name, tuple(members), "cat" if kind == "cat" else "stack", kind == "stack-t")
    owner.__dict__[_STACKS][name] = group
    return group


def _groups_to_stack(model: nn.Module, planned: Sequence[tuple[str, Sequence[str]]]) -> Iterator[tuple[str, list[str]]]:
    """The planned groups whose members can be stacked: whole, untied, unaliased parameters
    of one dtype, device and ``requires_grad``, not yet stacked, in no other group."""
    shared = _shared(model)
    seen: set[str] = set()
    names = dict(model.named_parameters())
    for kind, members in planned:
        members = list(members)
        if kind not in ("stack", "stack-t", "cat") or len(members) < 2 or not all(m in names for m in members):
            continue
        params = [names[m] for m in members]
        first = params[0]
        if shared & set(members) or seen & set(members) or len(set(members)) != len(members):
            log.info(
                "optimus_eqsat: stack_parameters leaves %s alone (tied, aliased or in another group)",
                ", ".join(members),
            )
            continue
        if any(
            p.dtype != first.dtype
            or p.device != first.device
            or p.requires_grad != first.requires_grad
            or (kind != "cat" and p.shape != first.shape)
            or p.shape[1:] != first.shape[1:]
            or p.ndim == 0
            or (kind == "stack-t" and p.ndim != 2)
            for p in params
        ):
            continue
        seen.update(members)
        yield kind, members


def stack_parameters(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    rounds: int = 2,
    exclude: Callable[[str], bool] | None = None,
    **options: Any,
) -> nn.Module:
    """Store the parameters the optimizer's batched training program reads stacked, in place.

    Runs the optimizer (``options`` as :func:`optimus_eqsat.optimize_graph` takes them; mode
    training) on Dynamo's graph of one training forward of ``model`` on ``example_inputs``
    (buffers and the RNG state are put back after it), pricing stacks of whole parameters as
    the free reads they become, takes every stack or dim-0 cat of whole parameters in its
    program, and registers each group as one leaf ``nn.Parameter`` on the members' closest
    common parent module (``_optimus_stack<k>_<attr>``). Each
    original parameter is then a view of its slot, read when the attribute is read:
    ``module.weight`` has the same values and shape, and the model's code runs unchanged,
    eager or compiled. Compiled with ``backend="optimus_eqsat"``, the batched program reads
    the stack itself: no copy of the weights per step, one gradient and one optimizer
    update per group.

    ``rounds``: planning runs at most. After a round stacked something, the next plans on the
    stacked model, whose program may batch other groups around the stacks now stored. Each
    round compiles and optimizes one forward (seconds). ``exclude(path)``: parameters to keep as they are (say,
    those that need their own optimizer settings); a group holding one is not stacked.

    - Build the optimizer (and any learning-rate scheduler, EMA copy or DDP/FSDP wrapper)
      *after* this call: ``model.parameters()`` now yields the stacks instead of their
      members, and an optimizer built before would update tensors the model no longer reads.
    - Gradients are on the stacks (``stack.grad[k]`` is member k's); a member's ``.grad`` is
      None, as it is no longer a leaf. ``stacked_groups(model)`` lists the groups.
    - ``state_dict()`` keys, shapes and order are the original model's; ``load_state_dict``
      takes checkpoints of the original model; :func:`unstack_parameters` restores the layout.
    - Tied parameters (one parameter under two names) and parameters sharing storage with
      another tensor of the model are left alone, with every group that holds one.

    Returns ``model`` (modified in place).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    for _ in range(rounds):
        planned = planned_groups(model, example_inputs, **options)
        if exclude is not None:
            planned = [(kind, members) for kind, members in planned if not any(map(exclude, members))]
        if not stack_groups(model, planned):
            break
    return model


def stack_groups(model: nn.Module, groups: Sequence[tuple[str, Sequence[str]]]) -> list[StackedGroup]:
    """Stack the given groups of ``model``'s parameters, in place: ``(kind, parameter paths)``
    each, ``kind`` "stack" (same-shaped parameters along a new dim 0), "stack-t" (the same
    for 2-D members, each transposed: the program reads them so) or "cat" (along dim 0), as
    :func:`planned_groups` gives them. A group holding a tied or aliased parameter, one
    already stacked or in an earlier group, or parameters of different dtypes, devices,
    ``requires_grad`` or (trailing) shapes is left alone. Returns the groups stacked."""
    stacked = [_stack_group(model, kind, list(members)) for kind, members in _groups_to_stack(model, groups)]
    for group in stacked:
        log.info("optimus_eqsat: stacked %d parameters as %s", len(group.members), group.path)
    return stacked


def stacked_groups(model: nn.Module) -> list[StackedGroup]:
    """The stacked parameters of ``model`` (:func:`stack_parameters`), owner by owner."""
    out: list[StackedGroup] = []
    for path, module in model.named_modules():
        for group in module.__dict__.get(_STACKS, {}).values():
            out.append(
                replace(group, owner=path, members=tuple(_join(path, group.owner, m) for m in group.members))
                if path != group.owner
                else group
            )
    return out


def _join(path: str, owner: str, member: str) -> str:
    """``member`` (a path from the model ``owner`` was found in) as a path under ``path``."""
    rel = member[len(owner) + 1 :] if owner else member
    return f"{path}.{rel}" if path else rel


def unstack_parameters(model: nn.Module) -> nn.Module:
    """Give ``model`` its original layout back, in place: each stacked member becomes its own
    leaf ``nn.Parameter`` again (a copy of its slot's current values, ``requires_grad`` as
    the stack's), in its module's original parameter order, and the stacks are removed.
    Rebuild the optimizer afterwards. Returns ``model``."""
    for module in list(model.modules()):
        state = module.__dict__
        if _SLOTS not in state:
            continue
        values = {}
        for attr, (owner, stack_name, index, transposed) in state[_SLOTS].items():
            stack = owner._parameters[stack_name]
            slot = stack.detach()[index]
            values[attr] = nn.Parameter(
                (slot.t() if transposed else slot).clone(memory_format=torch.contiguous_format),
                requires_grad=stack.requires_grad,
            )
        params = module._parameters
        restored = OrderedDict(
            (n, values[n] if n in values else params[n]) for n in state[_ORDER] if n in values or n in params
        )
        restored.update((n, p) for n, p in params.items() if n not in restored)
        params.clear()
        params.update(restored)
        module.__class__ = state.pop(_CLASS)
        for key in (_SLOTS, _ORDER):
            state.pop(key)
    for module in model.modules():
        stacks = module.__dict__.pop(_STACKS, None)
        if stacks is None:
            continue
        for name in stacks:
            del module._parameters[name]
        for handle in module.__dict__.pop(_HANDLES):
            handle.remove()
    return model
