"""FX graph -> egglog facts, one command per node, never recursive in graph depth.

Every node i whose op the term language knows becomes ``(union (Id i) TERM)``,
where TERM names its inputs ``(Id j)``. Placeholders, parameters and opaque
nodes become ``(Leaf i)``; the rebuilder copies opaque nodes verbatim. Split
family nodes (split, chunk, unbind) produce no fact of their own: their pieces
are Slice terms that the getitem users take.

Mutation: a value that is mutated (in place ops, ``out=``, setitem), everything
that aliases it (views, unknown ops) and every reader of those is opaque and
*ordered*. Ordering is by effects, not one total order: each ordered node has a
footprint (:func:`effect_footprints`), the memory it reads or writes (one key per
set of aliasing values), ``EVERYTHING`` for an unknown op, ``RNG`` for a random op
when the user asked Inductor for eager's random stream (``fallback_random``). Two
ordered nodes keep their order only when their footprints meet
(``Translation.effect_deps``); a training batch norm's statistics and a dropout
elsewhere in the graph do not wall anything off.

Random ops: Inductor does not reproduce eager's random stream (unless
``torch._inductor.config.fallback_random``), so the optimizer promises the same
distribution with independent draws, not the same numbers: random ops are opaque
but unordered. Under ``fallback_random`` they keep their order among themselves
(and against unknown ops), so eager's stream is kept.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx

from optimus_eqsat import normalize
from optimus_eqsat.dropout_draws import keeps_rng_order
from optimus_eqsat.fxvocab import (  # noqa: F401  (re-exported)
    ALIASING_OPS,
    RANDOM_OPS,
    ExampleInputError,
    canonical_name,
    check_example_inputs,
    memory_order,
    node_values,
    record_shapes,
)
from optimus_eqsat.fxvocab.mutation import (  # noqa: F401
    inplace_position,
    is_mutating,
    running_stats_written,
    written_inputs,
)
from optimus_eqsat.fxvocab.symbolic import SymbolicSizes
from optimus_eqsat.normalize import HANDLERS, MODULE_OPS, Unsupported, bind
from optimus_eqsat.opspec import OpRegistry, OpSpec, Slot
from optimus_eqsat.term import (
    Fact,
    Id,
    KnownShape,
    Leaf,
    ListTerm,
    Op1,
    Op2,
    Op3,
    Reshape,
    Scalar,
    Term,
    Unary,
    Union,
    cons_list,
)
from optimus_eqsat.tuple_ops import TUPLE_OPS

log = logging.getLogger(__name__)


class Impure(Unsupported):
    """A known op with a side effect (random, in training mode): opaque and ordered."""


class NodeStatus(str, enum.Enum):
    """What the translator made of an FX node (a ``str``: compares equal to its value)."""

    TERM = "term"  # a term of the language
    LEAF = "leaf"  # a graph input, parameter or constant: a Leaf term
    OPAQUE = "opaque"  # kept as it is (an unknown op, mutated memory): an opaque Leaf
    PIECES = "pieces"  # a split or tuple op: its pieces are terms, the node itself none
    OUTPUT = "output"  # the graph's output node

    def __str__(self) -> str:  # messages and tables show the value, as before the enum
        return self.value


@dataclass
class Translation:
    """The facts for one graph, and what the rebuilder needs to map terms back."""

    gm: torch.fx.GraphModule
    nodes: list[torch.fx.Node]
    facts: list[Fact] = field(default_factory=list)
    status: dict[int, NodeStatus] = field(default_factory=dict)  # what each node became
    # sizes >= 0, or codes of symbolic sizes (< 0: ``symbols`` says which expression and hint)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    symbols: SymbolicSizes = field(default_factory=SymbolicSizes)
    dtypes: dict[int, torch.dtype] = field(default_factory=dict)
    param_leaves: dict[int, str] = field(default_factory=dict)  # synthetic leaf id -> parameter path
    ordered: set[int] = field(default_factory=set)
    # ordered node id -> the ordered nodes before it whose footprints meet its own (its only order)
    effect_deps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    batch_members: dict[int, tuple[int, ...]] = field(default_factory=dict)  # batched term id -> member ids
    # random ops whose inputs' memory layout decides their numbers (eager's stream, under fallback_random)
    layout_sensitive: set[int] = field(default_factory=set)
    # inputs of those ops -> their dims outermost-first in memory (fxvocab.meta.memory_order)
    memory_orders: dict[int, list[int]] = field(default_factory=dict)
    opaque_reasons: dict[int, str] = field(default_factory=dict)
    registry: OpRegistry = field(default_factory=OpRegistry)
    copied: set[int] = field(default_factory=set)  # nodes copied verbatim (opaque, and pieces they read)
    roots: list[int] = field(default_factory=list)  # ids whose classes are extracted
    terms: dict[int, Term] = field(default_factory=dict)  # id -> the term it was unioned with
    cats: dict[int, tuple[tuple[Term, ...], int]] = field(default_factory=dict)  # cat/stack id -> (items, dim)
    list_ids: int = 0  # LId names handed out for long lists
    next_id: int = 0  # first id free for terms added after translation (batching)

    @functools.cached_property
    def index(self) -> dict[torch.fx.Node, int]:
        """FX node -> id; built once, after translation (which adds parameter leaves)."""
        return {n: i for i, n in enumerate(self.nodes)}

    def new_list_id(self) -> int:
        """A fresh LId name for a long list's tail."""
        self.list_ids += 1
        return self.list_ids


# ---------------------------------------------------------------- mutation analysis


def ordered_nodes(
    gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]
) -> tuple[set[torch.fx.Node], set[torch.fx.Node]]:
    """(nodes that must stay opaque, nodes whose relative order must be kept)."""
    memory = written_memory(gm, nodes)
    forced = memory.accesses()
    return forced, forced | memory.mutating


#: Footprint keys of effects that are not memory a graph names.
EVERYTHING = "*"  # an unknown op: it may touch any memory, and draw random numbers
RNG = "rng"  # the random stream, under fallback_random


@dataclass
class WrittenMemory:
    """What a graph writes: the mutating nodes, the values whose memory they may write (the
    written tensors, the views of them and what they are views of, placeholders included),
    and which of those share memory (``root``: one representative per set of aliasing values)."""

    mutating: set[torch.fx.Node] = field(default_factory=set)
    tainted: set[torch.fx.Node] = field(default_factory=set)
    root: dict[torch.fx.Node, torch.fx.Node] = field(default_factory=dict)

    def accesses(self) -> set[torch.fx.Node]:
        """The call nodes that read or write written memory (they stay opaque and ordered)."""
        readers = {u for n in self.tainted for u in n.users}
        return {n for n in self.tainted | readers if n.op not in ("placeholder", "get_attr", "output")}

    def footprint(self, node: torch.fx.Node, gm: torch.fx.GraphModule) -> set[Any]:
        """Keys of the written memory ``node`` reads or writes."""
        touched = [node, *node.all_input_nodes, *written_inputs(gm, node)]
        return {self.root[m] for m in touched if m in self.root}


def written_memory(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> WrittenMemory:
    """The memory the graph may write (:class:`WrittenMemory`)."""
    mutating = {n for n in nodes if n.op in ("call_function", "call_method", "call_module") and is_mutating(gm, n)}
    if not mutating:
        return WrittenMemory()

    def aliasing(n: torch.fx.Node) -> bool:  # unknown ops may alias too
        name = canonical_name(n)
        # (a norm's output is new memory: only its running statistics are written)
        return (
            n.op == "call_module"
            or name is None
            or name in ALIASING_OPS
            or (n in mutating and not running_stats_written(n))
        )

    def aliased_inputs(n: torch.fx.Node) -> list[torch.fx.Node]:
        # a known in-place op returns what it writes (``x.add_(y)`` is ``x``, never ``y``)
        if n in mutating and n.op != "call_module" and canonical_name(n) is not None:
            return written_inputs(gm, n)
        return n.all_input_nodes

    import networkx as nx  # (here: a compile the persistent cache answers never translates)

    tainted: set[torch.fx.Node] = set()
    memory = nx.Graph()  # tainted values, joined where one may alias the other
    work = [w for n in mutating for w in written_inputs(gm, n)] + [n for n in mutating if aliasing(n)]
    while work:
        n = work.pop()
        if n in tainted:
            continue
        tainted.add(n)
        memory.add_node(n)
        if aliasing(n):  # the base of a view is written through the view
            bases = aliased_inputs(n)
            work.extend(a for a in bases if a not in tainted)
            memory.add_edges_from((n, a) for a in bases)
        aliases = [u for u in n.users if aliasing(u)]
        work.extend(u for u in aliases if u not in tainted)
        memory.add_edges_from((n, u) for u in aliases)
    root = {n: min(part, key=lambda m: m.name) for part in nx.connected_components(memory) for n in part}
    return WrittenMemory(mutating, tainted, root)


def effect_footprints(
    gm: torch.fx.GraphModule, ordered: list[torch.fx.Node], memory: WrittenMemory, keep_rng_order: bool
) -> dict[torch.fx.Node, set[Any]]:
    """What each ordered node touches: the keys of the written memory it reads or writes,
    :data:`EVERYTHING` for an unknown op, :data:`RNG` for a random op when ``keep_rng_order``."""
    footprints = {}
    for node in ordered:
        keys = memory.footprint(node, gm)
        if _unknown(gm, node):
            keys.add(EVERYTHING)
        elif keep_rng_order and _random(gm, node):
            keys.add(RNG)
        footprints[node] = keys
    return footprints


def effect_edges(
    ordered: list[torch.fx.Node], footprints: dict[torch.fx.Node, set[Any]]
) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """For each ordered node (in graph order), the latest earlier ordered nodes whose
    footprints meet its own: the only order the rebuilt program must keep (transitively,
    every earlier effect on the same memory)."""
    position = {n: k for k, n in enumerate(ordered)}
    last: dict[Any, torch.fx.Node] = {}
    last_everything: torch.fx.Node | None = None
    deps: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in ordered:
        keys = footprints[node]
        if EVERYTHING in keys:
            before = set(last.values())
            last, last_everything = {}, node
        else:
            before = {last[k] for k in keys if k in last}
            last.update((k, node) for k in keys)
        if last_everything is not None and last_everything is not node:
            before.add(last_everything)
        deps[node] = sorted(before, key=position.__getitem__)
    return deps


def _unknown(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """An op whose effects nothing here knows (an unknown function or module)."""
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))) not in MODULE_OPS
    return node.op in ("call_function", "call_method") and canonical_name(node) is None


def _random(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A random op: it draws from the random stream (dropout in training included)."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training and module.p > 0
    name = canonical_name(node)
    if name in RANDOM_OPS:
        return True
    if name in ("dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d"):
        training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
        p: object = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
        return training is not False and p != 0
    return False


# ---------------------------------------------------------------- translator


class Translator:
    """Builds a :class:`Translation` for one GraphModule."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.ids = {n: i for i, n in enumerate(self.nodes)}
        self.t = Translation(gm, self.nodes)
        self.split_pieces: dict[int, list[Term]] = {}
        self.node: torch.fx.Node | None = None
        if example_inputs is not None:
            check_example_inputs(gm, example_inputs)
        values = node_values(gm, example_inputs)
        self.values = values  # (the layouts of random ops' inputs are read from it)
        symbols = self.t.symbols
        for i, n in enumerate(self.nodes):
            value = values[n]
            if n.op == "placeholder":
                symbols.note_source(n, value)
            shape = getattr(value, "shape", None)
            shape = symbols.encode_shape(shape) if shape is not None else None
            if shape is not None and not isinstance(value, (tuple, list)):
                self.t.shapes[i] = shape
                dtype = getattr(value, "dtype", None)
                if isinstance(dtype, torch.dtype):
                    self.t.dtypes[i] = dtype

    # -- Context protocol for handlers
    def ref(self, value: Any) -> Id:
        if not isinstance(value, torch.fx.Node):
            raise Unsupported(f"{value!r} is not a tensor value")
        i = self.ids[value]
        if self.t.status.get(i) not in (NodeStatus.TERM, NodeStatus.LEAF, NodeStatus.OPAQUE):
            raise Unsupported(f"{value.name} is not a tensor term")
        if isinstance(self.values.get(value), (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            # (a size: ``-x.size(1)`` is operator.neg of a SymInt, which torch.neg refuses)
            raise Unsupported(f"{value.name} is a number, not a tensor")
        return Id(i)

    def shape(self, value: Any) -> tuple[int, ...]:
        shape = self.t.shapes.get(self.ids.get(value, -1)) if isinstance(value, torch.fx.Node) else None
        if shape is None:
            raise Unsupported("unknown shape")
        return shape

    def out_shape(self) -> tuple[int, ...]:
        return self.shape(self.node)

    def same_dtype_as_input(self, value: Any) -> bool:
        dtypes = self.t.dtypes
        a, b = dtypes.get(self.ids.get(value, -1)), dtypes.get(self.ids[self.node])
        return a is not None and a == b

    def pieces(self, value: Any) -> list[Term] | None:
        return self.split_pieces.get(self.ids[value]) if isinstance(value, torch.fx.Node) else None

    def cons(self, items: list[Term], dim: int) -> ListTerm:
        self.t.cats[self.ids[self.node]] = (tuple(items), dim)  # batching reads cats as lists
        return cons_list(items, dim, self.t.facts.append, self.t.new_list_id)

    def named(self, key: str, target: Any, n_operands: int, kind: str) -> str:
        spec = OpSpec("call_function", target, tuple(Slot(i) for i in range(n_operands)), (), kind)
        return self.t.registry.add_named(key, spec)

    def generic(
        self,
        kind: str,
        elementwise: bool = False,
        *,
        op: str | None = None,
        target: Any = None,
        args: tuple | None = None,
        kwargs: dict | None = None,
    ) -> Term:
        """An op kept as is, keyed by its target and constant arguments."""
        node = cast(torch.fx.Node, self.node)  # (set while a node is translated)
        op = op or node.op
        target = node.target if target is None else target
        args = node.args if args is None else args
        kwargs = dict(node.kwargs if kwargs is None else kwargs)
        operands: list[Id] = []

        def slot(value: Any) -> Any:
            if isinstance(value, torch.fx.Node):
                operands.append(self.ref(value))
                return Slot(len(operands) - 1)
            if isinstance(value, (list, tuple)):
                return type(value)(slot(v) for v in value)
            if isinstance(value, dict):
                raise Unsupported("dict argument")
            return value

        template = tuple(slot(a) for a in args)
        kw = tuple(sorted((k, slot(v)) for k, v in kwargs.items()))
        if op not in ("call_function", "call_method"):
            raise Unsupported(op)
        try:
            hash((template, kw))
        except TypeError as exc:
            raise Unsupported(f"unhashable argument: {exc}") from None
        key = self.t.registry.register(OpSpec(op, target, template, kw, kind))
        if elementwise and len(operands) == 1:
            return Unary(key, operands[0])
        if 1 <= len(operands) <= 3:
            return (Op1, Op2, Op3)[len(operands) - 1](key, *operands)
        raise Unsupported(f"{len(operands)} tensor operands")

    # -- translation
    def run(self) -> Translation:
        memory = written_memory(self.gm, self.nodes)
        forced = memory.accesses()
        ordered = forced | memory.mutating
        keep_rng_order = keeps_rng_order()
        t = self.t
        for i, node in enumerate(self.nodes):
            self.node = node
            if node.op in ("placeholder", "get_attr"):
                self._leaf(i)
            elif node.op == "output":
                t.status[i] = NodeStatus.OUTPUT
            elif node in forced:
                self._opaque(i, "reads or writes mutated memory", ordered=True)
            else:
                try:
                    self._call(i, node)
                except Impure as exc:
                    self._opaque(i, str(exc), ordered=keep_rng_order)
                except Unsupported as exc:
                    self._opaque(
                        i,
                        str(exc),
                        ordered=node in ordered
                        or _unknown(self.gm, node)
                        or (keep_rng_order and _random(self.gm, node)),
                    )
        if keep_rng_order:
            t.layout_sensitive = {i for i in t.ordered if _random(self.gm, self.nodes[i])}
            for i in t.layout_sensitive:
                for arg in self.nodes[i].all_input_nodes:
                    value = self.values.get(arg)
                    if isinstance(value, torch.Tensor):
                        t.memory_orders[self.ids[arg]] = memory_order(value)
        self._order_effects(memory, keep_rng_order)
        self._collect_roots()
        t.next_id = len(self.nodes)
        return t

    def _order_effects(self, memory: WrittenMemory, keep_rng_order: bool) -> None:
        """``effect_deps`` of the ordered nodes: only those whose footprints meet keep their order."""
        t = self.t
        ordered = [self.nodes[i] for i in sorted(t.ordered)]
        deps = effect_edges(ordered, effect_footprints(self.gm, ordered, memory, keep_rng_order))
        t.effect_deps = {self.ids[n]: tuple(self.ids[d] for d in before) for n, before in deps.items()}

    def _emit(self, i: int, term: Term) -> None:
        if self._shape_disagrees(i, term):
            self._opaque(i, "its recorded shape is not its operand's", ordered=False)
            return
        self.t.facts.append(Union(Id(i), term))
        self.t.terms[i] = term
        self.t.status[i] = NodeStatus.TERM
        # Every known shape is loaded, also those the shape rules could derive: derived
        # along a chain they take one saturation step per node (quadratic on deep graphs).
        if i in self.t.shapes:
            self.t.facts.append(KnownShape(Id(i), self.t.shapes[i]))

    def _shape_disagrees(self, i: int, term: Term) -> bool:
        """An elementwise op of one tensor whose recorded shape is not its operand's. Dynamo's
        meta can give a value a concrete size where its operand has a symbolic one of the same
        hint; the shape rules would derive the operand's and egglog refuses two shapes for one
        value, so such a node stays opaque."""
        if not isinstance(term, (Unary, Scalar)) or not isinstance(term.x, Id):
            return False
        shapes = self.t.shapes
        return i in shapes and term.x.i in shapes and tuple(shapes[i]) != tuple(shapes[term.x.i])

    def _leaf(self, i: int) -> None:
        self.t.status[i] = NodeStatus.LEAF
        self._emit(i, Leaf(i))
        self.t.status[i] = NodeStatus.LEAF

    def _opaque(self, i: int, reason: str, ordered: bool) -> None:
        self.t.opaque_reasons[i] = reason
        self._emit(i, Leaf(i))
        self.t.status[i] = NodeStatus.OPAQUE
        if ordered:
            self.t.ordered.add(i)

    def _call(self, i: int, node: torch.fx.Node) -> None:
        if node.op == "call_module":
            return self._emit(i, self._module(node))
        name = canonical_name(node)
        if name is None:
            raise Unsupported(f"unknown target {node.target}")
        if name in RANDOM_OPS:
            raise Impure(f"{name} is random")
        if name not in HANDLERS:
            raise Unsupported(f"no handler for {name}")
        params, defaults, handler = HANDLERS[name]
        bound = bind(node, params, defaults) if params else {}
        if name in ("split", "chunk", "unbind") or name in TUPLE_OPS:
            self._check_piece_users(node)
        result = handler(cast(normalize.Context, self), bound)  # (self.node: this node)
        if isinstance(result, list):
            self.split_pieces[i] = result
            self.t.status[i] = NodeStatus.PIECES
        else:
            self._emit(i, result)

    def _check_piece_users(self, node: torch.fx.Node) -> None:
        for user in node.users:
            name = canonical_name(user)
            if name == "getitem" and isinstance(user.args[1], int):
                continue
            if name in ("cat", "stack") and user.args and user.args[0] is node:
                continue
            raise Unsupported(f"split result used whole by {user.name}")

    def _module(self, node: torch.fx.Node) -> Term:
        module = self.gm.get_submodule(str(node.target))
        entry = MODULE_OPS.get(type(module))
        if entry is None or node.kwargs or len(node.args) != 1:
            raise Unsupported(f"module {type(module).__name__}")
        name, target, param_names, constants = entry
        x = node.args[0]
        if name == "identity" or (name == "dropout" and (not module.training or module.p == 0)):
            return self.ref(x)
        if name == "dropout":
            raise Impure("dropout module in training mode")
        if name == "flatten":
            return Reshape(self.ref(x), self.out_shape())
        params = [self._param_leaf(f"{node.target}.{p}", getattr(module, p)) for p in param_names]
        if name == "linear":
            return normalize.h_linear(
                cast(normalize.Context, self), {"input": x, "weight": params[0], "bias": params[1]}
            )
        kwargs = constants(module)
        args: tuple = (x,)
        if name == "layer_norm":
            args = (x, kwargs.pop("normalized_shape"), *params)
        elif name == "embedding":
            args = (x, *params)
        kind = normalize.GENERIC_KINDS.get(name, normalize.POINTWISE)
        elementwise = name in normalize.ELEMENTWISE_UNARY
        return self.generic(kind, elementwise, op="call_function", target=target, args=args, kwargs=kwargs)

    def _param_leaf(self, path: str, value: Any) -> torch.fx.Node | None:
        """A module parameter as a leaf: a synthetic get_attr node (added to the id table)."""
        if value is None:
            return None
        for i, existing in self.t.param_leaves.items():
            if existing == path:
                return self.nodes[i]
        stub = torch.fx.Node(self.gm.graph, f"_param_{len(self.nodes)}", "get_attr", path, (), {})
        i = len(self.nodes)
        self.nodes.append(stub)
        self.ids[stub] = i
        self.t.param_leaves[i] = path
        self.t.shapes[i] = tuple(value.shape)
        self.t.dtypes[i] = value.dtype
        self._leaf(i)
        return stub

    def _collect_roots(self) -> None:
        """Classes to extract: graph outputs and inputs of verbatim-copied nodes."""
        t = self.t
        roots: dict[int, None] = {}
        work = [i for i, s in t.status.items() if s in (NodeStatus.OPAQUE, NodeStatus.OUTPUT)]
        seen = set(work)
        while work:
            i = work.pop()
            t.copied.add(i)
            for arg in self.nodes[i].all_input_nodes:
                j = self.ids[arg]
                if t.status[j] == NodeStatus.PIECES:
                    if j not in seen:  # a split read whole by an opaque node is copied too
                        seen.add(j)
                        work.append(j)
                elif t.status[j] in (NodeStatus.TERM, NodeStatus.LEAF):
                    roots[j] = None
        t.copied -= {i for i, s in t.status.items() if s == NodeStatus.OUTPUT}
        t.roots = list(roots)


def translate(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None) -> Translation:
    """Translate a GraphModule into egglog facts."""
    return Translator(gm, example_inputs).run()
