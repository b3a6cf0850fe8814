"""The wheel ships the rule sets and extractors inside the package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_rewrites_extract_and_backend_entry_point(tmp_path):
    pytest.importorskip("hatchling")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
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
