"""OIP requests in the worker: inputs become kservev2 rows, answers become output tensors,
rows join back into one reply per request (worker/torchserve/oip.py), without a socket."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from trioserve.core.errors import ServeError
from trioserve.core.messages import Param, WorkItem
from trioserve.core.oip import Tensor
from trioserve.core.oip.transport import (
    OIP_HEADER,
    OUTPUTS_HEADER,
    REQUEST_HEADER,
    outputs_reply,
    param_tensor,
    reply_outputs,
    request_header,
    tensor_param,
)
from trioserve.worker.torchserve import oip
from trioserve.worker.torchserve.batch import run_batch
from trioserve.worker.torchserve.context import Context


def oip_item(request_id: str, *tensors: Tensor) -> WorkItem:
    return WorkItem(request_id, [(OIP_HEADER, "1"), ("x", "y")], [tensor_param(t) for t in tensors])


def plain_item(request_id: str, body: bytes) -> WorkItem:
    return WorkItem(request_id, [], [Param("body", body)])


def run(items: list[WorkItem], handler: Any) -> Any:
    """Run ``items`` as one batch through ``handler`` the way WorkerLoop._oip_reply does."""
    context = Context("m", "/d", None, 8, None, "0.12.0")
    expanded = oip.expand(items)
    context.begin_batch(
        [i.request_id for i in expanded.items], [dict(i.headers) for i in expanded.items]
    )
    reply = run_batch(oip.wrap_entry(handler, expanded), context, 1, expanded.items, expanded.data)
    return oip.merge(reply, items, expanded)


def test_transport_round_trips_a_tensor_and_outputs() -> None:
    tensor = Tensor.from_values("x", "FP16", [2, 1], [[0.5], [-1.0]])
    assert param_tensor(tensor_param(tensor)) == Tensor.from_raw("x", "FP16", [2, 1], tensor.raw)
    outputs = [tensor, Tensor.from_values("s", "BYTES", [2], ["", "abc"])]
    header, body = outputs_reply(outputs)
    back = reply_outputs({OUTPUTS_HEADER: header}, body)
    assert [(t.name, t.datatype, t.shape, t.to_list()) for t in back] == [
        ("x", "FP16", (2, 1), [0.5, -1.0]),
        ("s", "BYTES", (2,), [b"", b"abc"]),
    ]
    with pytest.raises(ServeError, match="add up"):
        reply_outputs({OUTPUTS_HEADER: header}, body + b"\0")


def test_rows_are_one_per_input_nested_in_their_shape_and_requests_batch() -> None:
    seen: list[Any] = []

    def handler(data: list[Any], context: Any) -> list[Any]:
        seen.extend(data)
        return [row.get("data", row.get("body")) for row in data]

    items = [
        oip_item(
            "a",
            Tensor.from_values("m", "INT32", [2, 2], [1, 2, 3, 4]),
            Tensor.from_values("t", "BYTES", [1], ["héllo"]),
        ),
        plain_item("b", b"raw"),
        oip_item("c", Tensor.from_values("f", "BOOL", [2], [True, False])),
    ]
    reply = run(items, handler)
    assert seen == [
        {"name": "m", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]},
        {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["héllo"]},
        {"body": b"raw"},
        {"name": "f", "shape": [2], "datatype": "BOOL", "data": [True, False]},
    ]
    assert [r.request_id for r in reply.replies] == ["a", "b", "c"]
    a, b, c = reply.replies
    described = json.loads(a.headers[OUTPUTS_HEADER])
    assert described == [["m", "INT64", [2, 2]], ["t", "BYTES", [1]]]
    outputs = reply_outputs(a.headers, a.body)
    assert outputs[0].to_list() == [1, 2, 3, 4] and outputs[1].to_list() == ["héllo".encode()]
    assert bytes(b.body) == b"raw" and OUTPUTS_HEADER not in b.headers
    assert reply_outputs(c.headers, c.body)[0].to_list() == [True, False]


@pytest.mark.parametrize(
    ("answer", "datatype", "shape", "values"),
    [
        ([1.5, 2.5], "FP64", (2,), [1.5, 2.5]),
        ([[1, 2, 3]], "INT64", (1, 3), [1, 2, 3]),
        (7, "INT64", (1,), [7]),
        (True, "BOOL", (1,), [True]),
        ("text", "BYTES", (1,), [b"text"]),
        (b"\xff", "BYTES", (1,), [b"\xff"]),
        (["a", "bc"], "BYTES", (2,), [b"a", b"bc"]),
        ({"k": 1}, "BYTES", (1,), [b'{"k": 1}']),
        ([[1], [2, 3]], "BYTES", (1,), [b"[[1], [2, 3]]"]),  # ragged: its JSON
        (torch.tensor([[1.0, 2.0]]), "FP32", (1, 2), [1.0, 2.0]),
        (torch.tensor([1.0, 0.5], dtype=torch.bfloat16), "BF16", (2,), [1.0, 0.5]),
        (torch.tensor([True]), "BOOL", (1,), [True]),
        (np.array([[3, 4]], dtype=np.int16), "INT16", (1, 2), [3, 4]),
        (np.array([0.25], dtype=np.float16), "FP16", (1,), [0.25]),
    ],
)
def test_answers_become_tensors_of_their_type_and_shape(
    answer: Any, datatype: str, shape: tuple[int, ...], values: list[Any]
) -> None:
    tensor = oip.answer_tensor("out", answer)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("out", datatype, shape)
    assert tensor.to_list() == values


def test_a_row_with_an_error_status_answers_its_request_with_it() -> None:
    def handler(data: list[Any], context: Any) -> list[Any]:
        context.set_response_status(422, "nope", idx=1)
        return ["fine", "bad"]

    item = oip_item(
        "a", Tensor.from_values("x", "INT8", [1], [1]), Tensor.from_values("y", "INT8", [1], [2])
    )
    (reply,) = run([item], handler).replies
    assert reply.status == 422


def test_a_wrong_answer_count_fails_the_batch_as_usual() -> None:
    item = oip_item("a", Tensor.from_values("x", "INT8", [1], [1]))
    reply = run([item], lambda data, context: [])
    assert reply.code == 503 and "mismatched" in reply.message


def test_an_undecodable_input_is_a_clear_error() -> None:
    bad = WorkItem("a", [(OIP_HEADER, "1")], [Param("x", b"\0\0\0", tensor_param(
        Tensor.from_values("x", "FP32", [1], [1.0])).content_type)])  # fmt: skip
    with pytest.raises(ServeError, match="'x'"):
        oip.expand([bad])


def test_an_empty_answer_takes_the_inputs_datatype() -> None:
    item = oip_item("a", Tensor.from_values("x", "FP16", [0], []))
    (reply,) = run([item], lambda data, context: [[]]).replies
    (output,) = reply_outputs(reply.headers, reply.body)
    assert (output.datatype, output.shape) == ("FP16", (0,))


def test_an_answer_that_is_no_tensor_fails_only_its_request() -> None:
    items = [
        oip_item("big", Tensor.from_values("x", "INT8", [1], [1])),
        oip_item("ok", Tensor.from_values("y", "INT8", [1], [1])),
    ]
    answers = [[2**70], [3]]
    reply = run(items, lambda data, context: answers)
    assert reply.code == 200
    big, ok = reply.replies
    assert big.status == 500 and b"not a valid output" in bytes(big.body)
    assert b"'x'" in bytes(big.body)
    assert reply_outputs(ok.headers, ok.body)[0].to_list() == [3]


def test_tensor_and_request_parameters_travel_to_the_worker_and_back() -> None:
    """Input parameters (``content_type``...) ride in the tensor's parameter; an output's
    parameters in the outputs header; the request's id and parameters in their header."""
    sent = Tensor.from_values(
        "t", "BYTES", [1], ["a;b=c"], {"content_type": "str", "odd": "x; y=%z", "n": 2}
    )
    received = param_tensor(tensor_param(sent))
    assert received == sent and received.parameters == sent.parameters
    out = Tensor.from_values("o", "INT64", [2], [1, 2], {"content_type": "np"})
    plain = Tensor.from_values("p", "FP32", [1], [1.0])
    described, body = outputs_reply([out, plain])
    back = reply_outputs({OUTPUTS_HEADER: described}, body)
    assert back == [out, plain] and back[0].parameters == {"content_type": "np"}
    assert request_header(None, {}) is None
    name, value = request_header("id-1", {"content_type": "np"}) or ("", "")
    assert name == REQUEST_HEADER
    assert json.loads(value) == {"id": "id-1", "parameters": {"content_type": "np"}}
