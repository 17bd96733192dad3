"""Request envelopes around a handler's entry point: ``kserve`` (v1) and ``kservev2``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trioserve.worker.torchserve import envelopes
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.metrics import MetricsCache


def batch(*headers: dict[str, str]) -> Context:
    context = Context("tiny", str(Path.cwd()), None, 4, None, "0.12.0", metrics=MetricsCache("t"))
    context.begin_batch([f"r{i}" for i in range(len(headers))], [dict(h) for h in headers])
    return context


def doubling(seen: list[Any]) -> Any:
    def entry(data: Any, context: Any) -> Any:
        seen.append(data)
        if data is None:
            return None
        return [2 * row if isinstance(row, int) else row for row in data]

    return entry


def test_kserve_answers_predictions_or_explanations_per_request() -> None:
    seen: list[Any] = []
    entry = envelopes.wrap("kserve", doubling(seen))
    context = batch({"explain": "False"}, {"explain": "True"})
    rows = [{"body": b'{"instances": [1, 2]}'}, {"data": {"instances": [3]}}]
    assert entry(rows, context) == [{"predictions": [2, 4]}, {"explanations": [6]}]
    assert seen == [[1, 2, 3]]  # every request of the batch (TorchServe's: the first only)


def v2(inputs: list[dict[str, Any]], request_id: str | None = None) -> bytes:
    body: dict[str, Any] = {"inputs": inputs}
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body).encode()


def test_kservev2_gives_one_row_per_input_and_names_outputs_after_them() -> None:
    seen: list[Any] = []

    def entry(data: Any, context: Any) -> Any:
        seen.append(data)
        return [
            sum(sum(r) for r in row["data"]) if row["datatype"] == "INT32" else "hi" for row in data
        ]

    wrapped = envelopes.wrap("kservev2", entry)
    first = v2(
        [
            {"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]},
            {"name": "b", "shape": [1], "datatype": "BYTES", "data": ["x"]},
        ],
        request_id="mine",
    )
    second = v2([{"name": "c", "shape": [1, 1], "datatype": "INT32", "data": [5]}])
    answers = wrapped([{"body": first}, {"body": second}], batch({}, {}))
    assert seen[0] == [
        {"name": "a", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]},
        {"name": "b", "shape": [1], "datatype": "BYTES", "data": ["x"]},
        {"name": "c", "shape": [1, 1], "datatype": "INT32", "data": [[5]]},
    ]
    assert answers == [
        {
            "id": "mine",
            "model_name": "tiny",
            "outputs": [
                {"name": "a", "shape": [1], "datatype": "INT64", "data": [10]},
                {"name": "b", "shape": [1], "datatype": "BYTES", "data": ["hi"]},
            ],
        },
        {
            "id": "r1",  # no id in the request: the server's request id
            "model_name": "tiny",
            "outputs": [{"name": "c", "shape": [1], "datatype": "INT64", "data": [5]}],
        },
    ]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "request 0: "),
        (v2([{"name": "a", "shape": [2], "datatype": "INT32", "data": [1]}]), "request 0: "),
        (b'{"inputs": "nope"}', "inputs"),
    ],
)
def test_kservev2_bad_request_is_a_400_naming_it(body: bytes, says: str) -> None:
    wrapped = envelopes.wrap("kservev2", doubling([]))
    with pytest.raises(PredictionException, match=says) as info:
        wrapped([{"body": body}], batch({}))
    assert info.value.error_code == 400


def test_kservev2_answer_that_is_no_tensor_is_a_500_saying_so() -> None:
    wrapped = envelopes.wrap("kservev2", lambda data, context: [2**70])  # past INT64
    body = v2([{"name": "a", "shape": [1], "datatype": "INT32", "data": [1]}])
    with pytest.raises(PredictionException, match="not a valid output") as info:
        wrapped([{"body": body}], batch({}))
    assert info.value.error_code == 500


def test_torchserves_envelope_classes_import_and_run() -> None:
    import importlib

    from trioserve.worker.torchserve import ts_shim

    ts_shim.install()
    base = importlib.import_module("ts.torch_handler.request_envelope.base")
    json_module = importlib.import_module("ts.torch_handler.request_envelope.json")

    class Upper(base.BaseEnvelope):  # a custom envelope written against TorchServe's API
        def parse_input(self, data: Any) -> Any:
            return [row["body"].upper() for row in data]

        def format_output(self, data: Any) -> Any:
            return [{"out": item} for item in data]

    echo = lambda data, context: data  # noqa: E731
    assert Upper(echo).handle([{"body": "a"}, {"body": "b"}], batch({}, {})) == [
        {"out": "A"},
        {"out": "B"},
    ]
    wrapped = json_module.JSONEnvelope(lambda data, context: [2 * x for x in data])
    assert wrapped.handle([{"body": b'{"instances": [1, 2]}'}], batch({})) == [
        {"predictions": [2, 4]}
    ]
