from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .server import Server, archive, wait_gone

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store with the test archives, built by the real archiver command."""
    path = tmp_path_factory.mktemp("store")
    handlers = Path(__file__).parent / "handlers"
    archive(path, "control", "control_handler.py", "-c", str(handlers / "control-config.yaml"))
    archive(path, "control2", "control_handler.py")
    archive(path, "tsstyle", "ts_style_handler.py", "-c", str(handlers / "ts-config.yaml"))
    archive(path, "slowload", "slow_load_handler.py", "-c", str(handlers / "slow-config.yaml"))
    archive(path, "broken", "broken_handler.py")
    archive(path, "echo", str(REPO / "handlers" / "echo" / "echo_handler.py"))
    archive(path, "batch", "control_handler.py", "-c", str(handlers / "batch-config.yaml"))
    archive(path, "tensor", "tensor_handler.py", "-c", str(handlers / "tensor-config.yaml"))
    archive(path, "stateful", "stateful_handler.py", "-c", str(handlers / "stateful-config.yaml"))
    streaming_sums = str(REPO / "handlers" / "stateful_stream" / "stream_sum_handler.py")
    archive(path, "streamsum", streaming_sums, "-c", str(handlers / "stream-config.yaml"))
    archive(path, "streamsum1", streaming_sums, "-c", str(handlers / "stream1-config.yaml"))
    archive(path, "tscancel", "ts_cancel_handler.py", "-c", str(handlers / "tscancel-config.yaml"))
    archive(path, "oip", "oip_handler.py", "-c", str(handlers / "oip-config.yaml"))
    archive(path, "multi", "control_handler.py", version="1.0", file="multi-1.mar")
    archive(path, "multi", "control_handler.py", version="2.0", file="multi-2.mar")
    return path


@pytest.fixture
def make_server(tmp_path: Path, store: Path) -> Iterator[object]:
    """Start servers on free ports; every one is stopped (and checked) afterwards."""
    servers: list[Server] = []

    def make(models: str = "control=control.mar", **kwargs: object) -> Server:
        workdir = tmp_path / f"server{len(servers)}"
        workdir.mkdir()
        (workdir / "markers").mkdir()
        env = {"TRIOSERVE_TEST_MARKERS": str(workdir / "markers")}
        env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
        server = Server(workdir, store, models, env=env, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        pids = server.child_pids() if server.process and server.process.poll() is None else []
        server.stop()
        server.kill()
        assert wait_gone(pids) == [], f"child processes left behind:\n{server.log}"
