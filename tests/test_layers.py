"""Contracts between the package's modules that import-linter does not express."""

from __future__ import annotations

import ast
from pathlib import Path

import optimus_eqsat
from optimus_eqsat.disk_cache import source_roots

PACKAGE = Path(optimus_eqsat.__file__).parent


def _imports_of_private_names() -> list[str]:
    found = []
    for root in source_roots():
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optimus_eqsat"):
                    for alias in node.names:
                        # (a private *module* of a package, such as kernels._triton_grouped_linear, is its own)
                        private = alias.name.startswith("_") and not alias.name.startswith("__")
                        module = f"{node.module}.{alias.name}".replace(".", "/")
                        is_module = (PACKAGE.parent / module).with_suffix(".py").exists()
                        if private and not is_module:
                            found.append(f"{path.relative_to(root)}:{node.lineno} {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name():
    assert _imports_of_private_names() == []


def test_every_import_of_the_package_is_absolute():
    relative = [
        f"{path.name}:{node.lineno}"
        for root in source_roots()
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert relative == []
