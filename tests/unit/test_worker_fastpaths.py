"""The worker's fast paths give exactly what the plain code they replace gives.

* ``codec.dumps_indent2`` vs ``json.dumps(value, indent=2)`` (response bodies);
* ``wire.decode_batch`` vs ``core.messages.decode_batch`` (results and errors);
* ``HandlerThread`` (one dedicated thread, outcomes, cancellation of the waiting task);
* ``CancelBook`` counting;
* ``WorkerLoop`` over a real socket (the direct write and the reused read buffer).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.core import messages
from trioserve.core.frames import Frame, FrameError, Kind, decode, encode
from trioserve.core.messages import (
    LoadSpec,
    Param,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_load,
)
from trioserve.worker import wire
from trioserve.worker.cancellation import CancelBook
from trioserve.worker.handler_thread import THREAD_NAME, HandlerThread
from trioserve.worker.torchserve.codec import MAX_FAST_DEPTH, dumps_indent2, encode_output

from .worker_socket import socket_worker

# -- dumps_indent2 ------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_dumps_indent2_matches_json(value: Any) -> None:
    assert dumps_indent2(value) == json.dumps(value, indent=2)


class Number(int):
    pass


class Text(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"class": 3, "probability": 0.25},
        {"a": {"b": [1, 2.5, None, True, False, "\u00e9\n\"x\""]}, "c": [], "d": {}},
        [[0.1, 0.2], [float("nan"), float("inf"), -float("inf")], ()],
        {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},  # json.dumps'
        {Text("k"): Number(7)},  # subclasses: left to json.dumps
        [Number(3), Text("t")],
        {"x": 10**30, "y": -0.0, "z": 1e-300},
        "plain", 12, 1.5, None, True,
    ],
)  # fmt: skip
def test_dumps_indent2_examples(value: Any) -> None:
    assert dumps_indent2(value) == json.dumps(value, indent=2)
    if not isinstance(value, str):  # a str answer is sent as it is
        assert encode_output(value) == json.dumps(value, indent=2).encode("utf-8")


def test_dumps_indent2_deep_and_circular() -> None:
    deep: Any = 1
    for _ in range(MAX_FAST_DEPTH + 5):
        deep = [deep]
    assert dumps_indent2(deep) == json.dumps(deep, indent=2)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indent2(loop)
    with pytest.raises(TypeError):
        dumps_indent2({"x": object()})
    with pytest.raises(TypeError):
        dumps_indent2({("tuple", "key"): 1})


# -- wire.decode_batch --------------------------------------------------------------------------


def _items(count: int) -> list[WorkItem]:
    return [
        WorkItem(
            f"id-{i}",
            [("host", "h"), ("Content-Type", "application/octet-stream"), ("x", str(i))],
            [Param("body", bytes([i]) * 8, "application/octet-stream"), Param("extra", b"e")],
        )
        for i in range(count)
    ]


def _same(frame: Frame) -> None:
    try:
        expected: Any = messages.decode_batch(frame)
    except FrameError as exc:
        expected = exc
    try:
        got: Any = wire.decode_batch(frame)
    except FrameError as exc:
        got = exc
    if isinstance(expected, FrameError):
        assert isinstance(got, FrameError)
        assert str(got) == str(expected)
        return
    assert got == expected
    for item_got, item_expected in zip(got[1], expected[1], strict=True):
        for p_got, p_expected in zip(item_got.params, item_expected.params, strict=True):
            assert bytes(p_got.value) == bytes(p_expected.value)


def test_wire_decode_batch_matches_core() -> None:
    frame = decode(encode_batch(7, _items(16)))
    _same(frame)
    assert wire.decode_batch(frame)[0] == 7
    _same(decode(encode_batch(8, [])))


def _batch_meta(**request: Any) -> dict[str, Any]:
    req = {"id": "r", "headers": [["a", "b"]], "params": [{"name": "body", "ct": None, "blob": 0}]}
    req.update(request)
    return {"batch_id": 1, "requests": [req]}


@pytest.mark.parametrize(
    "meta",
    [
        {"batch_id": True, "requests": []},
        {"batch_id": "1", "requests": []},
        {"requests": []},
        {"batch_id": 1, "requests": {}},
        {"batch_id": 1, "requests": ["x"]},
        _batch_meta(headers={"a": "b"}),
        _batch_meta(headers=[["a"]]),
        _batch_meta(headers=[["a", 1]]),
        _batch_meta(headers=[("a", "b", "c")]),
        _batch_meta(params={}),
        _batch_meta(params=["x"]),
        _batch_meta(params=[{"name": "b", "ct": 5, "blob": 0}]),
        _batch_meta(params=[{"name": 5, "ct": None, "blob": 0}]),
        _batch_meta(params=[{"name": "b", "ct": None, "blob": 3}]),
        _batch_meta(params=[{"name": "b", "ct": None, "blob": -1}]),
        _batch_meta(params=[{"name": "b", "ct": None, "blob": "0"}]),
        _batch_meta(params=[{"name": "b", "ct": None, "blob": True}]),  # core accepts: blob 1
        _batch_meta(params=[{"name": "b", "ct": None}]),
        _batch_meta(id=5),
        _batch_meta(id=None),
        {"batch_id": 1, "requests": [{"id": "only"}]},  # headers and params default to []
    ],
)
def test_wire_decode_batch_odd_frames(meta: dict[str, Any]) -> None:
    frame = decode(encode(Kind.BATCH, meta, [b"zero", b"one"]))
    _same(frame)


def test_wire_decode_batch_wrong_kind() -> None:
    _same(decode(encode(Kind.PING, {"batch_id": 1, "requests": []})))


# -- HandlerThread ------------------------------------------------------------------------------


async def test_handler_thread_runs_in_one_named_thread() -> None:
    thread = HandlerThread()
    try:
        seen = [(await thread.run(lambda: threading.current_thread())).unwrap() for _ in range(3)]
        assert len({id(t) for t in seen}) == 1
        assert seen[0].name == THREAD_NAME
        assert seen[0] is not threading.current_thread()

        def boom() -> None:
            raise KeyError("x")

        result = await thread.run(boom)
        with pytest.raises(KeyError):
            result.unwrap()
    finally:
        thread.close()


async def test_handler_thread_cancelled_wait_drops_the_outcome() -> None:
    thread = HandlerThread()
    release = threading.Event()
    try:
        with trio.move_on_after(0.05):
            await thread.run(lambda: release.wait(10))
        release.set()
        assert (await thread.run(lambda: 42)).unwrap() == 42
    finally:
        thread.close()


async def test_handler_thread_closed() -> None:
    thread = HandlerThread()
    assert (await thread.run(lambda: 1)).unwrap() == 1
    thread.close()
    with pytest.raises(RuntimeError, match="closed"):
        await thread.run(lambda: 2)


# -- CancelBook ---------------------------------------------------------------------------------


def test_cancel_book_counts_batches() -> None:
    book = CancelBook()
    assert book.cancel(["a"]) == []
    book.track(["a", "b"])
    book.track(["a"])
    assert book.cancel(["a", "zzz"]) == ["a"]
    assert book.is_cancelled("a") and not book.is_cancelled("b")
    book.release(["a"])
    assert book.is_cancelled("a")  # a second batch still holds it
    book.release(["a", "b"])
    assert not book.is_cancelled("a")
    assert book.cancel(["a", "b"]) == []


# -- the worker over a real socket ----------------------------------------------------------------

ECHO = """
def handle(data, context):
    if data is None:
        return None
    context.metrics.add_counter("Seen", len(data))
    return [bytes(row["body"]) for row in data]
"""


class Exited(Exception):
    pass


def fake_exit(status: int, why: str) -> NoReturn:
    raise Exited(status, why)


async def test_worker_over_a_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames in and out over a socketpair: the direct write (with an answer far larger than
    the socket takes at once) and the reused read buffer (a frame split across reads)."""
    (tmp_path / "sock_echo.py").write_text(ECHO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sw = socket_worker(fake_exit, send_buffer=4096)
    worker, peer, next_frame = sw.worker, sw.peer, sw.next_frame
    status: list[int] = []

    async def serve() -> None:
        status.append(await worker.run())

    spec = LoadSpec("m", "1", str(tmp_path), "sock_echo", batch_size=4)
    big = bytes(range(256)) * 1200  # 300 kB
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await peer.send_all(encode_load(spec))
            assert (await next_frame()).meta == {"code": 200, "message": "loaded"}
            batch = encode_batch(5, [
                WorkItem("a", [], [Param("body", big, "application/octet-stream")]),
                WorkItem("b", [], [Param("body", b"yy", None)]),
            ])  # fmt: skip
            for start in range(0, len(batch), 1000):  # a frame split across many reads
                await peer.send_all(batch[start : start + 1000])
            reply = decode_reply(await next_frame())
            assert (reply.batch_id, reply.code, reply.final) == (5, 200, True)
            assert [bytes(r.body) for r in reply.replies] == [big, b"yy"]
            metrics = await next_frame()
            assert metrics.kind is Kind.METRICS
            assert [m["name"] for m in metrics.meta["metrics"]] == ["Seen", "PredictionTime"]
            await peer.send_all(encode(Kind.PING, {"n": 3}))
            pong = await next_frame()
            assert (pong.kind, pong.meta) == (Kind.PONG, {"n": 3})
            await peer.send_all(encode(Kind.SHUTDOWN, {}))
    assert status == [0]
    await sw.aclose()
