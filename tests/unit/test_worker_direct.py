"""Batches go from the frame reader straight to the handler thread, which writes the answers.

* ``HandlerThread.submit`` (fire and forget, in order with awaited calls);
* ``write_all`` (the handler thread's write to a full non-blocking socket);
* ``WorkerLoop`` over a real socket: batches queued during the load and sent after it are all
  answered in order, a PING is answered between them, and SHUTDOWN waits for the last one.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from pathlib import Path
from typing import NoReturn

import pytest
import trio

from trioserve.core.frames import Kind, encode
from trioserve.core.messages import (
    LoadSpec,
    Param,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_load,
)
from trioserve.worker.connection import write_all
from trioserve.worker.handler_thread import HandlerThread

from .worker_socket import socket_worker

# -- HandlerThread.submit -----------------------------------------------------------------------


async def test_submit_runs_in_order_with_awaited_calls() -> None:
    thread = HandlerThread()
    seen: list[int] = []
    try:
        for i in range(5):
            thread.submit(lambda i=i: seen.append(i))
        assert (await thread.run(lambda: list(seen))).unwrap() == [0, 1, 2, 3, 4]
    finally:
        thread.close()


async def test_submit_logs_an_escaped_error(caplog: pytest.LogCaptureFixture) -> None:
    thread = HandlerThread()

    def boom() -> None:
        raise KeyError("escaped")

    try:
        with caplog.at_level(logging.ERROR, logger="trioserve.worker"):
            thread.submit(boom)
            assert (await thread.run(lambda: 7)).unwrap() == 7
        assert "a call in the handler thread failed" in caplog.text
    finally:
        thread.close()


async def test_submit_after_close_fails() -> None:
    thread = HandlerThread()
    thread.close()
    with pytest.raises(RuntimeError, match="closed"):
        thread.submit(lambda: None)


# -- write_all ----------------------------------------------------------------------------------


def test_write_all_waits_for_room() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ours.setblocking(False)
    data = bytes(range(256)) * 2000  # 512 kB: far more than the socket takes at once
    got = bytearray()

    def read() -> None:
        while len(got) < len(data):
            got.extend(theirs.recv(1 << 16))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        write_all(ours.fileno(), data)
        reader.join(10)
        assert bytes(got) == data
    finally:
        ours.close()
        theirs.close()


# -- the worker over a socket -------------------------------------------------------------------

SLOW_ECHO = """
import time

def handle(data, context):
    if data is None:
        return None
    time.sleep(0.01)
    return [bytes(row["body"]) for row in data]
"""


class Exited(Exception):
    pass


def fake_exit(status: int, why: str) -> NoReturn:
    raise Exited(status, why)


def one_request_batch(batch_id: int) -> bytes:
    item = WorkItem(f"r{batch_id}", [], [Param("body", b"%d" % batch_id, None)])
    return encode_batch(batch_id, [item])


async def test_batches_during_and_after_load_answered_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow_echo.py").write_text(SLOW_ECHO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sw = socket_worker(fake_exit)
    worker, peer, next_frame = sw.worker, sw.peer, sw.next_frame
    status: list[int] = []

    async def serve() -> None:
        status.append(await worker.run())

    spec = LoadSpec("m", "1", str(tmp_path), "slow_echo", batch_size=1)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            # Three batches ride with the LOAD (queued until it is done), three follow it,
            # a PING comes in while they run, and SHUTDOWN right behind them.
            await peer.send_all(encode_load(spec) + b"".join(map(one_request_batch, (1, 2, 3))))
            assert (await next_frame()).kind is Kind.LOAD_RESULT
            await peer.send_all(b"".join(map(one_request_batch, (4, 5, 6))))
            await peer.send_all(encode(Kind.PING, {"n": 9}) + encode(Kind.SHUTDOWN, {}))
            answered: list[int] = []
            pongs = 0
            while len(answered) < 6 or pongs < 1:
                frame = await next_frame()
                if frame.kind is Kind.PONG:
                    pongs += 1
                elif frame.kind is Kind.RESPONSE:
                    reply = decode_reply(frame)
                    assert (reply.code, bytes(reply.replies[0].body)) == (
                        200,
                        b"%d" % reply.batch_id,
                    )
                    answered.append(reply.batch_id)
    assert answered == [1, 2, 3, 4, 5, 6]
    assert pongs == 1
    assert status == [0]
    await sw.aclose()


async def test_an_answer_that_cannot_be_sent_ends_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing else would answer the batch: the worker exits (status 1), so the server fails
    the batch at once instead of waiting for the response timeout."""
    import trioserve.worker.responses as worker_responses  # every RESPONSE frame is encoded there

    (tmp_path / "slow_echo.py").write_text(SLOW_ECHO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    real_encode = worker_responses.encode_reply

    def encode_reply(reply):  # type: ignore[no-untyped-def]
        if reply.batch_id == 2:
            raise ValueError("cannot encode")
        return real_encode(reply)

    monkeypatch.setattr(worker_responses, "encode_reply", encode_reply)
    exits: list[tuple[int, str]] = []

    def recording_exit(status: int, why: str) -> NoReturn:
        exits.append((status, why))
        raise Exited(status, why)

    sw = socket_worker(recording_exit)
    worker, peer, next_frame = sw.worker, sw.peer, sw.next_frame

    spec = LoadSpec("m", "1", str(tmp_path), "slow_echo", batch_size=1)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await peer.send_all(encode_load(spec))
            assert (await next_frame()).kind is Kind.LOAD_RESULT
            await peer.send_all(b"".join(map(one_request_batch, (1, 2, 3))))
            answered = []
            while len(answered) < 2:
                frame = await next_frame()
                if frame.kind is Kind.RESPONSE:
                    answered.append(decode_reply(frame).batch_id)
            await peer.send_all(encode(Kind.SHUTDOWN, {}))
    assert answered == [1, 3]
    assert exits == [(1, "batch 2: its answer could not be sent")]
    await sw.aclose()
