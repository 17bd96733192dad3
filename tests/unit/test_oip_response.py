"""REST inference response encoding and OIP error bodies."""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip import (
    RequestedOutput,
    Tensor,
    encode_infer_response,
    error_body,
    parse_infer_request,
)


@contextmanager
def refused(message: str) -> Iterator[pytest.ExceptionInfo[ServeError]]:
    with pytest.raises(ServeError, match=re.escape(message)) as caught:
        yield caught
    assert caught.value.kind is ErrorKind.BAD_INPUT


def encode(
    outputs: list[Tensor],
    requested: list[RequestedOutput] | None = None,
    *,
    binary_default: bool = False,
    model_version: str | None = "1",
    id: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    return encode_infer_response(
        model_name="m",
        model_version=model_version,
        id=id,
        parameters=parameters,
        outputs=outputs,
        requested=requested or [],
        binary_default=binary_default,
    )


def decode(body: bytes, header_length: int | None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """What a client does with a response: the JSON, and every output as a Tensor."""
    header = json.loads(body if header_length is None else body[:header_length])
    offset = len(body) if header_length is None else header_length
    tensors = {}
    for out in header["outputs"]:
        parameters = dict(out.get("parameters", {}))
        size = parameters.pop("binary_data_size", None)
        name, datatype, shape = out["name"], out["datatype"], out["shape"]
        if size is None:
            tensors[name] = Tensor.from_values(name, datatype, shape, out["data"], parameters)
        else:
            blob = body[offset : offset + size]
            offset += size
            tensors[name] = Tensor.from_raw(name, datatype, shape, blob, parameters)
    assert offset == len(body)
    return header, tensors


A = Tensor.from_values("a", "FP32", [2, 2], [1.5, 2.5, 3.5, 4.5])
B = Tensor.from_values("b", "BYTES", [2], ["x", ""])
C = Tensor.from_values("c", "INT8", [3], [1, -2, 3], {"unit": "count"})


def test_all_json_by_default() -> None:
    body, length = encode([A, B, C], id="r1", parameters={"sequence_end": True})
    assert length is None
    assert json.loads(body) == {
        "model_name": "m",
        "model_version": "1",
        "id": "r1",
        "parameters": {"sequence_end": True},
        "outputs": [
            {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [1.5, 2.5, 3.5, 4.5]},
            {"name": "b", "datatype": "BYTES", "shape": [2], "data": ["x", ""]},
            {
                "name": "c",
                "datatype": "INT8",
                "shape": [3],
                "parameters": {"unit": "count"},
                "data": [1, -2, 3],
            },
        ],
    }


def test_version_id_and_parameters_are_left_out_when_absent() -> None:
    body, _ = encode([A], model_version=None, id=None, parameters={})
    assert list(json.loads(body)) == ["model_name", "outputs"]
    assert json.loads(encode([], model_version=None)[0]) == {"model_name": "m", "outputs": []}


def test_mixed_binary_and_json_outputs_with_selection() -> None:
    requested = [
        RequestedOutput("c", {"binary_data": False}),
        RequestedOutput("a", {"binary_data": True}),
        RequestedOutput("b", {}),
    ]
    body, length = encode([A, B, C], requested, binary_default=True)
    assert length is not None
    header = json.loads(body[:length])
    assert [o["name"] for o in header["outputs"]] == ["c", "a", "b"]
    c, a, b = header["outputs"]
    assert c == {
        "name": "c",
        "datatype": "INT8",
        "shape": [3],
        "parameters": {"unit": "count"},
        "data": [1, -2, 3],
    }
    assert a == {
        "name": "a",
        "datatype": "FP32",
        "shape": [2, 2],
        "parameters": {"binary_data_size": 16},
    }
    assert b["parameters"] == {"binary_data_size": len(B.raw)} and "data" not in b
    assert body[length:] == bytes(A.raw) + bytes(B.raw)
    _, tensors = decode(body, length)
    assert tensors == {"a": A, "b": B, "c": C}


def test_selection_leaves_out_outputs_not_requested() -> None:
    body, length = encode([A, B, C], [RequestedOutput("b")])
    assert length is None
    assert [o["name"] for o in json.loads(body)["outputs"]] == ["b"]


def test_output_choice_overrides_the_request_default() -> None:
    body, length = encode(
        [A, C], [RequestedOutput("a", {"binary_data": True}), RequestedOutput("c")]
    )
    header, tensors = decode(body, length)
    assert "data" not in header["outputs"][0] and header["outputs"][1]["data"] == [1, -2, 3]
    assert tensors["a"] == A

    body, length = encode(
        [A, C], [RequestedOutput("a", {"binary_data": False})], binary_default=True
    )
    assert length is None and json.loads(body)["outputs"][0]["data"] == [1.5, 2.5, 3.5, 4.5]


def test_binary_default_applies_to_every_output_when_none_are_requested() -> None:
    body, length = encode([A, B, C], binary_default=True)
    header, tensors = decode(body, length)
    assert all("data" not in o for o in header["outputs"])
    assert header["outputs"][2]["parameters"] == {"unit": "count", "binary_data_size": 3}
    assert tensors == {"a": A, "b": B, "c": C}


def test_binary_output_of_zero_bytes_still_sets_the_header_length() -> None:
    empty = Tensor.from_values("e", "FP32", [0], [])
    body, length = encode([empty], binary_default=True)
    assert length == len(body)
    assert json.loads(body)["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_unknown_requested_output_is_named() -> None:
    with refused("requested output 'nope' is not an output of the model (its outputs: 'a', 'c')"):
        encode([A, C], [RequestedOutput("a"), RequestedOutput("nope")])


def test_non_utf8_bytes_output() -> None:
    weird = Tensor.from_values("w", "BYTES", [1], [b"\xff"])
    with refused("output 'w': BYTES element 0 is not valid UTF-8"):
        encode([weird])
    body, length = encode([weird], [RequestedOutput("w", {"binary_data": True})])
    assert decode(body, length)[1]["w"].to_list() == [b"\xff"]


def test_half_precision_outputs_in_json_are_numbers() -> None:
    half = Tensor.from_raw("h", "FP16", [2], struct.pack("<2e", 0.5, -2.0))
    brain = Tensor.from_raw("g", "BF16", [2], struct.pack("<2H", 0x3F80, 0xC040))
    outputs = json.loads(encode([half, brain])[0])["outputs"]
    assert [o["data"] for o in outputs] == [[0.5, -2.0], [1.0, -3.0]]


def test_nan_and_infinity_in_json_outputs() -> None:
    special = Tensor.from_values("s", "FP64", [3], [math.nan, math.inf, -math.inf])
    body, _ = encode([special])
    assert b"[NaN,Infinity,-Infinity]" in body
    data = json.loads(body)["outputs"][0]["data"]
    assert math.isnan(data[0]) and data[1:] == [math.inf, -math.inf]


def test_floats_survive_json_exactly() -> None:
    values = [0.1, 1 / 3, 1e-310, 1.7976931348623157e308, -0.0]
    body, _ = encode([Tensor.from_values("f", "FP64", [5], values)])
    assert json.loads(body)["outputs"][0]["data"] == values


def test_lone_surrogate_in_parameters_still_encodes() -> None:
    body, _ = encode([], parameters={"note": "\ud800"})
    assert json.loads(body)["parameters"] == {"note": "\ud800"}


def test_request_to_response_round_trip() -> None:
    """A request parsed from the wire, echoed back as the response, reads the same."""
    raw = struct.pack("<2d", 1.25, -7.0)
    header = json.dumps(
        {
            "id": "abc",
            "parameters": {"binary_data_output": True},
            "inputs": [
                {
                    "name": "x",
                    "shape": [2],
                    "datatype": "FP64",
                    "parameters": {"binary_data_size": 16},
                },
                {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["héllo"]},
            ],
            "outputs": [{"name": "t", "parameters": {"binary_data": False}}, {"name": "x"}],
        }
    ).encode()
    request = parse_infer_request(header + raw, header_length=len(header))
    body, length = encode_infer_response(
        model_name="echo",
        model_version=None,
        id=request.id,
        parameters=None,
        outputs=request.inputs,
        requested=request.outputs,
        binary_default=request.binary_default,
    )
    document, tensors = decode(body, length)
    assert document["id"] == "abc" and document["model_name"] == "echo"
    assert [o["name"] for o in document["outputs"]] == ["t", "x"]
    assert document["outputs"][0]["data"] == ["héllo"]
    assert tensors["x"].to_list() == [1.25, -7.0] and body[length:] == raw


def test_error_body() -> None:
    assert error_body("boom") == b'{"error":"boom"}'
    message = 'input "x": naïve \\ value'
    assert json.loads(error_body(message)) == {"error": message}
