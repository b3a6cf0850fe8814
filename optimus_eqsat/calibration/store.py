"""Where profiles live: the user's cache (one JSON file per device, dtype, torch
version and thread count) and the defaults shipped in the package.

Cache directory: ``$OPTIMUS_EQSAT_CACHE_DIR/profiles`` if set, else
``$XDG_CACHE_HOME/optimus_eqsat/profiles``, else ``~/.cache/optimus_eqsat/profiles``.
"""

from __future__ import annotations

import os
import platform
import re
from importlib import resources
from pathlib import Path

import torch

from optimus_eqsat.calibration.profile import CalibratedProfile

__all__ = [
    "cache_dir",
    "device_name",
    "dtype_name",
    "profile_path",
    "save_profile",
    "load_profile",
    "shipped_profile",
    "shipped_profile_names",
    "current_profile",
]


def cache_dir() -> Path:
    """The directory of the user's calibrated profiles (not created here)."""
    override = os.environ.get("OPTIMUS_EQSAT_CACHE_DIR")
    if override:
        return Path(override).expanduser() / "profiles"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "optimus_eqsat" / "profiles"


def dtype_name(dtype: torch.dtype | str) -> str:
    """ "float32" for torch.float32 or "float32"; rejects non-floating dtypes."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in ("float32", "bfloat16", "float16", "float64"):
        raise ValueError(f"unsupported dtype {dtype!r}: float32, bfloat16, float16 or float64")
    return name


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device_kind: str) -> str:
    """The name profiles are keyed by: the CPU model, or CUDA's device name."""
    if device_kind == "cpu":
        return _cpu_model()
    if device_kind == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    raise ValueError(f"device_kind must be 'cpu' or 'cuda', not {device_kind!r}")


def _threads(device_kind: str, threads: int | None) -> int | None:
    """The thread count of the key: CPU only; None means torch's current setting."""
    if device_kind != "cpu":
        return None
    return threads if threads is not None else torch.get_num_threads()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+]+", "-", text).strip("-").lower()


def profile_path(device: str, dtype: str, torch_version: str, threads: int | None) -> Path:
    """The cache file of one key."""
    thread_part = f"_t{threads}" if threads is not None else ""
    return cache_dir() / f"{_slug(device)}_{dtype}_torch{_slug(torch_version)}{thread_part}.json"


def save_profile(profile: CalibratedProfile, path: str | Path | None = None) -> Path:
    """Write ``profile`` to ``path`` or its key's place in the cache; returns the path."""
    target = (
        Path(path)
        if path is not None
        else profile_path(profile.device, profile.dtype, profile.torch_version, profile.threads)
    )
    return profile.save(target)


def load_profile(
    device_kind: str, dtype: torch.dtype | str = torch.float32, threads: int | None = None
) -> CalibratedProfile | None:
    """The user's profile of this machine's device for ``dtype``, the running torch
    and ``threads`` (CPU; None: torch's current thread count), or None."""
    if device_kind == "cuda" and not torch.cuda.is_available():
        return None
    key = (device_name(device_kind), dtype_name(dtype), torch.__version__, _threads(device_kind, threads))
    path = profile_path(*key)
    if not path.is_file():
        return None
    profile = CalibratedProfile.load(path)
    if (profile.device, profile.dtype, profile.torch_version, profile.threads) != key:
        return None  # two names slugged alike: not ours
    return profile


def _shipped_dir():  # importlib.resources Traversable: works from a wheel or a checkout
    return resources.files("optimus_eqsat.calibration") / "profiles"


def shipped_profile_names() -> list[str]:
    """Names of the profiles shipped in the package (``cpu``, ``h200``, ...)."""
    return sorted(p.name.removesuffix(".json") for p in _shipped_dir().iterdir() if p.name.endswith(".json"))


def shipped_profile(name: str) -> CalibratedProfile:
    """A default profile shipped in the package, e.g. ``"cpu"`` or ``"h200"``."""
    entry = _shipped_dir() / f"{name.lower()}.json"
    if not entry.is_file():
        raise KeyError(f"no shipped profile {name!r}; shipped: {shipped_profile_names()}")
    return CalibratedProfile.from_json(entry.read_text())


def _shipped_for(device_kind: str, dtype: str) -> CalibratedProfile:
    """The shipped default closest to this device: ``cpu``, or ``h200`` for any CUDA device."""
    base = "cpu" if device_kind == "cpu" else "h200"
    names = shipped_profile_names()
    return shipped_profile(f"{base}_{dtype}" if f"{base}_{dtype}" in names else base)


def current_profile(
    device_kind: str, dtype: torch.dtype | str = torch.float32, threads: int | None = None
) -> CalibratedProfile:
    """The profile to price with now: the user's calibrated one, else the shipped default."""
    return load_profile(device_kind, dtype, threads) or _shipped_for(device_kind, dtype_name(dtype))
