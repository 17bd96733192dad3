"""The REST request envelope as MLServer's clients send it (``null`` for every unset optional
field), bodies nested too deep, and messages that quote a client's long names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip import RequestedOutput, Tensor, parse_infer_request

# What MLServer 1.7.1's own types give, verbatim: ``InferenceRequest(inputs=[StringCodec.
# encode_input("prompt", ["hi"], use_bytes=False), NumpyCodec.encode_input("x", ...)],
# outputs=[RequestOutput(name="out")]).dict()`` (the documented client posts exactly this).
MLSERVER_DICT = (
    '{"id": null, "parameters": null, "inputs": [{"name": "prompt", "shape": [1, 1], '
    '"datatype": "BYTES", "parameters": {"content_type": "str", "headers": null}, '
    '"data": ["hi"]}, {"name": "x", "shape": [2, 1], "datatype": "FP64", "parameters": '
    '{"content_type": "np", "headers": null}, "data": [1.0, 2.0]}], "outputs": '
    '[{"name": "out", "parameters": null}]}'
)
# ... and ``.model_dump()`` (or ``.dict(exclude_none=True)``) of the same request.
MLSERVER_DUMP = (
    '{"inputs": [{"name": "prompt", "shape": [1, 1], "datatype": "BYTES", "parameters": '
    '{"content_type": "str"}, "data": ["hi"]}, {"name": "x", "shape": [2, 1], "datatype": '
    '"FP64", "parameters": {"content_type": "np"}, "data": [1.0, 2.0]}], "outputs": '
    '[{"name": "out"}]}'
)


def parse(body: str | bytes) -> Any:
    text = body.encode() if isinstance(body, str) else body
    return parse_infer_request(text, header_length=None)


def refusal(body: Any) -> str:
    with pytest.raises(ServeError) as caught:
        parse(json.dumps(body))
    assert caught.value.kind is ErrorKind.BAD_INPUT
    return caught.value.message


def test_mlserver_nulls_read_as_absent() -> None:
    with_nulls, without = parse(MLSERVER_DICT), parse(MLSERVER_DUMP)
    assert with_nulls == without
    assert with_nulls.id is None and with_nulls.parameters == {}
    prompt, x = with_nulls.inputs
    assert prompt == Tensor.from_values("prompt", "BYTES", [1, 1], ["hi"], {"content_type": "str"})
    assert x.parameters == {"content_type": "np"} and x.to_list() == [1.0, 2.0]
    assert with_nulls.outputs == [RequestedOutput("out", {})]


def test_a_null_parameter_is_dropped_and_the_others_kept() -> None:
    request = parse(
        json.dumps(
            {
                "parameters": {"content_type": None, "headers": None, "custom": 3},
                "inputs": [
                    {"name": "a", "shape": [1], "datatype": "INT8", "data": [1],
                     "parameters": {"binary_data_size": None}},
                ],
                "outputs": [{"name": "o", "parameters": {"binary_data": None}}],
            }
        )
    )  # fmt: skip
    assert request.parameters == {"custom": 3}
    assert request.inputs[0].parameters == {} and request.inputs[0].to_list() == [1]
    assert request.outputs == [RequestedOutput("o", {})]
    assert request.outputs[0].binary_data is None


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"id": 5, "inputs": []}, "id must be a string"),
        ({"parameters": "x", "inputs": []}, "parameters must be an object"),
        ({"parameters": {"headers": {}}, "inputs": []}, "parameters.headers must be a string"),
        ({"parameters": {"h": [None]}, "inputs": []}, "parameters.h must be a string"),
        ({"inputs": None}, "inputs must be an array"),
        ({"inputs": [None]}, "inputs[0] must be an object"),
        (
            {"inputs": [{"name": None, "shape": [1], "datatype": "INT8", "data": [1]}]},
            "inputs[0].name must be a string",
        ),
        (
            {"inputs": [{"name": "a", "shape": None, "datatype": "INT8", "data": [1]}]},
            "inputs[0].shape must be an array",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": None, "data": [1]}]},
            "inputs[0].datatype must be a string",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "INT8", "data": None}]},
            "input 'a' has no data",
        ),
        ({"inputs": [], "outputs": [{"name": None}]}, "outputs[0].name must be a string"),
        ({"inputs": [], "outputs": [None]}, "outputs[0] must be an object"),
    ],
)
def test_null_where_a_value_is_required_and_wrong_types_are_still_refused(
    body: dict[str, Any], says: str
) -> None:
    assert says in refusal(body)


def test_a_body_nested_too_deep_is_refused_naming_the_limit() -> None:
    deep = '{"inputs": [{"name": "a", "shape": [1], "datatype": "BYTES", "data": '
    deep += "[" * 100_000 + "]" * 100_000 + "}]}"
    with pytest.raises(ServeError, match="malformed JSON: nested deeper than 200 levels"):
        parse(deep)


def test_a_long_name_or_key_is_quoted_as_a_prefix_and_its_length() -> None:
    big = "n" * (1 << 20)
    cases = [
        {"inputs": [{"name": big, "shape": [1], "datatype": "XX", "data": [1]}]},
        {"inputs": [{"name": "a", "shape": [1], "datatype": big, "data": [1]}]},
        {"inputs": [{"name": big, "shape": [2], "datatype": "INT32", "data": [1]}]},
        {"inputs": [{"name": "a", "shape": [1], "datatype": "INT8", "data": [1],
                     "parameters": {big: [1]}}]},
        {"inputs": [{"name": "a", "shape": [1], "datatype": "INT8", "data": [1],
                     "parameters": {"binary_data_size": big}}]},
        {"inputs": [], "outputs": [{"name": big, "parameters": {"binary_data": 1}}]},
        {"inputs": [], "outputs": [{"name": big}, {"name": big}]},
    ]  # fmt: skip
    for body in cases:
        message = refusal(body)
        assert len(message) < 400, message[:400]
        assert f"'{'n' * 64}'... (1048576 characters)" in message
