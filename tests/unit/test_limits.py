"""What one request may expand to (core/limits.py), sans IO: each limit accepts a request at
the limit and refuses one over it with TOO_LARGE naming the setting, before per-item objects
are built, in every parser that counts (REST and gRPC OIP, KServe v1, the worker's
envelopes); the settings come from config.properties and TS_* variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trioserve._proto.inference import (
    InferTensorContents,
    ModelInferRequest,
    ModelInferRequestInferInputTensor,
    ModelInferRequestInferRequestedOutputTensor,
)
from trioserve.config import CliOptions, ConfigError, ServerConfig, load_config
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.frames import FrameDecoder
from trioserve.core.kserve import instances_of
from trioserve.core.limits import (
    DEFAULT_LIMITS,
    ELEMENTS_CAP,
    LIMIT_SETTINGS,
    RequestLimits,
    check_elements,
    check_inputs,
    check_instances,
    check_outputs,
    declared_elements,
)
from trioserve.core.messages import LoadSpec, encode_load
from trioserve.core.oip import parse_infer_request
from trioserve.grpc.oip_messages import request_inputs, requested_outputs
from trioserve.worker.torchserve import envelopes
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.metrics import MetricsCache

SMALL = RequestLimits(max_request_inputs=3, max_request_instances=4, max_request_elements=10)


def refused(setting: str, count: int, excinfo: pytest.ExceptionInfo[ServeError]) -> None:
    """The error is TOO_LARGE and its message names the count, the limit and the setting."""
    error = excinfo.value
    assert error.kind is ErrorKind.TOO_LARGE
    limit = getattr(SMALL, setting)
    assert f" {count} " in error.message and f"at most {limit} " in error.message
    assert f"({setting})" in error.message and f"raise {setting} in config.properties" in (
        error.message
    )


# -- the checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "setting"),
    [
        (check_inputs, "max_request_inputs"),
        (check_outputs, "max_request_inputs"),
        (check_instances, "max_request_instances"),
        (check_elements, "max_request_elements"),
    ],
)
def test_each_check_accepts_the_limit_and_refuses_one_more(check: Any, setting: str) -> None:
    limit = getattr(SMALL, setting)
    check(limit, SMALL)
    with pytest.raises(ServeError) as excinfo:
        check(limit + 1, SMALL)
    refused(setting, limit + 1, excinfo)


def test_the_defaults_are_generous_for_real_use() -> None:
    assert RequestLimits(2048, 10_000, 1 << 25) == DEFAULT_LIMITS
    assert dict(LIMIT_SETTINGS) == {
        "max_request_inputs": 2048,
        "max_request_instances": 10_000,
        "max_request_elements": 1 << 25,
    }
    check_inputs(2048)
    check_instances(10_000)
    check_elements(224 * 224 * 3 * 64)  # a batch of 64 RGB images


def test_declared_elements_sums_the_shapes_it_can_read() -> None:
    assert declared_elements([[2, 3], [4], []]) == 6 + 4 + 1
    # shapes the tensor checks refuse with their own message count nothing here
    assert declared_elements([[2, -1], "ab", None, [1.5], [3]]) == 3  # type: ignore[list-item]
    assert declared_elements([[2**30, 2**30]]) == 2**60
    # beyond 2**64 a shape counts as 2**64 (its exact product can take minutes: see
    # test_hostile_parsers.py), unless a dimension is 0
    assert declared_elements([[2**40, 2**40]]) == ELEMENTS_CAP
    assert declared_elements([[2**40, 2**40, 0]]) == 0


def test_limits_travel_in_the_load_frame() -> None:
    spec = LoadSpec(
        "m", "1", "/d", "h.py", batch_size=2, max_response_size=1000, request_limits=SMALL
    )
    frame = FrameDecoder().feed(encode_load(spec))[0]
    back = LoadSpec.from_meta(frame.meta)
    assert (back.request_limits, back.max_response_size) == (SMALL, 1000)
    # an older LOAD frame without them: the defaults
    meta = {
        k: v for k, v in spec.to_meta().items() if k not in ("request_limits", "max_response_size")
    }
    old = LoadSpec.from_meta(meta)
    assert (old.request_limits, old.max_response_size) == (DEFAULT_LIMITS, 6553500)
    assert RequestLimits.from_meta({"max_request_inputs": 0, "max_request_elements": "9"}) == (
        DEFAULT_LIMITS
    )


# -- configuration --------------------------------------------------------------------


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ServerConfig:
    path = tmp_path / "config.properties"
    path.write_text(text)
    return load_config(CliOptions(ts_config=str(path)), env or {}, tmp_path)


def test_the_limits_are_settings_with_defaults(tmp_path: Path) -> None:
    assert ServerConfig().request_limits == DEFAULT_LIMITS
    assert load(tmp_path, "").request_limits == DEFAULT_LIMITS
    config = load(
        tmp_path, "max_request_inputs=3\nmax_request_instances=4\nmax_request_elements=10\n"
    )
    assert config.request_limits == SMALL
    assert config.unknown_keys == ()


def test_the_limits_come_from_ts_variables_when_the_file_allows(tmp_path: Path) -> None:
    env = {"TS_MAX_REQUEST_INPUTS": "7", "TS_MAX_REQUEST_INSTANCES": "8"}
    assert load(tmp_path, "", env).request_limits == DEFAULT_LIMITS
    limits = load(tmp_path, "enable_envvars_config=true\nmax_request_inputs=3\n", env)
    assert limits.request_limits == RequestLimits(7, 8, DEFAULT_LIMITS.max_request_elements)


@pytest.mark.parametrize("value", ["0", "-1", "many", "1.5"])
def test_a_bad_limit_stops_start_up_naming_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="max_request_instances"):
        load(tmp_path, f"max_request_instances={value}\n")


# -- REST OIP -------------------------------------------------------------------------


def rest_body(inputs: int = 1, outputs: int = 0, elements: int = 1) -> bytes:
    body: dict[str, Any] = {
        "inputs": [
            {"name": f"i{i}", "shape": [elements], "datatype": "INT32", "data": [1] * elements}
            for i in range(inputs)
        ]
    }
    if outputs:
        body["outputs"] = [{"name": f"o{i}"} for i in range(outputs)]
    return json.dumps(body, separators=(",", ":")).encode()


def test_rest_inputs_outputs_and_elements_are_counted() -> None:
    parsed = parse_infer_request(
        rest_body(inputs=3, outputs=3, elements=3), header_length=None, limits=SMALL
    )
    assert (len(parsed.inputs), len(parsed.outputs)) == (3, 3)
    with pytest.raises(ServeError) as excinfo:
        parse_infer_request(rest_body(inputs=4), header_length=None, limits=SMALL)
    refused("max_request_inputs", 4, excinfo)
    assert "inputs" in excinfo.value.message
    with pytest.raises(ServeError) as excinfo:
        parse_infer_request(rest_body(outputs=4), header_length=None, limits=SMALL)
    refused("max_request_inputs", 4, excinfo)
    assert "outputs" in excinfo.value.message
    with pytest.raises(ServeError) as excinfo:
        parse_infer_request(rest_body(inputs=2, elements=6), header_length=None, limits=SMALL)
    refused("max_request_elements", 12, excinfo)


def test_rest_elements_are_counted_from_the_shapes_before_the_data() -> None:
    """A shape declaring 11 elements is refused as too large before its (short) data is
    read: no tensor is built for it."""
    body = {"inputs": [{"name": "x", "shape": [11], "datatype": "FP32", "data": [1.0]}]}
    with pytest.raises(ServeError) as excinfo:
        parse_infer_request(json.dumps(body).encode(), header_length=None, limits=SMALL)
    refused("max_request_elements", 11, excinfo)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [11],
                    "datatype": "INT8",
                    "parameters": {"binary_data_size": 11},
                }
            ]
        }
    ).encode()
    with pytest.raises(ServeError) as excinfo:
        parse_infer_request(head + bytes(11), header_length=len(head), limits=SMALL)
    refused("max_request_elements", 11, excinfo)


def test_the_issue_s_16000_rest_inputs_are_refused_by_default() -> None:
    body = rest_body(inputs=16_000)
    assert len(body) < 1 << 20
    with pytest.raises(ServeError) as excinfo:
        parse_infer_request(body, header_length=None)
    assert excinfo.value.kind is ErrorKind.TOO_LARGE
    assert "16000 inputs" in excinfo.value.message and "max_request_inputs" in excinfo.value.message


# -- gRPC OIP -------------------------------------------------------------------------


def grpc_request(inputs: int = 1, outputs: int = 0, elements: int = 1) -> ModelInferRequest:
    return ModelInferRequest(
        model_name="m",
        inputs=[
            ModelInferRequestInferInputTensor(
                name=f"i{i}",
                datatype="FP32",
                shape=[elements],
                contents=InferTensorContents(fp32_contents=[1.0] * elements),
            )
            for i in range(inputs)
        ],
        outputs=[ModelInferRequestInferRequestedOutputTensor(name=f"o{i}") for i in range(outputs)],
    )


def test_grpc_inputs_outputs_and_elements_are_counted() -> None:
    message = grpc_request(inputs=3, outputs=3, elements=3)
    assert len(request_inputs(message, SMALL)) == 3
    assert len(requested_outputs(message, SMALL)) == 3
    with pytest.raises(ServeError) as excinfo:
        request_inputs(grpc_request(inputs=4), SMALL)
    refused("max_request_inputs", 4, excinfo)
    with pytest.raises(ServeError) as excinfo:
        requested_outputs(grpc_request(outputs=4), SMALL)
    refused("max_request_inputs", 4, excinfo)
    with pytest.raises(ServeError) as excinfo:
        request_inputs(grpc_request(inputs=2, elements=6), SMALL)
    refused("max_request_elements", 12, excinfo)


def test_grpc_inputs_over_the_default_are_refused_before_any_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trioserve.grpc.oip_messages as messages

    built: list[str] = []
    monkeypatch.setattr(messages, "_typed_input", lambda tensor, _p: built.append(tensor.name))
    # (the issue's 40,000 go end to end: tests/e2e/test_request_limits.py)
    message = ModelInferRequest.FromString(bytes(grpc_request(inputs=2049)))
    with pytest.raises(ServeError) as excinfo:
        request_inputs(message)
    assert excinfo.value.kind is ErrorKind.TOO_LARGE
    assert "2049 inputs" in excinfo.value.message and "max_request_inputs" in excinfo.value.message
    assert built == []


# -- KServe v1 ------------------------------------------------------------------------


def test_v1_instances_are_counted() -> None:
    assert instances_of(b'{"instances": [1, 2, 3, 4]}', SMALL) == [1, 2, 3, 4]
    with pytest.raises(ServeError) as excinfo:
        instances_of(b'{"instances": [1, 2, 3, 4, 5]}', SMALL)
    refused("max_request_instances", 5, excinfo)


def test_the_issue_s_262000_v1_instances_are_refused_by_default() -> None:
    body = b'{"instances":[' + b",".join([b"[0]"] * 262_000) + b"]}"
    assert len(body) <= 1 << 20
    with pytest.raises(ServeError) as excinfo:
        instances_of(body)
    assert excinfo.value.kind is ErrorKind.TOO_LARGE
    assert "262000 instances" in excinfo.value.message
    assert "max_request_instances" in excinfo.value.message


# -- the worker's envelopes -----------------------------------------------------------


def context(n: int) -> Context:
    ctx = Context("m", str(Path.cwd()), None, 4, None, "0.12.0", metrics=MetricsCache("m"))
    ctx.begin_batch([f"r{i}" for i in range(n)], [{} for _ in range(n)])
    return ctx


@pytest.mark.parametrize("envelope", ["json", "kserve"])
def test_an_instance_envelope_holds_bodies_to_the_worker_s_limits(envelope: str) -> None:
    entry = envelopes.wrap(envelope, lambda data, _ctx: data, SMALL)
    assert entry([{"body": b'{"instances": [1, 2, 3, 4]}'}], context(1)) == [
        {"predictions": [1, 2, 3, 4]}
    ]
    with pytest.raises(PredictionException) as excinfo:
        entry([{"body": b'{"instances": [1, 2, 3, 4, 5]}'}], context(1))
    assert excinfo.value.error_code == 413
    assert "max_request_instances" in excinfo.value.message


def test_the_kservev2_envelope_holds_bodies_to_the_worker_s_limits() -> None:
    entry = envelopes.wrap("kservev2", lambda data, _ctx: [1 for _ in data], SMALL)
    answer = entry([{"body": rest_body(inputs=3)}], context(1))
    assert [o["name"] for o in answer[0]["outputs"]] == ["i0", "i1", "i2"]
    with pytest.raises(PredictionException) as excinfo:
        entry([{"body": rest_body(inputs=4)}], context(1))
    assert excinfo.value.error_code == 413
    assert "request 0: the request has 4 inputs" in excinfo.value.message
    assert "max_request_inputs" in excinfo.value.message
    with pytest.raises(PredictionException) as excinfo:
        entry([{"body": b'{"inputs": 1}'}], context(1))
    assert excinfo.value.error_code == 400  # a malformed body is still a 400


def test_a_raw_binary_request_s_elements_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw request (Inference-Header-Content-Length: 0) is one input of the model's
    declared datatype: its elements are the body's bytes over the item size."""
    import trioserve.http.oip as http_oip
    from trioserve.core.oip import TensorMeta

    monkeypatch.setattr(http_oip, "declared_inputs", lambda _m: [TensorMeta("x", "INT8", (-1,))])
    headers = [(b"inference-header-content-length", b"0")]
    request = http_oip.read_request(None, headers, bytes(10), SMALL)  # type: ignore[arg-type]
    assert request.inputs[0].element_count == 10
    with pytest.raises(ServeError) as excinfo:
        http_oip.read_request(None, headers, bytes(11), SMALL)  # type: ignore[arg-type]
    refused("max_request_elements", 11, excinfo)
