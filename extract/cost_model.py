"""Device profiles and the step-time model of one kernel.

The objective is the wall-clock step time a user pays. A compiled program's
step is Inductor's wrapper calling kernels: each costs **host** time (the
wrapper's Python/C++ per generated-kernel launch, per extern library call, per
buffer it allocates, per custom-op dispatch) and **device** time (bytes moved
over the measured bandwidth, FLOPs over the throughput of the dtype actually
used; matmuls from a measured table where one exists). On a CPU the two run one
after the other; on a GPU the host issues launches while the device works
(:func:`step_seconds` overlaps them). A step also pays one call of the compiled
graph (``call_s``).

A profile comes from a measurement on the device at hand when there is one
(``optimus-eqsat calibrate``, :mod:`optimus_eqsat.calibration`): ``"cpu"`` is
this machine's CPU (the user's own calibration when it exists, else the one
shipped), ``"h200"`` the H200 run recorded in ``benchmarks/results/gpu/``.
``"h100"`` and ``"a100"`` take datasheet device numbers with the host costs
measured on the H200 (the same wrapper software on a similar host).
``"auto"`` follows the example inputs' device (:func:`profile_for_inputs`).

==========  =========  ==================  ==============  ==============
profile     HBM BW     matmul FP32 / BF16  vector FP32     host per launch
==========  =========  ==================  ==============  ==============
h100 (SXM)  3.35 TB/s  67 / 989 TFLOP/s    67 TFLOP/s      H200's, measured
h200 (SXM)  4.8 TB/s   67 / 989 TFLOP/s    67 TFLOP/s      14.7 us measured
a100 (80G)  2.039 TB/s 19.5 / 312 TFLOP/s  19.5 TFLOP/s    H200's, measured
cpu         measured   measured table      measured        measured
==========  =========  ==================  ==============  ==============

Sources: NVIDIA H100/H200/A100 datasheets (dense, no sparsity). PyTorch's
default fp32 matmul does not use TF32, so fp32 matmuls get the SIMT peak.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optimus_eqsat.fxvocab.kinds import KernelKind

if TYPE_CHECKING:  # the calibration package imports torch; this module stays light
    from optimus_eqsat.calibration.profile import CalibratedProfile

__all__ = [
    "DeviceProfile",
    "KernelKind",
    "PROFILES",
    "get_profile",
    "kernel_time",
    "kernel_costs",
    "step_seconds",
    "profile_for_inputs",
    "LAUNCHING_KINDS",
    "FUSIBLE_KINDS",
]


# Kinds that Inductor turns into generated (Triton / C++) code and may fuse.
FUSIBLE_KINDS = frozenset({KernelKind.POINTWISE, KernelKind.REDUCTION, KernelKind.CAT, KernelKind.GATHER})
# Kinds that cost a launch when they stand alone.
LAUNCHING_KINDS = FUSIBLE_KINDS | {KernelKind.MATMUL, KernelKind.OPAQUE}
_EXTERN_KINDS = (KernelKind.MATMUL, KernelKind.OPAQUE)


@dataclass(frozen=True)
class DeviceProfile:
    """The step-time numbers of one device (SI units: seconds, bytes/s, FLOP/s).

    Host time per wrapper operation: ``launch_overhead_s`` per generated kernel,
    ``extern_launch_overhead_s`` per extern call (None: the same), ``alloc_s``
    per buffer, ``custom_op_s`` per custom-op dispatch, ``call_s`` per call of
    the compiled graph, ``view_s`` per view of a buffer the wrapper materializes
    (a slice an extern call or the caller reads, each input slot of a cat
    buffer: ``reinterpret_tensor``), ``input_s`` per graph input of a call and
    ``trained_input_s`` per input that requires grad in a training step (these
    two are the same for every program of one model: they move the step time,
    never the choice). Device time: ``mem_bandwidth_bytes_per_s`` (times
    ``bandwidth_efficiency``), ``pointwise_flops_per_s``, and matmuls at
    ``matmul_flops_per_s`` (fp32) or ``half_matmul_flops_per_s`` (bf16/fp16),
    or from ``calibration``'s measured table when it is for the dtype at hand;
    a GPU kernel takes at least ``device_kernel_s``. ``overlap``: the host
    issues launches while the device runs (GPU streams) rather than one after
    the other (CPU). ``codegen`` names Inductor's code generator: "triton" (one
    kernel per fused group) or "cpp" (all generated code between two extern
    calls in one C++ kernel). ``grouped_host_s`` / ``grouped_host_s_per_member``:
    host time of one ``optimus_eqsat::grouped_linear`` call (host-bound; the
    defaults are an H200's: 0.3 ms a call plus 17 us a member).
    """

    name: str
    launch_overhead_s: float
    mem_bandwidth_bytes_per_s: float
    matmul_flops_per_s: float
    pointwise_flops_per_s: float
    extern_launch_overhead_s: float | None = None
    bandwidth_efficiency: float = 0.8
    codegen: str = "triton"
    source: str = ""
    grouped_host_s: float = 3e-4
    grouped_host_s_per_member: float = 1.7e-5
    call_s: float = 0.0
    alloc_s: float = 0.0
    custom_op_s: float = 0.0
    overlap: bool = True
    device_kernel_s: float = 0.0
    half_matmul_flops_per_s: float | None = None
    input_s: float = 0.0  # per graph input per call: Dynamo's guards, the wrapper's arguments
    view_s: float = 0.0  # per view of a buffer the wrapper materializes (reinterpret_tensor)
    reduction_s: float = 0.0  # per reduction loop in generated code (CPU: its setup, not roofline)
    reduction_row_s: float = 0.0  # per row of a reduction in generated code (CPU: row loops, not roofline)
    trained_input_s: float = 0.0  # per input requiring grad per training step: autograd's bookkeeping
    calibration: CalibratedProfile | None = dataclasses.field(default=None, compare=False, repr=False)

    def launch_s(self, kind: KernelKind) -> float:
        """Host time of launching one kernel of ``kind``."""
        if kind in _EXTERN_KINDS and self.extern_launch_overhead_s is not None:
            return self.extern_launch_overhead_s
        return self.launch_overhead_s

    def matmul_rate(self, flops: float, shape: tuple[int, int, int, int] | None, itemsize: int) -> float:
        """FLOP/s of one matmul: the measured table for its dtype when there is one (it holds
        small-GEMM efficiency), else the dtype's peak. ``shape`` is (batch, M, K, N)."""
        cal = self.calibration
        if cal is not None and cal.matmul and shape is not None and _itemsize(cal.dtype) == itemsize:
            batch, m, k, n = shape
            return cal.matmul_flops_per_s(max(m, 1), max(k, 1), max(n, 1), max(batch, 1))
        if itemsize <= 2 and self.half_matmul_flops_per_s is not None:
            return self.half_matmul_flops_per_s
        return self.matmul_flops_per_s


def _itemsize(dtype_name: str) -> int:
    return {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}.get(dtype_name, 4)


# Host costs of the H200 run (benchmarks/results/gpu: Inductor default's step time at batch
# 32 fits 84 us + 14.7 us per launch), used for GPUs not measured here: same wrapper software.
_GPU_HOST: dict[str, Any] = dict(
    launch_overhead_s=14.7e-6, call_s=84e-6, overlap=True, device_kernel_s=2e-6, codegen="triton"
)


def _from_calibration(name: str, cal: CalibratedProfile, **device: Any) -> DeviceProfile:
    """A profile from a calibrated one (measured host costs; device numbers measured where
    the calibration has them, else ``device``'s)."""
    cpu = cal.device_kind == "cpu"
    fields: dict[str, Any] = dict(
        name=name,
        launch_overhead_s=cal.generated_kernel_s,
        extern_launch_overhead_s=cal.extern_call_s,
        call_s=cal.call_s,
        alloc_s=cal.alloc_s,
        custom_op_s=cal.custom_op_s or 0.0,
        input_s=cal.input_s or 0.0,
        trained_input_s=cal.trained_input_s or 0.0,
        view_s=cal.view_s or 0.0,
        reduction_row_s=(cal.reduction_row_s or 0.0) if cpu else 0.0,
        reduction_s=(cal.reduction_s or 0.0) if cpu else 0.0,
        mem_bandwidth_bytes_per_s=cal.mem_bandwidth_bytes_per_s,
        pointwise_flops_per_s=cal.pointwise_flops_per_s,
        matmul_flops_per_s=max((e.flops_per_s for e in cal.matmul), default=cal.pointwise_flops_per_s),
        bandwidth_efficiency=1.0 if cpu else 0.8,  # the CPU figure is a measured sustained rate
        codegen="cpp" if cpu else "triton",
        overlap=not cpu,
        device_kernel_s=0.0 if cpu else 2e-6,
        source=f"calibrated: {cal.device} ({cal.dtype}, torch {cal.torch_version}, threads {cal.threads}, "
        f"{cal.created})",
        calibration=cal,
    )
    fields.update(device)
    return DeviceProfile(**fields)


@functools.cache
def _cpu_profile() -> DeviceProfile:
    from optimus_eqsat.calibration.store import current_profile

    return _from_calibration("cpu", current_profile("cpu"))


@functools.cache
def _h200_profile() -> DeviceProfile:
    from optimus_eqsat.calibration.store import shipped_profile

    return _from_calibration("h200", shipped_profile("h200"), half_matmul_flops_per_s=989e12, bandwidth_efficiency=0.8)


_DATASHEET: dict[str, DeviceProfile] = {
    "h100": DeviceProfile(
        name="h100",
        mem_bandwidth_bytes_per_s=3.35e12,
        matmul_flops_per_s=67e12,
        half_matmul_flops_per_s=989e12,
        pointwise_flops_per_s=67e12,
        source="NVIDIA H100 SXM5 datasheet; host costs measured on an H200",
        **_GPU_HOST,
    ),
    "a100": DeviceProfile(
        name="a100",
        mem_bandwidth_bytes_per_s=2.039e12,
        matmul_flops_per_s=19.5e12,
        half_matmul_flops_per_s=312e12,
        pointwise_flops_per_s=19.5e12,
        source="NVIDIA A100 80GB SXM datasheet; host costs measured on an H200",
        **_GPU_HOST,
    ),
}
_MEASURED = {"cpu": _cpu_profile, "h200": _h200_profile}


class _Profiles(Mapping):
    """Name -> profile; the measured ones are read from their calibration on first use."""

    def __getitem__(self, key: str) -> DeviceProfile:
        if key in _MEASURED:
            return _MEASURED[key]()
        return _DATASHEET[key]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({*_DATASHEET, *_MEASURED}))

    def __len__(self) -> int:
        return len({*_DATASHEET, *_MEASURED})


PROFILES: Mapping[str, DeviceProfile] = _Profiles()


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
            raise KeyError(f"unknown device profile {name_or_profile!r}; known: {sorted(PROFILES)} or 'auto'")
        profile = PROFILES[key]
    return dataclasses.replace(profile, **overrides) if overrides else profile


def profile_for_inputs(example_inputs: Iterable[Any] | None) -> str:
    """The profile name for the device of the example inputs: the GPU by name (h100, h200,
    a100; other GPUs get h200's), else "cpu"."""
    for x in example_inputs or ():
        device = getattr(x, "device", None)
        if device is not None and device.type == "cuda":
            import torch

            gpu = torch.cuda.get_device_name(device).lower()
            return next((name for name in ("h100", "h200", "a100") if name in gpu), "h200")
    return "cpu"


def kernel_costs(
    profile: DeviceProfile,
    kind: KernelKind,
    bytes_moved: float,
    flops: float,
    matmul_shape: tuple[int, int, int, int] | None = None,
    itemsize: int = 4,
    buffers: int = 1,
) -> tuple[float, float]:
    """(host seconds, device seconds) of one kernel of ``kind``: the launch and the
    ``buffers`` it writes on the host; max(memory, compute) on the device, a GPU kernel at
    least ``device_kernel_s``. VIEW and NONE cost nothing."""
    if kind not in LAUNCHING_KINDS:
        return 0.0, 0.0
    if kind is KernelKind.MATMUL:
        rate = profile.matmul_rate(flops, matmul_shape, itemsize)
    else:
        rate = profile.pointwise_flops_per_s
    memory_s = bytes_moved / (profile.mem_bandwidth_bytes_per_s * profile.bandwidth_efficiency)
    device = max(memory_s, flops / rate if rate else 0.0, profile.device_kernel_s)
    return profile.launch_s(kind) + buffers * profile.alloc_s, device


def kernel_time(profile: DeviceProfile, kind: KernelKind, bytes_moved: float, flops: float) -> float:
    """Host plus device seconds of one kernel (see :func:`kernel_costs`)."""
    host, device = kernel_costs(profile, kind, bytes_moved, flops)
    return host + device


def step_seconds(profile: DeviceProfile, costs: Sequence[tuple[float, float]], calls: int = 1) -> float:
    """Wall-clock seconds of ``calls`` calls of a compiled graph whose kernels cost ``costs``
    ((host, device) each, in launch order). Serial on a CPU; on a GPU the host issues a
    kernel, the device starts it once the previous one ended, and the step ends when both
    are done."""
    host = calls * profile.call_s
    if not profile.overlap:
        return host + sum(h + d for h, d in costs)
    device_free = host
    for h, d in costs:
        host += h
        device_free = max(device_free, host) + d
    return max(host, device_free)
