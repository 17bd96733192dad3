"""Run a real trioserve process for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from trioserve.launch import launch

HANDLERS = Path(__file__).parent / "handlers"


def archive(
    store: Path, name: str, handler: str, *extra: str, version: str = "1.0", file: str = ""
) -> Path:
    """Build an archive with the real ``trioserve archive`` command."""
    export = store if not file else store / f".build-{file}"
    cmd = [
        sys.executable,
        "-m",
        "trioserve",
        "archive",
        "--model-name",
        name,
        "-v",
        version,
        "--handler",
        str(HANDLERS / handler),
        "--export-path",
        str(export),
        "-f",
        *extra,
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    if file:
        (export / f"{name}.mar").rename(store / file)
        export.rmdir()
        return store / file
    return store / f"{name}.mar"


@dataclass
class Server:
    workdir: Path
    store: Path
    models: str
    properties: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    management_port: int = 0
    metrics_port: int = 0
    grpc_inference_port: int = 0
    grpc_management_port: int = 0
    tokens: bool = False
    # How to run trioserve; the one-file binary's test runs ``python3 trioserve.pyz``.
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "trioserve"])

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_inference_port}"

    @property
    def grpc_management_target(self) -> str:
        return f"127.0.0.1:{self.grpc_management_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def key(self, kind: str) -> str:
        """A key from the server's key_file.json (token auth must be on)."""
        data = json.loads((self.workdir / "key_file.json").read_text())
        return str(data[kind]["key"])

    def auth(self, kind: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key(kind)}"}

    @property
    def log(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 60) -> str:
        # Port 0 everywhere: the kernel picks free ports at bind time and the READY report
        # names them, so no port can be taken between choosing and binding it.
        props = {
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "grpc_inference_port": "0",
            "grpc_management_port": "0",
            "disable_token_authorization": "false" if self.tokens else "true",
            "model_store": str(self.store),
            "load_models": self.models,
            "default_workers_per_model": "1",
            "default_startup_timeout": "30",
            "shutdown_grace_seconds": "10",
            **self.properties,
        }
        config = self.workdir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        launched = launch(
            [*self.command, "start", "--foreground", "--ts-config", str(config)],
            log_path=self.workdir / "server.log",
            cwd=self.workdir,
            env={**os.environ, **self.env},
            timeout=timeout,
        )  # fmt: skip
        self.process = launched.process
        text = "\n".join(launched.report)
        if not launched.ready:
            self.kill()
            raise RuntimeError(f"server did not start: {text!r}\n{self.log}")
        # An API that is switched off (enable_metrics_api=false, say) has no listener: port 0.
        bound = launched.bound
        apis = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
        (
            self.port,
            self.management_port,
            self.metrics_port,
            self.grpc_inference_port,
            self.grpc_management_port,
        ) = (
            launched.port(api) if api in bound and not bound[api][0].startswith("unix:") else 0
            for api in apis
        )
        return text

    def descendants(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def child_pids(self) -> list[int]:
        """Every process the server started: workers and serving processes."""
        return [p.pid for p in self.descendants()]

    def worker_pids(self) -> list[int]:
        """The model worker processes (every descendant but the serving processes)."""
        return [p.pid for p in self.descendants() if not _is_serving(p)]

    def serving_pids(self) -> list[int]:
        """The serving processes the server started besides itself (serving_processes > 1)."""
        return [p.pid for p in self.descendants() if _is_serving(p)]

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> int | None:
        """SIGTERM, wait; returns the exit status (None if it had to be killed)."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.signal(signal.SIGTERM)
        try:
            return self.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kids = self.descendants()
            self.process.kill()
            self.process.wait(10)
            for kid in kids:
                try:
                    kid.kill()
                except psutil.NoSuchProcess:
                    pass


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    """Start ``server``; afterwards stop it and check that every process it started is gone."""
    server.start()
    try:
        yield server
    finally:
        pids = server.child_pids()
        server.stop()
        server.kill()
        assert wait_gone(pids) == [], f"child processes left behind:\n{server.log}"


def _is_serving(process: psutil.Process) -> bool:
    try:
        return SERVING_MODULE in process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


SERVING_MODULE = "trioserve.serving_process"


def wait_gone(pids: list[int], timeout: float = 15) -> list[int]:
    """The pids still alive after ``timeout`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
