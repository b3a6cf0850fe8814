"""The calibrated device profile: what one call, kernel, buffer and FLOP cost
on a device, measured through Inductor, and its JSON form.

Matmul throughput is a table of measured shapes. :meth:`CalibratedProfile.matmul_flops_per_s`
interpolates it: each entry is a point ``(log2 flops, log2 min(M, N, K))``;
the answer is the inverse-distance-weighted mean (power 2) of ``log2 flops_per_s``
over the four nearest points of the same op (bmm falls back to mm, with
``M * batch`` rows), exact at a measured point. Outside the table the nearest
points decide, so a huge matmul gets the throughput of the largest measured one.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CalibratedProfile", "MatmulEntry", "SCHEMA_VERSION", "PER_CALL_FIELDS"]

SCHEMA_VERSION = 1

# The host costs fitted by regression (seconds per occurrence), in table order.
PER_CALL_FIELDS = ("call_s", "generated_kernel_s", "extern_call_s", "alloc_s", "custom_op_s")


@dataclass(frozen=True)
class MatmulEntry:
    """One measured matmul shape: ``op`` "mm" ((M,K)@(K,N)) or "bmm" (batch of them).

    ``seconds``: median time of the compiled one-matmul program; ``kernel_s``: that
    minus the same program at the smallest shape (the fixed host costs, which the
    profile's per-call fields price); ``flops_per_s`` = 2*batch*M*N*K / kernel_s.
    ``overhead_bound``: kernel_s was below the timing noise, so it was raised to
    the noise floor and ``flops_per_s`` is a lower bound.
    """

    op: str
    batch: int
    m: int
    k: int
    n: int
    seconds: float
    kernel_s: float
    flops_per_s: float
    overhead_bound: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class CalibratedProfile:
    """Measured primitive costs of one device, dtype, torch version and thread count.

    SI units (seconds, bytes/s, FLOP/s). ``None``: not measured on this device.
    ``source`` says per field whether it was measured (and how) or taken from a
    datasheet. ``spread`` holds, per measured field, the interquartile range of
    its per-round estimates (same unit). ``fit`` records the regression of the
    per-call costs: residuals and the programs with their verified kernel counts.
    """

    device: str
    device_kind: str  # "cpu" or "cuda"
    dtype: str  # "float32", "bfloat16", "float16"
    torch_version: str
    threads: int | None  # CPU threads; None on CUDA
    created: str  # ISO 8601
    call_s: float
    generated_kernel_s: float
    extern_call_s: float
    alloc_s: float
    mem_bandwidth_bytes_per_s: float
    pointwise_flops_per_s: float
    custom_op_s: float | None = None
    matmul: tuple[MatmulEntry, ...] = ()
    cudagraph_call_s: float | None = None
    cudagraph_kernel_s: float | None = None
    # Per graph input per call (Dynamo's guards and the wrapper's argument handling), and
    # per input that requires grad per training step (autograd's saving and accumulating,
    # zero_grad): the same for every program of one model, so they set the absolute step
    # time but never which program is faster.
    input_s: float | None = None
    trained_input_s: float | None = None
    # Per view of a buffer the wrapper materializes (``reinterpret_tensor``: a slice an extern
    # call or the caller reads, each input slot of a cat buffer).
    view_s: float | None = None
    # Per reduction loop in generated code (its setup) and per row it loops over (layer norms
    # over rows of 8): small reductions run far from any roofline on a CPU.
    reduction_s: float | None = None
    reduction_row_s: float | None = None
    source: dict[str, str] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # -- matmul table -------------------------------------------------------

    def matmul_flops_per_s(self, m: int, k: int, n: int, batch: int = 1, op: str | None = None) -> float:
        """Interpolated matmul throughput for ``(batch x) (M,K) @ (K,N)`` (see module doc)."""
        op = op or ("bmm" if batch > 1 else "mm")
        entries = [e for e in self.matmul if e.op == op]
        if not entries and op == "bmm":
            entries, m, batch = [e for e in self.matmul if e.op == "mm"], m * batch, 1
        if not entries:
            raise ValueError(f"profile {self.device!r} has no matmul table")
        point = (math.log2(max(2.0 * batch * m * n * k, 1.0)), math.log2(max(min(m, n, k), 1)))
        scored = sorted(
            ((math.dist(point, (math.log2(e.flops), math.log2(min(e.m, e.n, e.k)))), e) for e in entries),
            key=lambda scored_entry: scored_entry[0],  # equal distances: keep table order, never compare entries
        )[:4]
        if scored[0][0] < 1e-9 or len(scored) == 1:
            return scored[0][1].flops_per_s
        weights = [1.0 / d**2 for d, _ in scored]
        log_rate = sum(w * math.log2(e.flops_per_s) for w, (_, e) in zip(weights, scored)) / sum(weights)
        return 2.0**log_rate

    def matmul_time_s(self, m: int, k: int, n: int, batch: int = 1) -> float:
        """Kernel time of one matmul from the table, without the per-call host cost."""
        return 2.0 * batch * m * n * k / self.matmul_flops_per_s(m, k, n, batch)

    # -- JSON ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["matmul"] = [dataclasses.asdict(e) for e in self.matmul]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibratedProfile:
        """Inverse of :meth:`to_dict`; unknown keys (a newer schema's extras) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        entry_fields = {f.name for f in dataclasses.fields(MatmulEntry)}
        kwargs["matmul"] = tuple(
            MatmulEntry(**{k: v for k, v in e.items() if k in entry_fields}) for e in data.get("matmul", ())
        )
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CalibratedProfile:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> CalibratedProfile:
        return cls.from_json(Path(path).read_text())

    # -- display ------------------------------------------------------------

    def table(self) -> str:
        """A short text table: each primitive, its value and spread."""
        rows = [f"{self.device} ({self.device_kind}, {self.dtype}, torch {self.torch_version}, threads {self.threads})"]

        def line(name: str, value: float | None, unit: str, scale: float) -> None:
            if value is None:
                rows.append(f"  {name:<28} {'-':>12}")
                return
            spread = self.spread.get(name)
            spread_txt = f"  IQR {spread * scale:.3g}" if spread is not None else ""
            rows.append(f"  {name:<28} {value * scale:12.4g} {unit}{spread_txt}")

        for name in (
            *PER_CALL_FIELDS,
            "input_s",
            "trained_input_s",
            "view_s",
            "reduction_s",
            "reduction_row_s",
            "cudagraph_call_s",
            "cudagraph_kernel_s",
        ):
            line(name, getattr(self, name), "us", 1e6)
        line("mem_bandwidth_bytes_per_s", self.mem_bandwidth_bytes_per_s, "GB/s", 1e-9)
        line("pointwise_flops_per_s", self.pointwise_flops_per_s, "GFLOP/s", 1e-9)
        if self.fit:
            rows.append(
                f"  fit: {len(self.fit.get('programs', []))} programs, residual rms "
                f"{self.fit.get('residual_rms_s', float('nan')) * 1e6:.3g} us "
                f"({self.fit.get('residual_rel', float('nan')):.1%}), kernel counts verified: "
                f"{self.fit.get('counts_verified')}"
            )
        if self.matmul:
            rows.append("  matmul (op batch M K N: GFLOP/s, * = overhead-bound lower bound)")
            rows.extend(
                f"    {e.op:<3} {e.batch:>3} {e.m:>5} {e.k:>5} {e.n:>5}: "
                f"{e.flops_per_s * 1e-9:10.4g}{' *' if e.overhead_bound else ''}"
                for e in self.matmul
            )
        return "\n".join(rows)
