"""REST inference request parsing: the JSON envelope, the binary tensor data extension and
raw binary requests."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.oip import (
    InferRequest,
    RequestedOutput,
    Tensor,
    TensorMeta,
    parse_header_length,
    parse_infer_request,
    raw_request,
)


@contextmanager
def refused(message: str) -> Iterator[pytest.ExceptionInfo[ServeError]]:
    """Expects a BAD_INPUT ServeError whose message contains ``message``."""
    with pytest.raises(ServeError, match=re.escape(message)) as caught:
        yield caught
    assert caught.value.kind is ErrorKind.BAD_INPUT


def binary_body(document: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    header = json.dumps(document).encode()
    return header + b"".join(blobs), len(header)


def parse_json(document: Any) -> InferRequest:
    return parse_infer_request(json.dumps(document).encode(), header_length=None)


# --- JSON requests -----------------------------------------------------------------------


def test_json_request() -> None:
    request = parse_json(
        {
            "id": "42",
            "parameters": {"binary_data_output": True, "priority": 2, "note": "x"},
            "inputs": [
                {"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
                {
                    "name": "b",
                    "shape": [1],
                    "datatype": "BYTES",
                    "data": ["hi"],
                    "parameters": {"content_type": "str"},
                },
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}, {"name": "z"}],
            "extra_field": "ignored",
        }
    )
    assert request.id == "42"
    assert request.parameters == {"binary_data_output": True, "priority": 2, "note": "x"}
    assert request.binary_default is True and request.raw is False
    a, b = request.inputs
    assert a == Tensor.from_values("a", "FP32", [2, 2], [1.0, 2.0, 3.0, 4.0])
    assert b.to_json() == ["hi"] and b.parameters == {"content_type": "str"}
    assert request.outputs == [
        RequestedOutput("y", {"binary_data": False}),
        RequestedOutput("z", {}),
    ]
    assert [o.binary_data for o in request.outputs] == [False, None]


def test_minimal_request_defaults() -> None:
    request = parse_json({"inputs": []})
    assert request == InferRequest([], [], None, {}, raw=False)
    assert request.binary_default is False


def test_body_may_be_a_memoryview_or_bytearray() -> None:
    body = json.dumps(
        {"inputs": [{"name": "a", "shape": [1], "datatype": "INT8", "data": [1]}]}
    ).encode()
    for given in (memoryview(body), bytearray(body)):
        assert parse_infer_request(given, header_length=None).inputs[0].to_list() == [1]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": [', "malformed JSON: EOF while parsing a list at line 1 column 12"),
        (b"\xff\xfe", "malformed JSON: "),
        (b"", "malformed JSON: EOF while parsing a value"),
        (b"[]", "the request body must be a JSON object"),
        (b'"x"', "the request body must be a JSON object"),
        (b"{}", "invalid inference request: inputs is required"),
        (b'{"inputs": {}}', "invalid inference request: inputs must be an array"),
        (b'{"inputs": [1]}', "invalid inference request: inputs[0] must be an object"),
        (
            b'{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}',
            "invalid inference request: inputs[0].name is required",
        ),
        (
            b'{"inputs": [{"name": "a", "datatype": "FP32", "data": [1]}]}',
            "invalid inference request: inputs[0].shape is required",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "data": [1]}]}',
            "invalid inference request: inputs[0].datatype is required",
        ),
        (
            b'{"inputs": [{"name": "a"}]}',
            "invalid inference request: inputs[0].shape is required (and 1 more problem)",
        ),
        (
            b'{"inputs": [{"name": 1, "shape": [1], "datatype": "FP32", "data": [1]}]}',
            "invalid inference request: inputs[0].name must be a string",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1, "2"], "datatype": "FP32", "data": [1]}]}',
            "invalid inference request: inputs[0].shape[1] must be an integer",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1.0], "datatype": "FP32", "data": [1]}]}',
            "invalid inference request: inputs[0].shape[0] must be an integer",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": 1, "datatype": "FP32", "data": [1]}]}',
            "invalid inference request: inputs[0].shape must be an array",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": 5, "data": [1]}]}',
            "invalid inference request: inputs[0].datatype must be a string",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1],'
            b' "parameters": []}]}',
            "invalid inference request: inputs[0].parameters must be an object",
        ),
        (
            b'{"inputs": [], "parameters": {"x": [1]}}',
            "invalid inference request: parameters.x must be a string, number or boolean",
        ),
        (
            b'{"inputs": [], "parameters": {"x": {"y": 1}}}',
            "invalid inference request: parameters.x must be a string, number or boolean",
        ),
        (b'{"inputs": [], "id": 7}', "invalid inference request: id must be a string"),
        (
            b'{"inputs": [], "outputs": [{"parameters": {}}]}',
            "invalid inference request: outputs[0].name is required",
        ),
    ],
)
def test_envelope_errors_name_the_field(body: bytes, message: str) -> None:
    with refused(message) as caught:
        parse_infer_request(body, header_length=None)
    assert "[{" not in caught.value.message and "type=" not in caught.value.message


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32"}]},
            "input 'a' has no data: give data, or parameters.binary_data_size",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": None}]},
            "input 'a' has no data",
        ),
        (
            {"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "data": [1]}]},
            "input 'a': shape [2] needs 2 elements but data has 1",
        ),
        (
            {"inputs": [{"name": "a", "shape": [-1], "datatype": "FP32", "data": [1]}]},
            "input 'a': shape [-1] has a negative dimension (-1)",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "FLOAT", "data": [1]}]},
            "input 'a': unknown datatype 'FLOAT'; valid datatypes: BOOL,",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1], "datatype": "UINT8", "data": [[300]]}]},
            "input 'a': data element 0 is 300, not in range (0..255) for UINT8",
        ),
        (
            {
                "inputs": [
                    {"name": "a", "shape": [1], "datatype": "INT8", "data": [1]},
                    {"name": "a", "shape": [1], "datatype": "INT8", "data": [2]},
                ]
            },
            "input 'a' is given more than once",
        ),
        (
            {"inputs": [], "outputs": [{"name": "y"}, {"name": "y"}]},
            "requested output 'y' is given more than once",
        ),
        (
            {"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": 1}}]},
            "output 'y': parameters.binary_data must be a boolean, not 1",
        ),
        (
            {"inputs": [], "parameters": {"binary_data_output": "yes"}},
            "parameters.binary_data_output must be a boolean, not 'yes'",
        ),
    ],
)
def test_input_errors_name_the_input(document: dict[str, Any], message: str) -> None:
    with refused(message):
        parse_json(document)


# --- the binary tensor data extension ----------------------------------------------------


def test_two_binary_inputs_and_one_json_input() -> None:
    floats = struct.pack("<3f", 1.5, 2.5, 3.5)
    strings = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    body, length = binary_body(
        {
            "inputs": [
                {
                    "name": "f",
                    "shape": [3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(floats), "keep": "me"},
                },
                {"name": "j", "shape": [2], "datatype": "INT64", "data": [7, 8]},
                {
                    "name": "s",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(strings)},
                },
            ],
            "outputs": [{"name": "out", "parameters": {"binary_data": True}}],
        },
        floats,
        strings,
    )
    request = parse_infer_request(body, header_length=length)
    f, j, s = request.inputs
    assert f.to_list() == [1.5, 2.5, 3.5] and f.parameters == {"keep": "me"}
    assert j.to_list() == [7, 8] and j.parameters == {}
    assert s.to_list() == [b"hi", b""] and s.parameters == {}
    assert bytes(f.raw) == floats and bytes(s.raw) == strings
    assert f.raw.obj is body  # a view of the body, not a copy
    assert request.outputs[0].binary_data is True


def test_binary_input_of_zero_bytes() -> None:
    body, length = binary_body(
        {
            "inputs": [
                {
                    "name": "e",
                    "shape": [0],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 0},
                },
                {
                    "name": "x",
                    "shape": [1],
                    "datatype": "INT8",
                    "parameters": {"binary_data_size": 1},
                },
            ]
        },
        b"\x05",
    )
    empty, x = parse_infer_request(body, header_length=length).inputs
    assert empty.to_list() == [] and x.to_list() == [5]


def two_inputs(size_a: Any, size_b: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "a",
                "shape": [2],
                "datatype": "INT16",
                "parameters": {"binary_data_size": size_a},
            },
            {
                "name": "b",
                "shape": [1],
                "datatype": "INT32",
                "parameters": {"binary_data_size": size_b},
            },
        ]
    }


def test_sizes_that_do_not_add_up() -> None:
    body, length = binary_body(two_inputs(4, 4), bytes(10))
    with refused(
        "the inputs' parameters.binary_data_size add up to 8 bytes but 10 bytes follow the "
        f"JSON header (Inference-Header-Content-Length: {length})"
    ):
        parse_infer_request(body, header_length=length)
    body, length = binary_body(two_inputs(4, 4), bytes(6))
    with refused("add up to 8 bytes but 6 bytes follow the JSON header"):
        parse_infer_request(body, header_length=length)


def test_blob_that_does_not_fit_its_input() -> None:
    body, length = binary_body(two_inputs(2, 6), bytes(8))
    with refused(
        "input 'a': shape [2] of INT16 needs 4 bytes (2 elements of 2) but the data has 2"
    ):
        parse_infer_request(body, header_length=length)


def test_binary_data_after_json_without_the_header() -> None:
    body, _ = binary_body(two_inputs(4, 4), bytes(8))
    with refused("malformed JSON: trailing characters") as caught:
        parse_infer_request(body, header_length=None)
    assert "needs the Inference-Header-Content-Length header" in caught.value.message
    header_only = json.dumps(two_inputs(4, 4)).encode()
    with refused(
        "add up to 8 bytes but no Inference-Header-Content-Length header was sent, so no "
        "binary data follows the JSON"
    ):
        parse_infer_request(header_only, header_length=None)


def test_header_length_must_fit_the_body() -> None:
    with refused("Inference-Header-Content-Length is 99 but the body has 10 bytes"):
        parse_infer_request(bytes(10), header_length=99)
    with refused("Inference-Header-Content-Length is -1"):
        parse_infer_request(bytes(10), header_length=-1)
    body, length = binary_body(two_inputs(4, 4), bytes(8))
    with refused("malformed JSON"):
        parse_infer_request(body, header_length=length - 1)


@pytest.mark.parametrize("size", [-1, 1.5, True, "4"])
def test_binary_data_size_must_be_a_non_negative_integer(size: Any) -> None:
    body, length = binary_body(two_inputs(size, 4), bytes(8))
    with refused("input 'a': parameters.binary_data_size must be a non-negative integer"):
        parse_infer_request(body, header_length=length)


def test_binary_input_may_not_carry_data_too() -> None:
    document = two_inputs(4, 4)
    document["inputs"][0]["data"] = [1, 2]
    body, length = binary_body(document, bytes(8))
    with refused("input 'a' has both data and parameters.binary_data_size; give one of them"):
        parse_infer_request(body, header_length=length)


def test_parse_header_length() -> None:
    assert parse_header_length(None) is None
    assert parse_header_length("0") == 0
    assert parse_header_length(" 123 ") == 123
    for bad in ("", "-1", "1.5", "abc", "١٢"):
        with refused("Inference-Header-Content-Length must be a non-negative integer"):
            parse_header_length(bad)


def test_raw_request_is_not_parsed_without_the_model() -> None:
    with pytest.raises(ValueError, match="raw_request"):
        parse_infer_request(b"\0\0\0\0", header_length=0)


# --- raw binary requests -----------------------------------------------------------------


def test_raw_request_with_fixed_shape() -> None:
    body = struct.pack("<4f", 1, 2, 3, 4)
    request = raw_request(body, [TensorMeta("x", "FP32", (2, 2))])
    assert request.raw is True and request.binary_default is True
    assert request.outputs == [] and request.id is None
    (tensor,) = request.inputs
    assert tensor.name == "x" and tensor.shape == (2, 2) and tensor.to_list() == [1, 2, 3, 4]
    assert tensor.raw.obj is body


@pytest.mark.parametrize(
    ("shape", "size", "resolved"),
    [
        ((-1,), 12, (3,)),
        ((-1, 3), 24, (2, 3)),
        ((2, -1), 24, (2, 3)),
        ((-1, -1, 3), 24, (1, 2, 3)),  # a batch of one, then the variable dimension
        ((-1,), 0, (0,)),
    ],
)
def test_raw_request_derives_the_variable_dimension(
    shape: tuple[int, ...], size: int, resolved: tuple[int, ...]
) -> None:
    request = raw_request(bytes(size), [TensorMeta("x", "FP32", shape)])
    assert request.inputs[0].shape == resolved


def test_raw_request_bytes_input_is_one_element() -> None:
    request = raw_request(b"\x89PNG...", [TensorMeta("image", "BYTES", (-1,))])
    (tensor,) = request.inputs
    assert tensor.shape == (1,) and tensor.to_list() == [b"\x89PNG..."]
    assert raw_request(b"", [TensorMeta("t", "BYTES", (1, 1))]).inputs[0].to_list() == [b""]


@pytest.mark.parametrize(
    ("inputs", "size", "message"),
    [
        ([], 4, "needs a model with exactly one input; this model has 0"),
        (
            [TensorMeta("a", "FP32", (1,)), TensorMeta("b", "FP32", (1,))],
            4,
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
            "exactly one input; this model has 2",
        ),
        ([TensorMeta("a", "FP32", (-1, -1, -1))], 8, "at most one variable dimension"),
        ([TensorMeta("a", "FP32", (3, -1, -1))], 8, "at most one variable dimension"),
        (
            [TensorMeta("a", "FP32", (-1, 3))],
            20,
            "the body's 20 bytes do not fill input 'a' of shape [-1, 3] (FP32) with whole "
            "12-byte slices",
        ),
        ([TensorMeta("a", "FP32", (0, -1))], 0, "with whole 0-byte slices"),
        ([TensorMeta("a", "FP32", (2,))], 4, "input 'a': shape [2] of FP32 needs 8 bytes"),
        ([TensorMeta("a", "BYTES", (2,))], 4, "can fill a BYTES input only when its shape holds"),
        ([TensorMeta("a", "COMPLEX", (2,))], 4, "input 'a': unknown datatype 'COMPLEX'"),
    ],
)
def test_raw_request_refusals(inputs: list[TensorMeta], size: int, message: str) -> None:
    with refused(message):
        raw_request(bytes(size), inputs)
