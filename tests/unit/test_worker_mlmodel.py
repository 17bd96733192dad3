"""The worker's MLServer-model runner without a socket: load from a folder (through the
``mlserver`` shim), each OIP work item becomes an InferenceRequest, answers become output
tensors, failures stay with their request, streams send intermediate replies within their
window and are cancelled into the generator (trioserve/worker/mlserver/mlmodel.py)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trioserve.core.frames import FrameDecoder
from trioserve.core.messages import BatchReply, LoadSpec, Param, WorkItem, decode_reply
from trioserve.core.oip import Tensor
from trioserve.core.oip.transport import (
    END_HEADER,
    OIP_HEADER,
    OUTPUTS_HEADER,
    STREAM_HEADER,
    reply_outputs,
    request_header,
    tensor_param,
)
from trioserve.worker.errors import LoadError
from trioserve.worker.mlserver import mlserver_shim
from trioserve.worker.mlserver.mlmodel import CANCELLED, STREAM_WINDOW, MLModelRunner, load_mlmodel

RUNTIME = """
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceResponse, ResponseOutput

class Model(MLModel):
    async def load(self):
        self.loaded_with = self.settings.parameters.extra
        return self.settings.parameters.extra.get("ready", True)

    async def predict_stream(self, payloads):
        try:
            async for payload in payloads:
                for i in range(int(payload.inputs[0].data[0])):
                    yield InferenceResponse(model_name=self.name, outputs=[
                        ResponseOutput(name="i", shape=[1], datatype="INT64", data=[i])])
        finally:
            self.closed = True

    async def predict(self, payload):
        first = payload.inputs[0]
        if first.name == "bad":
            raise MLServerError("not this one", status_code=422)
        if first.name == "boom":
            raise ValueError("boom")
        if first.name == "wrongtype":
            return {"not": "a response"}
        if first.name == "odd":
            return InferenceResponse(model_name=self.name, outputs=[
                ResponseOutput(name="o", shape=[2], datatype="INT32", data=[1])])
        array = NumpyCodec.decode_input(first)
        out = NumpyCodec.encode_output("y", array + 1)
        out.parameters = {"content_type": "np", "seen_id": payload.id or ""}
        return InferenceResponse(model_name=self.name, outputs=[out])
"""


@pytest.fixture
def frames() -> Frames:
    return Frames()


@pytest.fixture
def runner(tmp_path: Path, frames: Frames) -> Any:
    yield from _runner(tmp_path, {}, frames)


class Frames:
    """What the runner writes, decoded, with a way to wait for it."""

    def __init__(self) -> None:
        self.replies: list[BatchReply] = []
        self.changed = threading.Condition()

    def send(self, data: bytes) -> None:
        # Whole frames, one or more: what one turn of the model loop wrote goes together, and
        # a stream's intermediate replies share frames; kept here one reply each, in order.
        frames = FrameDecoder(1 << 30).feed(data)
        assert frames
        with self.changed:
            for frame in map(decode_reply, frames):
                if frame.final:
                    self.replies.append(frame)
                else:
                    self.replies.extend(replace(frame, replies=[r]) for r in frame.replies)
            self.changed.notify_all()

    def wait(self, predicate: Callable[[list[BatchReply]], bool]) -> list[BatchReply]:
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.replies), timeout=10)
            return list(self.replies)


def _runner(tmp_path: Path, extra: dict[str, Any], frames: Frames | None = None) -> Any:
    module = f"rt_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(RUNTIME)
    spec = LoadSpec(
        "m", "1.0", str(tmp_path), f"{module}.Model",
        model_settings={"name": "m", "parameters": {"version": "1.0", "extra": extra}},
    )  # fmt: skip
    runner = load_mlmodel(spec, (frames or Frames()).send)
    try:
        yield runner
    finally:
        runner.close()
        sys.path.remove(str(tmp_path))
        mlserver_shim.uninstall()


def item(
    request_id: str, tensor: Tensor, oip_id: str | None = None, stream: str | None = None
) -> WorkItem:
    headers = [(OIP_HEADER, "1")]
    if stream:
        headers.append((STREAM_HEADER, stream))
    described = request_header(oip_id, {})
    if described:
        headers.append(described)
    return WorkItem(request_id, headers, [tensor_param(tensor)])


def test_a_batch_is_predicted_request_by_request(runner: MLModelRunner, frames: Frames) -> None:
    x = Tensor.from_values("x", "INT64", [1, 2], [1, 2])
    items = [
        item("a", x, oip_id="client-id"),
        item("b", Tensor.from_values("bad", "INT64", [1], [0])),
        item("c", Tensor.from_values("boom", "INT64", [1], [0])),
        item("d", Tensor.from_values("odd", "INT64", [1], [0])),
        WorkItem("e", [], [Param("body", b"1,2")]),
    ]
    runner.submit(7, items)
    (reply,) = frames.wait(lambda got: len(got) == 1)
    assert (reply.batch_id, reply.code, reply.final) == (7, 200, True)
    a, b, c, d, e = reply.replies
    (y,) = reply_outputs(a.headers, a.body)
    assert (y.name, y.datatype, y.shape, y.to_list()) == ("y", "INT64", (1, 2), [2, 3])
    assert y.parameters == {"content_type": "np", "seen_id": "client-id"}
    assert (b.status, bytes(b.body)) == (422, b"not this one")
    assert (c.status, bytes(c.body)) == (500, b"boom")
    assert d.status == 500 and b"needs 2 elements" in bytes(d.body)
    assert e.status == 400 and b"/v2/models/m/infer" in bytes(e.body)
    assert OUTPUTS_HEADER not in b.headers


def test_load_false_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="returned False"):
        next(_runner(tmp_path, {"ready": False}))


def test_implementation_must_be_a_class(tmp_path: Path) -> None:
    spec = LoadSpec("m", "1", str(tmp_path), "nomodule", model_settings={})
    try:
        with pytest.raises(LoadError, match=r"module\.Class"):
            load_mlmodel(spec, Frames().send)
    finally:
        sys.path.remove(str(tmp_path))
        mlserver_shim.uninstall()


def test_settings_reach_the_model(runner: MLModelRunner) -> None:
    assert runner.model.name == "m" and runner.model.version == "1.0"
    assert runner.model.loaded_with == {}
    assert json.loads(json.dumps(runner.model.settings.parameters.extra)) == {}


def test_a_stream_sends_within_its_window_and_ends_with_a_marker(
    runner: MLModelRunner, frames: Frames
) -> None:
    runner.submit(1, [item("s", Tensor.from_values("n", "INT64", [1], [40]), stream="out")])
    got = frames.wait(lambda got: len(got) >= STREAM_WINDOW)
    time.sleep(0.2)
    assert len(frames.replies) == STREAM_WINDOW  # nobody acknowledged: the model waits
    runner.ack("s", 100)
    got = frames.wait(lambda got: got[-1].final)
    values = [reply_outputs(r.replies[0].headers, r.replies[0].body)[0].to_list() for r in got[:-1]]
    assert values == [[i] for i in range(40)]
    (end,) = got[-1].replies
    assert end.status == 200 and END_HEADER in end.headers and bytes(end.body) == b""
    assert runner.model.closed


def test_a_streamed_input_feeds_the_running_generator(
    runner: MLModelRunner, frames: Frames
) -> None:
    runner.submit(1, [item("s", Tensor.from_values("n", "INT64", [1], [1]), stream="in")])
    frames.wait(lambda got: len(got) == 1)
    runner.feed(item("s", Tensor.from_values("n", "INT64", [1], [2])), False)
    frames.wait(lambda got: len(got) == 3)
    runner.feed(WorkItem("s", [], []), True)
    got = frames.wait(lambda got: got[-1].final)
    assert len(got) == 4 and END_HEADER in got[-1].replies[0].headers


def test_cancel_closes_the_generator(runner: MLModelRunner, frames: Frames) -> None:
    runner.submit(1, [item("s", Tensor.from_values("n", "INT64", [1], [1000]), stream="out")])
    frames.wait(lambda got: len(got) >= STREAM_WINDOW)
    runner.cancel(["s"])
    got = frames.wait(lambda got: got[-1].final)
    assert got[-1].replies[0].status == CANCELLED
    assert runner.model.closed
    runner.wait_idle()


def test_a_predict_answering_the_wrong_type_is_a_500_naming_it(
    runner: MLModelRunner, frames: Frames
) -> None:
    runner.submit(3, [item("w", Tensor.from_values("wrongtype", "INT64", [1], [0]))])
    (reply,) = frames.wait(lambda got: len(got) == 1)
    (answer,) = reply.replies
    assert answer.status == 500
    assert bytes(answer.body) == b"Model.predict must answer an InferenceResponse, not dict"


def test_a_predict_stream_that_is_not_an_async_generator(tmp_path: Path) -> None:
    module = f"rt_plain_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(
        "from mlserver import MLModel\n"
        "class Plain(MLModel):\n"
        "    def predict_stream(self, payloads):\n"
        "        return [1, 2]\n"
    )
    frames = Frames()
    spec = LoadSpec("m", "1", str(tmp_path), f"{module}.Plain", model_settings={"name": "m"})
    runner = load_mlmodel(spec, frames.send)
    try:
        tensor = Tensor.from_values("n", "INT64", [1], [1])
        runner.submit(1, [item("p", tensor, stream="out")])
        (reply,) = frames.wait(lambda got: len(got) == 1)
        (answer,) = reply.replies
        assert answer.status == 500
        assert bytes(answer.body) == (
            b"Plain.predict_stream must be an async generator (or return an async iterator), "
            b"not list"
        )
    finally:
        runner.close()
        sys.path.remove(str(tmp_path))
        mlserver_shim.uninstall()
