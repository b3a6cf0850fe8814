"""The small programs calibration compiles with Inductor, and their kernel counts.

Host-cost families (tiny 8x8 tensors, so the work is negligible and the time is
what Inductor's wrapper costs; ``k`` ops each; "extern" excludes custom ops, which
the repository's counter counts as extern calls and calibration counts apart):

=============  ===============================  =========  ======  ======  ===========
family         body                             generated  extern  custom  allocations
=============  ===============================  =========  ======  ======  ===========
chain_mm       ``x = x @ w`` k times            0          k       0       2 (reused)
mm_relu        ``x = (x @ w).relu()`` k times   k          k       0       k
outputs        ``return x + 1, ..., x + k``     1          0       0       k
custom         ``x = passthrough(x)`` k times   0          0       k       0
=============  ===============================  =========  ======  ======  ===========

On CPU all generated code between two extern calls lands in one C++ kernel, so
``mm_relu`` is how k generated kernels are made; ``chain_mm`` separates the extern
cost from it, ``outputs`` the per-buffer cost (one kernel writing k fresh buffers,
which are also returned: their output handling is part of the buffer's cost), and
``custom`` a Python custom op (``torch.library``) whose body is one ``clone``.
Counts are read from the output code of the very program that is timed
(:func:`optimus_eqsat.inductor_count.count_kernels_in_code`, plus wrapper
``empty_strided_*`` calls for allocations) and checked against the table.

Each program is a function made from source, so each has its own code object
and Dynamo cache: no ``torch._dynamo.reset()`` is needed between them (a reset
would make every earlier program recompile).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from optimus_eqsat.inductor_count import count_kernels_in_code

__all__ = [
    "Counts",
    "Program",
    "CalibrationError",
    "HOST_FAMILIES",
    "host_program",
    "inputs_program",
    "views_program",
    "rows_program",
    "norms_program",
    "bandwidth_program",
    "pointwise_flops_program",
    "matmul_program",
    "compile_program",
]

CUSTOM_NAMESPACE = "optimus_eqsat_calibration"
_ALLOC = re.compile(r"\bempty_strided_\w+\(")
_CUSTOM = re.compile(rf"\btorch\.ops\.{CUSTOM_NAMESPACE}\.\w+(?:\.\w+)?\(")
HOST_FAMILIES = ("chain_mm", "mm_relu", "outputs", "custom")


class CalibrationError(RuntimeError):
    """A calibration measurement cannot be trusted (wrong kernel counts, a nonsense fit)."""


@dataclass(frozen=True)
class Counts:
    """What one program's wrapper does per call: generated kernel calls, extern calls
    other than custom ops, custom-op calls and buffer allocations."""

    generated: int
    extern: int
    custom: int
    alloc: int


@dataclass
class Program:
    """One calibration program: its function, inputs, expected counts and, once
    compiled, the compiled callable and the counts of its output code.

    ``expected``: Counts fields to check (others are taken as counted).
    ``work``: bytes moved or FLOPs of its one big kernel (throughput programs).
    """

    name: str
    family: str
    k: int
    fn: Callable
    inputs: tuple
    expected: dict[str, int]
    work: float = 0.0
    compiled: Callable | None = None
    counts: Counts | None = None
    code: str = ""

    def __call__(self) -> Any:
        assert self.compiled is not None, f"{self.name} is not compiled"
        return self.compiled(*self.inputs)


def _function(name: str, params: Sequence[str], body: Sequence[str]) -> Callable:
    """A fresh function (own code object) from source lines."""
    source = f"def {name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, f"<optimus_eqsat calibration: {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


_custom_op: Any = None


def _passthrough_op() -> Any:
    """``optimus_eqsat_calibration::passthrough``: a Python custom op returning a clone."""
    global _custom_op
    if _custom_op is None:

        @torch.library.custom_op(f"{CUSTOM_NAMESPACE}::passthrough", mutates_args=())
        def passthrough(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @passthrough.register_fake
        def _(x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)

        _custom_op = passthrough
    return _custom_op


def host_program(family: str, k: int, device: str, dtype: torch.dtype, tag: str = "") -> Program:
    """A program of ``family`` (see module doc) with ``k`` ops on 8x8 tensors."""
    x = torch.randn(8, 8, device=device, dtype=dtype)
    # Orthogonal: a chain of 64 products neither overflows nor sinks into denormals.
    w = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))[0].to(device=device, dtype=dtype)
    name = f"{family}_{k}{tag}"
    if family == "chain_mm":
        body, expected = ["x = x @ w"] * k, {"generated": 0, "extern": k, "custom": 0}
    elif family == "mm_relu":
        body, expected = ["x = (x @ w).relu()"] * k, {"generated": k, "extern": k, "custom": 0}
    elif family == "outputs":
        body = [f"return ({', '.join(f'x + {i + 1}' for i in range(k))},)"]
        expected = {"extern": 0, "custom": 0, "alloc": k}
        if device == "cpu":
            expected["generated"] = 1  # Triton may split k outputs over several kernels
    elif family == "custom":
        _passthrough_op()
        body = [f"x = torch.ops.{CUSTOM_NAMESPACE}.passthrough(x)"] * k
        expected = {"generated": 0, "extern": 0, "custom": k}
    else:
        raise ValueError(f"unknown host family {family!r}; known: {HOST_FAMILIES}")
    if family != "outputs":
        body = [*body, "return x"]
    return Program(name, family, k, _function(name, ["x", "w"], body), (x, w), expected)


def inputs_program(k: int, device: str, dtype: torch.dtype, trained: bool = False) -> Program:
    """A module of ``k`` layers, each holding one parameter, computing ``x * w1 + ... + x * wk``:
    one generated kernel reading ``k + 1`` inputs, the parameters reached through the module
    tree as in real models (Dynamo guards each along its attribute path). ``trained``: the
    parameters require grad (a training step's per-parameter costs)."""
    name = f"{'trained' if trained else 'inputs'}_{k}"
    layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(k))
    for layer in layers:
        layer.w = torch.nn.Parameter(torch.randn(8, 8, device=device, dtype=dtype), requires_grad=trained)
    forward = _function(name, ["self", "x"], ["return " + " + ".join(f"x * self.layers[{i}].w" for i in range(k))])
    module = type(name, (torch.nn.Module,), {"forward": forward})()  # own class: its own code object and cache
    module.layers = layers
    x = torch.randn(8, 8, device=device, dtype=dtype)
    return Program(
        name, "trained" if trained else "inputs", k, module, (x,), {"generated": 1, "extern": 0, "custom": 0}
    )


def views_program(k: int, device: str, dtype: torch.dtype) -> Program:
    """``relu(x)`` returned as ``k`` row views: one kernel, ``k`` ``reinterpret_tensor`` calls
    of the wrapper (what a view of a buffer costs when an extern call or the caller reads it)."""
    x = torch.randn(k, 8, device=device, dtype=dtype)
    name = f"views_{k}"
    fn = _function(name, ["x"], ["y = x.relu()", f"return ({', '.join(f'y[{i}]' for i in range(k))},)"])
    return Program(name, "views", k, fn, (x,), {"generated": 1, "extern": 0, "custom": 0})


def rows_program(rows: int, device: str, dtype: torch.dtype) -> Program:
    """One layer norm over ``rows`` rows of 8: what a row of a small normalization costs in
    generated code (a reduction loop per row, far from any roofline at these widths)."""
    x = torch.randn(rows, 8, device=device, dtype=dtype)
    name = f"rows_{rows}"
    fn = _function(name, ["x"], ["return torch.nn.functional.layer_norm(x, (8,))"])
    return Program(name, "rows", rows, fn, (x,), {"generated": 1, "extern": 0, "custom": 0})


def norms_program(k: int, device: str, dtype: torch.dtype) -> Program:
    """``k`` layer norms of independent 32x8 inputs: one generated kernel of ``k`` loop nests
    (what a small normalization costs beyond its rows: its loop's setup)."""
    xs = tuple(torch.randn(32, 8, device=device, dtype=dtype) for _ in range(k))
    names = [f"x{i}" for i in range(k)]
    name = f"norms_{k}"
    fn = _function(name, names, [f"return ({', '.join(f'torch.nn.functional.layer_norm({x}, (8,))' for x in names)},)"])
    return Program(name, "norms", k, fn, xs, {"generated": 1, "extern": 0, "custom": 0})


def bandwidth_program(numel: int, device: str, dtype: torch.dtype) -> Program:
    """One in-place pointwise kernel over ``numel`` elements (read + write, no allocation:
    a fresh large output would time the OS's page faults, not the memory)."""
    a = torch.randn(numel, device=device, dtype=dtype)
    fn = _function("bandwidth", ["a"], ["a.mul_(-1.0)", "return None"])
    return Program(
        "bandwidth",
        "bandwidth",
        1,
        fn,
        (a,),
        {"generated": 1, "extern": 0, "custom": 0},
        work=2.0 * numel * a.element_size(),
    )


def pointwise_flops_program(numel: int, depth: int, device: str, dtype: torch.dtype) -> Program:
    """One generated kernel doing ``depth`` multiply-adds per element of a cache-sized tensor."""
    fn = _function("pointwise_flops", ["x"], ["x = x * 0.999 + 0.001"] * depth + ["return x"])
    x = torch.randn(numel, device=device, dtype=dtype)
    return Program(
        "pointwise_flops",
        "pointwise_flops",
        depth,
        fn,
        (x,),
        {"generated": 1, "extern": 0, "custom": 0},
        work=2.0 * depth * numel,
    )


def matmul_program(op: str, batch: int, m: int, k: int, n: int, device: str, dtype: torch.dtype) -> Program:
    """One ``mm`` ((M,K)@(K,N)) or ``bmm`` (batch of them) through Inductor's extern call."""
    lead = (batch,) if op == "bmm" else ()
    a = torch.randn(*lead, m, k, device=device, dtype=dtype)
    b = torch.randn(*lead, k, n, device=device, dtype=dtype)
    name = f"{op}_{batch}x{m}x{k}x{n}"
    fn = _function(f"{op}_{batch}_{m}_{k}_{n}", ["a", "b"], [f"return torch.{op}(a, b)"])
    return Program(name, op, 1, fn, (a, b), {"generated": 0, "extern": 1, "custom": 0}, work=2.0 * batch * m * n * k)


def count_program_code(code: str) -> Counts:
    """Counts of one Inductor output-code module (see module doc)."""
    generated, extern = count_kernels_in_code(code)
    custom = len(_CUSTOM.findall(code))
    return Counts(generated=generated, extern=extern - custom, custom=custom, alloc=len(_ALLOC.findall(code)))


def compile_program(program: Program, mode: str | None = None) -> Program:
    """Compile ``program`` with ``torch.compile`` (Inductor), run it once, count and
    check its kernels (the forward's, in a training program); raises
    :class:`CalibrationError` on a mismatch."""
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    compiled = torch.compile(program.fn, dynamic=False, mode=mode)
    # run_and_get_code would reset Dynamo and make every earlier program recompile.
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        compiled(*program.inputs)
    # A training program compiles its forward, and its backward now or at its first backward.
    graphs = (1, 2) if program.family == "trained" else (1,)
    if len(codes) not in graphs:
        raise CalibrationError(
            f"{program.name}: expected {' or '.join(map(str, graphs))} compiled graph(s), "
            f"Inductor produced {len(codes)}"
        )
    program.compiled, program.code = compiled, codes[0]
    program.counts = count_program_code(codes[0])
    wrong = {
        key: (getattr(program.counts, key), want)
        for key, want in program.expected.items()
        if getattr(program.counts, key) != want
    }
    if wrong:
        detail = ", ".join(f"{key} {got} (expected {want})" for key, (got, want) in wrong.items())
        raise CalibrationError(f"{program.name}: kernel counts differ: {detail}")
    return program
