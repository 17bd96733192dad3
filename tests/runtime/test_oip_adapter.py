"""The OIP REST adapter over the dataplane, against a fake worker that speaks the transport:
a request's tensors reach the worker as parameters, its outputs come back, are encoded as
JSON or binary; failures become {"error"} answers."""

from __future__ import annotations

import json

import trio

from trioserve.core.messages import BatchReply, Reply, WorkItem
from trioserve.core.oip.transport import OIP_HEADER, outputs_reply, param_tensor
from trioserve.http import oip
from trioserve.http.bodies import Answer
from trioserve.runtime.dataplane import Dataplane

from .fakes import FakeLauncher, FakeProcess, OneModelManager, model_version

SEEN: list[WorkItem] = []


async def mirror(proc: FakeProcess, batch_id: int, items: list[WorkItem]) -> None:
    """Answer each OIP request with its inputs as outputs; an input named ``bad`` gets a
    handler-style 400; ``die`` kills the worker."""
    SEEN.extend(items)
    replies = []
    for item in items:
        assert (OIP_HEADER, "1") in item.headers
        tensors = [param_tensor(p) for p in item.params]
        if any(t.name == "die" for t in tensors):
            proc.exit(-9)
            return
        if any(t.name == "bad" for t in tensors):
            replies.append(Reply(item.request_id, b"bad input, says the handler", 400))
            continue
        header, body = outputs_reply(tensors)
        replies.append(Reply(item.request_id, body, headers={"x-trioserve-oip-outputs": header}))
    await proc.send_reply(BatchReply(batch_id, 200, "", replies, True))


async def started(nursery: trio.Nursery) -> Dataplane:
    SEEN.clear()
    model = model_version(FakeLauncher(behaviour=mirror))
    await nursery.start(model.run)
    await model.scale(1, 1)
    await model.wait_settled()
    return Dataplane(OneModelManager(model))  # type: ignore[arg-type]


def request(*inputs: dict[str, object], **extra: object) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


FP32 = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, -2.0]}


async def call(dataplane: Dataplane, endpoint: str, body: bytes) -> Answer:
    return await oip.answer(dataplane, endpoint, {"model_name": "m"}, [], body)


async def test_infer_sends_tensors_as_raw_parameters_and_encodes_the_outputs() -> None:
    async with trio.open_nursery() as nursery:
        dataplane = await started(nursery)
        answer = await call(dataplane, "oip_infer", request(FP32, id="q"))
        assert answer.status == 200
        assert isinstance(answer.body, bytes)
        body = json.loads(answer.body)
        assert body["id"] == "q" and body["model_name"] == "m"
        assert body["outputs"] == [{"name": "x", "datatype": "FP32", "shape": [2],
                                    "data": [1.5, -2.0]}]  # fmt: skip
        (item,) = SEEN
        (param,) = item.params
        assert bytes(param.value) == b"\x00\x00\xc0?\x00\x00\x00\xc0"  # little-endian FP32
        nursery.cancel_scope.cancel()


async def test_binary_output_on_request() -> None:
    async with trio.open_nursery() as nursery:
        dataplane = await started(nursery)
        answer = await call(
            dataplane, "oip_infer", request(FP32, parameters={"binary_data_output": True})
        )
        assert answer.status == 200 and isinstance(answer.body, bytes)
        length = int(dict(answer.headers)["Inference-Header-Content-Length"])
        assert answer.body[length:] == b"\x00\x00\xc0?\x00\x00\x00\xc0"
        nursery.cancel_scope.cancel()


async def test_failures_are_error_bodies_with_their_status() -> None:
    async with trio.open_nursery() as nursery:
        dataplane = await started(nursery)
        bad = {"name": "bad", "shape": [1], "datatype": "INT8", "data": [1]}
        refused = await call(dataplane, "oip_infer", request(bad))
        assert refused.status == 400
        assert refused.body == b'{"error":"bad input, says the handler"}'
        malformed = await call(dataplane, "oip_infer", b"[1, 2")
        assert malformed.status == 400 and b"malformed JSON" in malformed.body  # type: ignore[operator]
        died = await call(dataplane, "oip_infer", request({**bad, "name": "die"}))
        assert died.status in (500, 507) and b'"error"' in died.body  # type: ignore[operator]
        nursery.cancel_scope.cancel()


async def test_infer_stream_is_one_event_per_answer() -> None:
    async with trio.open_nursery() as nursery:
        dataplane = await started(nursery)
        answer = await call(dataplane, "oip_infer_stream", request(FP32))
        assert answer.status == 200
        assert dict(answer.headers)["Content-Type"].startswith("text/event-stream")
        assert not isinstance(answer.body, bytes)
        events = [event async for event in answer.body]
        assert len(events) == 1 and events[0].startswith(b"data: {")
        assert json.loads(events[0][6:])["outputs"][0]["data"] == [1.5, -2.0]
        nursery.cancel_scope.cancel()
