"""GPU kernel cost model: device profiles, kernel kinds and a roofline time.

This module is a small pure table with no torch dependency; the code that maps
an FX graph onto kernels lives in :mod:`optimus_eqsat.extract.fx_cost` (and
the modules it names).

A kernel costs::

    time = launch_overhead + max(bytes_moved / (bandwidth * efficiency),
                                 flops / peak_flops(kind))

Views and graph bookkeeping cost nothing: they launch no kernel.

Device numbers are vendors' public datasheet peaks (dense, no sparsity):

==========  =========  ==================  ===================  ============
profile     HBM BW     matmul peak (BF16)  vector FP32 peak     launch
==========  =========  ==================  ===================  ============
h100 (SXM)  3.35 TB/s  989 TFLOP/s         67 TFLOP/s           5 us
h200 (SXM)  4.8 TB/s   989 TFLOP/s         67 TFLOP/s           5 us
a100 (80G)  2.039 TB/s 312 TFLOP/s         19.5 TFLOP/s         5 us
cpu         20 GB/s    100 GFLOP/s         20 GFLOP/s           3 us
==========  =========  ==================  ===================  ============

Sources: NVIDIA H100 Tensor Core GPU datasheet, NVIDIA H200 Tensor Core GPU
datasheet, NVIDIA A100 datasheet (80GB SXM). The ~5 us launch overhead is the
usual end-to-end cost of a small CUDA kernel launched from PyTorch (CPU-side
dispatch plus launch latency; CUDA graphs would lower it). The "cpu" profile is
a rough few-core desktop/server figure for local runs: a "launch" there is the
Python/C++ call overhead of one generated kernel or extern call.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DeviceProfile",
    "KernelKind",
    "PROFILES",
    "get_profile",
    "kernel_time",
    "LAUNCHING_KINDS",
    "FUSIBLE_KINDS",
]


class KernelKind(enum.Enum):
    """What an FX node becomes under Inductor (before fusion).

    VIEW       free: metadata only (slice, reshape/view, permute, getitem,
               squeeze/unsqueeze, expand, alias, detach); launches nothing.
    POINTWISE  elementwise; fuses into one generated kernel with neighbours.
    REDUCTION  sum/mean/amax/softmax/layer_norm/...; a generated kernel that
               pointwise producers and consumers fuse into.
    MATMUL     extern library call (mm/addmm/bmm/baddbmm/linear/matmul/conv):
               one launch each, never fused with generated code.
    CAT        a copy into one buffer, free when fused with a pointwise
               producer/consumer, else one copy kernel.
    GATHER     embedding/index_select/gather: Inductor lowers these to indirect
               loads, so they fuse like pointwise ops.
    OPAQUE     unknown op (or a library fallback such as embedding_bag): one
               launch, never fused.
    NONE       placeholders, outputs, get_attr, scalar (SymInt) arithmetic.
    """

    VIEW = "view"
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    CAT = "cat"
    GATHER = "gather"
    OPAQUE = "opaque"
    NONE = "none"


# Kinds that Inductor turns into generated (Triton / C++) code and may fuse.
FUSIBLE_KINDS = frozenset(
    {KernelKind.POINTWISE, KernelKind.REDUCTION, KernelKind.CAT, KernelKind.GATHER}
)
# Kinds that cost a launch when they stand alone.
LAUNCHING_KINDS = FUSIBLE_KINDS | {KernelKind.MATMUL, KernelKind.OPAQUE}


@dataclass(frozen=True)
class DeviceProfile:
    """Roofline numbers of one device (SI units: seconds, bytes/s, FLOP/s).

    ``codegen`` names the fusion flavour Inductor uses on the device:
    "triton" (GPU: one kernel per fused group) or "cpp" (CPU: all generated
    code between two extern calls lands in one C++ kernel).
    ``bandwidth_efficiency`` is the fraction of peak bandwidth a well-written
    memory-bound kernel reaches.
    ``grouped_host_s`` / ``grouped_host_s_per_member``: host time of one
    ``optimus_eqsat::grouped_linear`` call, measured with benchmarks/gpu_check.py
    on an H200 machine (torch 2.11, triton 3.6, 2026-11-30): 16 members 0.72 ms,
    300 members 5.6 ms per forward call, host-bound, i.e. about 0.3 ms per call
    plus 17 us per member (custom-op dispatch of 3N tensors and the Python that
    fills the kernel's pointer table). They, not its single launch, decide
    whether the call pays; with them it rarely does.
    """

    name: str
    launch_overhead_s: float
    mem_bandwidth_bytes_per_s: float
    matmul_flops_per_s: float
    pointwise_flops_per_s: float
    extern_launch_overhead_s: float | None = None  # None: same as launch_overhead_s
    bandwidth_efficiency: float = 0.8
    codegen: str = "triton"
    source: str = ""
    grouped_host_s: float = 3e-4
    grouped_host_s_per_member: float = 1.7e-5

    def launch_s(self, kind: KernelKind) -> float:
        """Fixed cost of launching one kernel of ``kind``."""
        if kind in (KernelKind.MATMUL, KernelKind.OPAQUE) and self.extern_launch_overhead_s is not None:
            return self.extern_launch_overhead_s
        return self.launch_overhead_s


PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile(
        name="h100",
        launch_overhead_s=5e-6,
        mem_bandwidth_bytes_per_s=3.35e12,
        matmul_flops_per_s=989e12,  # BF16 dense tensor core
        pointwise_flops_per_s=67e12,  # FP32 CUDA cores
        source="NVIDIA H100 SXM5 datasheet",
    ),
    "h200": DeviceProfile(
        name="h200",
        launch_overhead_s=5e-6,
        mem_bandwidth_bytes_per_s=4.8e12,  # HBM3e
        matmul_flops_per_s=989e12,
        pointwise_flops_per_s=67e12,
        source="NVIDIA H200 SXM datasheet",
    ),
    "a100": DeviceProfile(
        name="a100",
        launch_overhead_s=5e-6,
        mem_bandwidth_bytes_per_s=2.039e12,  # 80GB SXM
        matmul_flops_per_s=312e12,
        pointwise_flops_per_s=19.5e12,
        source="NVIDIA A100 80GB SXM datasheet",
    ),
    "cpu": DeviceProfile(
        name="cpu",
        launch_overhead_s=3e-6,  # Python wrapper -> C++ kernel call
        mem_bandwidth_bytes_per_s=20e9,
        matmul_flops_per_s=100e9,
        pointwise_flops_per_s=20e9,
        codegen="cpp",
        source="rough few-core x86 figures; for local runs only",
    ),
}


def get_profile(name_or_profile: str | DeviceProfile = "h100", **overrides: Any) -> DeviceProfile:
    """A profile by name (case-insensitive) or as given, with fields overridden.

    >>> get_profile("h100", launch_overhead_s=3e-6).launch_overhead_s
    3e-06
    """
    if isinstance(name_or_profile, DeviceProfile):
        profile = name_or_profile
    else:
        key = name_or_profile.lower()
        if key not in PROFILES:
            raise KeyError(f"unknown device profile {name_or_profile!r}; known: {sorted(PROFILES)}")
        profile = PROFILES[key]
    return dataclasses.replace(profile, **overrides) if overrides else profile


def kernel_time(profile: DeviceProfile, kind: KernelKind, bytes_moved: float, flops: float) -> float:
    """Seconds one kernel of ``kind`` takes: launch + roofline max(memory, compute).

    VIEW and NONE are free. MATMUL uses the tensor-core peak; every other kind
    the vector peak.
    """
    if kind not in LAUNCHING_KINDS:
        return 0.0
    peak = profile.matmul_flops_per_s if kind is KernelKind.MATMUL else profile.pointwise_flops_per_s
    memory_s = bytes_moved / (profile.mem_bandwidth_bytes_per_s * profile.bandwidth_efficiency)
    compute_s = flops / peak
    return profile.launch_s(kind) + max(memory_s, compute_s)
