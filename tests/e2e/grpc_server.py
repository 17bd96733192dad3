"""A real trioserve process with its gRPC listeners, for end-to-end tests.

:class:`GrpcServer` is :class:`tests.e2e.server.Server` started through
``grpc_launcher.py`` (``serve()`` plus ``serve_grpc``) on free gRPC ports.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .server import Server, free_port

LAUNCHER = Path(__file__).with_name("grpc_launcher.py")


@dataclass
class GrpcServer(Server):
    grpc_inference_port: int = 0
    grpc_management_port: int = 0

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_inference_port}"

    @property
    def grpc_management_target(self) -> str:
        return f"127.0.0.1:{self.grpc_management_port}"

    def start(self, timeout: float = 60) -> str:
        self.port = free_port()
        self.management_port = free_port()
        self.metrics_port = free_port()
        self.grpc_inference_port = free_port()
        self.grpc_management_port = free_port()
        props = {
            "inference_address": self.url,
            "management_address": self.management_url,
            "metrics_address": self.metrics_url,
            "grpc_inference_address": "127.0.0.1",
            "grpc_inference_port": str(self.grpc_inference_port),
            "grpc_management_address": "127.0.0.1",
            "grpc_management_port": str(self.grpc_management_port),
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
        read_fd, write_fd = os.pipe()
        env = {**os.environ, **self.env, "TRIOSERVE_READY_FD": str(write_fd)}
        with open(self.workdir / "server.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(LAUNCHER), str(config)],
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=log,
                pass_fds=(write_fd,),
            )
        os.close(write_fd)
        deadline = time.monotonic() + timeout
        report = b""
        try:
            while b"\n" not in report and time.monotonic() < deadline:
                ready, _, _ = select.select([read_fd], [], [], 0.1)
                if ready:
                    chunk = os.read(read_fd, 4096)
                    if not chunk:
                        break
                    report += chunk
        finally:
            os.close(read_fd)
        text = report.decode()
        if not text.startswith("READY"):
            self.kill()
            raise RuntimeError(f"server did not start: {text!r}\n{self.log}")
        return text
