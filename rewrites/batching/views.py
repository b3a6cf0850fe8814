"""Lists of tensors that are views: runs of group members and of evenly spaced slices.

Batching stacks operands and concatenates results. A list item by item costs a
copy per item (Inductor's ConcatKernel) and, in the e-graph, a list walk per
cell; but two kinds of runs in such lists are views of one tensor:

* *member runs*: members of batched groups at consecutive positions, or
  interleaved from p groups with one member shape (features whose widths
  cycle through p shape classes land in p groups, and their outputs are
  concatenated in feature order)::

      [G[k], G[k+1], ..., G[k+L-1]]                     == G[k:k+L]
      [A[i], B[j], C[l], A[i+1], B[j+1], C[l+1], ...]   == stack([A[i:], B[j:], C[l:]], 1).flatten(0, 1)

  (the second is a cat of p inputs, which Inductor fuses into its reader);
* *member-slice runs*: one slice (same dim, start and end) of each of consecutive
  members of one group, as a per-member ``chunk`` or ``split`` leaves them (a
  GLU's gate and value halves, an LSTM's gates)::

      [G[k][..., a:b], G[k+1][..., a:b], ...]           == G[k:k+L][..., a:b]

* *strided runs*: slices of one source along one dim with equal widths w at
  offsets a, a+P, a+2P, ... (P >= w): ``x.narrow(d, a, L*P)`` unflattened to
  (L, P) at d, sliced to w, with the L dim moved to the front. The members of a
  linear on concatenated weights are slices of its result, and so are slices of
  them: equal members, or one chunk of each, are such a run;
* *cyclic runs* (cats only): a cycle of p slices of one source along the cat's
  dim, any widths and order (a reordered block, a gather of a few columns),
  repeated L times at a constant stride P: ``x.narrow(d, a, L*P)`` unflattened
  to (L, P) at d, each cycle position sliced out of the P and the p slices
  concatenated there, then flattened back: one cat input instead of p * L.

Where the last stride window of a run would end past the source, the windows
start up to P - w earlier (each row then slices its piece further in); where
that is not enough, the run reads the source zero-padded to fit (``F.pad``, a
pointwise op its readers inline): stacks get that as one more alternative, cats
always.

:func:`stack_terms` builds ``torch.stack(items)`` from such runs (batching's
operand stacks); :func:`cat_alternatives` gives every concatenation of the
graph (nested cats on one dim flattened) an alternative built from its runs,
so a cat of all members of a batched group is a view of the batched term and
not one copy per member. Both are found in one pass over the list, linear in
its length; the e-graph then only sees a few terms per run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch.nn.functional as F

from optimus_eqsat.opspec import POINTWISE, OpSpec
from optimus_eqsat.opspec import Slot as Operand
from optimus_eqsat.term import Cat, Fact, Id, KnownShape, Op1, Permute, Reshape, Slice, Term, Union, cons_list
from optimus_eqsat.translate import NodeStatus, Translation

Slot = tuple[Term, int]  # (batched term, position of the member in it)
Piece = tuple[int, int, int, int]  # (source id, dim, start, end)
# Writes a run's stack term: given where to emit list-naming facts and fresh list ids.
StackBuilder = Callable[[Callable[[Fact], None], Callable[[], int]], Term]


def _slice_of_node(term: object) -> Slice | None:
    """``term`` when it is a slice of a whole FX value (``Slice(Id i, ...)``)."""
    return term if isinstance(term, Slice) and isinstance(term.x, Id) else None


def _source(s: Slice) -> int:
    """The id of the FX value a slice from :func:`_slice_of_node` slices."""
    return cast(Id, s.x).i


@dataclass(frozen=True)
class Item:
    """One list member: its term, its shape, and what it is a view of."""

    term: Term
    shape: tuple[int, ...] | None
    slot: Slot | None = None  # a member of a batched group
    piece: Piece | None = None  # a slice of a node
    piece_slot: Slot | None = None  # the group slot of the node ``piece`` slices, when a member
    of_group: bool = False  # ``piece`` slices a batched term, which the extractor may not pick


def _known_piece(it: Item) -> Piece:
    """``it.piece``, where the caller has seen that ``it`` is a slice."""
    return cast(Piece, it.piece)


def _piece(t: Translation, source: int, dim: int, start: int, end: int) -> Piece:
    """Compose slices of slices on one dim down to the first source that is not one."""
    while (s := _slice_of_node(t.terms.get(source))) is not None and s.dim == dim:
        source, start, end = _source(s), start + s.start, end + s.start
    return source, dim, start, end


def make_item(
    t: Translation,
    term: Term,
    slot_of: dict[int, Slot],
    shape: tuple[int, ...] | None = None,
    columns: dict[int, Piece] | None = None,
) -> Item:
    """Read ``term`` (an ``Id``, a slice of one, either reshaped to a non-empty shape) as an
    :class:`Item`. ``shape`` overrides the item's own (a stack pads operands on the left).
    ``columns``: members of batched groups that are slices of their batched term (a linear
    on concatenated weights), so slices of them are slices of that term."""
    inner, own = term, None
    if isinstance(term, Reshape) and term.shape:
        inner, own = term.x, term.shape
    slot = piece = None
    of_group = False
    if isinstance(inner, Id):
        i = inner.i
        own = own or t.shapes.get(i)
        slot = slot_of.get(i)
        if (s := _slice_of_node(t.terms.get(i))) is not None:
            piece = _piece(t, _source(s), s.dim, s.start, s.end)
        elif columns and i in columns:
            piece, of_group = columns[i], True
    elif (s := _slice_of_node(inner)) is not None:
        src, dim, start, end = _source(s), s.dim, s.start, s.end
        if own is None and src in t.shapes:
            own = t.shapes[src][:dim] + (end - start,) + t.shapes[src][dim + 1 :]
        piece = _piece(t, src, dim, start, end)
    if piece is not None and columns and (column := columns.get(piece[0])) is not None and column[1] == piece[1]:
        piece, of_group = (column[0], column[1], column[2] + piece[2], column[2] + piece[3]), True
    # (after the columns: a node may be a member of a linear on concatenated weights and of
    # another group too, and the slot must be of the node the final piece slices)
    piece_slot = slot_of.get(piece[0]) if piece is not None else None
    return Item(term, shape or own, slot, piece, piece_slot, of_group)


def _member_run(items: list[Item], j: int) -> tuple[int, list[Slot]]:
    """Length and cycle (first slot of each group) of the member run starting at ``j``."""
    first = items[j]
    cycle = [cast(Slot, first.slot)]  # the caller has seen that item j is a member
    q = j + 1
    while q < len(items) and items[q].slot is not None and cast(Slot, items[q].slot)[0] not in {s[0] for s in cycle}:
        cycle.append(cast(Slot, items[q].slot))
        q += 1
    p, length = len(cycle), 0
    for r in range(len(items) - j):
        it, (term, k) = items[j + r], cycle[r % p]
        if it.slot != (term, k + r // p) or it.shape != first.shape:
            break
        length = r + 1
    if p > 1:
        length -= length % p
        if length < 2 * p:
            return 0, cycle
    return length, cycle


def _member_slice_run(t: Translation, items: list[Item], j: int) -> int:
    """Length of the member-slice run starting at ``j`` (module docstring): item ``j + r``
    is the same slice of member ``k + r`` of one group, shaped as that slice; 0 when
    shorter than 2."""
    first = items[j]
    src, dim, a, b = _known_piece(first)
    group, k = cast(Slot, first.piece_slot)  # the caller has seen that it is set
    src_shape = t.shapes.get(src)
    if src_shape is None or first.shape != src_shape[:dim] + (b - a,) + src_shape[dim + 1 :]:
        return 0
    length = 1
    while j + length < len(items):
        it = items[j + length]
        if it.piece_slot != (group, k + length) or it.piece is None or it.shape != first.shape:
            break
        s, d, a1, b1 = it.piece
        if (d, a1, b1) != (dim, a, b) or t.shapes.get(s) != src_shape:
            break
        length += 1
    return length if length >= 2 else 0


def _member_slice_stack(t: Translation, it: Item, length: int) -> StackBuilder:
    src, dim, a, b = _known_piece(it)
    group, k = cast(Slot, it.piece_slot)
    src_shape = t.shapes[src]

    def build(emit: Callable[[Fact], None], new_list_id: Callable[[], int]) -> Term:
        members = Reshape(Slice(group, 0, k, k + length), (length,) + src_shape)
        return Slice(members, dim + 1, a, b)

    return build


def _strided_run(t: Translation, items: list[Item], j: int, pad: bool = False) -> tuple[int, int]:
    """Length and stride of the evenly spaced slices of one source starting at ``j``.
    ``pad``: the source may be zero-padded so the last slice's stride window fits."""
    src, dim, a0, b0 = _known_piece(items[j])
    width = b0 - a0
    if j + 1 >= len(items) or items[j + 1].piece is None or src not in t.shapes:
        return 0, 0
    s1, d1, a1, b1 = _known_piece(items[j + 1])
    stride = a1 - a0
    if (s1, d1, b1 - a1) != (src, dim, width) or stride < width or width <= 0:
        return 0, 0
    length = 1
    while j + length < len(items):
        it = items[j + length]
        if it.piece != (src, dim, a0 + length * stride, a0 + length * stride + width) or it.shape != items[j].shape:
            break
        length += 1
    size = t.shapes[src][dim]
    if not (pad and isinstance(size, int)):
        # the windows may start up to stride - width before the first piece (each row then
        # slices its piece further in), so a run whose last piece ends the source still fits
        lead = min(a0, stride - width) if isinstance(size, int) else 0
        while length >= 2 and a0 - lead + length * stride > size:
            length -= 1  # the last piece's stride window runs past the source
    return (length, stride) if length >= 2 else (0, 0)


@dataclass(frozen=True)
class Run:
    """items[start:stop], all of one shape; ``build`` makes their stack (a view where it can)."""

    start: int
    stop: int
    shape: tuple[int, ...] | None  # None: a single item of unknown shape (in a cat)
    build: StackBuilder | None  # None: a single item
    contiguous_piece: int | None = None  # dim of a run of adjacent slices (cat rules already merge those)
    members: bool = False  # a member run: its items may also be computed one by one
    # A cyclic run (only in a cat): builds the items' concatenation on the cat's dim itself.
    cat_build: StackBuilder | None = None


MAX_CYCLE = 16  # longest cycle of slices a cyclic run looks for (the search is linear in it)


def _cyclic_run(t: Translation, items: list[Item], j: int, cat_dim: int) -> tuple[int, int, int]:
    """Length (items), cycle length p >= 2 and stride of the cyclic run starting at ``j``
    (module docstring); (0, 0, 0) when there is none."""
    src, dim, a0, _ = _known_piece(items[j])
    if dim != cat_dim or src not in t.shapes:
        return 0, 0, 0
    src_shape = t.shapes[src]

    def slice_at(q: int) -> tuple[int, int] | None:  # (start, end) of item q when a slice of src on dim
        it = items[q] if q < len(items) else None
        if it is None or it.piece is None or it.piece[:2] != (src, dim):
            return None
        start, end = it.piece[2:]
        return (start, end) if it.shape == src_shape[:dim] + (end - start,) + src_shape[dim + 1 :] else None

    for p in range(2, min(MAX_CYCLE, (len(items) - j) // 2) + 1):
        cycle = cast(list[tuple[int, int]], [slice_at(j + i) for i in range(p)])  # None is tested next
        nxt = slice_at(j + p)
        if None in cycle or nxt is None:
            break  # the cycle has to be slices of src throughout
        stride, base = nxt[0] - a0, min(a for a, _ in cycle)
        if stride <= 0 or max(b for _, b in cycle) - base > stride:
            continue
        if stride == sum(b - a for a, b in cycle) and all(cycle[i][1] == cycle[i + 1][0] for i in range(p - 1)):
            continue  # adjacent slices in order: one contiguous slice (the cat rules' work), or a longer cycle
        reps = 1
        while all(
            slice_at(j + reps * p + i) == (a + reps * stride, b + reps * stride) for i, (a, b) in enumerate(cycle)
        ):
            reps += 1
        while not isinstance(src_shape[dim], int) and reps >= 2 and base + reps * stride > src_shape[dim]:
            reps -= 1  # the last window would run past a source of unknown size (known: zero-padded)
        if reps >= 2:
            return reps * p, p, stride
    return 0, 0, 0


def _cyclic_cat(t: Translation, items: list[Item], j: int, p: int, stride: int, reps: int) -> StackBuilder:
    src, dim = _known_piece(items[j])[:2]
    src_shape = t.shapes[src]
    cycle = [_known_piece(items[j + i])[2:] for i in range(p)]
    base = min(a for a, _ in cycle)
    widths = [b - a for a, b in cycle]

    def build(emit: Callable[[Fact], None], new_list_id: Callable[[], int]) -> Term:
        window = _window(t, src, dim, base, base + reps * stride, emit)
        rows = Reshape(window, src_shape[:dim] + (reps, stride) + src_shape[dim + 1 :])
        columns = [Slice(rows, dim + 1, a - base, b - base) for a, b in cycle]
        picked = Cat(cons_list(columns, dim + 1, emit, new_list_id, widths))
        return Reshape(picked, src_shape[:dim] + (reps * sum(widths),) + src_shape[dim + 1 :])

    return build


def find_runs(t: Translation, items: list[Item], cat_dim: int | None = None, pad: bool = False) -> list[Run]:
    """Split ``items`` into member runs, member-slice runs, strided runs and single items, in one pass;
    with ``cat_dim`` (the items of a cat on that dim) also cyclic runs; with ``pad``,
    strided runs read a zero-padded source where the last stride window runs past it."""
    runs, j = [], 0
    while j < len(items):
        it = items[j]
        run = None
        if it.shape is not None and it.slot is not None:
            length, cycle = _member_run(items, j)
            if length >= 2:
                run = Run(j, j + length, it.shape, _member_stack(cycle, length, it.shape), members=True)
        if run is None and it.shape is not None and it.piece_slot is not None:
            length = _member_slice_run(t, items, j)
            if length >= 2:
                run = Run(j, j + length, it.shape, _member_slice_stack(t, it, length), members=True)
        if run is None and it.shape is not None and it.piece is not None:
            length, stride = _strided_run(t, items, j, pad)
            if length >= 2:
                src, dim, a0, b0 = it.piece
                run = Run(
                    j,
                    j + length,
                    it.shape,
                    _strided_stack(t, it.piece, stride, length, it.shape),
                    dim if stride == b0 - a0 else None,
                    members=any(x.of_group for x in items[j : j + length]),
                )
        if cat_dim is not None and it.piece is not None and (run is None or run.contiguous_piece is not None):
            length, p, stride = _cyclic_run(t, items, j, cat_dim)
            if length > (run.stop - run.start if run else 0):  # pairs of adjacent slices repeated: a cycle
                run = Run(j, j + length, it.shape, None, cat_build=_cyclic_cat(t, items, j, p, stride, length // p))
        runs.append(run or Run(j, j + 1, it.shape, None))
        j = runs[-1].stop
    return runs


def _member_stack(cycle: list[Slot], length: int, shape: tuple[int, ...]) -> StackBuilder:
    p = len(cycle)

    def build(emit: Callable[[Fact], None], new_list_id: Callable[[], int]) -> Term:
        if p == 1:
            term, k = cycle[0]
            return Reshape(Slice(term, 0, k, k + length), (length,) + shape)
        full = length // p
        parts: list[Term] = [Reshape(Slice(term, 0, k, k + full), (full, 1) + shape) for term, k in cycle]
        return Reshape(Cat(cons_list(parts, 1, emit, new_list_id, [1] * p)), (length,) + shape)

    return build


def _strided_stack(
    t: Translation, piece: tuple[int, int, int, int], stride: int, length: int, shape: tuple[int, ...]
) -> StackBuilder:
    src, dim, a0, b0 = piece
    src_shape = t.shapes[src]
    size = src_shape[dim]
    # where the last window runs past the source, start the windows earlier (as far as the
    # first piece and the gap between pieces allow) instead of padding the source
    overrun = a0 + length * stride - size if isinstance(size, int) else 0
    lead = max(0, min(a0, stride - (b0 - a0), overrun))

    def build(emit: Callable[[Fact], None], new_list_id: Callable[[], int]) -> Term:
        window = _window(t, src, dim, a0 - lead, a0 - lead + length * stride, emit)
        rows = Reshape(window, src_shape[:dim] + (length, stride) + src_shape[dim + 1 :])
        perm = (dim,) + tuple(range(dim)) + tuple(range(dim + 1, len(src_shape) + 1))
        picked = Permute(Slice(rows, dim + 1, lead, lead + b0 - a0), perm)
        return Reshape(picked, (length,) + shape)

    return build


def name_term(t: Translation, term: Term, shape: tuple[int, ...] | None, emit: Callable[[Fact], None]) -> Id:
    """Name ``term`` by a fresh id; give it a shape when rules cannot derive it."""
    name = Id(t.next_id)
    t.next_id += 1
    emit(Union(name, term))
    if shape is not None:
        emit(KnownShape(name, shape))
    return name


def zero_padded(
    t: Translation, x: Term, shape: tuple[int, ...], dim: int, extra: int, emit: Callable[[Fact], None]
) -> Id:
    """A new id for ``x`` (of ``shape``) with ``extra`` zeros appended on ``dim`` (F.pad, which
    fuses into its readers as an ordinary pointwise op)."""
    key = t.registry.register(
        OpSpec("call_function", F.pad, (Operand(0), (0, 0) * (len(shape) - 1 - dim) + (0, extra)), (), POINTWISE)
    )
    return name_term(t, Op1(key, x), shape[:dim] + (shape[dim] + extra,) + shape[dim + 1 :], emit)


def _window(t: Translation, src: int, dim: int, start: int, end: int, emit: Callable[[Fact], None]) -> Term:
    """``src[start:end]`` on ``dim``, over ``src`` zero-padded where ``end`` runs past a known size."""
    size = t.shapes[src][dim]
    overrun = end - size if isinstance(size, int) else 0
    source = Id(src) if overrun <= 0 else zero_padded(t, Id(src), t.shapes[src], dim, overrun, emit)
    return Slice(source, dim, start, end)


def stack_terms(t: Translation, items: list[Item], emit: Callable[[Fact], None]) -> list[Term]:
    """Equal terms for ``torch.stack(items)`` (all of one shape): a view per run and a
    unit-dim reshape per other item; where a strided run stops short of the source's end
    (its last stride window would run past it), the same over the zero-padded source too;
    and, when a run holds group members, the plain stack of the items, so the extractor
    may still compute those one by one (their group need not be batched for this stack to be)."""
    runs = find_runs(t, items)
    terms = [_stack_of(t, items, runs, emit)]
    padded = find_runs(t, items, pad=True)
    if len(padded) < len(runs):
        terms.append(_stack_of(t, items, padded, emit))
    if any(r.members for r in runs):
        plain = [Reshape(it.term, (1,) + _stack_shape(runs[0])) for it in items]
        terms.append(Cat(cons_list(plain, 0, emit, t.new_list_id, [1] * len(plain))))
    return terms


def _stack_shape(r: Run) -> tuple[int, ...]:
    """``r.shape`` of a run of a stack's items, which all have a shape."""
    return cast(tuple[int, ...], r.shape)


def _stack_of(t: Translation, items: list[Item], runs: list[Run], emit: Callable[[Fact], None]) -> Term:
    """The stack of ``items`` as the cat of its runs' stacks (a unit-dim reshape per single item)."""
    parts = [
        r.build(emit, t.new_list_id) if r.build else Reshape(items[r.start].term, (1,) + _stack_shape(r)) for r in runs
    ]
    sizes = [r.stop - r.start for r in runs]
    return parts[0] if len(parts) == 1 else Cat(cons_list(parts, 0, emit, t.new_list_id, sizes))


def _flat_items(t: Translation, cat: int, dim: int) -> list[Term]:
    """The cat's items, nested cats on the same dim expanded in place (iteratively: an
    accumulation chain of cats can be deeper than Python's recursion limit)."""
    out: list[Term] = []
    pending = list(reversed(t.cats[cat][0]))
    while pending:
        term = pending.pop()
        inner = term.i if isinstance(term, Id) else None
        if inner is not None and inner in t.cats and t.cats[inner][1] == dim and t.status.get(inner) == NodeStatus.TERM:
            pending.extend(reversed(t.cats[inner][0]))
        else:
            out.append(term)
    return out


def _only_inside_a_cat(t: Translation, cat: int, dim: int) -> bool:
    users = list(t.nodes[cat].users)
    if len(users) != 1:
        return False
    outer = t.index.get(users[0])
    return (
        outer in t.cats
        and t.cats[outer][1] == dim
        and t.status.get(outer) == NodeStatus.TERM
        and Id(cat) in t.cats[outer][0]
    )  # flattened into it by _flat_items


def cat_alternatives(t: Translation, slot_of: dict[int, Slot], emit: Callable[[Fact], None]) -> int:
    """Union every cat having a member or strided run with the cat of its runs' views.

    Runs of adjacent slices along the cat's own dim are left to the cat-run rules.
    Returns how many cats gained an alternative.
    """
    added = 0
    for cat, (_, dim) in t.cats.items():
        if t.status.get(cat) != NodeStatus.TERM or _only_inside_a_cat(t, cat, dim):
            continue  # an inner cat is covered by its outer one (and a chain of n is not flattened n times)
        items = [make_item(t, term, slot_of) for term in _flat_items(t, cat, dim)]
        runs = find_runs(t, items, cat_dim=dim, pad=True)
        if all((r.build is None or r.contiguous_piece == dim) and r.cat_build is None for r in runs):
            continue
        parts: list[Term] = []
        sizes: list[int | None] = []
        for r in runs:
            length, s = r.stop - r.start, r.shape
            if r.cat_build is not None:
                sizes.append(sum(_known_piece(it)[3] - _known_piece(it)[2] for it in items[r.start : r.stop]))
                parts.append(r.cat_build(emit, t.new_list_id))
                continue
            sizes.append(t.symbols.product((length, s[dim])) if s is not None else None)
            if r.build is None:
                parts.append(items[r.start].term)
                continue
            assert s is not None  # a run with a build (member or strided) has a shape
            perm = tuple(range(1, dim + 1)) + (0,) + tuple(range(dim + 1, len(s) + 1))
            merged = s[:dim] + (t.symbols.product((length, s[dim])),) + s[dim + 1 :]
            parts.append(Reshape(Permute(r.build(emit, t.new_list_id), perm), merged))
        known = None if None in sizes else cast(list[int], sizes)
        whole = parts[0] if len(parts) == 1 else Cat(cons_list(parts, dim, emit, t.new_list_id, known))
        emit(Union(Id(cat), whole))
        added += 1
    return added
