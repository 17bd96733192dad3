"""The OpenAPI documents of the inference, management and metrics APIs, and of the Open
Inference Protocol's REST routes (served on the inference port beside TorchServe's)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from openapi_spec_validator import OpenAPIV30SpecValidator, validate

from trioserve.http.openapi import (
    DOCUMENT_FILES,
    OPENAPI_VERSION,
    TITLES,
    VERSION_PLACEHOLDER,
    documented_routes,
    documents_folder,
    inference_document,
    management_document,
    metrics_document,
    oip_document,
    werkzeug_rule_to_openapi,
)

VERSION = "0.12.0"
ERROR_REF = {"$ref": "#/components/schemas/Error"}
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PREDICT_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PREDICT_PATHS = (
    "/predictions/{model_name}",
    "/predictions/{model_name}/{model_version}",
    "/predictions/{model_name}/{model_version}/{rest}",
    "/explanations/{model_name}",
    "/explanations/{model_name}/{model_version}",
    "/explanations/{model_name}/{model_version}/{rest}",
)

INFERENCE_ROUTES = {
    ("OPTIONS", "/"),
    ("GET", "/api-description"),
    ("GET", "/ping"),
    ("POST", "/ping"),
} | {(method, path) for path in PREDICT_PATHS for method in PREDICT_METHODS}

MANAGEMENT_ROUTES = {
    ("OPTIONS", "/"),
    ("GET", "/api-description"),
    ("GET", "/models"),
    ("POST", "/models"),
    ("GET", "/models/{model_name}"),
    ("GET", "/models/{model_name}/{model_version}"),
    ("PUT", "/models/{model_name}"),
    ("PUT", "/models/{model_name}/{model_version}"),
    ("PUT", "/models/{model_name}/{model_version}/set-default"),
    ("DELETE", "/models/{model_name}"),
    ("DELETE", "/models/{model_name}/{model_version}"),
    ("GET", "/token"),
}

METRICS_ROUTES = {("OPTIONS", "/"), ("GET", "/metrics")}

OIP_MODEL_PATHS = ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}")
OIP_INFER_PATHS = tuple(
    f"{model}/{action}"
    for model in OIP_MODEL_PATHS
    for action in ("infer", "generate", "infer_stream", "generate_stream")
)
OIP_ROUTES = (
    {
        ("GET", "/v2"),
        ("GET", "/v2/health/live"),
        ("GET", "/v2/health/ready"),
        ("GET", "/v2/docs/dataplane.json"),
    }
    | {("GET", path) for path in OIP_MODEL_PATHS}
    | {("GET", f"{path}/ready") for path in OIP_MODEL_PATHS}
    | {
        ("GET", f"{path}/{extension}")
        for path in OIP_MODEL_PATHS
        for extension in ("config", "stats")
    }
    | {("GET", "/v2/models/stats")}
    | {("POST", path) for path in OIP_INFER_PATHS}
    | {
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/{model_name}/load"),
        ("POST", "/v2/repository/models/{model_name}/unload"),
    }
)
DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]

BUILDERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "inference": inference_document,
    "management": management_document,
    "metrics": metrics_document,
    "oip": oip_document,
}
EXPECTED_ROUTES = {
    "inference": INFERENCE_ROUTES,
    "management": MANAGEMENT_ROUTES,
    "metrics": METRICS_ROUTES,
    "oip": OIP_ROUTES,
}
UNSECURED = {("OPTIONS", "/"), ("GET", "/api-description"), ("GET", "/v2/docs/dataplane.json")}

# Error-status responses whose body is not the document's Error schema: the readiness
# answers say "not ready" with the readiness body, not as an error.
NON_ERROR_BODIES = {
    ("inference", "/ping", "500"),
    ("oip", "/v2/health/ready", "503"),
    ("oip", "/v2/models/{model_name}/ready", "503"),
    ("oip", "/v2/models/{model_name}/versions/{model_version}/ready", "503"),
}


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(METHOD, path, path item, operation) for every operation."""
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield method.upper(), path, item, item[method]


def media_schema(response: dict[str, Any], media_type: str = "application/json") -> Any:
    return response["content"][media_type]["schema"]


def resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    prefix = "#/components/schemas/"
    assert ref.startswith(prefix)
    resolved: dict[str, Any] = doc["components"]["schemas"][ref.removeprefix(prefix)]
    return resolved


@pytest.fixture(params=sorted(BUILDERS))
def api(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def doc(api: str) -> dict[str, Any]:
    return BUILDERS[api](VERSION)


# ----------------------------------------------------------------------------------------------
# Whole documents


def test_document_validates_as_openapi_30(doc: dict[str, Any]) -> None:
    validate(doc, cls=OpenAPIV30SpecValidator)  # raises on any problem
    validate(doc)  # auto-detected as 3.0 too


def test_header(api: str, doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.0.1"
    assert doc["info"]["title"] == TITLES[api]
    assert doc["info"]["version"] == VERSION


def test_only_the_oip_document_has_its_own_title() -> None:
    assert set(TITLES) == set(DOCUMENT_FILES)
    assert {api for api, title in TITLES.items() if title != "TorchServe APIs"} == {"oip"}


def test_version_is_the_given_one() -> None:
    for build in BUILDERS.values():
        assert build("9.9.9-dev")["info"]["version"] == "9.9.9-dev"


def test_document_is_plain_json(doc: dict[str, Any]) -> None:
    assert json.loads(json.dumps(doc)) == doc


def test_each_call_builds_a_fresh_document(api: str) -> None:
    first = BUILDERS[api](VERSION)
    second = BUILDERS[api](VERSION)
    assert first == second
    first["paths"].clear()
    assert second == BUILDERS[api](VERSION)


def test_no_object_is_shared_within_a_document(doc: dict[str, Any]) -> None:
    seen: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict | list):
            assert id(node) not in seen
            seen.add(id(node))
            for child in node.values() if isinstance(node, dict) else node:
                walk(child)

    walk(doc)


def test_nested_parts_are_fresh_too() -> None:
    # The 401 response is written once in the file and reused through YAML aliases.
    first = inference_document(VERSION)
    first["paths"]["/ping"]["get"]["responses"]["401"]["description"] = "changed"
    first["paths"]["/predictions/{model_name}"]["parameters"][0]["name"] = "changed"
    second = inference_document(VERSION)
    assert second["paths"]["/ping"]["get"]["responses"]["401"]["description"] != "changed"
    assert second["paths"]["/predictions/{model_name}"]["parameters"][0]["name"] == "model_name"


# ----------------------------------------------------------------------------------------------
# The YAML files shipped in the package


def shipped_files() -> dict[str, Any]:
    """File name -> parsed content of every file in the documents folder."""
    return {
        entry.name: yaml.safe_load(entry.read_text(encoding="utf-8"))
        for entry in documents_folder().iterdir()
        if entry.is_file()
    }


def test_the_folder_holds_only_yaml_documents() -> None:
    entries = [entry.name for entry in documents_folder().iterdir()]
    assert entries
    assert all(name.endswith(".yaml") for name in entries), entries
    assert set(DOCUMENT_FILES.values()) == set(entries)


@pytest.mark.parametrize(("api", "name"), sorted(DOCUMENT_FILES.items()))
def test_shipped_file_validates_as_openapi_30(api: str, name: str) -> None:
    raw = shipped_files()[name]
    validate(raw, cls=OpenAPIV30SpecValidator)  # raises on any problem
    assert raw["openapi"] == OPENAPI_VERSION
    assert raw["info"]["title"] == TITLES[api]
    assert raw["info"]["version"] == VERSION_PLACEHOLDER


def test_every_shipped_file_is_loaded_by_an_api() -> None:
    """No orphan: each file is exactly the document of one API, give or take the version."""
    loaded_by: dict[str, list[str]] = {}
    for name, raw in shipped_files().items():
        raw["info"]["version"] = VERSION
        loaded_by[name] = [api for api, build in BUILDERS.items() if build(VERSION) == raw]
    assert all(len(apis) == 1 for apis in loaded_by.values()), loaded_by
    assert sorted(apis[0] for apis in loaded_by.values()) == sorted(BUILDERS), loaded_by
    assert {apis[0]: name for name, apis in loaded_by.items()} == DOCUMENT_FILES


def test_served_json_keeps_the_file_order(api: str, doc: dict[str, Any]) -> None:
    raw = shipped_files()[DOCUMENT_FILES[api]]
    raw["info"]["version"] = VERSION
    assert json.dumps(doc) == json.dumps(raw)


# ----------------------------------------------------------------------------------------------
# Routes and operations


def test_documented_routes_are_exactly_the_server_routes(api: str, doc: dict[str, Any]) -> None:
    assert documented_routes(doc) == EXPECTED_ROUTES[api]


def test_expected_route_counts() -> None:
    assert len(INFERENCE_ROUTES) == 4 + 6 * 5
    assert len(MANAGEMENT_ROUTES) == 12
    assert len(METRICS_ROUTES) == 2
    assert len(OIP_ROUTES) == 4 + 2 * 2 + 2 * 4 + 3 + (1 + 2 * 2)


def test_documented_routes_ignores_non_method_keys() -> None:
    doc = {
        "paths": {
            "/a/{x}": {
                "parameters": [],
                "summary": "s",
                "description": "d",
                "servers": [],
                "get": {},
                "patch": {},
            },
            "/b": {"options": {}},
        }
    }
    assert documented_routes(doc) == {("GET", "/a/{x}"), ("PATCH", "/a/{x}"), ("OPTIONS", "/b")}
    assert documented_routes({"paths": {}}) == set()


def test_operation_ids_are_unique_across_all_documents() -> None:
    ids = [
        op["operationId"]
        for build in BUILDERS.values()
        for _method, _path, _item, op in operations(build(VERSION))
    ]
    assert all(isinstance(i, str) and i for i in ids)
    assert len(ids) == len(set(ids))


def test_every_operation_has_a_summary_and_responses(doc: dict[str, Any]) -> None:
    for _method, _path, _item, op in operations(doc):
        assert op["summary"].strip()
        assert op["responses"]


def test_path_parameters_are_declared(doc: dict[str, Any]) -> None:
    for method, path, item, op in operations(doc):
        template = set(re.findall(r"\{([^}]+)\}", path))
        declared = {
            p["name"]
            for p in [*item.get("parameters", []), *op.get("parameters", [])]
            if p["in"] == "path"
        }
        assert declared == template, (method, path)
        for p in [*item.get("parameters", []), *op.get("parameters", [])]:
            if p["in"] == "path":
                assert p["required"] is True


# ----------------------------------------------------------------------------------------------
# Errors and security


def test_every_error_response_references_the_error_schema(api: str, doc: dict[str, Any]) -> None:
    checked = 0
    for _method, path, _item, op in operations(doc):
        for code, response in op["responses"].items():
            if int(code) < 400 or (api, path, code) in NON_ERROR_BODIES:
                continue
            assert response["description"]
            assert response["content"] == {"application/json": {"schema": ERROR_REF}}, (path, code)
            checked += 1
    if api != "metrics":
        assert checked > 0


def test_error_schema(api: str, doc: dict[str, Any]) -> None:
    if api == "metrics":
        return
    error = doc["components"]["schemas"]["Error"]
    if api == "oip":  # the protocol's error object: {"error": message}, nothing else
        assert error["type"] == "object"
        assert error["required"] == ["error"]
        assert error["additionalProperties"] is False
        assert list(error["properties"]) == ["error"]
        assert error["properties"]["error"]["type"] == "string"
        return
    assert error["type"] == "object"
    assert error["required"] == ["code", "type", "message"]
    assert error["additionalProperties"] is False
    assert error["properties"]["code"]["type"] == "integer"
    assert error["properties"]["type"]["type"] == "string"
    assert error["properties"]["message"]["type"] == "string"


def test_bearer_security(api: str, doc: dict[str, Any]) -> None:
    schemes = doc.get("components", {}).get("securitySchemes", {})
    if api == "metrics":
        assert schemes == {}
    else:
        assert set(schemes) == {"bearerAuth"}
        assert schemes["bearerAuth"]["type"] == "http"
        assert schemes["bearerAuth"]["scheme"] == "bearer"
    for method, path, _item, op in operations(doc):
        if api == "metrics" or (method, path) in UNSECURED:
            assert "security" not in op, (method, path)
            assert "401" not in op["responses"], (method, path)
        else:
            assert op["security"] == [{"bearerAuth": []}], (method, path)
            assert media_schema(op["responses"]["401"]) == ERROR_REF, (method, path)


# ----------------------------------------------------------------------------------------------
# Inference specifics


def test_ping() -> None:
    doc = inference_document(VERSION)
    for method in ("get", "post"):
        responses = doc["paths"]["/ping"][method]["responses"]
        for code in ("200", "500"):
            health = resolve(doc, media_schema(responses[code]))
            assert health["required"] == ["status"]
            assert health["properties"]["status"]["enum"] == ["Healthy", "Unhealthy"]


def test_prediction_operations() -> None:
    doc = inference_document(VERSION)
    for path in PREDICT_PATHS:
        for method in PREDICT_METHODS:
            op = doc["paths"][path][method.lower()]
            body = op["requestBody"]
            assert body["required"] is False
            assert body["content"]["*/*"]["schema"] == {"type": "string", "format": "binary"}
            for form in ("multipart/form-data", "application/x-www-form-urlencoded"):
                schema = body["content"][form]["schema"]
                assert schema["type"] == "object"
                assert schema["additionalProperties"] is True
            responses = op["responses"]
            assert media_schema(responses["200"], "*/*") == {"type": "string", "format": "binary"}
            assert set(responses) == {"200", "400", "401", "404", "413", "500", "503", "507"}


def test_rest_parameter_only_on_rest_paths() -> None:
    doc = inference_document(VERSION)
    for path in PREDICT_PATHS:
        names = [p["name"] for p in doc["paths"][path]["parameters"]]
        assert ("rest" in names) == path.endswith("{rest}")


# ----------------------------------------------------------------------------------------------
# Management specifics


def query_params(op: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}


def test_list_models() -> None:
    doc = management_document(VERSION)
    op = doc["paths"]["/models"]["get"]
    params = query_params(op)
    assert set(params) == {"limit", "next_page_token"}
    assert all(p["schema"]["type"] == "integer" for p in params.values())
    listing = resolve(doc, media_schema(op["responses"]["200"]))
    assert listing["required"] == ["models"]
    assert listing["properties"]["nextPageToken"]["type"] == "string"
    summary = resolve(doc, listing["properties"]["models"]["items"])
    assert set(summary["required"]) == {"modelName", "modelUrl"}


REGISTER_FIELDS = {
    "url": "string",
    "model_name": "string",
    "handler": "string",
    "runtime": "string",
    "batch_size": "integer",
    "max_batch_delay": "integer",
    "initial_workers": "integer",
    "synchronous": "boolean",
    "response_timeout": "integer",
    "startup_timeout": "integer",
    "s3_sse_kms": "boolean",
}


def test_register_model() -> None:
    doc = management_document(VERSION)
    op = doc["paths"]["/models"]["post"]
    params = query_params(op)
    assert {name: p["schema"]["type"] for name, p in params.items()} == REGISTER_FIELDS
    # The JSON body may carry url instead, so the query cannot require it.
    assert not any(p["required"] for p in params.values())
    assert "url" in params["url"]["description"].lower()
    assert "JSON body" in op["description"]
    assert op["requestBody"]["required"] is False
    body = resolve(doc, media_schema(op["requestBody"]))
    assert {name: s["type"] for name, s in body["properties"].items()} == REGISTER_FIELDS
    assert body["required"] == ["url"]
    responses = op["responses"]
    assert set(responses) == {"200", "202", "400", "401", "404", "405", "409", "500"}
    for code in ("200", "202"):
        assert media_schema(responses[code]) == {"$ref": "#/components/schemas/Status"}


def test_register_query_and_body_agree() -> None:
    """The file writes each register parameter twice: in the query string and in the body."""
    doc = management_document(VERSION)
    params = query_params(doc["paths"]["/models"]["post"])
    body = doc["components"]["schemas"]["RegisterModelRequest"]["properties"]
    assert list(params) == list(body)
    for name, param in params.items():
        assert body[name] == {**param["schema"], "description": param["description"]}, name


DESCRIBE_FIELDS = [
    "modelName",
    "modelVersion",
    "modelUrl",
    "engine",
    "runtime",
    "minWorkers",
    "maxWorkers",
    "batchSize",
    "maxBatchDelay",
    "responseTimeout",
    "startupTimeout",
    "maxRetryTimeoutInSec",
    "clientTimeoutInMills",
    "parallelType",
    "parallelLevel",
    "deviceType",
    "deviceIds",
    "continuousBatching",
    "useJobTicket",
    "useVenv",
    "stateful",
    "sequenceMaxIdleMSec",
    "sequenceTimeoutMSec",
    "maxNumSequence",
    "maxSequenceJobQueueSize",
    "loadedAtStartup",
    "workers",
    "jobQueueStatus",
    "customizedMetadata",
]


@pytest.mark.parametrize("path", ["/models/{model_name}", "/models/{model_name}/{model_version}"])
def test_describe_model(path: str) -> None:
    doc = management_document(VERSION)
    op = doc["paths"][path]["get"]
    params = query_params(op)
    assert set(params) == {"customized"}
    assert params["customized"]["schema"]["type"] == "boolean"
    array = media_schema(op["responses"]["200"])
    assert array["type"] == "array"
    describe = resolve(doc, array["items"])
    assert list(describe["properties"]) == DESCRIBE_FIELDS
    assert "customizedMetadata" not in describe["required"]
    assert {"modelName", "workers", "jobQueueStatus"} <= set(describe["required"])
    worker = resolve(doc, describe["properties"]["workers"]["items"])
    assert set(worker["properties"]) == {
        "id",
        "startTime",
        "status",
        "memoryUsage",
        "pid",
        "gpu",
        "gpuUsage",
    }
    queue = resolve(doc, describe["properties"]["jobQueueStatus"])
    assert set(queue["properties"]) == {"remainingCapacity", "pendingRequests"}
    assert set(op["responses"]) >= {"200", "401", "404"}


@pytest.mark.parametrize("path", ["/models/{model_name}", "/models/{model_name}/{model_version}"])
def test_scale_workers(path: str) -> None:
    op = management_document(VERSION)["paths"][path]["put"]
    assert set(query_params(op)) == {
        "min_worker",
        "max_worker",
        "synchronous",
        "timeout",
        "number_gpu",
    }
    assert set(op["responses"]) == {"200", "202", "206", "400", "401", "404", "500"}


@pytest.mark.parametrize("path", ["/models/{model_name}", "/models/{model_name}/{model_version}"])
def test_unregister_model(path: str) -> None:
    op = management_document(VERSION)["paths"][path]["delete"]
    assert set(op["responses"]) == {"200", "401", "403", "404", "405", "408"}


def test_set_default() -> None:
    op = management_document(VERSION)["paths"]["/models/{model_name}/{model_version}/set-default"]
    assert set(op["put"]["responses"]) == {"200", "401", "404"}


def test_token() -> None:
    op = management_document(VERSION)["paths"]["/token"]["get"]
    params = query_params(op)
    assert params["type"]["schema"]["enum"] == ["management", "inference"]
    assert set(op["responses"]) == {"200", "400", "401", "404"}
    assert "text/plain" in op["responses"]["200"]["content"]


# ----------------------------------------------------------------------------------------------
# Metrics specifics


def test_metrics_name_filter() -> None:
    op = metrics_document(VERSION)["paths"]["/metrics"]["get"]
    (param,) = op["parameters"]
    assert param["name"] == "name[]"
    assert param["in"] == "query"
    assert param["style"] == "form"
    assert param["explode"] is True
    assert param["schema"] == {"type": "array", "items": {"type": "string"}}
    assert op["responses"]["200"]["content"]["text/plain"]["schema"]["type"] == "string"


# ----------------------------------------------------------------------------------------------
# Open Inference Protocol specifics


def schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = doc["components"]["schemas"][name]
    return found


def test_oip_datatypes_are_the_codecs() -> None:
    from trioserve.core.oip.datatypes import DATATYPES as CODEC_DATATYPES

    datatype = schema(oip_document(VERSION), "Datatype")
    assert datatype["type"] == "string"
    assert datatype["enum"] == DATATYPES == list(CODEC_DATATYPES)


def test_oip_inference_request() -> None:
    doc = oip_document(VERSION)
    request = schema(doc, "InferenceRequest")
    assert request["required"] == ["inputs"]
    assert list(request["properties"]) == ["id", "parameters", "inputs", "outputs"]
    assert request["properties"]["id"]["type"] == "string"
    item = resolve(doc, request["properties"]["inputs"]["items"])
    assert item["required"] == ["name", "shape", "datatype"]
    assert list(item["properties"]) == ["name", "shape", "datatype", "parameters", "data"]
    assert item["properties"]["shape"]["items"]["type"] == "integer"
    assert item["properties"]["datatype"] == {"$ref": "#/components/schemas/Datatype"}
    output = resolve(doc, request["properties"]["outputs"]["items"])
    assert output["required"] == ["name"]
    assert list(output["properties"]) == ["name", "parameters"]
    for parent in (request, item, output):
        assert parent["properties"]["parameters"]["allOf"] == [
            {"$ref": "#/components/schemas/Parameters"}
        ]
    values = schema(doc, "Parameters")["additionalProperties"]["anyOf"]
    assert [v["type"] for v in values] == ["string", "number", "boolean"]


def test_oip_answer_bodies() -> None:
    """The bodies http/oip.py answers, key for key."""
    doc = oip_document(VERSION)
    expected = {
        "ServerMetadata": ["name", "version", "extensions"],
        "ServerLive": ["live"],
        "ServerReady": ["ready"],
        "ModelReady": ["name", "ready"],
        "ModelMetadata": ["name", "versions", "platform", "inputs", "outputs"],
        "TensorMetadata": ["name", "datatype", "shape"],
        "InferenceResponse": ["model_name", "model_version", "id", "parameters", "outputs"],
        "ResponseOutput": ["name", "datatype", "shape", "parameters", "data"],
    }
    for name, keys in expected.items():
        body = schema(doc, name)
        assert body["type"] == "object", name
        assert list(body["properties"]) == keys, name
        assert set(body["required"]) <= set(keys), name
    assert schema(doc, "TensorMetadata")["properties"]["shape"]["items"]["minimum"] == -1


def test_oip_metadata_and_readiness_operations() -> None:
    doc = oip_document(VERSION)
    paths = doc["paths"]
    answers = {
        "/v2": {"200": "ServerMetadata"},
        "/v2/health/live": {"200": "ServerLive"},
        "/v2/health/ready": {"200": "ServerReady", "503": "ServerReady"},
    }
    for path in OIP_MODEL_PATHS:
        answers[path] = {"200": "ModelMetadata", "404": "Error", "500": "Error"}
        answers[f"{path}/ready"] = {
            "200": "ModelReady",
            "503": "ModelReady",
            "404": "Error",
            "500": "Error",
        }
    for path, codes in answers.items():
        responses = paths[path]["get"]["responses"]
        assert set(responses) == {*codes, "401"}, path
        for code, name in codes.items():
            assert media_schema(responses[code]) == {"$ref": f"#/components/schemas/{name}"}


def test_oip_inference_operations() -> None:
    doc = oip_document(VERSION)
    for path in OIP_INFER_PATHS:
        op = doc["paths"][path]["post"]
        (header,) = op["parameters"]
        assert header["name"] == "Inference-Header-Content-Length"
        assert header["in"] == "header" and header["required"] is False
        assert header["schema"]["minimum"] == 0
        body = op["requestBody"]
        assert body["required"] is True
        assert media_schema(body) == {"$ref": "#/components/schemas/InferenceRequest"}
        binary = {"type": "string", "format": "binary"}
        assert media_schema(body, "application/octet-stream") == binary
        responses = op["responses"]
        if path.endswith("_stream"):
            assert set(responses) == {"200", "400", "401", "404", "413", "500", "503"}, path
            assert set(responses["200"]["content"]) == {"text/event-stream"}
        else:
            assert set(responses) == {"200", "400", "401", "404", "413", "500", "503", "504", "507"}
            ok = responses["200"]
            assert media_schema(ok) == {"$ref": "#/components/schemas/InferenceResponse"}
            assert media_schema(ok, "application/octet-stream") == binary
            assert "Inference-Header-Content-Length" in ok["headers"]
            assert "Retry-After" in responses["503"]["headers"]


def test_oip_document_operation() -> None:
    op = oip_document(VERSION)["paths"]["/v2/docs/dataplane.json"]["get"]
    assert "security" not in op
    assert set(op["responses"]) == {"200"}


# ----------------------------------------------------------------------------------------------
# Werkzeug rules


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("/", "/"),
        ("/ping", "/ping"),
        ("/api-description", "/api-description"),
        ("/models/<model_name>", "/models/{model_name}"),
        ("/models/<model_name>/<model_version>", "/models/{model_name}/{model_version}"),
        ("/models/<model_name>/<path:rest>", "/models/{model_name}/{rest}"),
        (
            "/predictions/<model_name>/<model_version>/<path:rest>",
            "/predictions/{model_name}/{model_version}/{rest}",
        ),
        (
            "/models/<model_name>/<model_version>/set-default",
            "/models/{model_name}/{model_version}/set-default",
        ),
        ("/items/<int:item_id>", "/items/{item_id}"),
        ("/items/<int(min=1, max=9):item_id>/x", "/items/{item_id}/x"),
        ("/files/<string(length=2):a>-<any(x, y):b>", "/files/{a}-{b}"),
    ],
)
def test_werkzeug_rule_to_openapi(rule: str, expected: str) -> None:
    assert werkzeug_rule_to_openapi(rule) == expected
