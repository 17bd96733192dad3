"""The dataplane against a fake worker: admission, metrics recorded once, deadlines,
cancellation tied to the caller's scope, sequence routing."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import RequestLimits
from trioserve.core.messages import BatchReply, Param, Reply, WorkItem
from trioserve.core.request import InferenceRequest, Outcome
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.sequences import SequenceHeaders

from .fakes import FakeLauncher, FakeProcess, OneModelManager, model_version


@dataclass
class RecordedMetrics:
    events: list[tuple[str, object]] = field(default_factory=list)

    def request_received(self, model: str, version: str | None) -> None:
        self.events.append(("received", (model, version)))

    def request_finished(
        self, model: str, version: str | None, *, latency_us: float, queue_us: float
    ) -> None:
        assert latency_us >= queue_us >= 0
        self.events.append(("finished", (model, version)))

    def request_outcome(self, outcome: Outcome) -> None:
        self.events.append(("outcome", outcome))


class NamedModels(OneModelManager):
    """One model version, found only by its own name."""

    def get(self, name: str, version: str | None = None):  # type: ignore[no-untyped-def]
        if name != "m":
            raise ServeError(ErrorKind.NOT_FOUND, f"Model not found: {name}")
        return self.model


def request(body: bytes = b"x", **fields: object) -> InferenceRequest:
    return InferenceRequest("m", None, [Param("data", body)], **fields)  # type: ignore[arg-type]


async def started(
    nursery: trio.Nursery, launcher: FakeLauncher
) -> tuple[Dataplane, RecordedMetrics]:
    model = model_version(launcher)
    await nursery.start(model.run)
    await model.scale(1, 1)
    await model.wait_settled()
    metrics = RecordedMetrics()
    sequences = SequenceHeaders(id_header="seq")
    return Dataplane(NamedModels(model), metrics, sequences=sequences), metrics  # type: ignore[arg-type]


async def hold(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
    await trio.sleep_forever()


async def test_a_request_is_counted_once_from_submit_to_its_final_reply() -> None:
    async with trio.open_nursery() as nursery:
        dataplane, metrics = await started(nursery, FakeLauncher())
        async with dataplane.submit(request(b"hello")) as call:
            replies = [(bytes(r.body), final) async for r, final in call.replies()]
        assert replies == [(b"hello", True)]
        assert metrics.events == [
            ("received", ("m", None)),
            ("outcome", Outcome.OK),
            ("finished", ("m", None)),
        ]
        nursery.cancel_scope.cancel()


async def test_an_unknown_model_is_refused_and_classed_as_a_client_error() -> None:
    async with trio.open_nursery() as nursery:
        dataplane, metrics = await started(nursery, FakeLauncher())
        with pytest.raises(ServeError) as refused:
            dataplane.submit(InferenceRequest("other", None, [Param("data", b"x")]))
        assert refused.value.kind is ErrorKind.NOT_FOUND
        # No series is made for a name the client invented; the response class counts.
        assert metrics.events == [("outcome", Outcome.CLIENT_ERROR)]
        nursery.cancel_scope.cancel()


async def test_a_deadline_that_passes_while_running_cancels_the_request() -> None:
    launcher = FakeLauncher(behaviour=hold)
    async with trio.open_nursery() as nursery:
        dataplane, metrics = await started(nursery, launcher)
        call = dataplane.submit(request(deadline=trio.current_time() + 0.2))
        with pytest.raises(ServeError) as late:
            await call.next_reply()
        assert late.value.kind is ErrorKind.TIMEOUT
        await trio.testing.wait_all_tasks_blocked()
        assert launcher.processes[0].cancelled == [call.request_id]
        assert metrics.events[-1] == ("outcome", Outcome.SERVER_ERROR)
        nursery.cancel_scope.cancel()


async def test_a_deadline_that_passes_in_the_queue_fails_the_request_unrun() -> None:
    launcher = FakeLauncher(behaviour=hold)
    async with trio.open_nursery() as nursery:
        dataplane, _metrics = await started(nursery, launcher)
        busy = dataplane.submit(request(b"first"))  # occupies the only worker
        await trio.testing.wait_all_tasks_blocked()
        queued = dataplane.submit(request(b"second", deadline=trio.current_time() + 0.2))
        with pytest.raises(ServeError) as late:
            await queued.next_reply()
        assert late.value.kind is ErrorKind.TIMEOUT
        assert [len(batch) for batch in launcher.batches] == [1]  # the second never ran
        busy.cancel()
        nursery.cancel_scope.cancel()


async def test_leaving_the_callers_scope_cancels_the_running_request() -> None:
    launcher = FakeLauncher(behaviour=hold)
    async with trio.open_nursery() as nursery:
        dataplane, _metrics = await started(nursery, launcher)
        with trio.move_on_after(0.1):
            async with dataplane.submit(request()) as call:
                await call.next_reply()
        await trio.testing.wait_all_tasks_blocked()
        assert launcher.processes[0].cancelled == [call.request_id]
        nursery.cancel_scope.cancel()


async def test_each_request_is_counted_once_in_the_statistics_however_it_ends() -> None:
    async with trio.open_nursery() as nursery:
        dataplane, _metrics = await started(nursery, FakeLauncher())
        stats = dataplane.manager.get("m").stats
        async with dataplane.submit(request()) as call:  # leaving it cancels the call
            assert [final async for _reply, final in call.replies()] == [True]
        call.cancel()
        assert (stats.success.count, stats.fail.count, stats.queue.count) == (1, 0, 1)
        assert (stats.inference_count, stats.execution_count) == (1, 1)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        dataplane, _metrics = await started(nursery, FakeLauncher(behaviour=hold))
        stats = dataplane.manager.get("m").stats
        with trio.move_on_after(0.1):
            async with dataplane.submit(request()) as call:
                await call.next_reply()
        call.cancel()  # cancelled before its final reply: one failed request
        assert (stats.success.count, stats.fail.count) == (0, 1)
        assert stats.last_inference_ms > 0
        nursery.cancel_scope.cancel()


async def test_a_request_of_a_sequence_carries_its_id_to_the_handler() -> None:
    seen: list[list[tuple[str, str]]] = []

    async def record(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        seen.extend(list(i.headers) for i in items)
        await proc.send_reply(
            BatchReply(batch_id, 200, "", [Reply(items[0].request_id, b"ok")], True)
        )

    async with trio.open_nursery() as nursery:
        dataplane, _metrics = await started(nursery, FakeLauncher(behaviour=record))
        async with dataplane.submit(request(sequence_id="s-1")) as call:
            assert call.sequence_id == "s-1"
            await call.next_reply()
        assert ("seq", "s-1") in [tuple(h) for h in seen[0]]
        nursery.cancel_scope.cancel()


async def test_a_request_with_more_inputs_than_the_limit_is_refused_before_it_is_queued() -> None:
    """Form fields and gRPC ``input`` entries become one input each: the dataplane counts
    them for every protocol (max_request_inputs), and a refusal is a counted client error."""
    async with trio.open_nursery() as nursery:
        dataplane, metrics = await started(nursery, FakeLauncher())
        dataplane.limits = RequestLimits(max_request_inputs=2)
        two = [Param("a", b"1"), Param("b", b"2")]
        async with dataplane.submit(InferenceRequest("m", None, two)) as call:
            assert [final async for _reply, final in call.replies()] == [True]
        three = [*two, Param("c", b"3")]
        with pytest.raises(ServeError) as excinfo:
            dataplane.submit(InferenceRequest("m", None, three))
        assert excinfo.value.kind is ErrorKind.TOO_LARGE
        assert "3 inputs" in excinfo.value.message
        assert "max_request_inputs" in excinfo.value.message
        assert metrics.events[-1] == ("outcome", Outcome.CLIENT_ERROR)
        nursery.cancel_scope.cancel()
