"""trioserve.model's OIP types, settings and errors behave as mlserver 1.7.1's.

The expected values were taken from mlserver 1.7.1 (running the same calls against the
real package); they are literals here so the tests do not need mlserver.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

import pydantic
import pytest

from trioserve.model import errors
from trioserve.model.settings import ModelParameters, ModelSettings, Settings
from trioserve.model.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    Parameters,
    RepositoryIndexResponse,
    RepositoryIndexResponseItem,
    RequestInput,
    ResponseOutput,
    State,
    TensorData,
)

REQUEST_JSON = {
    "id": "1",
    "parameters": {"content_type": "np", "foo": "bar"},
    "inputs": [
        {
            "name": "a",
            "shape": [1, 2],
            "datatype": "INT32",
            "data": [1, 2],
            "parameters": {"content_type": "np"},
        }
    ],
    "outputs": [{"name": "o"}],
}


def test_request_dump_skips_unset_and_none_fields() -> None:
    req = InferenceRequest.model_validate(REQUEST_JSON)
    # From mlserver 1.7.1.
    assert req.model_dump() == {
        "id": "1",
        "parameters": {"content_type": "np", "foo": "bar"},
        "inputs": [
            {
                "name": "a",
                "shape": [1, 2],
                "datatype": "INT32",
                "parameters": {"content_type": "np"},
                "data": [1, 2],
            }
        ],
        "outputs": [{"name": "o"}],
    }
    assert req.model_dump_json() == (
        '{"id":"1","parameters":{"content_type":"np","foo":"bar"},"inputs":[{"name":"a",'
        '"shape":[1,2],"datatype":"INT32","parameters":{"content_type":"np"},"data":[1,2]}],'
        '"outputs":[{"name":"o"}]}'
    )


def test_full_dump_on_request() -> None:
    req = InferenceRequest.model_validate(REQUEST_JSON)
    # From mlserver 1.7.1.
    assert req.model_dump(exclude_unset=False, exclude_none=False) == {
        "id": "1",
        "parameters": {"content_type": "np", "headers": None, "foo": "bar"},
        "inputs": [
            {
                "name": "a",
                "shape": [1, 2],
                "datatype": "INT32",
                "parameters": {"content_type": "np", "headers": None},
                "data": [1, 2],
            }
        ],
        "outputs": [{"name": "o", "parameters": None}],
    }


def test_datatype_is_stored_as_its_string() -> None:
    out = ResponseOutput(name="o", shape=[1], datatype=Datatype.FP32, data=TensorData([1.0]))
    assert out.datatype == "FP32"
    resp = InferenceResponse(model_name="m", outputs=[out])
    # From mlserver 1.7.1.
    assert resp.model_dump() == {
        "model_name": "m",
        "outputs": [{"name": "o", "shape": [1], "datatype": "FP32", "data": [1.0]}],
    }


def test_an_unknown_datatype_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        InferenceRequest.model_validate(
            {"inputs": [{"name": "a", "shape": [1], "datatype": "FP31", "data": [1]}]}
        )


def test_tensor_data_is_a_sequence_or_a_scalar() -> None:
    data = TensorData([1, 2])
    assert (len(data), list(data), data[1]) == (2, [1, 2], 2)  # from mlserver 1.7.1
    req = InferenceRequest.model_validate_json(
        '{"inputs":[{"name":"a","shape":[],"datatype":"FP64","data":3.5}]}'
    )
    assert req.inputs[0].data.root == 3.5
    assert req.model_dump() == {
        "inputs": [{"name": "a", "shape": [], "datatype": "FP64", "data": 3.5}]
    }


def test_parameters_keep_extra_keys() -> None:
    params = Parameters(content_type="x", foo=1)  # type: ignore[call-arg]
    assert params.model_dump() == {"content_type": "x", "foo": 1}
    assert params.model_extra == {"foo": 1}


def test_bytes_dump_as_json_text() -> None:
    out = ResponseOutput(name="o", shape=[1, 1], datatype=Datatype.BYTES, data=TensorData([b"x"]))
    resp = InferenceResponse(model_name="m", outputs=[out])
    # From mlserver 1.7.1.
    assert resp.model_dump_json() == (
        '{"model_name":"m","outputs":[{"name":"o","shape":[1,1],"datatype":"BYTES","data":["x"]}]}'
    )


def test_metadata_and_repository_types() -> None:
    meta = MetadataModelResponse(
        name="m", platform="", inputs=[MetadataTensor(name="a", datatype=Datatype.FP32, shape=[-1])]
    )
    # From mlserver 1.7.1.
    assert meta.model_dump() == {
        "name": "m",
        "platform": "",
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [-1]}],
    }
    index = RepositoryIndexResponse(
        [RepositoryIndexResponseItem(name="m", state=State.READY, reason="")]
    )
    assert len(index) == 1 and index[0].name == "m"
    assert index.model_dump() == [{"name": "m", "version": None, "state": "READY", "reason": ""}]


def test_request_input_fields() -> None:
    inp = RequestInput(name="a", shape=[2], datatype=Datatype.INT64, data=TensorData([1, 2]))
    assert inp.parameters is None
    assert list(inp.data) == [1, 2]


def test_model_settings_dump_as_mlserver() -> None:
    settings = ModelSettings(
        name="m",
        implementation="x.Y",
        parameters={"uri": "./a", "extra": {"k": 1}, "zz": 3},
    )
    # From mlserver 1.7.1.
    assert settings.model_dump() == {
        "implementation_": "x.Y",
        "name": "m",
        "platform": "",
        "versions": [],
        "inputs": [],
        "outputs": [],
        "parallel_workers": None,
        "warm_workers": False,
        "max_batch_size": 0,
        "max_batch_time": 0.0,
        "parameters": {
            "uri": "./a",
            "version": None,
            "environment_path": None,
            "environment_tarball": None,
            "inference_pool_gid": None,
            "autogenerate_inference_pool_gid": False,
            "format": None,
            "content_type": None,
            "extra": {"k": 1},
            "zz": 3,
        },
        "cache_enabled": False,
    }
    assert settings.model_dump(by_alias=True, exclude_unset=True) == {
        "implementation": "x.Y",
        "name": "m",
        "parameters": {"uri": "./a", "extra": {"k": 1}, "zz": 3},
    }
    assert settings.version is None


def test_implementation_accepts_a_class_or_a_path() -> None:
    by_class = ModelSettings(name="m", implementation=OrderedDict)
    assert by_class.implementation_ == "collections.OrderedDict"
    assert by_class.implementation is OrderedDict
    by_path = ModelSettings.model_validate({"implementation": "collections.Counter"})
    assert by_path.implementation.__name__ == "Counter"
    by_path.implementation = OrderedDict  # type: ignore[assignment]
    assert by_path.implementation_ == "collections.OrderedDict"


def test_unknown_settings_are_ignored_and_parameters_kept() -> None:
    settings = ModelSettings.model_validate(
        {"name": "m", "implementation": "a.B", "bogus": 1, "parameters": {"version": "3"}}
    )
    assert settings.version == "3"
    assert not hasattr(settings, "bogus")
    assert ModelParameters(uri="u").extra == {}
    assert ModelParameters(autogenerate_inference_pool_gid=True).inference_pool_gid


def test_source_sets_the_model_folder(tmp_path: Path) -> None:
    path = tmp_path / "model-settings.json"
    path.write_text(json.dumps({"name": "m", "implementation": "a.B"}))
    settings = ModelSettings.parse_file(str(path))
    assert settings._source == str(path)
    assert settings.model_folder == str(tmp_path)
    assert "_source" not in settings.model_dump()
    assert ModelSettings(name="n").model_folder is None


def test_implementation_imports_from_the_model_folder(tmp_path: Path) -> None:
    (tmp_path / "fx_model_folder_runtime.py").write_text("class Runtime:\n    pass\n")
    settings = ModelSettings.model_validate(
        {
            "implementation": "fx_model_folder_runtime.Runtime",
            "_source": str(tmp_path / "model-settings.json"),
        }
    )
    try:
        assert settings.implementation.__name__ == "Runtime"
    finally:
        sys.modules.pop("fx_model_folder_runtime", None)
    assert str(tmp_path) not in sys.path


def test_server_settings_defaults() -> None:
    settings = Settings(http_port=9000, unknown=True)  # type: ignore[call-arg]
    assert (settings.http_port, settings.grpc_port, settings.server_name) == (
        9000,
        8081,
        "mlserver",
    )


def test_errors_carry_mlserver_status_codes() -> None:
    raised = [
        errors.MLServerError("x"),
        errors.InferenceError("y"),
        errors.ModelNotFound("m"),
        errors.ModelNotFound("m", "1"),
        errors.ModelNotReady("m"),
        errors.InvalidModelURI("m", "/p"),
        errors.ModelParametersMissing("m"),
    ]
    # From mlserver 1.7.1.
    assert [(str(e), e.status_code) for e in raised] == [
        ("x", 400),
        ("y", 400),
        ("Model m not found", 404),
        ("Model m with version 1 not found", 404),
        ("Model m is not ready yet.", 400),
        ("Invalid URI specified for model m (/p)", 422),
        ("Parameters missing for model m", 400),
    ]
    assert errors.MLServerError("z", 503).status_code == 503
