"""The worker never sends what the server would refuse, and never dies of a request: answers
over ``max_response_size`` are answered 413, frames still too large fail their replies,
metrics that do not fit are dropped, a v1 body over the worker's limits is refused, and one
request's many rows make one request id in a metric record. In-process, over a memory
stream; the test reads frames with the server's own limit, so a frame the server would refuse
(and restart the worker for) fails the test."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from trioserve.core.frames import FrameDecoder, Kind, encode
from trioserve.core.kserve import V1_HEADER
from trioserve.core.limits import RequestLimits, response_frame_limit
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    Param,
    WorkItem,
    decode_reply,
    encode_batch,
    encode_load,
)
from trioserve.worker.torchserve import ts_shim

from .test_worker_loop import FIXTURES, Session, worker_session


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    had_shim = ts_shim.installed()
    yield
    for name in ("fx_big", "fx_echo"):
        sys.modules.pop(name, None)
    if not had_shim:
        ts_shim.uninstall()


async def load(
    s: Session,
    handler: str,
    *,
    batch_size: int = 1,
    max_response_size: int = 1000,
    limits: RequestLimits | None = None,
) -> None:
    """Load ``handler``; from now on frames are read with the server's limit for them."""
    spec = LoadSpec(
        "m",
        "1.0",
        str(FIXTURES),
        str(FIXTURES / handler),
        batch_size=batch_size,
        max_response_size=max_response_size,
        request_limits=limits or RequestLimits(),
    )
    s.decoder = FrameDecoder(response_frame_limit(max_response_size, batch_size))
    await s.send(encode_load(spec))
    assert (await s.recv()).meta == {"code": 200, "message": "loaded"}


def sized(batch_id: int, *sizes: int, **headers: str) -> bytes:
    items = [
        WorkItem(f"b{batch_id}-r{i}", [("size", str(size)), *headers.items()], [Param("d", b"")])
        for i, size in enumerate(sizes)
    ]
    return encode_batch(batch_id, items)


async def answer(s: Session) -> BatchReply:
    """The next RESPONSE frame, past any METRICS frame."""
    while (frame := await s.recv()).kind is Kind.METRICS:
        pass
    return decode_reply(frame)


async def next_reply_and_pong(s: Session) -> None:
    """Whatever METRICS frame comes, the worker still answers a PING after it."""
    await s.send(encode(Kind.PING, {"n": 7}))
    while (frame := await s.recv()).kind is Kind.METRICS:
        pass
    assert (frame.kind, frame.meta) == (Kind.PONG, {"n": 7})


async def test_an_answer_over_max_response_size_is_a_413_and_the_worker_keeps_serving() -> None:
    async with worker_session() as s:
        await load(s, "fx_big.py", batch_size=2)
        await s.send(sized(1, 1001, 1000))
        reply = await answer(s)
        (big, fits) = reply.replies
        assert (reply.code, big.status, fits.status) == (200, 413, 200)
        assert bytes(fits.body) == b"x" * 1000
        message = bytes(big.body).decode()
        assert "1001 bytes" in message and "max_response_size" in message and "1000" in message
        # far over the frame limit too (2 MiB > 2 * 1000 + 1 MiB): still one small 413
        await s.send(sized(2, 2 << 20))
        reply = await answer(s)
        assert [r.status for r in reply.replies] == [413]
        await next_reply_and_pong(s)
        await s.send(sized(3, 5))
        reply = await answer(s)
        assert [(r.status, bytes(r.body)) for r in reply.replies] == [(200, b"xxxxx")]
        assert s.exited is None


async def test_a_frame_too_large_for_its_headers_fails_its_replies() -> None:
    async with worker_session() as s:
        await load(s, "fx_big.py")
        await s.send(sized(1, 10, mode="header", header=str(2 << 20)))
        reply = await answer(s)
        assert [r.status for r in reply.replies] == [500]
        assert "more than the server reads" in bytes(reply.replies[0].body).decode()
        await next_reply_and_pong(s)
        await s.send(sized(2, 3))
        assert [bytes(r.body) for r in (await answer(s)).replies] == [b"xxx"]


async def test_an_intermediate_answer_over_the_limit_is_a_413() -> None:
    async with worker_session() as s:
        await load(s, "fx_big.py")
        await s.send(sized(1, 2 << 20, mode="stream"))
        first = await answer(s)
        assert not first.final and [r.status for r in first.replies] == [413]
        last = await answer(s)
        assert last.final and [bytes(r.body) for r in last.replies] == [b"done"]


async def test_metric_records_that_do_not_fit_a_frame_are_dropped() -> None:
    async with worker_session() as s:
        await load(s, "fx_big.py")
        await s.send(sized(1, 1, mode="metrics", count="20000"))
        assert (await answer(s)).code == 200
        await s.send(encode(Kind.PING, {"n": 1}))
        assert (await s.recv()).kind is Kind.PONG  # no METRICS frame before it
        await s.send(sized(2, 1, mode="metrics", count="3"))
        assert (await answer(s)).code == 200
        metrics = await s.recv()
        assert metrics.kind is Kind.METRICS
        assert {m["name"] for m in metrics.meta["metrics"]} >= {"Count0", "Count2"}


def v1(batch_id: int, instances: int) -> bytes:
    body = json.dumps({"instances": [{"v": n} for n in range(instances)]}).encode()
    headers = [("explain", "False"), (V1_HEADER, "1")]
    item = WorkItem(f"v1-{batch_id}", headers, [Param("body", body, "application/json")])
    return encode_batch(batch_id, [item])


async def test_a_v1_body_over_the_worker_s_instance_limit_is_refused() -> None:
    async with worker_session() as s:
        await load(s, "fx_echo.py", limits=RequestLimits(max_request_instances=4))
        await s.send(v1(1, 5))
        refused = await answer(s)
        assert refused.code == 413
        assert "5 instances" in refused.message and "max_request_instances" in refused.message
        await next_reply_and_pong(s)
        await s.send(v1(2, 4))
        reply = await answer(s)
        assert (reply.code, [r.status for r in reply.replies]) == (200, [200])
        assert len(json.loads(bytes(reply.replies[0].body))["predictions"]) == 4


async def test_one_request_s_rows_name_its_id_once_in_a_metric_record() -> None:
    """262,000 v1 instances once made a record naming the request id 262,000 times (9.7 MB):
    a METRICS frame the server refused, restarting the worker."""
    async with worker_session() as s:
        await load(s, "fx_echo.py", max_response_size=1 << 20)
        await s.send(v1(1, 1000))
        assert (await answer(s)).code == 200
        metrics = await s.recv()
        assert metrics.kind is Kind.METRICS
        assert {m["request_id"] for m in metrics.meta["metrics"]} == {"v1-1"}


def test_the_worker_keeps_to_the_frame_limit_the_server_sends() -> None:
    """The server reads frames sized for its batch capacity (twice batchSize for a stateful
    continuous-batching model) and says so in LOAD: the worker uses that number rather than
    working one out from batch_size, and a spec without it falls back to batch_size."""
    from trioserve.worker.responses import FrameLimit

    doubled = response_frame_limit(1000, 2)
    spec = LoadSpec(
        "m", "1.0", "/tmp", "h", batch_size=1, max_response_size=1000, max_response_frame=doubled
    )
    back = LoadSpec.from_meta(json.loads(json.dumps(spec.to_meta())))
    assert back.max_response_frame == doubled
    assert FrameLimit.of(back).frame == doubled
    legacy = spec.to_meta()
    del legacy["max_response_frame"]
    assert FrameLimit.of(LoadSpec.from_meta(legacy)).frame == response_frame_limit(1000, 1)
