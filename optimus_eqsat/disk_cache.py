"""A cache on disk that survives restarts: entries keyed by a digest, written atomically.

Training jobs restart often; without a cache every new process saturates, extracts and
times the same graphs again. :mod:`.program_cache` keys the optimizer's programs and the
measured choice's decisions on everything they depend on (the graph, its inputs' shapes,
the options, the device, and a fingerprint of this package's own source and rule files, so
an entry written by other code is never read back). Entries are pickles written to a
temporary file and renamed into place: a concurrent writer of the same key writes the same
content, a reader sees a whole file or none, and an unreadable file is a miss.

Where: ``$OPTIMUS_EQSAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/optimus_eqsat``, else
``~/.cache/optimus_eqsat``. ``OPTIMUS_EQSAT_CACHE=0`` turns it off for the process; the
option ``persistent_cache=False`` for one call; ``optimus-eqsat cache --clear`` empties it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

log = logging.getLogger("optimus_eqsat")

DIR_ENV = "OPTIMUS_EQSAT_CACHE_DIR"
SWITCH_ENV = "OPTIMUS_EQSAT_CACHE"
FORMAT = 1  # bumped when an entry's layout changes
MAX_ENTRIES = 1000  # per kind; the oldest go first


def cache_root() -> Path:
    """The folder of every kind of entry (see the module docstring); the user's calibrated
    device profiles live in its ``profiles`` folder (``calibration/store.py``)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "optimus_eqsat"


def cache_enabled() -> bool:
    """False when ``OPTIMUS_EQSAT_CACHE`` turns the cache off (0, false, off, no), or while
    Inductor's ``force_disable_caches`` is set (a cold compile is then cold here too)."""
    from torch._inductor import config as inductor_config

    if inductor_config.force_disable_caches:
        return False
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def digest(*parts: Any) -> str:
    """A hex digest of the parts' reprs (the parts must have deterministic reprs)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


@cache
def code_fingerprint() -> str:
    """A digest of the versions of torch and egglog and of every source and rule file of this
    package (the rule sets and extractors included): any change to them invalidates every
    entry, so a development checkout never reads what older code wrote."""
    from importlib.metadata import version

    import torch

    # (egglog's version from its metadata: importing egglog costs about 0.15 s)
    h = hashlib.sha256(f"{FORMAT} {torch.__version__} {version('egglog')}".encode())
    for root, path in package_source_files():
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def package_source_files() -> list[tuple[Path, Path]]:
    """Every Python source, rule file and calibration profile of the package, each with the
    folder of :func:`source_roots` it lies under, in a stable order."""
    return [
        (root, path)
        for root in source_roots()
        for path in sorted(root.rglob("*"))
        if path.suffix in (".py", ".egg", ".json") and path.is_file() and "__pycache__" not in path.parts
    ]


def source_roots() -> tuple[Path, ...]:
    """The folders of the package's sources: the package and its rewrites/ and extract/
    (symbolic links in a checkout, which a recursive glob of the package does not enter)."""
    package = Path(__file__).parent
    return (package, package / "rewrites", package / "extract")


class DiskCache:
    """One kind of entry (a folder under :func:`cache_root`): pickled values by key."""

    def __init__(self, kind: str, root: Path | None = None):
        self.kind = kind
        self.root = root

    @property
    def folder(self) -> Path:
        return (self.root or cache_root()) / f"{self.kind}-v{FORMAT}"

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.pkl"

    def get(self, key: str) -> Any | None:
        """The value stored under ``key``, or None (missing or unreadable, or a cache folder
        that cannot be read: a miss, logged; never an error inside a user's compile)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a folder that cannot be one (a file on its path), no permission
            log.info("optimus_eqsat: cache entry %s not read (%s)", path, exc)
            return None
        except Exception as exc:  # a truncated or foreign file: drop it
            log.info("optimus_eqsat: unreadable cache entry %s dropped (%s)", path.name, exc)
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
            return None

    def put(self, key: str, value: Any) -> bool:
        """Store ``value`` under ``key``: whole or not at all. False (logged) when it cannot be
        pickled or written; the caller carries on without the entry."""
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self._path(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except Exception as exc:
            log.info("optimus_eqsat: not cached on disk (%s: %s)", type(exc).__name__, exc)
            return False
        self._prune()
        return True

    def _prune(self) -> None:
        """Keep the newest :data:`MAX_ENTRIES` entries (another process may prune too)."""
        try:
            entries = list(self.folder.glob("*.pkl"))
            if len(entries) <= MAX_ENTRIES:
                return
            entries.sort(key=lambda p: p.stat().st_mtime)
            for path in entries[: len(entries) - MAX_ENTRIES]:
                path.unlink(missing_ok=True)
        except OSError:
            pass

    def __len__(self) -> int:
        return len(list(self.folder.glob("*.pkl"))) if self.folder.exists() else 0


def clear_cache(root: Path | None = None) -> int:
    """Remove every entry of every kind; returns how many were removed."""
    root = root or cache_root()
    removed = 0
    if root.exists():
        for path in root.glob("*-v*/*"):
            if path.is_file():
                path.unlink(missing_ok=True)
                removed += path.suffix == ".pkl"
    return removed
