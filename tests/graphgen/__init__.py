"""Seeded random FX-graph generator: the input side of the differential fuzzer.

``random_graph(seed)`` builds a ``torch.fx.GraphModule`` directly with
``torch.fx.Graph`` from the ops of optimus-eqsat's term language (split/cat/view
plumbing, linears, norms, pointwise ops) plus, on request, ops the optimizer does
not know (opaque ops, tuple-returning ops) and in-place mutations.

How it stays valid: every emitted node is *evaluated while it is built* on
concrete example tensors (``_Builder.env``), so shapes are never guessed -- a
builder reads the real shape of its operands, and the eager semantics of
in-place ops and views are mirrored exactly.  Builders are small functions, one
per op family, registered in ``BUILDERS``; each tags the families it used so
tests can assert coverage (``GeneratedGraph.families``).

Modules: ``builder`` (the graph under construction and its concrete values),
``views``, ``compute``, ``tangles``, ``effects`` (the builders, by kind of
fragment; ``training``: batch norms, dropouts, checkpoint, grad-mode and autocast regions), ``families`` (the builder table and the tags to cover), ``driver``
(assembling a program: ``random_graph``, ``random_module``). Underscore names
are private to the package, shared between its modules.

Numerical care (so the differential test is not flaky):
  * operands of ``exp`` are bounded, divisions are by ``abs(y) + 1``,
    ``sqrt``/``log`` take ``abs(x) + 1``;
  * comparison masks, ``sort``/``topk``/``max(dim)`` are only applied to values
    whose concrete elements are separated from thresholds / from each other by
    a margin, so rounding differences cannot flip a decision;
  * values that grow large or non-finite are never reused as operands.

Autograd care (so ``backward`` works in eager): in-place ops only touch fresh
intermediates created inside the in-place motif (never placeholders,
parameters or their views), reads before a mutation only use ops that do not
save their input for backward, and ``relu_`` is always the last mutation.
"""

from __future__ import annotations

import torch

__all__ = [
    "GeneratedGraph",
    "random_graph",
    "random_module",
    "opaque_mix",
    "BUILDERS",
    "ALL_FAMILIES",
    "STATE_FAMILIES",
    "TRAIN_FAMILIES",
    "RNG_SEED",
    "single_thread",
]


def opaque_mix(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A user function the optimizer cannot know: a leaf for ``symbolic_trace``."""
    # Python-level control flow on a static attribute, so it stays a black box.
    if x.dim() >= 2:
        return x * scale + x.flip(-1) * (1.0 - scale)
    return x * scale + 0.25


# Defined here, not in effects.py: FX names the call in the generated code
# after the function's module (``graphgen_opaque_mix``), and it stays as it was.
torch.fx.wrap("opaque_mix")

# Imported after opaque_mix, which effects.py takes from this package.
from .driver import RNG_SEED, GeneratedGraph, random_graph, random_module, single_thread  # noqa: E402
from .families import ALL_FAMILIES, BUILDERS, STATE_FAMILIES, TRAIN_FAMILIES  # noqa: E402
