"""The one-file binary (``make binary``, docs/binary.md): built with scripts/build_binary.py,
then run by a Python that has neither trioserve nor any of its dependencies installed.

That Python is a fresh venv (``--without-pip``) of the interpreter this test runs under: the
zipapp holds compiled extensions, so it needs the same Python version. A second fresh venv
gets torch (this venv's) and nothing else, through a ``.pth`` file naming a folder that holds
links to torch and its own dependencies only: torch "from the environment".
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from importlib.metadata import distribution
from pathlib import Path

import httpx
import psutil
import pytest
from packaging.requirements import Requirement

import trioserve

from ..base_install import link_distributions
from .server import Server, wait_gone

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HANDLERS = Path(__file__).parent / "handlers"
SAMPLE = REPO / "handlers" / "classifier" / "sample.json"
BUILD_SCRIPT = REPO / "scripts" / "build_binary.py"
# What trioserve needs at run time: none of it may be importable by the bare Pythons.
NOT_THERE = ("trioserve", "trio", "hypercorn", "quart_trio", "pydantic", "grpclib", "cffi")


def _importable(python: Path, module: str) -> bool:
    # Run away from the checkout: ``-c`` puts the working directory on sys.path.
    code = f"import {module}"
    done = subprocess.run([python, "-c", code], capture_output=True, cwd=python.parents[2])
    return done.returncode == 0


def _fresh_python(root: Path, pth: Path | None = None) -> Path:
    """A new venv, without pip, of the interpreter this test's venv was made from."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    python = root / "bin" / "python"
    if pth is not None:
        (site,) = root.glob("lib/python*/site-packages")
        (site / "torch-only.pth").write_text(f"{pth}\n")
    return python


def _closure(name: str) -> set[str]:
    """The installed distributions ``name`` needs, itself included (normalised names)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        seen.add(key)
        for line in distribution(key).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _torch_only(folder: Path) -> Path:
    """``folder`` with links to torch (and numpy, which the classifier's handler may use) and
    their dependencies as installed in this venv, and nothing else."""
    return link_distributions(folder, _closure("torch") | _closure("numpy"))


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("binary") / "trioserve.pyz"
    build = [sys.executable, str(BUILD_SCRIPT), "-o", str(out)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"built {out}" in done.stdout
    return out


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = _fresh_python(tmp_path_factory.mktemp("bare") / "venv")
    assert [m for m in (*NOT_THERE, "torch") if _importable(python, m)] == []
    return python


@pytest.fixture(scope="module")
def with_torch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A bare Python that imports torch; and the folder torch comes from."""
    root = tmp_path_factory.mktemp("torchenv")
    folder = _torch_only(root / "torch-only")
    python = _fresh_python(root / "venv", pth=folder)
    assert [m for m in NOT_THERE if _importable(python, m)] == []
    assert _importable(python, "torch")
    return python, folder


@pytest.fixture(scope="module")
def shiv_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the zipapp extracts itself (SHIV_ROOT), instead of ~/.shiv."""
    return tmp_path_factory.mktemp("shiv")


def _env(shiv_root: Path) -> dict[str, str]:
    # An empty PYTHONPATH: nothing of this venv's leaks in that way.
    return {"SHIV_ROOT": str(shiv_root), "PYTHONPATH": ""}


def _run(python: Path, binary: Path, shiv_root: Path, *args: str) -> str:
    env = {**os.environ, **_env(shiv_root)}
    cmd = [str(python), str(binary), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=shiv_root, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _store(python: Path, binary: Path, shiv_root: Path, store: Path) -> str:
    """``demo-store`` into ``store``, and the ``whoami`` test model beside the demo models."""
    out = _run(python, binary, shiv_root, "demo-store", str(store))
    handler = str(HANDLERS / "whoami_handler.py")
    archive = ("archive", "--model-name", "whoami", "-v", "1.0", "--handler", handler)
    _run(python, binary, shiv_root, *archive, "--export-path", str(store))
    return out


@pytest.fixture
def serve(tmp_path: Path, binary: Path, shiv_root: Path) -> Iterator[object]:
    """Start ``python binary start --foreground`` on free ports; stop it with SIGTERM after
    the test and check that it exits cleanly and that its workers are gone."""
    started: list[Server] = []

    def start(python: Path, store: Path, models: str, **properties: str) -> Server:
        server = Server(
            tmp_path / f"server{len(started)}",
            store,
            models,
            properties=properties,
            env=_env(shiv_root),
            command=[str(python), str(binary)],
        )
        server.workdir.mkdir()
        started.append(server)
        server.start(timeout=120)
        return server

    yield start
    for server in started:
        pids = server.child_pids()
        status = server.stop()  # SIGTERM
        server.kill()
        assert status == 0, server.log
        assert wait_gone(pids) == [], f"child processes left behind:\n{server.log}"


def _whoami(server: Server) -> dict[str, str | None]:
    answer = httpx.post(f"{server.url}/predictions/whoami", content=b"?", timeout=60)
    assert answer.status_code == 200, answer.text
    found: dict[str, str | None] = answer.json()
    return found


def test_version(binary: Path, bare: Path, shiv_root: Path) -> None:
    out = _run(bare, binary, shiv_root, "--version")
    assert out.strip() == f"trioserve {trioserve.__version__}"
    # shiv extracted the zipapp's site-packages under SHIV_ROOT, not into ~/.shiv
    (extracted,) = shiv_root.glob("trioserve.pyz_*/site-packages")
    assert (extracted / "trioserve" / "cli.py").is_file()


def test_serves_the_demo_models_without_torch(
    binary: Path, bare: Path, shiv_root: Path, tmp_path: Path, serve: object
) -> None:
    store = tmp_path / "store"
    out = _store(bare, binary, shiv_root, store)
    assert "left out, they need PyTorch: classifier" in out
    assert not (store / "classifier.mar").exists()
    # Two serving processes: the second is a child the zipapp must be able to start too.
    server = serve(bare, store, "all", serving_processes="2")  # type: ignore[operator]
    assert len(server.serving_pids()) == 1
    answer = httpx.post(
        f"{server.url}/predictions/echo",
        content=b"hello binary",
        headers={"Content-Type": "text/plain"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.text == "hello binary"
    # The MLServer folder too: the model API does without numpy, which the binary lacks.
    prompt = {"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["hello"]}
    text = httpx.post(
        f"{server.url}/v2/models/textgen/generate", json={"inputs": [prompt]}, timeout=60
    )
    assert text.status_code == 200, text.text + server.log
    assert len(text.json()["outputs"][0]["data"][0].split()) == 16
    # The worker imported trioserve and trio from the extracted zipapp: the bare Python has
    # neither, and gives them no other place to come from.
    where = _whoami(server)
    assert where["executable"] == str(bare)
    assert str(where["trioserve"]).startswith(str(shiv_root))
    assert str(where["trio"]).startswith(str(shiv_root))
    assert where["torch"] is None


def test_serves_the_classifier_with_torch_from_the_environment(
    binary: Path,
    with_torch: tuple[Path, Path],
    shiv_root: Path,
    tmp_path: Path,
    serve: object,
) -> None:
    python, torch_folder = with_torch
    store = tmp_path / "store"
    out = _store(python, binary, shiv_root, store)
    assert "left out" not in out
    server = serve(python, store, "classifier.mar,whoami.mar")  # type: ignore[operator]
    answer = httpx.post(
        f"{server.url}/predictions/classifier",
        content=SAMPLE.read_bytes(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"cat", "dog", "bird", "fish"}
    assert abs(sum(body.values()) - 1.0) < 1e-5
    where = _whoami(server)
    assert where["executable"] == str(python)
    assert str(where["trioserve"]).startswith(str(shiv_root))
    assert str(where["torch"]).startswith(str(torch_folder))


def test_background_start_and_stop(
    binary: Path, bare: Path, shiv_root: Path, tmp_path: Path
) -> None:
    """``trioserve start`` without ``--foreground`` runs the server as ``python -m trioserve``
    (no zipapp start-up there): it and its worker import trioserve from the zipapp too."""
    store = tmp_path / "store"
    handler = str(HANDLERS / "whoami_handler.py")
    archive = ("archive", "--model-name", "whoami", "-v", "1.0", "--handler", handler)
    _run(bare, binary, shiv_root, *archive, "--export-path", str(store))
    config = tmp_path / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\ngrpc_management_port=0\n"
        f"disable_token_authorization=true\nmodel_store={store}\nload_models=whoami.mar\n"
    )
    env = {
        **os.environ,
        **_env(shiv_root),
        "TRIOSERVE_PID_FILE": str(tmp_path / "trioserve.pid"),
        "LOG_LOCATION": str(tmp_path / "logs"),
    }
    cmd = [str(bare), str(binary)]
    started = subprocess.run(
        [*cmd, "start", "--ts-config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    log = tmp_path / "logs" / "trioserve.log"
    assert started.returncode == 0, started.stdout + started.stderr
    pid = int((tmp_path / "trioserve.pid").read_text())
    children = [p.pid for p in psutil.Process(pid).children(recursive=True)]
    try:
        url = re.search(r"inference=(http://127\.0\.0\.1:\d+)", started.stdout)
        assert url is not None, started.stdout
        answer = httpx.post(f"{url[1]}/predictions/whoami", content=b"?", timeout=60)
        assert answer.status_code == 200, answer.text + log.read_text()
        where = answer.json()
        assert str(where["trioserve"]).startswith(str(shiv_root))
        assert where["executable"] == str(bare)
    finally:
        stopped = subprocess.run(
            [*cmd, "stop"], capture_output=True, text=True, env=env, timeout=120
        )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr + log.read_text()
    assert children != []  # the worker
    assert wait_gone([pid, *children]) == []


def test_the_wrong_python_is_told_so(tmp_path: Path) -> None:
    """The zipapp's preamble (run by shiv before trioserve) refuses a Python or platform it
    holds no compiled modules for, with a message that says which ones it has."""
    spec = importlib.util.spec_from_file_location("build_binary", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for versions, platform in [(("2.7",), sysconfig.get_platform()), ((mine,), "plan9-mips")]:
        preamble = tmp_path / "check_python.py"
        preamble.write_text(script.PREAMBLE.format(versions=versions, platform=platform))
        with pytest.raises(SystemExit, match=r"trioserve\.pyz holds compiled modules for Python"):
            runpy.run_path(str(preamble), run_name="__main__")
    preamble.write_text(script.PREAMBLE.format(versions=(mine,), platform=sysconfig.get_platform()))
    runpy.run_path(str(preamble), run_name="__main__")  # this one passes
