"""Device calibration: measure what Inductor's generated code costs on this machine.

The cost model's objective is the wall-clock step time users pay. On real
machines that is dominated, for small graphs, by host costs per call of
Inductor's wrapper (per generated kernel, per extern call, per buffer), and for
big ones by the device's sustained bandwidth and matmul throughput for the
dtype at hand. :func:`calibrate` measures these primitives through Inductor (the
TASO way: measure, store, price with the measurements); profiles are stored per
device, dtype, torch version and thread count in the user's cache, and the
package ships defaults (``cpu``, ``h200``, ...).

    >>> from optimus_eqsat.calibration import calibrate, save_profile, current_profile
    >>> save_profile(calibrate("cpu", threads=1))         # doctest: +SKIP
    >>> current_profile("cpu", threads=1).extern_call_s  # doctest: +SKIP

Command line: ``optimus-eqsat calibrate [--device cpu|cuda] [--dtype ...] [--threads N] [--quick] [--show]``.
"""

from optimus_eqsat.calibration.fit import HostFit, fit_host_costs
from optimus_eqsat.calibration.profile import CalibratedProfile, MatmulEntry
from optimus_eqsat.calibration.programs import CalibrationError, Counts
from optimus_eqsat.calibration.run import calibrate
from optimus_eqsat.calibration.store import (
    cache_dir,
    current_profile,
    device_name,
    load_profile,
    profile_path,
    save_profile,
    shipped_profile,
    shipped_profile_names,
)

__all__ = [
    "calibrate",
    "CalibratedProfile",
    "MatmulEntry",
    "CalibrationError",
    "Counts",
    "HostFit",
    "fit_host_costs",
    "cache_dir",
    "current_profile",
    "device_name",
    "load_profile",
    "profile_path",
    "save_profile",
    "shipped_profile",
    "shipped_profile_names",
]
