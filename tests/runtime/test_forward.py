"""Forwarded requests between two serving processes' dataplanes, in one Trio run over a real
link (a socket pair): the "member" forwards a stateful model's requests, the "control" side
runs them on fake workers. Sequences keep their state and order, a client that leaves
cancels the request on the worker, a lost link fails what was forwarded and cancels it
there, and a streamed request is sent at most WINDOW replies beyond what its client read."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import BatchReply, Param, Reply, WorkItem
from trioserve.core.request import InferenceRequest
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.forward import WINDOW, ForwardedCalls, Forwarder
from trioserve.runtime.link import Link
from trioserve.runtime.model import ModelVersion

from .fakes import FakeLauncher, FakeProcess, OneModelManager, wait_for
from .test_sequence_batcher import SEEN, answer, stateful_model


def cancelled(launcher: FakeLauncher) -> set[str]:
    return {request_id for proc in launcher.processes for request_id in proc.cancelled}


@dataclass
class Pair:
    member: Dataplane
    control: Dataplane
    model: ModelVersion
    forwarder: Forwarder
    calls: ForwardedCalls
    launcher: FakeLauncher
    member_link: Link


@asynccontextmanager
async def pair(launcher: FakeLauncher) -> AsyncIterator[Pair]:
    SEEN.clear()
    async with trio.open_nursery() as nursery:
        model = stateful_model(launcher)
        await nursery.start(model.run)
        await model.scale(2, 2)
        await model.wait_settled()
        control = Dataplane(OneModelManager(model))  # type: ignore[arg-type]
        a, b = trio.socket.socketpair()
        calls_box: list[ForwardedCalls] = []
        control_link = Link(a, lambda frame: calls_box[0].on_frame(frame), "member")
        calls = ForwardedCalls(control, control_link.post, nursery)
        calls_box.append(calls)
        forwarder_box: list[Forwarder] = []
        member_link = Link(b, lambda frame: forwarder_box[0].on_frame(frame), "control")
        forwarder = Forwarder(member_link.post)
        forwarder_box.append(forwarder)
        # The member's copy of the model: same settings, no workers, marked forwarded.
        mirror = stateful_model(FakeLauncher())
        mirror.forwarded = True
        member = Dataplane(OneModelManager(mirror), forward=forwarder.submit)  # type: ignore[arg-type]

        async def run_control_link() -> None:
            await control_link.run()
            calls.close()

        async def run_member_link() -> None:
            await member_link.run()
            forwarder.close(ServeError(ErrorKind.UNAVAILABLE, "the control process is gone"))

        nursery.start_soon(run_control_link)
        nursery.start_soon(run_member_link)
        yield Pair(member, control, model, forwarder, calls, launcher, member_link)
        nursery.cancel_scope.cancel()


async def send(dataplane: Dataplane, body: str, sequence_id: str | None = None) -> tuple[str, str]:
    request = InferenceRequest("m", None, [Param("data", body.encode())], sequence_id=sequence_id)
    async with dataplane.submit(request) as call:
        reply, final = await call.next_reply()
        assert final
    assert call.sequence_id is not None
    return call.sequence_id, bytes(reply.body).decode()


async def test_a_forwarded_sequence_keeps_its_order_worker_and_id() -> None:
    async with pair(FakeLauncher(behaviour=answer)) as p:
        sequence_id, body = await send(p.member, "first")
        assert sequence_id.startswith("ts-seq-") and body == "firsttrue"  # opened there
        for n in range(1, 6):
            # Either process may take the next request: both reach the same sequence.
            via = p.member if n % 2 else p.control
            assert await send(via, str(n), sequence_id) == (sequence_id, str(n))
        runs = [(pid, body) for pid, sid, body in SEEN if sid == sequence_id]
        assert [body for _pid, body in runs] == ["first", "1", "2", "3", "4", "5"]
        assert len({pid for pid, _body in runs}) == 1
        assert len(p.forwarder) == 0 and len(p.calls) == 0


async def hold(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
    await trio.sleep_forever()


async def test_a_client_that_leaves_cancels_the_forwarded_request_on_its_worker() -> None:
    launcher = FakeLauncher(behaviour=hold)
    async with pair(launcher) as p:
        request = InferenceRequest("m", None, [Param("data", b"x")])
        with trio.move_on_after(0.2):
            async with p.member.submit(request) as call:
                await call.next_reply()
        await wait_for(lambda: request.request_id in cancelled(launcher))
        await wait_for(lambda: len(p.calls) == 0)


async def test_a_lost_link_fails_what_was_forwarded_and_cancels_it_there() -> None:
    launcher = FakeLauncher(behaviour=hold)
    async with pair(launcher) as p:
        request = InferenceRequest("m", None, [Param("data", b"x")])
        async with p.member.submit(request) as call:
            await wait_for(lambda: len(launcher.batches) == 1)
            p.member_link._socket.shutdown(socket.SHUT_RDWR)  # the link breaks
            with pytest.raises(ServeError) as failed:
                await call.next_reply()
            assert failed.value.kind is ErrorKind.UNAVAILABLE
        await wait_for(lambda: request.request_id in cancelled(launcher))
        with pytest.raises(ServeError):
            p.member.submit(InferenceRequest("m", None, [Param("data", b"y")]))


async def chatty(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
    for n in range(3 * WINDOW):
        replies = [Reply(i.request_id, str(n).encode()) for i in items]
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, False))
    await proc.send_reply(
        BatchReply(batch_id, 200, "", [Reply(i.request_id, b"end") for i in items], True)
    )


async def test_a_streamed_request_is_sent_at_most_window_replies_beyond_its_reads() -> None:
    async with pair(FakeLauncher(behaviour=chatty)) as p:
        request = InferenceRequest("m", None, [Param("data", b"x")], streamed=True)
        async with p.member.submit(request) as call:
            first, _ = await call.next_reply()
            assert bytes(first.body) == b"0"
            await trio.sleep(0.2)  # the control side may run ahead, but only so far
            job = call._job
            assert len(job._items) <= WINDOW
            bodies = [b"0"]
            final = False
            while not final:
                reply, final = await call.next_reply()
                bodies.append(bytes(reply.body))
        assert bodies == [str(n).encode() for n in range(3 * WINDOW)] + [b"end"]
