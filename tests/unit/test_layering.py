"""Layering rules of docs/design.md, checked on the source.

The server's layers point down only: core <- runtime <- adapters (http, grpc) <- wiring
(``trioserve/server.py``, ``trioserve/dev``...) <- the command line (``trioserve/cli.py``).
A module may import its own layer and the layers below it, never one above or a sibling
adapter; core and runtime import no web framework or RPC library.
"""

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
    return {name.split(".")[0] for name in imported_modules(path.read_text())}


def imported_modules(source: str, package: str = "") -> set[str]:
    """Every absolute module name the source imports (relative imports resolved against
    ``package``), wherever the import stands (functions too)."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                if node.module:
                    base = f"{base}.{node.module}"
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_core_is_sans_io() -> None:
    offenders = {
        path.name: sorted(imported_roots(path) & IO_MODULES)
        for path in (PACKAGE / "core").glob("*.py")
        if imported_roots(path) & IO_MODULES
    }
    assert offenders == {}


def test_the_metrics_merge_is_sans_io() -> None:
    assert imported_roots(PACKAGE / "metrics" / "merge.py") & IO_MODULES == set()


def test_importing_core_loads_no_io_library() -> None:
    code = (
        "import sys, trioserve.core.frames, trioserve.core.messages, trioserve.core.registry, "
        "trioserve.core.errors, trioserve.core.model_settings, trioserve.core.backoff, "
        "trioserve.core.request, trioserve.core.inflight; "
        "print(sorted(m for m in ('trio', 'torch', 'asyncio', 'quart') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_worker_does_not_import_torch_by_itself() -> None:
    code = "import sys, trioserve.worker.loop; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# The server's layers, lowest first: module prefix -> (layer, rank). The two adapters share
# a rank and may not import each other. Packages not named (archive, metrics, config, auth,
# sockio, collate, client, _proto) are libraries: any layer may use them, and they may use
# core (the bottom, sans-IO) but no layer above it. The worker subprocess is its own world.
LAYERS = {
    "trioserve.core": ("core", 0),
    "trioserve.runtime": ("runtime", 1),
    "trioserve.http": ("http", 2),
    "trioserve.grpc": ("grpc", 2),
    "trioserve.server": ("wiring", 3),
    "trioserve.assembly": ("wiring", 3),
    "trioserve.foreground": ("wiring", 3),
    "trioserve.processes": ("wiring", 3),
    "trioserve.serving_process": ("wiring", 3),
    "trioserve.dev": ("wiring", 3),
    # The command line sits on top: it wires the commands (dev among them), none imports it.
    "trioserve.cli": ("command line", 4),
    "trioserve.__main__": ("command line", 4),
}
FRAMEWORKS = {
    "quart",
    "quart_trio",
    "hypercorn",
    "werkzeug",
    "grpclib",
    "trio_asyncio",
    "h2",
    "asyncio",
}


def layer_of(module: str) -> tuple[str, int] | None:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def layering_violations(module: str, source: str) -> list[str]:
    """What in ``source`` (the text of ``module``) breaks the layering rules."""
    own = layer_of(module)
    package = module.rsplit(".", 1)[0] if not module.endswith(".__init__") else module[:-9]
    problems = []
    for name in sorted(imported_modules(source, package)):
        target = layer_of(name)
        if own is None:
            if target is not None and target[1] > 0 and not module.startswith("trioserve.worker"):
                problems.append(f"{module} (a library) imports the layer {name}")
            continue
        if target is not None and target[0] != own[0] and target[1] >= own[1]:
            problems.append(f"{module} imports {name}, a layer at or above its own")
        if own[1] <= 1 and name.split(".")[0] in FRAMEWORKS:
            problems.append(f"{module} imports the framework {name}")
    return problems


# The worker subprocess's own layout (docs/design.md, "Inside the worker process"): the
# frame loop and the plumbing both model APIs share in trioserve/worker/, one subpackage per
# model API it hosts. Only the loop (and ``__main__``, which runs it) uses the APIs; neither
# API uses the other; nothing of the server imports the worker (it starts it by name).
WORKER = "trioserve.worker"
WORKER_APIS = ("trioserve.worker.torchserve", "trioserve.worker.mlserver")
WORKER_WIRING = {"trioserve.worker.loop", "trioserve.worker.__main__"}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _worker_api(module: str) -> str | None:
    return next((api for api in WORKER_APIS if _within(module, api)), None)


def worker_violations(module: str, source: str) -> list[str]:
    """What in ``source`` (the text of ``module``) breaks the worker's layout."""
    package = module.rsplit(".", 1)[0] if not module.endswith(".__init__") else module[:-9]
    own = _worker_api(module)
    problems = []
    for name in sorted(imported_modules(source, package)):
        if not _within(name, WORKER):
            continue
        if not _within(module, WORKER):
            problems.append(f"{module} imports the worker's {name}")
            continue
        target = _worker_api(name)
        if target is None or target == own:
            continue
        if own is not None:
            problems.append(f"{module} ({own}) imports the other model API's {name}")
        elif module not in WORKER_WIRING:
            problems.append(f"{module} (shared by both model APIs) imports {name}")
    return problems


def test_the_worker_is_grouped_by_model_api() -> None:
    problems = [
        problem
        for module, path in _modules()
        for problem in worker_violations(module, path.read_text())
    ]
    assert problems == []


def test_the_worker_check_catches_what_it_must() -> None:
    """The worker's rule on made-up modules: an API importing the other, a shared module
    importing an API, the server importing the worker, absolute or relative."""
    ts, ml = "trioserve.worker.torchserve", "trioserve.worker.mlserver"
    assert worker_violations(f"{ml}.x", f"from {ts}.errors import PredictionException")
    assert worker_violations(f"{ts}.x", "from ...worker.mlserver import mlmodel")
    assert worker_violations("trioserve.worker.connection", f"import {ts}.context")
    assert worker_violations("trioserve.worker.responses", "from .torchserve import codec")
    assert worker_violations("trioserve.runtime.launcher", "from trioserve.worker import loop")
    assert not worker_violations("trioserve.worker.loop", f"from {ml}.mlmodel import load_mlmodel")
    assert not worker_violations(f"{ts}.x", "from trioserve.worker.errors import LoadError")
    assert not worker_violations(f"{ts}.builtin.x", "from ..base_handler import BaseHandler")
    assert not worker_violations(f"{ml}.x", "from trioserve.model import types")


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(relative.parts)
        if not module.startswith("trioserve._proto"):
            found.append((module, path))
    return found


def test_layers_point_down_only() -> None:
    problems = [
        problem
        for module, path in _modules()
        for problem in layering_violations(module, path.read_text())
    ]
    assert problems == []


def test_the_layering_check_catches_what_it_must() -> None:
    """The rule itself, on made-up modules: an upward import or a framework in runtime or
    core is caught, absolute or relative, at top level or inside a function."""
    assert layering_violations("trioserve.runtime.x", "from trioserve.http import front")
    assert layering_violations("trioserve.runtime.x", "from ..grpc.calls import Gate")
    assert layering_violations("trioserve.core.x", "import trioserve.runtime.jobs")
    assert layering_violations("trioserve.runtime.x", "def f():\n    import quart\n")
    assert layering_violations("trioserve.runtime.x", "from hypercorn.trio import serve")
    assert layering_violations("trioserve.http.x", "from trioserve.grpc import bridge")
    assert layering_violations("trioserve.grpc.x", "from trioserve.server import serve")
    assert layering_violations("trioserve.metrics.x", "from trioserve.runtime import jobs")
    assert layering_violations("trioserve.dev.loop", "from trioserve.cli import main")
    assert not layering_violations("trioserve.http.x", "from trioserve.runtime import jobs")
    assert not layering_violations("trioserve.server", "from trioserve.grpc import bridge")
    assert not layering_violations("trioserve.runtime.x", "from trioserve.core import errors")
