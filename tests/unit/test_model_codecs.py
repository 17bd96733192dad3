"""trioserve.model's codecs, MLModel helpers and get_model_uri behave as mlserver 1.7.1's.

The expected values were taken from mlserver 1.7.1 (running the same calls against the
real package); they are literals here so the tests do not need mlserver.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trioserve.model import MLModel
from trioserve.model.codecs import (
    Base64Codec,
    CodecError,
    CodecNotFound,
    DatetimeCodec,
    NumpyCodec,
    NumpyRequestCodec,
    StringCodec,
    StringRequestCodec,
    decode_args,
    decode_inference_request,
    encode_inference_response,
    encode_response_output,
    find_input_codec,
    find_request_codec,
    get_decoded,
    get_decoded_or_raw,
    has_decoded,
)
from trioserve.model.codecs.errors import InputsNotFound
from trioserve.model.errors import InvalidModelURI
from trioserve.model.settings import ModelParameters, ModelSettings
from trioserve.model.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
    TensorData,
)
from trioserve.model.utils import get_model_uri


def _input(name: str, shape: list[int], datatype: str, data: Any) -> RequestInput:
    return RequestInput.model_validate(
        {"name": name, "shape": shape, "datatype": datatype, "data": data}
    )


# From mlserver 1.7.1: (payload, NumpyCodec.encode_output("x", payload).model_dump()).
NUMPY_OUTPUTS = [
    (np.array([[1, 2]]), {"shape": [1, 2], "datatype": "INT64", "data": [1, 2]}),
    (
        np.array([1.5, np.nan], dtype=np.float32),
        {"shape": [2, 1], "datatype": "FP32", "data": [1.5, None]},
    ),
    (np.array(["a", "bc"]), {"shape": [2, 1], "datatype": "BYTES", "data": [b"a", b"bc"]}),
    (np.array([b"ab", b"cd"]), {"shape": [2, 1], "datatype": "BYTES", "data": [b"abcd"]}),
    (np.array([True, False]), {"shape": [2, 1], "datatype": "BOOL", "data": [True, False]}),
]


@pytest.mark.parametrize(("payload", "expected"), NUMPY_OUTPUTS)
def test_numpy_encode_output(payload: Any, expected: dict[str, Any]) -> None:
    dumped = NumpyCodec.encode_output("x", payload).model_dump()
    assert dumped == {"name": "x", "parameters": {"content_type": "np"}, **expected}


def test_numpy_encode_input() -> None:
    # From mlserver 1.7.1.
    assert NumpyCodec.encode_input(
        "x", np.array([[1, 2], [3, 4]], dtype=np.int32)
    ).model_dump() == {
        "name": "x",
        "shape": [2, 2],
        "datatype": "INT32",
        "parameters": {"content_type": "np"},
        "data": [1, 2, 3, 4],
    }


def test_numpy_decode_input() -> None:
    # From mlserver 1.7.1.
    decoded = NumpyCodec.decode_input(_input("a", [2, 2], "FP32", [1, 2, 3, 4]))
    assert (decoded.tolist(), str(decoded.dtype)) == ([[1.0, 2.0], [3.0, 4.0]], "float32")
    strings = NumpyCodec.decode_input(_input("a", [2, 1], "BYTES", ["ab", "c"]))
    assert (strings.tolist(), str(strings.dtype)) == ([["ab"], ["c"]], "<U2")
    raw = NumpyCodec.decode_input(_input("a", [1, 2], "BYTES", [b"abcd"]))
    assert (raw.tolist(), str(raw.dtype)) == ([[b"ab", b"cd"]], "|S2")
    output = ResponseOutput.model_validate(
        {"name": "o", "shape": [3], "datatype": "INT8", "data": [1, 2, 3]}
    )
    assert NumpyCodec.decode_output(output).dtype == np.int8


def test_string_codec() -> None:
    # From mlserver 1.7.1.
    assert StringCodec.encode_output("s", ["hi", "yo"]).model_dump() == {
        "name": "s",
        "shape": [2, 1],
        "datatype": "BYTES",
        "parameters": {"content_type": "str"},
        "data": [b"hi", b"yo"],
    }
    assert StringCodec.encode_output("s", ["hi", "yo"], use_bytes=False).model_dump()["data"] == [
        "hi",
        "yo",
    ]
    assert StringCodec.encode_input("s", ["hi"]).model_dump() == {
        "name": "s",
        "shape": [1, 1],
        "datatype": "BYTES",
        "parameters": {"content_type": "str"},
        "data": [b"hi"],
    }
    assert StringCodec.decode_input(_input("s", [2, 1], "BYTES", [b"a", "b"])) == ["a", "b"]
    assert StringCodec.decode_input(_input("s", [1], "BYTES", "abc")) == ["abc"]


def test_base64_codec() -> None:
    # From mlserver 1.7.1.
    assert Base64Codec.encode_output("b", [b"hello"]).model_dump() == {
        "name": "b",
        "shape": [1, 1],
        "datatype": "BYTES",
        "parameters": {"content_type": "base64"},
        "data": [b"aGVsbG8="],
    }
    assert Base64Codec.encode_input("b", [b"hello"], use_bytes=False).model_dump()["data"] == [
        "aGVsbG8="
    ]
    decoded = Base64Codec.decode_input(_input("b", [2, 1], "BYTES", ["aGVsbG8=", "not base64!"]))
    assert decoded == [b"hello", b"not base64!"]


def test_datetime_codec() -> None:
    when = datetime.datetime(2021, 8, 24, 15, 1, 19)
    # From mlserver 1.7.1.
    assert DatetimeCodec.encode_output("d", [when, "2020-01-01T00:00:00"]).model_dump() == {
        "name": "d",
        "shape": [2, 1],
        "datatype": "BYTES",
        "parameters": {"content_type": "datetime"},
        "data": [b"2021-08-24T15:01:19", b"2020-01-01T00:00:00"],
    }
    assert DatetimeCodec.encode_output("d", [when], use_bytes=False).model_dump()["data"] == [
        "2021-08-24T15:01:19"
    ]
    decoded = DatetimeCodec.decode_input(_input("d", [1, 1], "BYTES", [b"2021-08-24T15:01:19"]))
    assert decoded == [when]


def test_can_encode_and_registry() -> None:
    when = datetime.datetime(2021, 1, 1)
    # From mlserver 1.7.1.
    assert (
        NumpyCodec.can_encode(np.array([1])),
        StringCodec.can_encode(["a"]),
        StringCodec.can_encode(["a", 1]),
        Base64Codec.can_encode([b"a"]),
        DatetimeCodec.can_encode([when]),
    ) == (True, True, False, True, True)
    assert [find_input_codec(c) for c in ("np", "str", "base64", "datetime")] == [
        NumpyCodec,
        StringCodec,
        Base64Codec,
        DatetimeCodec,
    ]
    assert find_input_codec(payload=["a"]) is StringCodec
    assert find_input_codec(type_hint=np.ndarray) is NumpyCodec
    assert find_input_codec(type_hint=list[str]) is StringCodec
    assert find_request_codec("np") is NumpyRequestCodec
    assert find_request_codec("str") is StringRequestCodec
    assert find_input_codec("nope") is None


def test_request_codecs() -> None:
    # From mlserver 1.7.1.
    assert NumpyRequestCodec.encode_response("m", np.array([1, 2, 3]), "v1").model_dump() == {
        "model_name": "m",
        "model_version": "v1",
        "parameters": {"content_type": "np"},
        "outputs": [
            {
                "name": "output-1",
                "shape": [3, 1],
                "datatype": "INT64",
                "parameters": {"content_type": "np"},
                "data": [1, 2, 3],
            }
        ],
    }
    assert StringRequestCodec.encode_request(["a"]).model_dump() == {
        "parameters": {"content_type": "str"},
        "inputs": [
            {
                "name": "input-1",
                "shape": [1, 1],
                "datatype": "BYTES",
                "parameters": {"content_type": "str"},
                "data": [b"a"],
            }
        ],
    }
    request = InferenceRequest(inputs=[_input("a", [3], "INT64", [1, 2, 3])])
    assert NumpyRequestCodec.decode_request(request).tolist() == [1, 2, 3]
    two = InferenceRequest(inputs=[_input("a", [1], "INT64", [1]), _input("b", [1], "INT64", [1])])
    with pytest.raises(CodecError, match="only supports a single input tensor"):
        NumpyRequestCodec.decode_request(two)
    response = InferenceResponse(
        model_name="m", outputs=[NumpyCodec.encode_output("o", np.array([1.0, 2.0]))]
    )
    assert NumpyRequestCodec.decode_response(response).tolist() == [[1.0], [2.0]]


def test_decode_inference_request_keeps_the_decoded_values() -> None:
    request = InferenceRequest.model_validate(
        {
            "parameters": {"content_type": "np"},
            "inputs": [
                {
                    "name": "a",
                    "shape": [1, 2],
                    "datatype": "INT32",
                    "data": [1, 2],
                    "parameters": {"content_type": "np"},
                }
            ],
        }
    )
    before = request.model_dump()
    assert decode_inference_request(request).tolist() == [[1, 2]]
    assert has_decoded(request) and has_decoded(request.inputs[0])
    assert get_decoded(request.inputs[0]).tolist() == [[1, 2]]
    assert request.model_dump() == before  # the decoded value is never serialised
    plain = InferenceRequest(inputs=[_input("a", [1], "INT32", [1])])
    assert decode_inference_request(plain) is plain
    assert not has_decoded(plain.inputs[0])
    assert get_decoded_or_raw(plain.inputs[0]) == TensorData([1])
    assert get_decoded_or_raw(plain) is plain


def test_encode_helpers() -> None:
    # From mlserver 1.7.1.
    assert encode_response_output(["a"], RequestOutput(name="o")).model_dump() == {  # type: ignore[union-attr]
        "name": "o",
        "shape": [1, 1],
        "datatype": "BYTES",
        "parameters": {"content_type": "str"},
        "data": [b"a"],
    }
    settings = ModelSettings(name="m", parameters=ModelParameters(version="2"))
    response = encode_inference_response(np.array([1.0]), settings)
    assert response is not None
    assert response.model_dump() == {
        "model_name": "m",
        "model_version": "2",
        "parameters": {"content_type": "np"},
        "outputs": [
            {
                "name": "output-1",
                "shape": [1, 1],
                "datatype": "FP64",
                "parameters": {"content_type": "np"},
                "data": [1.0],
            }
        ],
    }
    assert encode_inference_response(object(), settings) is None


def test_codec_errors_say_what_is_missing() -> None:
    # From mlserver 1.7.1.
    assert str(CodecError("boom")) == "There was an error encoding / decoding the payload: boom"
    assert CodecError("boom").status_code == 400
    assert str(CodecNotFound(name="o")) == "Codec not found for output field with name 'o'"
    assert (
        str(CodecNotFound(payload_type="<class 'int'>", is_request=True))
        == "Codec not found for output response with type <class 'int'>"
    )


def test_pandas_codec_is_not_provided() -> None:
    with pytest.raises(ImportError, match="PandasCodec is not provided"):
        from trioserve.model.codecs import PandasCodec  # noqa: F401


class EchoModel(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
                for i in payload.inputs
            ],
        )


def _echo() -> EchoModel:
    settings = ModelSettings(
        name="echo",
        implementation=EchoModel,
        parameters=ModelParameters(version="v2", content_type="np"),
        inputs=[
            MetadataTensor(
                name="a",
                datatype=Datatype.FP32,
                shape=[-1],
                parameters=Parameters(content_type="np"),
            )
        ],
    )
    return EchoModel(settings)


REQUEST = InferenceRequest(
    id="r1",
    inputs=[_input("a", [2], "FP32", [1, 2]), _input("b", [1], "BYTES", ["x"])],
)
# From mlserver 1.7.1.
ECHOED = {
    "model_name": "echo",
    "id": "r1",
    "outputs": [
        {"name": "a", "shape": [2], "datatype": "FP32", "data": [1, 2]},
        {"name": "b", "shape": [1], "datatype": "BYTES", "data": ["x"]},
    ],
}


def test_mlmodel_surface() -> None:
    model = _echo()
    assert (model.name, model.version, model.ready) == ("echo", "v2", False)
    assert model.settings.implementation_.endswith("EchoModel")
    assert [t.name for t in model.inputs or []] == ["a"]
    assert asyncio.run(model.predict(REQUEST)).model_dump() == ECHOED
    assert asyncio.run(model.load()) is True
    assert asyncio.run(model.unload()) is True
    # From mlserver 1.7.1.
    assert asyncio.run(model.metadata()).model_dump() == {
        "name": "echo",
        "versions": [],
        "platform": "",
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [-1], "parameters": {"content_type": "np"}}
        ],
        "outputs": [],
        "parameters": {"content_type": "np"},
    }


def test_default_predict_and_predict_stream() -> None:
    with pytest.raises(NotImplementedError, match=r"predict\(\) method not implemented"):
        asyncio.run(MLModel(ModelSettings(name="m")).predict(REQUEST))

    async def requests() -> AsyncIterator[InferenceRequest]:
        yield REQUEST
        yield REQUEST

    async def stream() -> list[dict[str, Any]]:
        return [r.model_dump() async for r in _echo().predict_stream(requests())]

    assert asyncio.run(stream()) == [ECHOED]  # only the first request, as in mlserver 1.7.1


def test_mlmodel_decode_and_encode() -> None:
    model = _echo()
    request = InferenceRequest.model_validate(REQUEST.model_dump())
    decoded = model.decode(request.inputs[0])  # by the input's metadata: np
    assert (decoded.tolist(), str(decoded.dtype)) == ([1.0, 2.0], "float32")
    assert model.decode(request.inputs[1]) == TensorData(["x"])
    assert model.decode(request.inputs[1], default_codec=StringCodec) == ["x"]
    # The model's content type (np) decodes a single-input request.
    single = InferenceRequest(inputs=[_input("z", [1, 2], "INT32", [1, 2])])
    assert model.decode_request(single).tolist() == [[1, 2]]
    # From mlserver 1.7.1.
    assert model.encode_response(np.array([[1.5]])).model_dump() == {
        "model_name": "echo",
        "model_version": "v2",
        "parameters": {"content_type": "np"},
        "outputs": [
            {
                "name": "output-1",
                "shape": [1, 1],
                "datatype": "FP64",
                "parameters": {"content_type": "np"},
                "data": [1.5],
            }
        ],
    }
    assert model.encode(["hey"], RequestOutput(name="o")).model_dump()["data"] == [b"hey"]
    with pytest.raises(CodecNotFound, match="Codec not found for output field with name 'o'"):
        model.encode(object(), RequestOutput(name="o"))
    with pytest.raises(CodecNotFound, match="output response with type <class 'object'>"):
        model.encode_response(object())


class TypedModel(MLModel):
    @decode_args
    async def predict(self, foo: np.ndarray, bar: list[str]) -> np.ndarray:
        return foo * len(bar)


def test_decode_args() -> None:
    model = TypedModel(ModelSettings(name="typed"))
    request = InferenceRequest(
        inputs=[
            _input("foo", [2, 1], "INT64", [1, 2]),
            _input("bar", [2, 1], "BYTES", [b"a", b"b"]),
        ]
    )
    # From mlserver 1.7.1.
    assert asyncio.run(model.predict(request)).model_dump() == {
        "model_name": "typed",
        "outputs": [
            {
                "name": "output-0",
                "shape": [2, 1],
                "datatype": "INT64",
                "parameters": {"content_type": "np"},
                "data": [2, 4],
            }
        ],
    }
    unknown = InferenceRequest(inputs=[_input("baz", [1], "INT64", [1])])
    with pytest.raises(InputsNotFound, match="Input 'baz' was not found"):
        asyncio.run(model.predict(unknown))


def test_get_model_uri(tmp_path: Path) -> None:
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "model.joblib").touch()
    settings = ModelSettings.model_validate(
        {"name": "u", "parameters": {"uri": "./art"}, "_source": str(tmp_path / "m.json")}
    )
    assert asyncio.run(get_model_uri(settings)) == str(tmp_path / "art")
    assert asyncio.run(get_model_uri(settings, ["model.joblib"])) == str(
        tmp_path / "art" / "model.joblib"
    )
    remote = ModelSettings(name="u", parameters=ModelParameters(uri="s3://b/k"))
    assert asyncio.run(get_model_uri(remote)) == "s3://b/k"
    missing = ModelSettings(name="u", parameters=ModelParameters(uri="/nope/nothing"))
    with pytest.raises(InvalidModelURI, match=r"Invalid URI specified for model u \(/nope"):
        asyncio.run(get_model_uri(missing))
    with pytest.raises(InvalidModelURI, match=r"Invalid URI specified for model u$"):
        asyncio.run(get_model_uri(ModelSettings(name="u")))
