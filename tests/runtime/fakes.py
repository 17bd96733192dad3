"""In-process fake workers that speak the real frame protocol over a socket pair."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from trioserve.core.frames import FrameDecoder, Kind
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    Reply,
    WorkItem,
    decode_batch,
    decode_cancel,
    encode_load_result,
    encode_reply,
)
from trioserve.core.model_settings import ModelSettings
from trioserve.runtime.launcher import Launched
from trioserve.runtime.model import ModelVersion, PoolSettings
from trioserve.runtime.supervisor import WorkerSettings

_pids = itertools.count(100_000)

Behaviour = Callable[["FakeProcess", int, list[WorkItem]], Awaitable[None]]


class FakeProcess:
    def __init__(self) -> None:
        self.pid: int | None = next(_pids)
        self.returncode: int | None = None
        self._exited = trio.Event()
        self.signals: list[str] = []
        self.stream: trio.SocketStream | None = None
        self.cancelled: list[str] = []
        self.scope = trio.CancelScope()

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self.scope.cancel()
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        self.signals.append("TERM")
        self.exit(-15)

    def kill(self) -> None:
        self.signals.append("KILL")
        self.exit(-9)

    async def send_reply(self, reply: BatchReply) -> None:
        assert self.stream is not None
        await self.stream.send_all(encode_reply(reply))


async def echo(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
    replies = [Reply(i.request_id, bytes(i.params[0].value)) for i in items]
    await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))


@dataclass
class FakeLauncher:
    """Launches fake workers; ``behaviour`` answers each batch, ``load`` each LOAD."""

    behaviour: Behaviour = echo
    load_delay: float = 0.0
    load_code: int = 200
    processes: list[FakeProcess] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)
    # each launch's python_path
    python_paths: list[tuple[Path, ...]] = field(default_factory=list)

    async def launch(
        self, name: str, cwd: Path, nursery: trio.Nursery, *, python_path: Sequence[Path] = ()
    ) -> Launched:
        self.python_paths.append(tuple(python_path))
        server_end, worker_end = trio.socket.socketpair()
        proc = FakeProcess()
        proc.stream = trio.SocketStream(worker_end)
        self.processes.append(proc)
        nursery.start_soon(self._serve, proc)
        return Launched(trio.SocketStream(server_end), proc)

    async def _serve(self, proc: FakeProcess) -> None:
        assert proc.stream is not None
        try:
            await self._serve_frames(proc)
        finally:
            # The "process" ends: close its end so the server sees EOF.
            proc.stream.socket.close()
            proc.exit(0 if proc.returncode is None else proc.returncode)

    async def _serve_frames(self, proc: FakeProcess) -> None:
        assert proc.stream is not None
        decoder = FrameDecoder()
        with proc.scope:
            try:
                async with trio.open_nursery() as nursery:
                    while True:
                        data = await proc.stream.receive_some(65536)
                        if not data:
                            break
                        for frame in decoder.feed(data):
                            if frame.kind is Kind.LOAD:
                                await trio.sleep(self.load_delay)
                                await proc.stream.send_all(
                                    encode_load_result(self.load_code, "fake load")
                                )
                                if self.load_code != 200:
                                    proc.exit(1)
                                    return
                            elif frame.kind is Kind.BATCH:
                                batch_id, items = decode_batch(frame)
                                self.batches.append([i.request_id for i in items])
                                nursery.start_soon(self.behaviour, proc, batch_id, items)
                            elif frame.kind is Kind.CANCEL:
                                proc.cancelled.extend(decode_cancel(frame))
                            elif frame.kind is Kind.SHUTDOWN:
                                proc.exit(0)
                                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


class OneModelManager:
    """What the inference service needs of a ModelManager, over one ModelVersion."""

    def __init__(self, model: ModelVersion) -> None:
        self.model = model

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        return self.model

    def healthy(self) -> bool:
        return self.model.healthy


def model_version(launcher: FakeLauncher) -> ModelVersion:
    settings = ModelSettings(
        name="m",
        version="1.0",
        url="m.mar",
        handler="h.py",
        runtime="python",
        batch_size=1,
        max_batch_delay=100,
        min_workers=1,
        max_workers=1,
        response_timeout=30,
        startup_timeout=5,
        job_queue_size=10,
        loaded_at_startup=False,
    )
    ids = itertools.count(9000)
    pool = PoolSettings(
        worker=WorkerSettings(
            load=LoadSpec("m", "1.0", "/nonexistent", "h.py"),
            cwd=Path("/"),
            response_timeout=30,
            startup_timeout=5,
            stop_grace=0.5,
            max_frame=1 << 20,
        ),
        next_worker_id=lambda: next(ids),
    )
    return ModelVersion(settings, pool, launcher)


async def lifespan(receive: Any, send: Any) -> None:
    """Answer an ASGI lifespan scope's startup and shutdown (for test apps)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def wait_for(check: Callable[[], bool], timeout: float = 10) -> None:
    """Poll ``check`` until it holds (at most ``timeout`` seconds)."""
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.01)
