"""Malformed request bytes and stream ordering, in process against fake workers.

Every rpc of every service the server registers refuses malformed protobuf with
INVALID_ARGUMENT over a real HTTP/2 call (the bridge's one decode point). On the ordered
streams (ModelStreamInfer, StreamPredictions2) a message that cannot be read, or is refused,
ends the stream only after the answers to the messages before it, however slow those are:
the workers here hold every answer until the test releases them, after the bad message has
been read."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio
import trio.testing
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from trioserve._proto.inference import (
    GrpcInferenceServiceStub,
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelStreamInferResponse,
    ServerLiveRequest,
)
from trioserve._proto.org.pytorch.serve.grpc.inference import PredictionsRequest
from trioserve.config import CliOptions, load_config
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import BatchReply, Reply, WorkItem
from trioserve.core.oip.transport import outputs_reply, param_tensor
from trioserve.grpc.bridge import serve_grpc
from trioserve.grpc.calls import RpcContext
from trioserve.grpc.decode import request_decoder
from trioserve.grpc.inference import InferenceRpcs
from trioserve.grpc.oip import oip_service
from trioserve.grpc.ordered import answer_in_order
from trioserve.runtime.dataplane import Dataplane
from trioserve.server import grpc_listeners

from .fakes import FakeLauncher, FakeProcess, OneModelManager, model_version, wait_for

# -- every rpc of every registered service ---------------------------------------------


class RawCodec(CodecBase):
    """Sends bytes as they are and hands back what comes (a client of malformed input)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


def call_raw(port: int, path: str, cardinality: Cardinality, data: bytes) -> GRPCError | None:
    """One call carrying ``data`` as its request message; the error it ended with."""

    async def call() -> GRPCError | None:
        channel = Channel("127.0.0.1", port, codec=RawCodec())
        try:
            async with channel.request(path, cardinality, bytes, bytes, timeout=10) as stream:
                await stream.send_message(data, end=True)
                while await stream.recv_message() is not None:
                    pass
        except GRPCError as error:
            return error
        finally:
            channel.close()
        return None

    return asyncio.run(call())


def server_live(port: int) -> bool:
    async def call() -> bool:
        channel = Channel("127.0.0.1", port)
        try:
            reply = await GrpcInferenceServiceStub(channel, timeout=10).server_live(
                ServerLiveRequest()
            )
            return bool(reply.live)
        finally:
            channel.close()

    return asyncio.run(call())


async def test_every_rpc_of_every_service_refuses_malformed_bytes(tmp_path: Path) -> None:
    """The services are the ones the server builds (``grpc_listeners``): an rpc added there
    is covered without changing this test. Wire type 7 is malformed for any message type."""
    config = load_config(CliOptions(), {}, tmp_path)
    planned = [
        dataclasses.replace(listener, address=("127.0.0.1", 0))
        for listener in grpc_listeners(config, None, None)  # type: ignore[arg-type]
    ]
    routes = [
        (listener.api, path, route)
        for listener in planned
        for service in listener.services
        for path, route in service.base().__mapping__().items()
    ]
    assert len(routes) > 20
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:

        async def serve(*, task_status: trio.TaskStatus[dict[str, list[str]]]) -> None:
            await serve_grpc(
                planned,
                tokens=None,
                max_request_size=1 << 20,
                shutdown_trigger=shutdown.wait,
                task_status=task_status,
            )

        bound = await nursery.start(serve)
        ports = {api: int(urls[0].rsplit(":", 1)[1]) for api, urls in bound.items()}
        for api, path, route in routes:
            error = await trio.to_thread.run_sync(
                call_raw, ports[api], path, route.cardinality, b"\x0f"
            )
            assert error is not None and error.status is Status.INVALID_ARGUMENT, (path, error)
            message = error.message or ""
            assert message.startswith(
                f"malformed protobuf in {route.request_type.__name__}: field 1 "
            ), path
            assert message.endswith("at byte 0 has wire type 7, which does not exist"), path
        assert await trio.to_thread.run_sync(server_live, ports["grpc_inference"])
        shutdown.set()


# -- ordering on streams ---------------------------------------------------------------


async def test_an_unreadable_message_ends_the_stream_after_the_answers_before_it() -> None:
    """answer_in_order itself: the reader fails on the third message while the first two
    are still being answered; both answers come first, then the error."""
    release = trio.Event()
    answered: list[str] = []
    read_all = trio.Event()
    incoming = ["a", "b"]

    async def receive() -> str | None:
        if incoming:
            return incoming.pop(0)
        read_all.set()
        raise ServeError(ErrorKind.BAD_INPUT, "malformed protobuf in X: the third message")

    async def answer(message: str) -> None:
        await release.wait()
        answered.append(message)

    async with trio.open_nursery() as nursery:
        result: list[outcome.Outcome[None]] = []

        async def run() -> None:
            ordered = answer_in_order(receive, lambda m: m, answer, lambda m: None)
            result.append(await outcome.acapture(lambda: ordered))

        nursery.start_soon(run)
        await read_all.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert answered == [] and result == []  # still waiting for the first answer
        release.set()
    assert answered == ["a", "b"]
    with pytest.raises(ServeError, match="the third message"):
        result[0].unwrap()


def gated(release: trio.Event) -> Callable[[FakeProcess, int, list[WorkItem]], Awaitable[None]]:
    """A worker that holds every batch until ``release``; OIP requests get their inputs back
    as outputs, others their body."""

    async def behaviour(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
        await release.wait()
        replies = []
        for item in items:
            if any(name == "x-trioserve-oip" for name, _ in item.headers):
                header, body = outputs_reply([param_tensor(p) for p in item.params])
                headers = {"x-trioserve-oip-outputs": header}
                replies.append(Reply(item.request_id, body, headers=headers))
            else:
                replies.append(Reply(item.request_id, bytes(item.params[0].value)))
        await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))

    return behaviour


async def started(nursery: trio.Nursery, release: trio.Event) -> tuple[Dataplane, FakeLauncher]:
    launcher = FakeLauncher(behaviour=gated(release))
    model = model_version(launcher)
    await nursery.start(model.run)
    await model.scale(1, 1)
    await model.wait_settled()
    return Dataplane(OneModelManager(model)), launcher  # type: ignore[arg-type]


def infer_request(request_id: str, shape: int = 2) -> ModelInferRequest:
    tensor = ModelInferRequestInferInputTensor(
        name="x", datatype="FP32", shape=[shape], contents=InferTensorContents(fp32_contents=[1, 2])
    )
    return ModelInferRequest(model_name="m", id=request_id, inputs=[tensor])


TRUNCATED = bytes(infer_request("c"))[:-3]


async def run_stream(
    rpc: Callable[..., Awaitable[None]], messages: list[bytes], decode: Callable[[bytes], Any]
) -> tuple[list[Any], outcome.Outcome[None], FakeLauncher]:
    """Drive a bidi rpc as the bridge does (each message decoded strictly as it is read);
    the worker answers only once the last message has been read and everything settled."""
    release = trio.Event()
    sent: list[Any] = []
    read_all = trio.Event()
    queue = list(messages)

    async def receive() -> Any | None:
        if not queue:
            return None
        data = queue.pop(0)
        if not queue:
            read_all.set()
        return decode(data)

    async def send(message: Any) -> None:
        sent.append(message)

    async with trio.open_nursery() as nursery:
        dataplane, launcher = await started(nursery, release)
        context = RpcContext(method="stream", metadata=()).on_trio_clock()
        result: list[outcome.Outcome[None]] = []

        async def run() -> None:
            result.append(await outcome.acapture(rpc(dataplane), receive, context, send))

        nursery.start_soon(run)
        await read_all.wait()
        await wait_for(lambda: bool(launcher.batches))  # the first request is held there
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [] and result == []
        release.set()
        await wait_for(lambda: bool(result))
        nursery.cancel_scope.cancel()
    return sent, result[0], launcher


def ids(sent: list[Any]) -> list[str]:
    return [m.infer_response.id if isinstance(m, ModelStreamInferResponse) else m.id for m in sent]


@pytest.mark.parametrize("shape", ["mlserver", "triton"])
@pytest.mark.parametrize("bad", ["truncated", "bad shape"])
async def test_model_stream_infer_answers_earlier_requests_before_an_error(
    shape: str, bad: str
) -> None:
    third = TRUNCATED if bad == "truncated" else bytes(infer_request("c", shape=3))
    messages = [bytes(infer_request("a")), bytes(infer_request("b")), third]
    sent, result, _launcher = await run_stream(
        lambda dataplane: oip_service(dataplane, shape).model_stream_infer,
        messages,
        request_decoder(ModelInferRequest),
    )
    expected = "malformed protobuf in ModelInferRequest" if bad == "truncated" else "shape [3]"
    if shape == "triton" and bad == "bad shape":  # Triton's shape: in-band, stream stays open
        result.unwrap()
        assert ids(sent[:2]) == ["a", "b"] and expected in sent[2].error_message
        assert len(sent) == 3
        return
    assert ids(sent) == ["a", "b"]
    with pytest.raises(ServeError) as caught:
        result.unwrap()
    assert caught.value.kind is ErrorKind.BAD_INPUT and expected in caught.value.message


async def test_stream_predictions2_answers_earlier_requests_before_a_malformed_one() -> None:
    good = [
        bytes(PredictionsRequest(model_name="m", input={"data": d}, sequence_id="s"))
        for d in (b"a", b"b")
    ]
    sent, result, _launcher = await run_stream(
        lambda dataplane: InferenceRpcs(dataplane).stream_predictions2,
        [*good, b"\x0a\x05m"],
        request_decoder(PredictionsRequest),
    )
    assert [m.prediction for m in sent] == [b"a", b"b"]
    with pytest.raises(ServeError) as caught:
        result.unwrap()
    assert caught.value.message == (
        "malformed protobuf in PredictionsRequest: field 1 (model_name) at byte 0: length 5 "
        "runs past the end of the 3-byte message"
    )
