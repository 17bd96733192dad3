"""``trioserve dev``: a real process serves a handler file and an MLServer folder in place,
reloads them on edits, survives a broken edit, and leaves no process behind on a signal."""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from trioserve.launch import launch

from .server import wait_gone

pytestmark = pytest.mark.e2e

HANDLER = """\
import time


def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        if row.get("body") == "slow":
            time.sleep(1.5)
        answers.append({answer!r})
    return answers
"""

# Called with no data while the worker loads: it marks that the load has begun (in a file
# outside the watched folder), then hangs.
HANGS = """\
import pathlib
import time


def handle(data, context):
    pathlib.Path({marker!r}).touch()
    time.sleep(60)
"""

RUNTIME = """\
from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceResponse


class Version(MLModel):
    async def predict(self, payload):
        answer = StringCodec.encode_output("version", [{answer!r}])
        return InferenceResponse(model_name=self.name, outputs=[answer])
"""

SETTINGS = '{"implementation": "runtime.Version", "parameters": {"version": "1"}}'


@dataclass
class Dev:
    """A running ``trioserve dev``; its stdout and stderr go to ``log_path``."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, count: int = 1, timeout: float = 60) -> None:
        """Wait until ``text`` has been printed ``count`` times."""
        deadline = time.monotonic() + timeout
        while self.log.count(text) < count:
            assert self.process.poll() is None, f"trioserve dev exited:\n{self.log}"
            assert time.monotonic() < deadline, f"no {text!r} x{count} in:\n{self.log}"
            time.sleep(0.05)

    def curl_line(self) -> list[str]:
        lines = [line for line in self.log.splitlines() if line.startswith("curl ")]
        assert lines, self.log
        return shlex.split(lines[-1])

    def worker_pids(self) -> list[int]:
        return [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]


@contextlib.contextmanager
def dev(workdir: Path, path: Path, *flags: str, tokens: bool = True) -> Iterator[Dev]:
    """Start ``trioserve dev PATH`` on free ports; afterwards it must be gone, and so must
    its worker."""
    config = workdir / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\ngrpc_management_port=0\n"
        f"disable_token_authorization={'false' if tokens else 'true'}\n"
        "unregister_model_timeout=10\nshutdown_grace_seconds=5\n"
    )
    log_path = workdir / "dev.log"
    command = [sys.executable, "-m", "trioserve", "dev", str(path), "--ts-config", str(config)]
    launched = launch([*command, *flags], log_path=log_path, cwd=workdir, timeout=60)
    running = Dev(launched.process, log_path, 0)
    try:
        assert launched.ready, f"{launched.report}\n{running.log}"
        running.port = launched.port("inference")
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(10)


def stops_cleanly(running: Dev, signum: int) -> None:
    pids = running.worker_pids()
    assert pids, running.log
    running.process.send_signal(signum)
    assert running.process.wait(30) == 0, running.log
    assert wait_gone(pids) == [], running.log


def call_curl_line(args: list[str]) -> str:
    """Run the printed curl line: with curl when there is one, else the same request
    (URL, headers, body) with httpx."""
    if shutil.which("curl"):
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True)
        return done.stdout
    url = next(a for a in args if a.startswith("http"))
    headers = dict(args[i + 1].split(": ", 1) for i, a in enumerate(args) if a == "-H")
    body = args[args.index("--data-binary") + 1]
    content = Path(body[1:]).read_bytes() if body.startswith("@") else body.encode()
    return httpx.post(url, headers=headers, content=content, timeout=30).text


def test_a_handler_file_reloads_on_edits_and_survives_a_broken_one(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    handler = model / "handler.py"
    handler.write_text(HANDLER.format(answer="v1"))
    (model / "sample.txt").write_text("hello")
    with dev(tmp_path, handler) as running:
        assert "[dev] loaded handler in" in running.log
        curl = running.curl_line()
        key = (tmp_path / "key_file.json").read_text()
        assert f"http://127.0.0.1:{running.port}/predictions/handler" in curl
        assert any(a.startswith("Authorization: Bearer ") and a[22:] in key for a in curl)
        assert call_curl_line(curl) == "v1"
        headers = {"Authorization": curl[curl.index("-H") + 1].split(": ", 1)[1]}
        url = f"http://127.0.0.1:{running.port}/predictions/handler"

        def predict(body: str = "x") -> httpx.Response:
            return httpx.post(url, content=body, headers=headers, timeout=30)

        assert httpx.post(url, content="x", timeout=30).status_code == 401  # tokens are on

        # An edit while a request runs: the request finishes on the old code, the next
        # request gets the new code.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(predict, "slow")
            time.sleep(0.3)
            handler.write_text(HANDLER.format(answer="v2"))
            running.wait_for("[dev] reloaded handler in")
            assert (slow.result(timeout=30).status_code, slow.result().text) == (200, "v1")
        assert predict().text == "v2"

        handler.write_text("def handle(data, context:\n")
        running.wait_for("[dev] load failed: ")
        assert re.search(r"\[dev\] load failed: .*SyntaxError", running.log), running.log
        broken = predict()
        assert broken.status_code == 503 and "SyntaxError" in broken.json()["message"]

        handler.write_text(HANDLER.format(answer="v3"))
        running.wait_for("[dev] reloaded handler in", count=2)
        assert predict().text == "v3"
        assert call_curl_line(curl) == "v3"  # the printed line still works

        # An edit while a load hangs: the load is dropped and the new code loads at once.
        marker = tmp_path / "hanging"
        handler.write_text(HANGS.format(marker=str(marker)))
        running.wait_for("[dev] changed: ", count=4)
        deadline = time.monotonic() + 30
        while not marker.exists():  # the hanging load has begun
            assert time.monotonic() < deadline, running.log
            time.sleep(0.05)
        handler.write_text(HANDLER.format(answer="v4"))
        running.wait_for("[dev] reloaded handler in", count=3, timeout=20)
        assert "[dev] newer edits came while handler was loading" in running.log
        assert predict().text == "v4"
        stops_cleanly(running, signal.SIGINT)


def test_an_mlserver_folder_reloads_over_the_open_inference_protocol(tmp_path: Path) -> None:
    model = tmp_path / "versioned"
    model.mkdir()
    (model / "model-settings.json").write_text(SETTINGS)
    runtime = model / "runtime.py"
    runtime.write_text(RUNTIME.format(answer="v1"))
    with dev(tmp_path, model, "--model-name", "ver", tokens=False) as running:
        curl = running.curl_line()
        assert f"http://127.0.0.1:{running.port}/v2/models/ver/infer" in curl
        assert not any(a.startswith("Authorization") for a in curl)

        def version() -> str:
            answer = httpx.post(curl[4], content=curl[-1], timeout=30).json()
            return str(answer["outputs"][0]["data"][0])

        assert version() == "v1"
        assert call_curl_line(curl).count('"v1"') == 1
        runtime.write_text(RUNTIME.format(answer="v2"))
        running.wait_for("[dev] reloaded ver in")
        assert version() == "v2"
        stops_cleanly(running, signal.SIGTERM)
