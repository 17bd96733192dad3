"""Attached connections (trioserve/worker/attached.py): a WorkerLoop serving its primary
connection and more, in-process, over trio memory streams (a socket pair where the socket
matters), with a TorchServe handler and with an MLServer model."""

from __future__ import annotations

import logging
import os
import socket
import stat
import sys
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio
import trio.testing

from trioserve.core.frames import Frame, FrameDecoder, Kind, encode
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    Param,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_cancel,
    encode_load,
)
from trioserve.core.oip import Tensor
from trioserve.core.oip.transport import OIP_HEADER, STREAM_HEADER, reply_outputs, tensor_param
from trioserve.worker.attached import listen_socket
from trioserve.worker.loop import WorkerLoop
from trioserve.worker.mlserver import mlserver_shim
from trioserve.worker.torchserve import ts_shim

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "worker"

# A TorchServe handler that, in mode "wait", answers "started" and then waits (at most 10 s)
# for its request to be cancelled, telling the test through an event.
WAITING_HANDLER = """
import threading, time
from ts.handler_utils.utils import send_intermediate_predict_response

CANCELLED = threading.Event()

def handle(data, context):
    if data is None:
        return None
    if context.get_request_header(0, "mode") == "wait":
        ids = {0: context.get_request_id(0)}
        send_intermediate_predict_response(["started"], ids, "started", 200, context)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if context.is_cancelled(0):
                CANCELLED.set()
                return ["cancelled"]
            time.sleep(0.005)
        return ["never cancelled"]
    return [context.get_request_id(i) for i in range(len(data))]
"""

# An MLServer model: "wait" waits to be cancelled (telling the test), "n" streams n answers,
# anything else is answered with its values plus one.
MLSERVER_MODEL = """
import asyncio, threading
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceResponse, ResponseOutput

STARTED, CANCELLED = threading.Event(), threading.Event()

class Model(MLModel):
    async def predict(self, payload):
        first = payload.inputs[0]
        if first.name == "wait":
            STARTED.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                CANCELLED.set()
                raise
        out = NumpyCodec.encode_output("y", NumpyCodec.decode_input(first) + 1)
        return InferenceResponse(model_name=self.name, outputs=[out])

    async def predict_stream(self, payloads):
        async for payload in payloads:
            for i in range(int(payload.inputs[0].data[0])):
                yield InferenceResponse(model_name=self.name, outputs=[
                    ResponseOutput(name="i", shape=[1], datatype="INT64", data=[i])])
"""


class Exited(Exception):
    pass


def fake_exit(status: int, why: str) -> NoReturn:
    raise Exited(status, why)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    had_shim = ts_shim.installed()
    yield
    for name in ("fx_echo", "fx_attach_wait", "fx_attach_model"):
        sys.modules.pop(name, None)
    if not had_shim:
        ts_shim.uninstall()
    mlserver_shim.uninstall()


class Peer:
    """A serving process's end of one connection to the worker."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.frames: deque[Frame] = deque()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self) -> Frame:
        with trio.fail_after(10):
            while not self.frames:
                data = await self.stream.receive_some(1 << 16)
                assert data, "the worker closed the connection"
                self.frames.extend(self.decoder.feed(data))
        return self.frames.popleft()

    async def reply(self) -> BatchReply:
        """The next RESPONSE (METRICS frames skipped)."""
        while (frame := await self.recv()).kind is Kind.METRICS:
            pass
        assert frame.kind is Kind.RESPONSE, frame
        return decode_reply(frame)

    async def closed(self) -> None:
        """Wait until the worker closes the connection (frames before that are kept)."""
        with trio.fail_after(10):
            while data := await self.stream.receive_some(1 << 16):
                self.frames.extend(self.decoder.feed(data))

    async def load(self, spec: LoadSpec) -> Frame:
        await self.send(encode_load(spec))
        frame = await self.recv()
        assert frame.kind is Kind.LOAD_RESULT, frame
        return frame


class Worker:
    def __init__(self, loop: WorkerLoop, primary: Peer, nursery: trio.Nursery) -> None:
        self.loop = loop
        self.primary = primary
        self._nursery = nursery

    def attach(self) -> Peer:
        ours, theirs = trio.testing.memory_stream_pair()
        self._nursery.start_soon(self.loop.attach, theirs)
        return Peer(ours)

    def attach_socket(self) -> tuple[Peer, socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
        self._nursery.start_soon(self.loop.attach, stream)
        return Peer(trio.SocketStream(trio.socket.from_stdlib_socket(ours))), ours


@asynccontextmanager
async def worker() -> AsyncIterator[Worker]:
    ours, theirs = trio.testing.memory_stream_pair()
    loop = WorkerLoop(theirs, exit_fn=fake_exit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run)
        try:
            yield Worker(loop, Peer(ours), nursery)
        finally:
            nursery.cancel_scope.cancel()


def handler_spec(tmp_path: Path, handler: str = "fx_echo.py", **spec: Any) -> LoadSpec:
    if handler == "fx_attach_wait.py":
        (tmp_path / handler).write_text(WAITING_HANDLER)
        path = str(tmp_path / handler)
    else:
        path = str(FIXTURES / handler)
    return LoadSpec("m", "1.0", str(tmp_path), path, batch_size=4, **spec)


def batch(batch_id: int, *request_ids: str, **headers: str) -> bytes:
    items = [
        WorkItem(rid, list(headers.items()), [Param("body", b"1", "application/json")])
        for rid in request_ids
    ]
    return encode_batch(batch_id, items)


def answered_ids(reply: BatchReply) -> list[str]:
    return [r.request_id for r in reply.replies]


# -- a TorchServe handler ---------------------------------------------------------------------


async def test_load_on_an_attached_connection_waits_for_the_primary_load(tmp_path: Path) -> None:
    async with worker() as w:
        early = w.attach()
        await early.send(encode_load(handler_spec(tmp_path)))
        await early.send(encode(Kind.PING, {"n": 1}))
        pong = await early.recv()  # the LOAD is not answered: nothing is loaded yet
        assert (pong.kind, pong.meta) == (Kind.PONG, {"n": 1})
        assert (await w.primary.load(handler_spec(tmp_path))).meta["code"] == 200
        result = await early.recv()
        assert (result.kind, result.meta) == (Kind.LOAD_RESULT, {"code": 200, "message": "loaded"})
        late = w.attach()  # after the load: answered at once
        assert (await late.load(handler_spec(tmp_path))).meta == {"code": 200, "message": "loaded"}
        other = LoadSpec("other", "2.0", str(tmp_path), str(FIXTURES / "fx_echo.py"))
        refused = (await w.attach().load(other)).meta
        assert refused["code"] == 500 and "serves m version 1.0" in refused["message"]


async def test_a_load_after_the_primarys_shutdown_is_refused(tmp_path: Path) -> None:
    async with worker() as w:
        await w.primary.load(handler_spec(tmp_path, "fx_attach_wait.py"))
        await w.primary.send(batch(1, "busy", mode="wait"))  # keeps the worker up
        assert not (await w.primary.reply()).final
        await w.primary.send(encode(Kind.SHUTDOWN, {}))
        await w.primary.send(encode(Kind.PING, {"n": 1}))
        assert (await w.primary.recv()).kind is Kind.PONG  # the SHUTDOWN is handled
        late = w.attach()
        assert (await late.load(handler_spec(tmp_path, "fx_attach_wait.py"))).meta == {
            "code": 503,
            "message": "the worker is shutting down",
        }
        await w.primary.send(encode_cancel(["busy"]))
        assert (await w.primary.reply()).final


async def test_batches_are_answered_on_the_connection_they_came_from(tmp_path: Path) -> None:
    async with worker() as w:
        await w.primary.load(handler_spec(tmp_path))
        attached = w.attach()
        await attached.load(handler_spec(tmp_path))
        # The same batch id on both connections, while the first batch still runs.
        await w.primary.send(batch(1, "p1", mode="sleep", seconds="0.2"))
        await attached.send(batch(1, "a1", "a2"))
        await w.primary.send(batch(2, "p2"))
        mine = await attached.recv()
        assert mine.kind is Kind.RESPONSE
        assert (decode_reply(mine).batch_id, answered_ids(decode_reply(mine))) == (1, ["a1", "a2"])
        # The METRICS frame after it holds its own records, not the primary's batch's.
        metrics = await attached.recv()
        assert metrics.kind is Kind.METRICS
        counted = {m["request_id"] for m in metrics.meta["metrics"] if m["name"] == "EchoCount"}
        assert counted == {"a1,a2"}
        first, second = await w.primary.reply(), await w.primary.reply()
        assert [(first.batch_id, answered_ids(first)), (second.batch_id, answered_ids(second))] == [
            (1, ["p1"]),
            (2, ["p2"]),
        ]
        await attached.send(encode(Kind.PING, {"n": 7}))
        assert (await attached.recv()).meta == {"n": 7}


async def test_shutdown_detaches_after_the_batches_received(tmp_path: Path) -> None:
    async with worker() as w:
        await w.primary.load(handler_spec(tmp_path))
        attached = w.attach()
        await attached.load(handler_spec(tmp_path))
        await attached.send(batch(1, "slow", mode="sleep", seconds="0.2"))
        await attached.send(encode(Kind.SHUTDOWN, {}))
        await attached.send(batch(2, "late"))
        refused = await attached.reply()
        assert (refused.batch_id, refused.code) == (2, 503)
        done = await attached.reply()
        assert (done.batch_id, done.code, [bytes(r.body) for r in done.replies]) == (
            1,
            200,
            [b"slept"],
        )
        await attached.closed()
        await w.primary.send(batch(3, "still"))
        assert answered_ids(await w.primary.reply()) == ["still"]


async def test_end_of_an_attached_stream_cancels_its_requests_not_the_worker(
    tmp_path: Path,
) -> None:
    async with worker() as w:
        await w.primary.load(handler_spec(tmp_path, "fx_attach_wait.py"))
        attached = w.attach()
        await attached.load(handler_spec(tmp_path, "fx_attach_wait.py"))
        await attached.send(batch(1, "waiting", mode="wait"))
        await w.primary.send(batch(1, "queued"))  # behind it in the one handler thread
        started = await attached.reply()
        assert not started.final
        await attached.stream.aclose()
        # The handler sees the cancellation; its answer goes nowhere; the primary goes on.
        cancelled = sys.modules["fx_attach_wait"].CANCELLED
        assert await trio.to_thread.run_sync(cancelled.wait, 10)
        assert answered_ids(await w.primary.reply()) == ["queued"]


async def test_a_failed_write_ends_only_that_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve.worker")
    async with worker() as w:
        await w.primary.load(handler_spec(tmp_path))
        attached, sock = w.attach_socket()
        with sock:
            await attached.load(handler_spec(tmp_path))
            sock.shutdown(socket.SHUT_RD)  # its answers can no longer be written
            await attached.send(batch(1, "lost"))
            await w.primary.send(batch(1, "kept"))  # runs after it, in the one thread
            assert answered_ids(await w.primary.reply()) == ["kept"]
        assert "the server connection is gone (BrokenPipeError)" in caplog.text
        await w.primary.send(encode(Kind.PING, {"n": 2}))
        while (frame := await w.primary.recv()).kind is Kind.METRICS:
            pass
        assert (frame.kind, frame.meta) == (Kind.PONG, {"n": 2})


async def test_a_malformed_frame_ends_only_that_connection(tmp_path: Path) -> None:
    async with worker() as w:
        await w.primary.load(handler_spec(tmp_path))
        attached = w.attach()
        await attached.send(b"\x00\x00\x00\x08" + b"\xff" * 8)
        await attached.closed()
        await w.primary.send(batch(1, "fine"))
        assert answered_ids(await w.primary.reply()) == ["fine"]


# -- an MLServer model ------------------------------------------------------------------------


def model_spec(tmp_path: Path) -> LoadSpec:
    (tmp_path / "fx_attach_model.py").write_text(MLSERVER_MODEL)
    settings = {"name": "m", "parameters": {"version": "1.0"}}
    return LoadSpec("m", "1.0", str(tmp_path), "fx_attach_model.Model", model_settings=settings)


def oip_batch(batch_id: int, *requests: tuple[str, str, int], stream: bool = False) -> bytes:
    """A batch of OIP requests ``(request id, input name, value)``."""
    headers = [(OIP_HEADER, "1")] + ([(STREAM_HEADER, "out")] if stream else [])
    items = [
        WorkItem(rid, headers, [tensor_param(Tensor.from_values(name, "INT64", [1], [value]))])
        for rid, name, value in requests
    ]
    return encode_batch(batch_id, items)


def values(reply: BatchReply) -> list[tuple[str, list[Any]]]:
    return [(r.request_id, reply_outputs(r.headers, r.body)[0].to_list()) for r in reply.replies]


async def test_an_mlserver_model_answers_each_connection_its_own(tmp_path: Path) -> None:
    async with worker() as w:
        loaded = (await w.primary.load(model_spec(tmp_path))).meta
        # The runtime's own predict_stream is told to every connection's supervisor.
        assert (loaded["code"], loaded["streams"]) == (200, True)
        attached = w.attach()
        assert (await attached.load(model_spec(tmp_path))).meta["streams"] is True
        # The same batch ids on both, streams among them.
        await w.primary.send(oip_batch(1, ("p-s", "n", 3), stream=True))
        await attached.send(oip_batch(1, ("a-s", "n", 2), stream=True))
        await attached.send(oip_batch(2, ("a-u", "x", 41)))
        await w.primary.send(oip_batch(2, ("p-u", "x", 9)))
        got: dict[str, list[tuple[int, bool, list[Any]]]] = {}
        for peer, name, finals in ((w.primary, "primary", 2), (attached, "attached", 2)):
            seen = got.setdefault(name, [])
            while sum(final for _id, final, _v in seen) < finals:
                reply = await peer.reply()
                seen.append((reply.batch_id, reply.final, values(reply) if not reply.final else []))
        streamed = {
            name: [v for batch_id, final, vs in seen if batch_id == 1 and not final for v in vs]
            for name, seen in got.items()
        }
        assert streamed == {
            "primary": [("p-s", [0]), ("p-s", [1]), ("p-s", [2])],
            "attached": [("a-s", [0]), ("a-s", [1])],
        }
        for seen in got.values():
            assert sorted(batch_id for batch_id, final, _v in seen if final) == [1, 2]


async def test_an_mlserver_unary_answer_goes_to_its_connection(tmp_path: Path) -> None:
    async with worker() as w:
        await w.primary.load(model_spec(tmp_path))
        attached = w.attach()
        await attached.load(model_spec(tmp_path))
        await attached.send(oip_batch(5, ("a", "x", 41)))
        await w.primary.send(oip_batch(5, ("p", "x", 1)))
        assert values(await attached.reply()) == [("a", [42])]
        assert values(await w.primary.reply()) == [("p", [2])]


async def test_an_mlserver_request_of_a_connection_that_ends_is_cancelled(
    tmp_path: Path,
) -> None:
    async with worker() as w:
        await w.primary.load(model_spec(tmp_path))
        attached = w.attach()
        await attached.load(model_spec(tmp_path))
        await attached.send(oip_batch(1, ("waiting", "wait", 0)))
        model = sys.modules["fx_attach_model"]
        assert await trio.to_thread.run_sync(model.STARTED.wait, 10)
        await attached.stream.aclose()
        cancelled = model.CANCELLED
        assert await trio.to_thread.run_sync(cancelled.wait, 10)
        await w.primary.send(oip_batch(1, ("p", "x", 1)))
        assert values(await w.primary.reply()) == [("p", [2])]


async def test_cancel_on_an_attached_connection_reaches_the_model(tmp_path: Path) -> None:
    async with worker() as w:
        await w.primary.load(model_spec(tmp_path))
        attached = w.attach()
        await attached.load(model_spec(tmp_path))
        await attached.send(oip_batch(3, ("waiting", "wait", 0)))
        assert await trio.to_thread.run_sync(sys.modules["fx_attach_model"].STARTED.wait, 10)
        await attached.send(encode_cancel(["waiting"]))
        reply = await attached.reply()
        assert (reply.batch_id, reply.final, reply.replies[0].status) == (3, True, 499)
        assert sys.modules["fx_attach_model"].CANCELLED.is_set()


# -- the listening socket ---------------------------------------------------------------------


def test_the_listening_socket_replaces_a_stale_one_and_is_private(tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # its file stays behind, as a killed worker's does
    with listen_socket(path) as sock:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            accepted, _ = sock.accept()
            accepted.close()


def test_the_listening_socket_refuses_to_replace_anything_else(tmp_path: Path) -> None:
    path = tmp_path / "w.sock"
    path.write_text("not a socket")
    with pytest.raises(OSError, match="exists and is not a socket"):
        listen_socket(str(path))
    assert path.read_text() == "not a socket"
