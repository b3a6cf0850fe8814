"""Differential fuzzing through the whole backend: random graphs compiled by ``torch.compile``
with our backend (Dynamo, our pre- and post-grad passes, AOTAutograd, Inductor's generated
code) against eager.

``tests/test_fuzz.py`` runs the optimizer's FX program eagerly; what Inductor makes of that
program is not in it. Inductor's own code generation has been wrong on our programs where it
is right on the graphs users write (a kernel's result written in place over a piece of a
``cat``, fixed by :mod:`optimus_eqsat.inductor_compat`), so the programs users run are compared
here: outputs, gradients of float inputs and parameters, running statistics after the step.

The backend decides without timing (``measure=False``) for the H200's profile, which batches
more than the CPU's, with the fuzzer's options (every program checked, errors raised). A
compiled program has no float64 twin, so a value further from float64 than twice eager's error
is a mismatch; the benchmark (``python -m benchmarks.fuzz_at_scale --compiled``) then compiles
the graph with Inductor alone and counts the case as Inductor's where Inductor's program fails
the same check. A Dynamo flavour's case is the eager program its graph was captured from
(``compiled_case``: a captured graph cannot be traced again). Each compile costs seconds on
the CPU: the unit test runs a few cases, the benchmark hundreds.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.fx as fx

try:  # rootdir-relative import works whether or not tests/ is a package
    from graphgen import GeneratedGraph, random_graph
    from test_fuzz import FLAVOURS, _fuzz_options, _n_ops, compare_with_eager
except ImportError:  # pragma: no cover
    from tests.graphgen import GeneratedGraph, random_graph  # noqa: I001
    from tests.test_fuzz import FLAVOURS, _fuzz_options, _n_ops, compare_with_eager

from optimus_eqsat.backend import make_backend


def backend_for_fuzzing() -> Any:
    """Our backend as the compiled fuzzer runs it: no timing, the H200's profile, the fuzzer's
    options (raise on error, check programs the cost model would refuse)."""
    return make_backend(measure=False, profile="h200", **_fuzz_options())


def compiled_options(flavour: str) -> tuple[dict[str, Any], bool]:
    """The generator's options of the flavour's eager program, and whether its batch is dynamic:
    a Dynamo flavour's program is the one its graph was captured from (``torch.compile``
    captures it itself; a captured graph cannot be traced again), and node meta is Dynamo's."""
    options = {k: v for k, v in FLAVOURS[flavour][0].items() if k not in ("dynamo", "with_meta")}
    return options, bool(options.pop("dynamic_batch", False))


def compiled_case(flavour: str, seed: int) -> tuple[GeneratedGraph, bool]:
    """The fuzzer's case as eager code (:func:`compiled_options`) and whether its batch is dynamic."""
    options, dynamic = compiled_options(flavour)
    return random_graph(seed, n_ops=_n_ops(seed), **options), dynamic


def compiled_copy(gm: fx.GraphModule, backend: Any, dynamic: bool = False) -> fx.GraphModule:
    """A deep copy of ``gm`` (parameters and buffers of its own, under the same names) whose every call
    runs ``torch.compile(..., backend=backend)``; once compiled, ``meta["optimus_eqsat"]`` holds
    our backend's first report (the comparison's training checks read its mode)."""
    result = copy.deepcopy(gm)
    compiled = torch.compile(result.forward, backend=backend, dynamic=True if dynamic else None)
    reports = getattr(backend, "reports", None)

    def forward(*args: Any) -> Any:
        out = compiled(*args)
        if reports:
            result.meta["optimus_eqsat"] = reports[0]
        return out

    result.forward = forward  # type: ignore[method-assign]
    return result


def check_compiled(flavour: str, seed: int, backend: Any) -> fx.GraphModule:
    """The case compiled with ``backend`` against eager; returns the compiled copy."""
    g, dynamic = compiled_case(flavour, seed)
    result = compiled_copy(g.gm, backend, dynamic)
    with torch._inductor.config.patch(fallback_random=FLAVOURS[flavour][0].get("dropout_p", 0.0) > 0):
        compare_with_eager(g, result, float64_program=False)
    return result


# A few cases our passes rewrite, of the flavours whose programs Inductor compiles least like
# the graphs users write (batched training programs: norms, dropouts, checkpoints, a symbolic
# batch; split/cat; in-place ops).
_CASES = [
    ("train", 0),
    ("train", 3),
    ("train_dropout", 0),
    ("train_dynamic", 2),
    ("inplace", 2),
    ("gated", 0),
    ("plain", 5),
    # a graph break hands views of the input to the next piece; our program computed them
    # as slices of a reshape (a copy), and AOTAutograd's replay of those views read freed
    # metadata (a random shape, 3 runs in 4)
    ("train", 27),
    # a forward output Inductor lowers to a view of a buffer the backward was given to write
    # over ("donated"): the output read after backward() held the backward's values, with
    # Inductor alone too
    ("opaque", 70),
    # two saved tensors viewing one buffer, both donated: the backward wrote over one before
    # a matmul our post-grad pass had moved to its end read the other (a weight's gradient)
    ("inplace", 78),
]


@pytest.mark.parametrize("flavour,seed", _CASES, ids=[f"{f}-{s}" for f, s in _CASES])
def test_compiled_program_matches_eager(flavour: str, seed: int) -> None:
    torch._dynamo.reset()
    backend = backend_for_fuzzing()
    try:
        # caches off: a program an earlier run on this machine cached skips our post-grad
        # pass, and the check below would see no rewrite of ours (CI did)
        with torch._inductor.config.patch(force_disable_caches=True):
            check_compiled(flavour, seed, backend)
    except Exception as e:  # attach the program to any failure
        g, dynamic = compiled_case(flavour, seed)
        raise AssertionError(f"[{flavour}-{seed}] {g.description} (dynamic batch: {dynamic})\n{g.gm.code}") from e
    reports = backend.reports + [report for _, report in backend.post_grad_reports]
    assert any(r.changed for r in reports), "our passes rewrote nothing: the case tests Inductor alone"


def test_the_compiled_check_catches_a_backend_that_computes_something_else() -> None:
    """A backend whose program doubles every output is caught (the harness runs the compiled
    program, not the graph it was given)."""

    def doubling(gm: fx.GraphModule, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            out = gm(*args)
            return type(out)(o * 2 for o in out) if isinstance(out, (tuple, list)) else out * 2

        return run

    torch._dynamo.reset()
    with pytest.raises(AssertionError):
        check_compiled("plain", 5, doubling)
