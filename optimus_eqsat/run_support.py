"""What wraps one optimization run: phase timing into the report, the GC pause, one torch
thread for work on tiny tensors, and the user's saved-tensor hooks held off."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from optimus_eqsat.report import OptimizeReport


@contextmanager
def phase(report: OptimizeReport, name: str) -> Iterator[None]:
    """Add the seconds the block takes to ``report.phase_seconds[name]`` (phases may repeat)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        report.phase_seconds[name] = report.phase_seconds.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector, restoring its state after.

    An optimization builds millions of small objects (e-nodes, term rows, FX
    nodes) that are never cyclic garbage, and each full collection re-scans
    them all: on the 2,000-feature extreme graph collections took about a
    quarter of the optimizer's time (export 3.0 s -> 0.7 s, extraction
    13 s -> 9 s without them, CPU time on a loaded machine). Reference
    counting still frees everything acyclic; cycles wait for the next
    collection after the run.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def saved_tensor_hooks_held_off() -> Iterator[None]:
    """The user's saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``) not run by
    the ops of this block, as AOTAutograd holds them off while it traces.

    A module compiled on its own and called inside ``torch.utils.checkpoint`` compiles inside
    the checkpoint's hooks: every fake tensor our passes saved for a backward (meta propagation
    runs ops with grad on) was counted as saved by the user's forward, and the recomputation in
    the backward, which saves only the program's own, failed checkpoint's count check."""
    set_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    if set_tracing is None:  # (a torch without the switch)
        yield
        return
    prior = set_tracing(True)
    try:
        yield
    finally:
        set_tracing(prior)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch ops on one intra-op thread, restoring the count after.

    For tiny tensors: on a busy 2-core machine, intra-op thread hand-offs made a
    4x8 layer_norm take ~1 ms instead of ~4 us, and a small float64 matmul 40 ms
    (BLAS waiting for its workers) instead of 4 us.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
