"""A plain install serves an MLServer model folder: the wheel built from this checkout,
installed without extras into a fresh venv that has trioserve's base dependencies and nothing
else (no numpy, no torch), runs the ``textgen`` demo folder and answers it streamed and whole.

Offline: the venv is made without pip, this environment's pip installs the wheel into it
(``pip --python``, ``--no-deps --no-index``), and the base dependencies come from this
environment through a ``.pth`` file naming a folder of links to them
(tests/base_install.py). ``pip check`` then shows the wheel's requirements are all met there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from ..base_install import link_base_distributions
from .server import Server, running

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build_binary.py"
BODY = {
    "inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["hello"]}],
    "parameters": {"max_tokens": 5},
}


def _pip(venv_python: Path, *args: str) -> str:
    # pip runs its work in the venv's Python: no PYTHONPATH, or it sees this checkout.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv_python), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _importable(python: Path, module: str) -> bool:
    # Away from the checkout, and with no PYTHONPATH: only the venv's own paths count.
    code = f"import {module}"
    done = subprocess.run(
        [python, "-c", code], capture_output=True, cwd=python.parents[2], env={"PATH": ""}
    )
    return done.returncode == 0


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's ``bin/`` folder, with trioserve installed from its wheel, no extras."""
    spec = importlib.util.spec_from_file_location("build_binary", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root = tmp_path_factory.mktemp("plain")
    (root / "work").mkdir()
    wheel: Path = script.build_wheel(sys.executable, root / "work", quiet=True)

    base = getattr(sys, "_base_executable", sys.executable)
    venv = root / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "base-only.pth").write_text(f"{link_base_distributions(root / 'base')}\n")
    _pip(python, "install", "--no-deps", "--no-index", "--no-compile", str(wheel))
    assert "No broken requirements found" in _pip(python, "check")
    assert _importable(python, "trioserve.model")
    assert [m for m in ("numpy", "torch", "PIL", "mlserver") if _importable(python, m)] == []
    return venv / "bin"


@pytest.fixture
def plain_server(plain_install: Path, tmp_path: Path) -> Iterator[Server]:
    store = tmp_path / "store"
    shutil.copytree(REPO / "handlers" / "textgen", store / "textgen")
    workdir = tmp_path / "server"
    workdir.mkdir()
    server = Server(
        workdir,
        store,
        "textgen",
        # Nothing of this checkout or this environment on the path.
        env={"PYTHONPATH": ""},
        command=[str(plain_install / "trioserve")],
    )
    with running(server):
        yield server


def test_a_plain_install_serves_an_mlserver_model_folder(
    plain_install: Path, plain_server: Server
) -> None:
    (worker,) = plain_server.worker_pids()
    assert psutil.Process(worker).cmdline()[0] == str(plain_install / "python")
    url = f"{plain_server.url}/v2/models/textgen"
    with httpx.Client(timeout=60) as client:
        whole = client.post(f"{url}/generate", json=BODY)
        assert whole.status_code == 200, whole.text + plain_server.log
        with client.stream("POST", f"{url}/generate_stream", json=BODY) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in stream.iter_lines() if line.startswith("data:")]
    words = [json.loads(line[5:])["outputs"][0]["data"][0] for line in lines]
    assert len(words) == 5
    assert whole.json()["outputs"][0]["data"] == [" ".join(words)]
