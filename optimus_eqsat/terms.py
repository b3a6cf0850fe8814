"""Small builders of term-language text shared by the translator and batching."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

# egglog's parser recurses per nesting level: 1,000 nested list cells parse in
# 0.2 s, 5,000 in 4.5 s, 20,000 crash the process. Longer lists are chained
# through named cells (LId) of at most this many members each. Loading costs
# per cell grow with the nesting too: 0.24 ms a cell in chunks of 64, 0.1 ms in
# chunks of 16 (batching's stacks of the 300-feature extreme graph).
MAX_INLINE_LIST = 16


def vec(values: Iterable[int]) -> str:
    """A Shape literal."""
    values = [str(int(v)) for v in values]
    return f"(vec-of {' '.join(values)})" if values else "(vec-empty)"


def cons_list(items: list[str], dim: int, emit: Callable[[str], None], new_list_id: Callable[[], int],
              sizes: Sequence[int] | None = None) -> str:
    """A TList term of ``items`` concatenated along ``dim``.

    Long lists are built tail first in chunks; each finished chunk is named
    ``(LId k)`` by a fact passed to ``emit``, so no command nests deeply.
    With ``sizes`` (each item's extent along ``dim``) every named chunk also
    gets its ``ldim`` and ``lsize``: the shape rules derive those one cell per
    saturation round from the list's end, and a round costs 10-20 ms on a
    150,000-node e-graph, so a 2,000-member list loaded after saturation took
    17 s to settle; seeded, no walk is longer than one chunk.
    """
    tail = f"(TNil {dim})"
    chunks = [items[i : i + MAX_INLINE_LIST] for i in range(0, len(items), MAX_INLINE_LIST)] or [[]]
    suffix, suffix_size = len(items), 0
    for n, chunk in enumerate(reversed(chunks)):
        term = tail
        for item in reversed(chunk):
            term = f"(TCons {item} {term})"
        if n == len(chunks) - 1:
            return term
        k = new_list_id()
        emit(f"(union (LId {k}) {term})")
        if sizes is not None:
            suffix_size += sum(sizes[suffix - len(chunk) : suffix])
            emit(f"(set (ldim (LId {k})) {dim})")
            emit(f"(set (lsize (LId {k})) {suffix_size})")
        suffix -= len(chunk)
        tail = f"(LId {k})"
    return tail
