"""Layering rules of docs/design.md, checked on the source."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "trioserve"
IO_MODULES = {
    "trio",
    "asyncio",
    "torch",
    "quart",
    "quart_trio",
    "hypercorn",
    "grpclib",
    "socket",
    "selectors",
    "subprocess",
    "threading",
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_is_sans_io() -> None:
    offenders = {
        path.name: sorted(imported_roots(path) & IO_MODULES)
        for path in (PACKAGE / "core").glob("*.py")
        if imported_roots(path) & IO_MODULES
    }
    assert offenders == {}


def test_importing_core_loads_no_io_library() -> None:
    code = (
        "import sys, trioserve.core.frames, trioserve.core.messages, trioserve.core.registry, "
        "trioserve.core.errors, trioserve.core.model_settings, trioserve.core.backoff, "
        "trioserve.core.request; "
        "print(sorted(m for m in ('trio', 'torch', 'asyncio', 'quart') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_worker_does_not_import_torch_by_itself() -> None:
    code = "import sys, trioserve.worker.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
