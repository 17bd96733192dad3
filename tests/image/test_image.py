"""The OCI image (Dockerfile, docs/docker.md), built and served with buildah.

Outside the default suite (marker ``image``): it needs root, buildah and debootstrap, and
minutes. ``.venv/bin/pytest -m image tests/image -s`` prints the build time and the cold
start. The image is built by ``scripts/build_image.sh`` (cached layers make a rebuild of an
unchanged tree quick); the server then runs in a buildah working container from it, with
chroot isolation, which shares the host's network namespace: the listeners are moved to
free loopback ports by ``TS_*`` variables, which the image's config enables. The demo model
store is built on the host and mounted read-only at the image's model store.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/trioserve:latest"
HOME = "/home/model-server"
KEY_FILE = f"{HOME}/key_file.json"
SAMPLE = ROOT / "handlers" / "classifier" / "sample.json"
# handlers/classifier/README.md: the demo classifier's deterministic answer to sample.json
EXPECTED = {"fish": 0.2715802, "dog": 0.2589065, "bird": 0.2385515, "cat": 0.2309618}
START_TIMEOUT = 240.0


def buildah(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "docker" / "buildah-containers.conf")}
    return subprocess.run(
        ["buildah", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    """Build the image with the script; its configuration as buildah reports it."""
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        pytest.fail("the image tests need root and buildah (apt-get install buildah debootstrap)")
    started = time.monotonic()
    built = subprocess.run(
        ["sh", "scripts/build_image.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    assert built.stdout.strip() == "trioserve:latest"
    print(f"\nimage: built in {time.monotonic() - started:.1f} s; {built.stderr.splitlines()[-2]}")
    inspected = buildah("inspect", "--type", "image", IMAGE)
    assert inspected.returncode == 0, inspected.stderr
    config: dict[str, Any] = json.loads(inspected.stdout)["Docker"]["config"]
    return config


@dataclass
class Served:
    container: str
    env: list[str]  # --env options, to run more commands beside the server
    process: subprocess.Popen[str]  # buildah run
    server: psutil.Process  # trioserve itself (chroot isolation shares the PID namespace)
    ports: dict[str, int]
    cold_start: float

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """``docker exec``: a command in the running container."""
        return buildah("run", "--isolation", "chroot", *self.env, self.container, "--", *command)

    def key(self, kind: str = "inference") -> str:
        shown = self.run("cat", KEY_FILE)
        assert shown.returncode == 0, shown.stderr
        return str(json.loads(shown.stdout)[kind]["key"])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ports['inference']}{path}"


def _server_process(parent: int, entrypoint: list[str], deadline: float) -> psutil.Process:
    """trioserve's own process: ``buildah-chroot-exec`` (its parent) has the same arguments."""
    while time.monotonic() < deadline:
        for child in psutil.Process(parent).children(recursive=True):
            try:
                cmdline = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            if cmdline[-len(entrypoint) :] == entrypoint and "python" in Path(cmdline[0]).name:
                return child
        time.sleep(0.1)
    raise AssertionError("the trioserve process did not appear under buildah run")


def _get(url: str, key: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def served(image: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The image's entry point serving the demo models, until the drain test stops it."""
    store = tmp_path_factory.mktemp("image") / "model-store"
    subprocess.run(
        [sys.executable, "-m", "trioserve", "demo-store", str(store)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # the server runs as model-server (uid 1000): the store must be readable by it
    for path in [store, *store.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    names = ["inference", "management", "metrics", "grpc_inference", "grpc_management"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    env = [
        f"TS_INFERENCE_ADDRESS=http://127.0.0.1:{ports['inference']}",
        f"TS_MANAGEMENT_ADDRESS=http://127.0.0.1:{ports['management']}",
        f"TS_METRICS_ADDRESS=http://127.0.0.1:{ports['metrics']}",
        "TS_GRPC_INFERENCE_ADDRESS=127.0.0.1",
        f"TS_GRPC_INFERENCE_PORT={ports['grpc_inference']}",
        "TS_GRPC_MANAGEMENT_ADDRESS=127.0.0.1",
        f"TS_GRPC_MANAGEMENT_PORT={ports['grpc_management']}",
    ]
    env_options = [option for value in env for option in ("--env", value)]
    name = f"trioserve-image-test-{os.getpid()}"
    made = buildah("from", "--name", name, IMAGE)
    assert made.returncode == 0, made.stderr
    process: subprocess.Popen[str] | None = None
    log = (tmp_path_factory.getbasetemp() / "image-server.log").open("w")
    try:
        started = time.monotonic()
        process = subprocess.Popen(
            [
                "buildah",
                "run",
                "--isolation",
                "chroot",
                *env_options,
                "--volume",
                f"{store}:{HOME}/model-store:ro",
                name,
                "--",
                *image["Entrypoint"],
            ],
            env={**os.environ, "CONTAINERS_CONF": str(ROOT / "docker" / "buildah-containers.conf")},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = started + START_TIMEOUT
        server = _server_process(process.pid, image["Entrypoint"], deadline)
        key: str | None = None
        status = 0
        while time.monotonic() < deadline and process.poll() is None:
            if key is None:
                shown = buildah("run", "--isolation", "chroot", name, "--", "cat", KEY_FILE)
                if shown.returncode == 0:
                    key = json.loads(shown.stdout)["inference"]["key"]
            try:
                status, _ = _get(f"http://127.0.0.1:{ports['inference']}/ping", key)
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.2)
        cold_start = time.monotonic() - started
        assert status == 200, f"not ready after {cold_start:.0f} s: see {log.name}"
        print(f"\nimage: cold start {cold_start:.1f} s (buildah run to /ping 200, all demo models)")
        yield Served(name, env_options, process, server, ports, cold_start)
    finally:
        if process is not None and process.poll() is None:
            for child in psutil.Process(process.pid).children(recursive=True):
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            process.kill()
            process.wait(timeout=30)
        log.close()
        removed = buildah("rm", name)
        assert removed.returncode == 0, removed.stderr


def test_image_configuration(image: dict[str, Any]) -> None:
    assert image["User"] == "model-server"
    assert image["WorkingDir"] == HOME
    assert image["Entrypoint"] == ["/opt/trioserve/bin/trioserve", "start", "--foreground"]
    assert set(image["ExposedPorts"]) == {f"{p}/tcp" for p in (8080, 8081, 8082, 7070, 7071)}
    assert image["Healthcheck"]["Test"] == [
        "CMD",
        "/opt/trioserve/bin/python",
        "/opt/trioserve/healthcheck.py",
    ]
    assert f"TS_CONFIG_FILE={HOME}/config.properties" in image["Env"]


def test_default_config_listens_on_every_interface(served: Served) -> None:
    """The image's config as the server reads it, without the test's TS_* overrides."""
    script = (
        "import os, pathlib; from trioserve.config import CliOptions, load_config; "
        "c = load_config(CliOptions(), os.environ, pathlib.Path.cwd()); "
        "print(c.inference_address, c.management_address, c.metrics_address, "
        "c.grpc_inference_address, c.grpc_inference_port, c.grpc_management_address, "
        "c.grpc_management_port, c.model_store, c.load_models, c.key_file, "
        "c.disable_token_authorization, c.enable_model_api)"
    )
    shown = buildah("run", "--isolation", "chroot", served.container, "--", "python", "-c", script)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [
        "http://0.0.0.0:8080",
        "http://0.0.0.0:8081",
        "http://0.0.0.0:8082",
        "0.0.0.0",
        "7070",
        "0.0.0.0",
        "7071",
        f"{HOME}/model-store",
        "('all',)",
        f"{HOME}/key_file.json",
        "False",
        "False",
    ]


def test_runs_as_model_server_with_a_private_key_file(served: Served) -> None:
    assert served.server.uids().real == 1000
    listing = served.run("stat", "-c", "%U %a", KEY_FILE)
    assert listing.stdout.split() == ["model-server", "600"]


def test_token_is_required_and_prediction_answers(served: Served) -> None:
    status, _ = _get(served.url("/ping"), None)
    assert status == 401
    request = urllib.request.Request(
        served.url("/predictions/classifier"),
        data=SAMPLE.read_bytes(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {served.key()}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert list(answer) == list(EXPECTED)
    assert answer == pytest.approx(EXPECTED, abs=1e-5)


def test_healthcheck_pings_with_the_key(served: Served) -> None:
    checked = served.run("/opt/trioserve/bin/python", "/opt/trioserve/healthcheck.py", "-v")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[0] == '/ping: 200 {"status": "Healthy"}'


def test_healthcheck_without_a_current_key_asks_grpc_health(served: Served) -> None:
    stale = f"{HOME}/tmp/stale-keys.json"
    document = json.dumps({"inference": {"key": "expired0"}})
    wrote = served.run("sh", "-c", f"printf '%s' '{document}' > {stale}")
    assert wrote.returncode == 0, wrote.stderr
    checked = buildah(
        "run",
        "--isolation",
        "chroot",
        *served.env,
        "--env",
        f"TS_KEY_FILE={stale}",
        served.container,
        "--",
        "/opt/trioserve/bin/python",
        "/opt/trioserve/healthcheck.py",
        "-v",
    )
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[0].startswith("/ping: 401 ")
    assert lines[1:] == ["/ping needs a current inference key; gRPC health: SERVING"]


def test_sigterm_drains_the_stream_in_flight_then_exits(served: Served) -> None:
    """Last: it stops the server. SIGTERM goes to trioserve itself, as to PID 1 in docker."""
    connection = http.client.HTTPConnection("127.0.0.1", served.ports["inference"], timeout=30)
    body = json.dumps({"prompt": "a b", "tokens": 40})
    connection.request(
        "POST",
        "/predictions/streaming",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {served.key()}"},
    )
    response = connection.getresponse()
    assert response.status == 200
    first = response.read1()
    assert first.startswith(b"a ")
    signalled = time.monotonic()
    served.server.send_signal(signal.SIGTERM)
    rest = response.read()
    connection.close()
    assert (first + rest).decode() == "a b " * 20 + "[done]"
    assert served.process.wait(timeout=60) == 0
    print(f"\nimage: exited {time.monotonic() - signalled:.1f} s after SIGTERM, stream complete")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served.ports["inference"]), timeout=5).close()
