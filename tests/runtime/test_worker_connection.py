"""WorkerConnection over a real socketpair: its direct reads and writes (no trio checkpoint
when the socket is ready) must keep frames whole and in order, fall back to waiting when the
socket is full or empty, and still let other tasks run under a flood."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.lowlevel

from trioserve.core.frames import Kind, encode
from trioserve.runtime import connection
from trioserve.runtime.connection import WorkerConnection

MAX_FRAME = 64 << 20


def socket_pair() -> tuple[WorkerConnection, WorkerConnection]:
    a, b = socket.socketpair()
    for sock in (a, b):
        sock.setblocking(False)
    return (
        WorkerConnection(trio.SocketStream(trio.socket.from_stdlib_socket(a)), MAX_FRAME),
        WorkerConnection(trio.SocketStream(trio.socket.from_stdlib_socket(b)), MAX_FRAME),
    )


async def test_frames_arrive_whole_and_in_order() -> None:
    left, right = socket_pair()
    for n in range(50):
        await left.send(encode(Kind.METRICS, {"n": n}, [bytes([n]) * (n * 37)]))
    for n in range(50):
        frame = await right.receive()
        assert frame is not None
        assert frame.meta == {"n": n}
        assert bytes(frame.blobs[0]) == bytes([n]) * (n * 37)
    await left.aclose()
    assert await right.receive() is None  # EOF
    await right.aclose()


async def test_a_frame_larger_than_the_socket_buffer_is_never_interleaved() -> None:
    left, right = socket_pair()
    big = encode(Kind.BATCH, {"big": True}, [b"\xab" * (8 << 20)])
    small = [encode(Kind.CANCEL, {"n": n}) for n in range(20)]
    got = []

    async def read_all() -> None:
        while len(got) < 1 + len(small):
            frame = await right.receive()
            assert frame is not None
            got.append(frame)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)

        async def send_small() -> None:
            for frame in small:
                await left.send(frame)

        async def send_big() -> None:
            await left.send(big)

        nursery.start_soon(send_big)
        nursery.start_soon(send_small)
    bigs = [f for f in got if f.kind is Kind.BATCH]
    assert len(bigs) == 1 and bytes(bigs[0].blobs[0]) == b"\xab" * (8 << 20)
    assert [f.meta["n"] for f in got if f.kind is Kind.CANCEL] == list(range(20))
    await left.aclose()
    await right.aclose()


async def test_a_flood_of_frames_still_lets_other_tasks_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small reads, and everything written before reading starts: every read finds data at
    # once, so only the receiver's own periodic checkpoint lets the ticker run.
    monkeypatch.setattr(connection, "_READ_SIZE", 1024)
    left, right = socket_pair()
    frame = encode(Kind.METRICS, {"pad": "x" * 900})
    total = 60  # about 57 KB: it fits in the socket buffer, so no write waits
    with trio.fail_after(5):
        for _ in range(total):
            await left.send(frame)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        for _ in range(total):
            assert await right.receive() is not None
        ticks_when_done = ticks
        nursery.cancel_scope.cancel()
    assert ticks_when_done >= 2  # 57 reads: a checkpoint every 16
    await left.aclose()
    await right.aclose()


async def test_receive_after_close_is_an_error() -> None:
    left, right = socket_pair()
    await right.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await right.receive()
    with pytest.raises(trio.ClosedResourceError):
        await right.send(encode(Kind.PING, {}))
    await left.aclose()


async def test_send_to_a_closed_peer_is_a_broken_resource() -> None:
    left, right = socket_pair()
    await right.aclose()
    # The peer's end is closed: the write fails at once (EPIPE), no frame is buffered.
    with pytest.raises(trio.BrokenResourceError):
        await left.send(encode(Kind.PING, {}))
    await left.aclose()
