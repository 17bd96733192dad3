"""Helpers for the gRPC end-to-end tests: stubs generated at test time, a model store, and
servers started with their gRPC listeners."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .grpc_server import GrpcServer
from .server import HANDLERS, archive, wait_gone

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"
GRPC_HANDLERS = Path(__file__).parent / "grpc_handlers"


@dataclass(frozen=True)
class GrpcioStubs:
    """The modules grpcio-tools generates from proto/ (plus the well-known Empty)."""

    inference: ModuleType  # inference_pb2
    inference_grpc: ModuleType  # inference_pb2_grpc
    management: ModuleType  # management_pb2
    management_grpc: ModuleType  # management_pb2_grpc
    empty: ModuleType  # google.protobuf.empty_pb2


def googleapis_dir() -> str:
    """The folder holding google/rpc/status.proto (googleapis-common-protos)."""
    import google.rpc

    for path in google.rpc.__path__:
        if os.path.exists(os.path.join(path, "status.proto")):
            return os.path.dirname(os.path.dirname(path))
    raise RuntimeError("googleapis-common-protos is not installed")


def grpcio_stubs(out: Path) -> GrpcioStubs:
    """Compile proto/ with grpcio-tools into ``out`` and import the result.

    protobuf's descriptor pool accepts each .proto once per process, so modules already
    imported (by another test module) are reused.
    """
    names = ("inference_pb2", "inference_pb2_grpc", "management_pb2", "management_pb2_grpc")
    if not all(name in sys.modules for name in names):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTO_DIR}",
                f"-I{googleapis_dir()}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                "inference.proto",
                "management.proto",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        sys.path.insert(0, str(out))
        try:
            for name in names:
                importlib.import_module(name)
        finally:
            sys.path.remove(str(out))
    from google.protobuf import empty_pb2

    return GrpcioStubs(*(sys.modules[name] for name in names), empty_pb2)


def build_store(path: Path) -> Path:
    """The archives the gRPC tests serve (built with the real archiver command)."""
    archive(path, "control", "control_handler.py", "-c", str(HANDLERS / "control-config.yaml"))
    archive(path, "gstream", str(GRPC_HANDLERS / "grpc_stream_handler.py"))
    archive(path, "echo", str(REPO / "handlers" / "echo" / "echo_handler.py"))
    archive(path, "multi", "control_handler.py", version="1.0", file="multi-1.mar")
    archive(path, "multi", "control_handler.py", version="2.0", file="multi-2.mar")
    return path


@contextmanager
def running_server(
    workdir: Path,
    store: Path,
    models: str,
    *,
    tokens: bool = False,
    properties: dict[str, str] | None = None,
) -> Iterator[GrpcServer]:
    """A started server; stopped afterwards, and no worker may outlive it."""
    workdir.mkdir(parents=True)
    markers = workdir / "markers"
    markers.mkdir()
    server = GrpcServer(
        workdir,
        store,
        models,
        properties=properties or {},
        env={"TRIOSERVE_TEST_MARKERS": str(markers)},
        tokens=tokens,
    )
    server.start()
    try:
        yield server
    finally:
        pids = server.child_pids() if server.process and server.process.poll() is None else []
        status = server.stop()
        server.kill()
        assert wait_gone(pids) == [], f"child processes left behind:\n{server.log}"
        assert status == 0, f"server exited with {status}:\n{server.log}"


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def markers(server: GrpcServer, prefix: str) -> set[str]:
    return {p.name for p in (server.workdir / "markers").glob(f"{prefix}-*")}
