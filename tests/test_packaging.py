"""The wheel ships the rule sets and extractors inside the package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def test_wheel_contains_rewrites_extract_and_backend_entry_point(tmp_path):
    pytest.importorskip("hatchling")
    wheel = _wheel(ROOT, tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "optimus_eqsat/language.egg",
        "optimus_eqsat/rewrites/splitcat.egg",
        "optimus_eqsat/rewrites/batching/__init__.py",
        "optimus_eqsat/rewrites/splitcat_runs.egg",
        "optimus_eqsat/extract/ilp.py",
        "optimus_eqsat/extract/fx_cost.py",
    ):
        assert required in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[torch_dynamo_backends]" in text and "optimus_eqsat = optimus_eqsat.backend" in text
    assert not any(n.startswith(("rewrites/", "extract/", "tests/", "benchmarks/")) for n in names)


def test_a_wheel_built_from_the_sdist_ships_the_same_files(tmp_path):
    """In a checkout optimus_eqsat/rewrites and /extract are links; the sdist carries the real
    folders (at the top, as in the repository) and its wheel must still put them in the package."""
    pytest.importorskip("hatchling")
    import tarfile

    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path / "sdist")],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (sdist,) = (tmp_path / "sdist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    from_sdist = _wheel(unpacked, tmp_path / "from_sdist")
    from_checkout = _wheel(ROOT, tmp_path / "from_checkout")

    def files(wheel: Path) -> set[str]:
        return {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}

    assert files(from_sdist) == files(from_checkout)
    assert "optimus_eqsat/extract/ilp.py" in files(from_sdist)


def test_backend_import_leaves_the_optimizer_s_heavy_libraries_unloaded():
    """A compile the persistent cache answers never builds an e-graph: importing the backend
    must not import egglog or networkx (together about 0.25 s of every warm process)."""
    code = (
        "import sys, optimus_eqsat.backend; "
        "print(sorted(m for m in ('egglog', 'egglog.bindings', 'networkx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
