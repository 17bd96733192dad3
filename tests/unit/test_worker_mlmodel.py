"""The worker's MLServer-model runner without a socket: load from a folder (through the
``mlserver`` shim), each OIP work item becomes an InferenceRequest, answers become output
tensors, failures stay with their request (trioserve/worker/mlmodel.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trioserve.core.messages import LoadSpec, Param, WorkItem
from trioserve.core.oip import Tensor
from trioserve.core.oip.transport import (
    OIP_HEADER,
    OUTPUTS_HEADER,
    reply_outputs,
    request_header,
    tensor_param,
)
from trioserve.worker import mlserver_shim
from trioserve.worker.errors import LoadError
from trioserve.worker.mlmodel import MLModelRunner, load_mlmodel

RUNTIME = """
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceResponse, ResponseOutput

class Model(MLModel):
    async def load(self):
        self.loaded_with = self.settings.parameters.extra
        return self.settings.parameters.extra.get("ready", True)

    async def predict(self, payload):
        first = payload.inputs[0]
        if first.name == "bad":
            raise MLServerError("not this one", status_code=422)
        if first.name == "boom":
            raise ValueError("boom")
        if first.name == "odd":
            return InferenceResponse(model_name=self.name, outputs=[
                ResponseOutput(name="o", shape=[2], datatype="INT32", data=[1])])
        array = NumpyCodec.decode_input(first)
        out = NumpyCodec.encode_output("y", array + 1)
        out.parameters = {"content_type": "np", "seen_id": payload.id or ""}
        return InferenceResponse(model_name=self.name, outputs=[out])
"""


@pytest.fixture
def runner(tmp_path: Path) -> Any:
    yield from _runner(tmp_path, {})


def _runner(tmp_path: Path, extra: dict[str, Any]) -> Any:
    module = f"rt_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{module}.py").write_text(RUNTIME)
    spec = LoadSpec(
        "m", "1.0", str(tmp_path), f"{module}.Model",
        model_settings={"name": "m", "parameters": {"version": "1.0", "extra": extra}},
    )  # fmt: skip
    runner = load_mlmodel(spec)
    try:
        yield runner
    finally:
        runner.close()
        sys.path.remove(str(tmp_path))
        mlserver_shim.uninstall()


def item(request_id: str, tensor: Tensor, oip_id: str | None = None) -> WorkItem:
    headers = [(OIP_HEADER, "1")]
    described = request_header(oip_id, {})
    if described:
        headers.append(described)
    return WorkItem(request_id, headers, [tensor_param(tensor)])


def test_a_batch_is_predicted_request_by_request(runner: MLModelRunner) -> None:
    x = Tensor.from_values("x", "INT64", [1, 2], [1, 2])
    items = [
        item("a", x, oip_id="client-id"),
        item("b", Tensor.from_values("bad", "INT64", [1], [0])),
        item("c", Tensor.from_values("boom", "INT64", [1], [0])),
        item("d", Tensor.from_values("odd", "INT64", [1], [0])),
        WorkItem("e", [], [Param("body", b"1,2")]),
    ]
    reply = runner.reply(7, items)
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
            load_mlmodel(spec)
    finally:
        sys.path.remove(str(tmp_path))
        mlserver_shim.uninstall()


def test_settings_reach_the_model(runner: MLModelRunner) -> None:
    assert runner.model.name == "m" and runner.model.version == "1.0"
    assert runner.model.loaded_with == {}
    assert json.loads(json.dumps(runner.model.settings.parameters.extra)) == {}
