"""KServe v1 without a socket: the body check (core/kserve.py) and the worker's expansion of
instances into rows and of answers into ``{"predictions"}`` (worker/torchserve/kserve.py)."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pytest
import torch

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.kserve import V1_HEADER, answer_body, instances_of
from trioserve.core.limits import DEFAULT_LIMITS
from trioserve.core.messages import BatchReply, Param, WorkItem
from trioserve.core.oip import Tensor
from trioserve.core.oip.transport import OIP_HEADER, reply_outputs, tensor_param
from trioserve.worker.torchserve import kserve, oip
from trioserve.worker.torchserve.context import Context


def v1_item(request_id: str, body: Any, *, explain: bool = False) -> WorkItem:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [("explain", "True" if explain else "False"), (V1_HEADER, "1"), ("x-k", "v")]
    return WorkItem(request_id, headers, [Param("body", raw, "application/json")])


def run(items: list[WorkItem], handler: Any, envelope: str | None = None) -> BatchReply:
    """One batch through ``handler`` the way WorkerLoop._reply_to runs it."""
    runner = kserve.rows_runner(items, envelope)
    assert runner is not None
    return runner(
        handler,
        Context("m", "/d", None, 8, None, "0.12.0"),
        1,
        items,
        decode=True,
        cancel_check=lambda _id: False,
        channel=None,
        tensors={},
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "not JSON"),
        (b'{"instances": ["\xc3\x28"]}', "not JSON: invalid UTF-8 at line 1 column 17"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"inputs": [1]}', 'no "instances" field'),
        (b'{"instances": {"a": 1}}', '"instances" must be an array, not an object'),
        (b'{"instances": "abc"}', "not a string"),
    ],
)
def test_a_body_that_is_not_instances_is_bad_input_saying_why(body: bytes, says: str) -> None:
    with pytest.raises(ServeError, match=says) as caught:
        instances_of(body)
    assert caught.value.kind is ErrorKind.BAD_INPUT


def test_instances_and_the_answer_body() -> None:
    assert instances_of(memoryview(b'{"instances": [[1, 2], {"a": "b"}], "x": 1}')) == [
        [1, 2],
        {"a": "b"},
    ]
    assert instances_of(b'{"instances": []}') == []
    assert json.loads(answer_body("predictions", [b"1", b'{"a":[2]}'])) == {
        "predictions": [1, {"a": [2]}]
    }
    assert json.loads(answer_body("explanations", [])) == {"explanations": []}


def test_each_instance_is_a_row_and_predictions_come_back_in_order() -> None:
    seen: list[Any] = []

    def handler(data: list[Any], context: Any) -> list[Any]:
        seen.extend(data)
        return [
            {"n": row, "explain": context.get_request_header(i, "explain")}
            if isinstance(row, int)
            else row["body"].decode()
            for i, row in enumerate(data)
        ]

    items = [
        v1_item("a", {"instances": [1, 2, 3]}),
        WorkItem("b", [], [Param("body", b"plain")]),
        v1_item("c", {"instances": [4]}, explain=True),
        v1_item("d", {"instances": []}),
    ]
    reply = run(items, handler)
    assert seen == [1, 2, 3, {"body": b"plain"}, 4]
    answers = {r.request_id: bytes(r.body) for r in reply.replies}
    assert set(answers) == {"a", "b", "c", "d"}
    assert answers["b"] == b"plain"
    got = {k: json.loads(v) for k, v in answers.items() if k != "b"}
    assert got["a"] == {
        "predictions": [{"n": n, "explain": "False"} for n in (1, 2, 3)],
    }
    assert got["c"] == {"explanations": [{"n": 4, "explain": "True"}]}
    assert got["d"] == {"predictions": []}
    for r in reply.replies:
        assert V1_HEADER not in r.headers


def test_tensors_and_arrays_become_json_and_other_answers_fail_their_request() -> None:
    def handler(data: list[Any], context: Any) -> list[Any]:
        return [
            torch.tensor([row, row * 2]) if row == 1 else np.float32(row) if row == 2 else object()
            for row in data
        ]

    reply = run([v1_item("ok", {"instances": [1, 2]}), v1_item("bad", {"instances": [3]})], handler)
    by_id = {r.request_id: r for r in reply.replies}
    assert json.loads(bytes(by_id["ok"].body)) == {"predictions": [[1, 2], 2.0]}
    assert by_id["bad"].status == 500
    assert b"prediction 2 is not JSON" in bytes(by_id["bad"].body)


def test_v1_and_oip_requests_batch_together() -> None:
    def handler(data: list[Any], context: Any) -> list[Any]:
        return [row["data"] if isinstance(row, dict) else row * 10 for row in data]

    oip_request = WorkItem(
        "o", [(OIP_HEADER, "1")], [tensor_param(Tensor.from_values("x", "INT64", [2], [5, 6]))]
    )
    reply = run([v1_item("v", {"instances": [1, 2]}), oip_request], handler)
    by_id = {r.request_id: r for r in reply.replies}
    assert json.loads(bytes(by_id["v"].body)) == {"predictions": [10, 20]}
    outputs = reply_outputs(by_id["o"].headers, by_id["o"].body)
    assert [(t.name, t.to_list()) for t in outputs] == [("x", [5, 6])]


def test_a_malformed_body_fails_the_batch_with_400_and_a_handler_error_passes_through() -> None:
    reply = run([v1_item("a", b"[]")], lambda data, context: data)
    assert (reply.code, reply.replies) == (400, [])
    assert "JSON object" in reply.message

    def failing(data: list[Any], context: Any) -> list[Any]:
        raise ValueError("boom")

    assert run([v1_item("a", {"instances": [1]})], failing).code >= 500


def test_which_runner_a_batch_gets() -> None:
    v1 = v1_item("a", {"instances": [1]})
    plain = WorkItem("b", [], [Param("body", b"x")])
    oip_request = WorkItem("o", [(OIP_HEADER, "1")], [])
    for items, envelope in (([plain, v1], None), ([v1], "body"), ([v1], "kservev2")):
        # run_batch, holding the bodies to the worker's limits (the defaults here)
        runner = kserve.rows_runner(items, envelope)
        assert isinstance(runner, functools.partial) and runner.func is kserve.run_batch
        assert runner.keywords == {"limits": DEFAULT_LIMITS}
    # The model's own envelope reads {"instances"}: v1 requests go to it as they are.
    assert kserve.rows_runner([v1], "kserve") is None
    assert kserve.rows_runner([v1], "json") is None
    assert kserve.rows_runner([v1, oip_request], "kserve") is oip.run_batch
    assert kserve.rows_runner([plain, oip_request], None) is oip.run_batch
    assert kserve.rows_runner([plain], None) is None
