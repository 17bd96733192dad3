"""serve_grpc as a Trio service, in process, against fake workers: start, drain, stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from trioserve._proto.inference import (
    GrpcInferenceServiceBase,
    GrpcInferenceServiceStub,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
)
from trioserve._proto.org.pytorch.serve.grpc.inference import (
    InferenceApIsServiceBase,
    InferenceApIsServiceStub,
    PredictionsRequest,
)
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import RequestLimits
from trioserve.core.messages import BatchReply, Reply, WorkItem
from trioserve.grpc import bridge
from trioserve.grpc.bridge import GrpcListener, _Bridge, _Servable, serve_grpc
from trioserve.grpc.calls import Dispatcher, Gate
from trioserve.grpc.inference import InferenceRpcs
from trioserve.grpc.loop_thread import LoopThread
from trioserve.grpc.oip import OipRpcs
from trioserve.runtime.dataplane import Dataplane

from .fakes import FakeLauncher, FakeProcess, OneModelManager, model_version, wait_for

# A call with a deadline runs as a Trio task; one without is answered from callbacks
# (Unary.start). Both must drain, abort and cancel alike.
TIMEOUTS = [pytest.param(10.0, id="deadline"), pytest.param(None, id="no-deadline")]


def call_predictions(port: int, body: bytes, timeout: float | None = 10) -> Any:
    """One Predictions call from a plain asyncio client (run in a thread)."""

    async def call() -> Any:
        channel = Channel("127.0.0.1", port)
        try:
            stub = InferenceApIsServiceStub(channel, timeout=timeout)
            return await stub.predictions(PredictionsRequest(model_name="m", input={"data": body}))
        except (GRPCError, StreamTerminatedError, ConnectionError) as error:
            return error
        finally:
            channel.close()

    return asyncio.run(call())


async def serving(
    nursery: trio.Nursery, behaviour: Callable[..., Any], **options: Any
) -> tuple[FakeLauncher, trio.Event, int, trio.Event]:
    """A fake model version behind serve_grpc; returns (launcher, shutdown, port, stopped)."""
    launcher = FakeLauncher(behaviour=behaviour)
    model = model_version(launcher)
    await nursery.start(model.run)
    await model.scale(1, 1)
    await model.wait_settled()
    shutdown = trio.Event()
    stopped = trio.Event()

    async def run(*, task_status: trio.TaskStatus[dict[str, list[str]]]) -> None:
        dataplane = Dataplane(OneModelManager(model))  # type: ignore[arg-type]
        await serve_grpc(
            [
                GrpcListener(
                    "grpc_inference",
                    ("127.0.0.1", 0),
                    [InferenceRpcs(dataplane), OipRpcs(dataplane)],
                )
            ],
            tokens=None,
            max_request_size=1000,
            shutdown_trigger=shutdown.wait,
            task_status=task_status,
            **options,
        )
        stopped.set()

    bound = await nursery.start(run)
    assert list(bound) == ["grpc_inference"]
    host, port = bound["grpc_inference"][0].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    return launcher, shutdown, int(port), stopped


def hold_until(release: trio.Event) -> Callable[..., Any]:
    async def behaviour(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await release.wait()
        replies = [Reply(i.request_id, b"done:" + bytes(i.params[0].value)) for i in items]
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    return behaviour


async def shutdown_drains(timeout: float | None) -> None:
    release = trio.Event()
    results: list[Any] = []
    async with trio.open_nursery() as nursery:
        launcher, shutdown, port, stopped = await serving(nursery, hold_until(release))

        async def in_flight() -> None:
            results.append(await trio.to_thread.run_sync(call_predictions, port, b"a", timeout))

        nursery.start_soon(in_flight)
        await wait_for(lambda: len(launcher.batches) == 1)
        shutdown.set()
        await trio.testing.wait_all_tasks_blocked()
        refused = await trio.to_thread.run_sync(call_predictions, port, b"b", timeout)
        assert isinstance(refused, GRPCError) and refused.status is Status.UNAVAILABLE
        assert "shutting down" in (refused.message or "")
        assert not stopped.is_set()
        release.set()
        await wait_for(lambda: bool(results))
        with trio.fail_after(5):
            await stopped.wait()
        nursery.cancel_scope.cancel()
    assert results[0].prediction == b"done:a"
    assert launcher.processes[0].cancelled == []


async def drain_timeout_cancels(timeout: float | None) -> None:
    release = trio.Event()
    results: list[Any] = []
    async with trio.open_nursery() as nursery:
        launcher, shutdown, port, stopped = await serving(
            nursery, hold_until(release), graceful_timeout=0.2
        )

        async def in_flight() -> None:
            results.append(await trio.to_thread.run_sync(call_predictions, port, b"a", timeout))

        nursery.start_soon(in_flight)
        await wait_for(lambda: len(launcher.batches) == 1)
        shutdown.set()
        with trio.fail_after(5):
            await stopped.wait()
        # the running job was cancelled: its worker got a CANCEL frame
        await wait_for(lambda: launcher.processes[0].cancelled == launcher.batches[0])
        await wait_for(lambda: bool(results))
        release.set()
        nursery.cancel_scope.cancel()
    # the client got a clear status, not a dropped connection
    assert isinstance(results[0], GRPCError) and results[0].status is Status.UNAVAILABLE
    assert "shut down before this call finished" in (results[0].message or "")


def infer_request() -> ModelInferRequest:
    tensor = ModelInferRequestInferInputTensor(
        name="x", datatype="FP32", shape=[2], contents=InferTensorContents(fp32_contents=[1, 2])
    )
    return ModelInferRequest(model_name="m", inputs=[tensor])


async def client_reset_cancels(timeout: float | None, rpc: str = "predictions") -> None:
    """A client that goes away mid-call (its channel closed) cancels the call's job, on
    TorchServe's Predictions and on the Open Inference Protocol's ModelInfer."""
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        launcher, shutdown, port, _stopped = await serving(nursery, hold_until(release))

        async def leave_early() -> None:
            async def call() -> None:
                channel = Channel("127.0.0.1", port)
                if rpc == "predictions":
                    stub = InferenceApIsServiceStub(channel, timeout=timeout)
                    request = PredictionsRequest(model_name="m", input={"data": b"a"})
                    task = asyncio.ensure_future(stub.predictions(request))
                else:
                    oip_stub = GrpcInferenceServiceStub(channel, timeout=timeout)
                    task = asyncio.ensure_future(oip_stub.model_infer(infer_request()))
                while not launcher.batches:
                    await asyncio.sleep(0.01)
                channel.close()
                with pytest.raises((StreamTerminatedError, ConnectionError, GRPCError)):
                    await task

            await trio.to_thread.run_sync(lambda: asyncio.run(call()))

        nursery.start_soon(leave_early)
        cancelled = launcher.processes[0].cancelled
        await wait_for(lambda: bool(launcher.batches) and cancelled == launcher.batches[0])
        release.set()
        shutdown.set()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("timeout", TIMEOUTS)
async def test_shutdown_refuses_new_calls_and_drains_the_ones_in_flight(
    timeout: float | None,
) -> None:
    await shutdown_drains(timeout)


@pytest.mark.parametrize("timeout", TIMEOUTS)
async def test_drain_timeout_cancels_the_calls_left_and_their_jobs(timeout: float | None) -> None:
    await drain_timeout_cancels(timeout)


@pytest.mark.parametrize("rpc", ["predictions", "model_infer"])
@pytest.mark.parametrize("timeout", TIMEOUTS)
async def test_a_client_that_leaves_cancels_its_job(timeout: float | None, rpc: str) -> None:
    await client_reset_cancels(timeout, rpc)


# The same with the fallback portal (grpclib's loop in a thread of its own), which the bridge
# uses where asyncio lacks what the driven loop needs.
FALLBACK_CASES = [shutdown_drains, drain_timeout_cancels, client_reset_cancels]


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=lambda case: case.__name__)
@pytest.mark.parametrize("timeout", TIMEOUTS)
async def test_on_the_fallback_loop_thread(
    case: Callable[[float | None], Any], timeout: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridge, "drivable", lambda: False)
    seen: list[str] = []
    monkeypatch.setattr(bridge.log, "info", lambda fmt, *args: seen.append(fmt % args))
    await case(timeout)
    assert "gRPC: grpclib runs on a loop thread" in seen


def call_stream2(port: int, bodies: list[bytes]) -> Any:
    """A StreamPredictions2 call; returns the responses, or the error that ended it."""

    async def call() -> Any:
        channel = Channel("127.0.0.1", port)
        responses: list[Any] = []
        try:
            stub = InferenceApIsServiceStub(channel, timeout=10)
            requests = [
                PredictionsRequest(model_name="m", input={"data": b}, sequence_id="s")
                for b in bodies
            ]
            async for response in stub.stream_predictions_2(requests):
                responses.append(response)
            return responses
        except (GRPCError, StreamTerminatedError, ConnectionError) as error:
            return (responses, error)
        finally:
            channel.close()

    return asyncio.run(call())


async def test_drain_timeout_aborts_a_bidi_stream_and_all_its_jobs() -> None:
    release = trio.Event()
    results: list[Any] = []
    async with trio.open_nursery() as nursery:
        launcher, shutdown, port, stopped = await serving(
            nursery, hold_until(release), graceful_timeout=0.2
        )

        async def in_flight() -> None:
            results.append(await trio.to_thread.run_sync(call_stream2, port, [b"a", b"b"]))

        nursery.start_soon(in_flight)
        await wait_for(lambda: len(launcher.batches) == 1)
        shutdown.set()
        with trio.fail_after(5):
            await stopped.wait()
        await wait_for(lambda: bool(results))
        assert launcher.processes[0].cancelled == launcher.batches[0]
        release.set()
        await trio.sleep(0.1)
        assert len(launcher.batches) == 1  # the queued request never reached the worker
        nursery.cancel_scope.cancel()
    responses, error = results[0]
    assert responses == []
    assert isinstance(error, GRPCError) and error.status is Status.UNAVAILABLE


async def test_oversized_unary_message_is_refused_before_it_is_read() -> None:
    release = trio.Event()
    release.set()
    async with trio.open_nursery() as nursery:
        _launcher, shutdown, port, stopped = await serving(nursery, hold_until(release))
        error = await trio.to_thread.run_sync(call_predictions, port, b"x" * 2000)
        assert isinstance(error, GRPCError) and error.status is Status.RESOURCE_EXHAUSTED
        ok = await trio.to_thread.run_sync(call_predictions, port, b"x")
        assert ok.prediction == b"done:x"
        shutdown.set()
        with trio.fail_after(5):
            await stopped.wait()
        nursery.cancel_scope.cancel()


def test_every_rpc_of_the_proto_must_be_implemented() -> None:
    rpcs = InferenceRpcs(None)  # type: ignore[arg-type]
    generated = InferenceApIsServiceBase().__mapping__()
    bridge = _Bridge(Dispatcher(Gate(), None), 100, LoopThread())
    _Servable(generated, rpcs, bridge)  # complete: fine

    class Missing:
        key_kind_of = rpcs.key_kind_of

        def methods(self) -> dict[str, Any]:
            methods = dict(rpcs.methods())
            del methods["StreamPredictions2"]
            return methods

    with pytest.raises(TypeError, match="StreamPredictions2"):
        _Servable(generated, Missing(), bridge)

    class WrongKind(Missing):
        def methods(self) -> dict[str, Any]:
            methods = dict(rpcs.methods())
            methods["Ping"] = methods["StreamPredictions"]
            return methods

    with pytest.raises(TypeError, match="UNARY_UNARY"):
        _Servable(generated, WrongKind(), bridge)


def test_the_decoders_count_inputs_under_the_limits_serve_grpc_is_given() -> None:
    """A ModelInfer message of more inputs than max_request_inputs is refused before it is
    parsed (3,000 empty inputs: 6 KB of wire, ~750 KB of messages); a raised limit lets it
    through to the parser."""
    message = b"\x2a\x00" * 3000
    generated = GrpcInferenceServiceBase().__mapping__()
    for limits in (RequestLimits(), RequestLimits(max_request_inputs=3000)):
        bridge = _Bridge(Dispatcher(Gate(), None), 100, LoopThread(), limits)
        decode = _Servable(generated, OipRpcs(None), bridge).decoders[  # type: ignore[arg-type]
            "/inference.GRPCInferenceService/ModelInfer"
        ]
        if limits.max_request_inputs < 3000:
            with pytest.raises(ServeError) as refused:
                decode(message)
            assert refused.value.kind is ErrorKind.TOO_LARGE
            assert "(inputs) has more than 2048 entries" in refused.value.message
        else:
            assert len(decode(message).inputs) == 3000
