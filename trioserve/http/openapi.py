"""OpenAPI 3.0.1 descriptions of the three HTTP APIs (inference, management, metrics).

These are the documents served by ``OPTIONS /`` and ``GET /api-description``. They are built
from plain dicts (no framework import), so the module can be used anywhere, including tests that
compare the documented routes with an application's URL map (:func:`documented_routes` and
:func:`werkzeug_rule_to_openapi`).

Every call returns a freshly built document: callers may mutate the result freely. No dict or
list object is shared between two places of one document either, so the result can be dumped as
YAML without anchors.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = [
    "OPENAPI_VERSION",
    "TITLE",
    "documented_routes",
    "inference_document",
    "management_document",
    "metrics_document",
    "werkzeug_rule_to_openapi",
]

OPENAPI_VERSION: Final = "3.0.1"
# TorchServe clients recognise the server by this title.
TITLE: Final = "TorchServe APIs"

SECURITY_SCHEME: Final = "bearerAuth"

HTTP_METHODS: Final = frozenset(
    {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
)

# Methods accepted on prediction and explanation routes (everything but OPTIONS).
PREDICT_METHODS: Final = ("get", "post", "put", "patch", "delete")

_TOKEN_HINT: Final = (
    "When token authorization is enabled, requests must carry `Authorization: Bearer <key>`."
)

# ----------------------------------------------------------------------------------------------
# Small builders. Each returns new objects on every call.


def _schema_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _json_response(description: str, schema_name: str) -> dict[str, Any]:
    return {"description": description, "content": _json_content(_schema_ref(schema_name))}


def _error(description: str) -> dict[str, Any]:
    return _json_response(description, "Error")


def _unauthorized(key: str) -> dict[str, Any]:
    return _error(
        f"Token authorization failed: the {key} key is missing, malformed, wrong or expired "
        "(InvalidKeyException)."
    )


def _text_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


def _binary_schema() -> dict[str, Any]:
    return {"type": "string", "format": "binary"}


def _free_form_object() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": True}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


def _query_param(
    name: str, schema: dict[str, Any], description: str, *, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


def _integer(default: int | None = None, fmt: str = "int32") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "format": fmt}
    if default is not None:
        schema["default"] = default
    return schema


def _boolean(default: bool | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "boolean"}
    if default is not None:
        schema["default"] = default
    return schema


def _string() -> dict[str, Any]:
    return {"type": "string"}


def _operation(
    operation_id: str,
    summary: str,
    description: str,
    responses: dict[str, dict[str, Any]],
    *,
    parameters: list[dict[str, Any]] | None = None,
    request_body: dict[str, Any] | None = None,
    secured: bool = True,
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
    }
    if parameters:
        operation["parameters"] = parameters
    if request_body is not None:
        operation["requestBody"] = request_body
    operation["responses"] = responses
    if secured:
        operation["security"] = [{SECURITY_SCHEME: []}]
    return operation


def _document(
    version: str, description: str, paths: dict[str, Any], components: dict[str, Any]
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": TITLE, "description": description, "version": version},
        "paths": paths,
    }
    if components:
        doc["components"] = components
    return doc


def _security_schemes() -> dict[str, Any]:
    return {
        SECURITY_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "Token authorization (on by default). Keys are written to `key_file.json` at "
                "start-up: the inference key guards the inference API, the management key the "
                "management API, and the API key only `GET /token`. Not required when token "
                "authorization is disabled."
            ),
        }
    }


def _api_description_operations(api: str, prefix: str) -> dict[str, dict[str, Any]]:
    """``OPTIONS /`` and ``GET /api-description``; both answer this very document."""

    def response() -> dict[str, dict[str, Any]]:
        return {
            "200": {
                "description": f"The OpenAPI 3.0.1 document of the {api} API.",
                "content": _json_content(_free_form_object()),
            }
        }

    return {
        "/": {
            "options": _operation(
                f"{prefix}ApiDescriptionOptions",
                f"Describe the {api} API",
                f"Returns the OpenAPI document of the {api} API. Needs no token.",
                response(),
                secured=False,
            )
        },
        "/api-description": {
            "get": _operation(
                f"{prefix}ApiDescription",
                f"Describe the {api} API",
                "Same document as `OPTIONS /`. Needs no token.",
                response(),
                secured=False,
            )
        },
    }


# ----------------------------------------------------------------------------------------------
# Shared component schemas.


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Body of every error generated by the server (keys in this order).",
        "required": ["code", "type", "message"],
        "additionalProperties": False,
        "properties": {
            "code": {"type": "integer", "format": "int32", "description": "The HTTP status."},
            "type": {
                "type": "string",
                "description": "Error class, e.g. `ModelNotFoundException`.",
            },
            "message": {"type": "string", "description": "Human readable explanation."},
        },
        "example": {
            "code": 404,
            "type": "ModelNotFoundException",
            "message": "Model not found: resnet18",
        },
    }


def _status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Outcome of a management action.",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
        "example": {"status": "Processing worker updates..."},
    }


# ----------------------------------------------------------------------------------------------
# Inference API.

_ENDPOINT_KINDS: Final = (
    ("predictions", "predictions", "Predict", "Run inference"),
    ("explanations", "explanations", "Explain", "Explain a prediction"),
)


def _inference_request_body() -> dict[str, Any]:
    return {
        "required": False,
        "description": (
            "Handler input. A raw body of any content type becomes one input named `body` with "
            "the request's content type. Each field of a `multipart/form-data` or "
            "`application/x-www-form-urlencoded` body becomes an input named after the field."
        ),
        "content": {
            "*/*": {"schema": _binary_schema()},
            "multipart/form-data": {"schema": _free_form_object()},
            "application/x-www-form-urlencoded": {"schema": _free_form_object()},
        },
    }


def _inference_responses() -> dict[str, dict[str, Any]]:
    return {
        "200": {
            "description": (
                "The handler's output. Status, headers and content type are set by the handler; "
                "a streaming handler produces a chunked response."
            ),
            "headers": {
                "x-request-id": {
                    "description": "Identifier the server gave to this request.",
                    "schema": {"type": "string"},
                }
            },
            "content": {"*/*": {"schema": _binary_schema()}},
        },
        "400": _error("Invalid request (BadRequestException)."),
        "401": _unauthorized("inference"),
        "404": _error("Unknown model or model version."),
        "413": _error("Request body larger than `max_request_size`."),
        "500": _error("Worker died or timed out, or an unexpected server error."),
        "503": _error(
            "No worker can take the request (none running, job queue full, sequence rejected) "
            "or the handler failed."
        ),
        "507": _error("Worker ran out of memory or hit a device error."),
    }


def _inference_paths() -> dict[str, Any]:
    paths: dict[str, Any] = _api_description_operations("inference", "inference")

    def ping_responses() -> dict[str, dict[str, Any]]:
        return {
            "200": _json_response("Every model has enough healthy workers.", "Health"),
            "500": _json_response(
                "Some model has fewer healthy workers than `minWorkers`.", "Health"
            ),
            "401": _unauthorized("inference"),
        }

    ping_description = "Health check of the server and its models. " + _TOKEN_HINT
    paths["/ping"] = {
        "get": _operation("ping", "Health check", ping_description, ping_responses()),
        "post": _operation("pingPost", "Health check", ping_description, ping_responses()),
    }

    for segment, id_base, verb, summary in _ENDPOINT_KINDS:
        explain_note = (
            " The handler receives header `explain: True`." if segment == "explanations" else ""
        )
        variants = (
            (
                f"/{segment}/{{model_name}}",
                id_base,
                f"{summary} on the default version of a model.",
                False,
                False,
            ),
            (
                f"/{segment}/{{model_name}}/{{model_version}}",
                f"{id_base}Version",
                f"{summary} on one version of a model.",
                True,
                False,
            ),
            (
                f"/{segment}/{{model_name}}/{{model_version}}/{{rest}}",
                f"{id_base}VersionPath",
                (
                    f"{summary} on one version of a model; the extra path segments are passed "
                    "to the handler in header `url_path`."
                ),
                True,
                True,
            ),
        )
        for path, op_base, description, has_version, has_rest in variants:
            parameters = [_path_param("model_name", "Name of the model.")]
            if has_version:
                parameters.append(_path_param("model_version", "Version of the model."))
            if has_rest:
                parameters.append(
                    _path_param(
                        "rest",
                        "Remaining path, which may span several `/`-separated segments.",
                    )
                )
            item: dict[str, Any] = {"parameters": parameters}
            for method in PREDICT_METHODS:
                item[method] = _operation(
                    f"{op_base}{method.capitalize()}",
                    f"{verb} ({method.upper()})",
                    f"{description} Every method except OPTIONS is accepted and treated alike."
                    f"{explain_note} {_TOKEN_HINT}",
                    _inference_responses(),
                    request_body=_inference_request_body(),
                )
            paths[path] = item
    return paths


def inference_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the inference API (default port 8080)."""
    components = {
        "schemas": {
            "Error": _error_schema(),
            "Health": {
                "type": "object",
                "required": ["status"],
                "properties": {"status": {"type": "string", "enum": ["Healthy", "Unhealthy"]}},
            },
        },
        "securitySchemes": _security_schemes(),
    }
    return _document(
        version,
        "Inference API: health check, predictions and explanations.",
        _inference_paths(),
        components,
    )


# ----------------------------------------------------------------------------------------------
# Management API.

# (name, schema factory, description) of the register parameters, shared by the query string
# and the JSON body.
_REGISTER_FIELDS: Final = (
    (
        "url",
        _string,
        "Archive to load: a `.mar`/`.tar.gz` name or directory in the model store, a `file://` "
        "URL, or an `http(s)://` URL allowed by `allowed_urls`. Required, either in the query "
        "string or in the JSON body.",
    ),
    ("model_name", _string, "Model name; defaults to the archive manifest's."),
    ("handler", _string, "Handler; defaults to the archive manifest's."),
    ("runtime", _string, "Runtime; defaults to the archive manifest's (`python`)."),
    ("batch_size", _integer, "Maximum batch size; model-config, then server config, then 1."),
    (
        "max_batch_delay",
        _integer,
        "Milliseconds to wait for a batch to fill; model-config, then server config, then 100.",
    ),
    (
        "initial_workers",
        _integer,
        "Workers to start; defaults to `default_workers_per_model`. Valid "
        "`minWorkers`/`maxWorkers` in the model-config win.",
    ),
    (
        "synchronous",
        lambda: _boolean(True),
        "Wait for the workers to start before answering (200) instead of answering 202.",
    ),
    (
        "response_timeout",
        _integer,
        "Seconds a worker may take per batch (default 120; a model-config value wins).",
    ),
    (
        "startup_timeout",
        _integer,
        "Seconds a worker may take to load the model (default 120; a model-config value wins).",
    ),
    ("s3_sse_kms", lambda: _boolean(False), "Use S3 SSE-KMS when downloading the archive."),
)


def _register_request_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": (
            "Register parameters as a JSON body (`Content-Type: application/json`), the "
            "alternative to the query string. Same names, meanings and defaults."
        ),
        "required": ["url"],
        "properties": {
            name: {**factory(), "description": text} for name, factory, text in _REGISTER_FIELDS
        },
    }


def _describe_schema() -> dict[str, Any]:
    def integer(description: str, fmt: str = "int32") -> dict[str, Any]:
        return {"type": "integer", "format": fmt, "description": description}

    def boolean(description: str) -> dict[str, Any]:
        return {"type": "boolean", "description": description}

    def string(description: str) -> dict[str, Any]:
        return {"type": "string", "description": description}

    properties: dict[str, Any] = {
        "modelName": string("Model name."),
        "modelVersion": string("Model version."),
        "modelUrl": string("Archive the model was loaded from."),
        "engine": string("Not used; omitted."),
        "runtime": string("Runtime, e.g. `python`."),
        "minWorkers": integer("Minimum number of workers."),
        "maxWorkers": integer("Maximum number of workers."),
        "batchSize": integer("Maximum batch size."),
        "maxBatchDelay": integer("Milliseconds to wait for a batch to fill."),
        "responseTimeout": integer("Seconds a worker may take per batch."),
        "startupTimeout": integer("Seconds a worker may take to load the model."),
        "maxRetryTimeoutInSec": integer("Seconds a crashed worker may take to recover."),
        "clientTimeoutInMills": integer("Client timeout in milliseconds (0: none)."),
        "parallelType": string("Model parallelism type (empty: none)."),
        "parallelLevel": integer("Model parallelism level."),
        "deviceType": {"type": "string", "enum": ["cpu", "gpu"], "description": "Device kind."},
        "deviceIds": {
            "type": "array",
            "items": {"type": "integer", "format": "int32"},
            "description": "Devices assigned to the model; omitted when none.",
        },
        "continuousBatching": boolean("Whether continuous batching is on."),
        "useJobTicket": boolean("Whether requests need a free worker to be accepted."),
        "useVenv": boolean("Whether the model runs in its own virtual environment."),
        "stateful": boolean("Whether the model uses sequence batching."),
        "sequenceMaxIdleMSec": integer("Idle time after which a sequence expires (ms).", "int64"),
        "sequenceTimeoutMSec": integer("Total lifetime of a sequence (ms).", "int64"),
        "maxNumSequence": integer("Maximum number of open sequences."),
        "maxSequenceJobQueueSize": integer("Job queue size per sequence."),
        "loadedAtStartup": boolean("Whether the model was loaded at server start."),
        "workers": {
            "type": "array",
            "items": _schema_ref("Worker"),
            "description": "The model's workers.",
        },
        "jobQueueStatus": _schema_ref("JobQueueStatus"),
        "customizedMetadata": {
            "type": "object",
            "additionalProperties": True,
            "description": (
                "Output of the handler's `describe_handle()` parsed as JSON (`{}` when it is "
                "not JSON); only with `customized=true`."
            ),
        },
    }
    optional = {"engine", "deviceIds", "customizedMetadata"}
    return {
        "type": "object",
        "description": "Description of one model version. Null fields are omitted.",
        "required": [name for name in properties if name not in optional],
        "properties": properties,
    }


def _management_schemas() -> dict[str, Any]:
    return {
        "Error": _error_schema(),
        "Status": _status_schema(),
        "ModelList": {
            "type": "object",
            "required": ["models"],
            "properties": {
                "nextPageToken": {
                    "type": "string",
                    "description": (
                        "Value for `next_page_token` to get the next page (a number as a "
                        "string); absent on the last page."
                    ),
                },
                "models": {"type": "array", "items": _schema_ref("ModelSummary")},
            },
        },
        "ModelSummary": {
            "type": "object",
            "required": ["modelName", "modelUrl"],
            "properties": {"modelName": _string(), "modelUrl": _string()},
        },
        "ModelDescription": _describe_schema(),
        "Worker": {
            "type": "object",
            "required": ["id", "startTime", "status", "memoryUsage", "pid", "gpu", "gpuUsage"],
            "properties": {
                "id": {"type": "string", "description": "Worker id (its port), e.g. `9000`."},
                "startTime": {
                    "type": "string",
                    "description": "Start time, `yyyy-MM-dd'T'HH:mm:ss.SSS'Z'`.",
                },
                "status": {"type": "string", "description": "`READY` or `UNLOADING`."},
                "memoryUsage": {
                    "type": "integer",
                    "format": "int64",
                    "description": "Resident memory in bytes.",
                },
                "pid": {"type": "integer", "format": "int64", "description": "Process id."},
                "gpu": {"type": "boolean", "description": "Whether the worker uses a GPU."},
                "gpuUsage": {"type": "string", "description": "GPU usage, `N/A` on CPU."},
            },
        },
        "JobQueueStatus": {
            "type": "object",
            "required": ["remainingCapacity", "pendingRequests"],
            "properties": {
                "remainingCapacity": {
                    "type": "integer",
                    "format": "int32",
                    "description": "Free places in the model's job queue.",
                },
                "pendingRequests": {
                    "type": "integer",
                    "format": "int32",
                    "description": "Requests waiting in the job queue.",
                },
            },
        },
        "RegisterModelRequest": _register_request_schema(),
    }


def _model_path_params(with_version: bool) -> list[dict[str, Any]]:
    params = [_path_param("model_name", "Name of the model.")]
    if with_version:
        params.append(_path_param("model_version", "Version of the model."))
    return params


def _list_models() -> dict[str, Any]:
    return _operation(
        "listModels",
        "List registered models",
        "Default versions of all models, sorted by name, one page at a time. " + _TOKEN_HINT,
        {
            "200": _json_response("One page of models.", "ModelList"),
            "400": _error("Invalid query parameter."),
            "401": _unauthorized("management"),
        },
        parameters=[
            _query_param(
                "limit",
                _integer(100),
                "Page size; values below 0 or above 100 are taken as 100.",
            ),
            _query_param("next_page_token", _integer(0), "Index of the first model to list."),
        ],
    )


def _register_model() -> dict[str, Any]:
    parameters = [_query_param(name, factory(), text) for name, factory, text in _REGISTER_FIELDS]
    return _operation(
        "registerModel",
        "Register a model",
        (
            "Loads a model archive and optionally starts workers. Parameters come either from "
            "the query string or from a JSON body with the same names. `url` is required, but "
            "it is not marked required in the query string because the JSON body may carry it "
            "instead. Answers 405 when the model API is disabled. " + _TOKEN_HINT
        ),
        {
            "200": _json_response(
                "Registered; workers started (synchronous) or none requested.", "Status"
            ),
            "202": _json_response("Registered; workers are starting (asynchronous).", "Status"),
            "400": _error("Missing `url` or an invalid parameter."),
            "401": _unauthorized("management"),
            "404": _error("Archive not found, or URL not allowed."),
            "405": _error("The model API is disabled."),
            "409": _error("This model name and version are already registered."),
            "500": _error("Workers failed to start; the registration was rolled back."),
        },
        parameters=parameters,
        request_body={
            "required": False,
            "description": "Register parameters as JSON, instead of the query string.",
            "content": _json_content(_schema_ref("RegisterModelRequest")),
        },
    )


def _describe_model(with_version: bool) -> dict[str, Any]:
    target = "one version (`all`: every version)" if with_version else "the default version"
    return _operation(
        "describeModelVersion" if with_version else "describeModel",
        "Describe a model version" if with_version else "Describe a model",
        f"Configuration and worker state of {target} of a model. " + _TOKEN_HINT,
        {
            "200": {
                "description": "One description per matching model version.",
                "content": _json_content(
                    {"type": "array", "items": _schema_ref("ModelDescription")}
                ),
            },
            "401": _unauthorized("management"),
            "404": _error("Unknown model or model version."),
            "500": _error("The handler's customized describe failed."),
        },
        parameters=[
            _query_param(
                "customized",
                _boolean(False),
                "Also ask the handler for `customizedMetadata`.",
            )
        ],
    )


def _scale_workers(with_version: bool) -> dict[str, Any]:
    target = "one version" if with_version else "the default version"
    return _operation(
        "scaleWorkersVersion" if with_version else "scaleWorkers",
        "Scale the workers of a model version" if with_version else "Scale the workers of a model",
        f"Sets the worker range of {target} of a model. " + _TOKEN_HINT,
        {
            "200": _json_response("Workers scaled (synchronous).", "Status"),
            "202": _json_response("Scaling in progress (asynchronous).", "Status"),
            "206": _json_response("Synchronous, but not all workers are up yet.", "Status"),
            "400": _error("Invalid parameter, e.g. `max_worker` below `min_worker`."),
            "401": _unauthorized("management"),
            "404": _error("Unknown model or model version."),
            "500": _error("Workers failed to start."),
        },
        parameters=[
            _query_param("min_worker", _integer(1), "Minimum number of workers."),
            _query_param("max_worker", _integer(), "Maximum number of workers (default: min)."),
            _query_param("synchronous", _boolean(False), "Wait for the workers before answering."),
            _query_param("timeout", _integer(), "Accepted for compatibility; ignored."),
            _query_param("number_gpu", _integer(), "Accepted for compatibility; ignored."),
        ],
    )


def _unregister_model(with_version: bool) -> dict[str, Any]:
    target = "one version" if with_version else "the default version"
    return _operation(
        "unregisterModelVersion" if with_version else "unregisterModel",
        "Unregister a model version" if with_version else "Unregister a model",
        f"Stops the workers of {target} of a model and removes it. " + _TOKEN_HINT,
        {
            "200": _json_response("Unregistered.", "Status"),
            "401": _unauthorized("management"),
            "403": _error("The default version cannot be removed while other versions exist."),
            "404": _error("Unknown model or model version."),
            "405": _error("The model API is disabled."),
            "408": _error("The workers did not stop within `unregister_model_timeout`."),
        },
    )


def _set_default() -> dict[str, Any]:
    return _operation(
        "setDefaultVersion",
        "Set the default version",
        "Makes this version the one used when a request names no version. " + _TOKEN_HINT,
        {
            "200": _json_response("Default version updated.", "Status"),
            "401": _unauthorized("management"),
            "404": _error("Unknown model or model version."),
        },
    )


def _token() -> dict[str, Any]:
    return _operation(
        "generateToken",
        "Regenerate a key",
        (
            "Replaces the management or inference key in `key_file.json`. Needs the API key "
            "as bearer token. Not available (404) when token authorization is disabled."
        ),
        {
            "200": _text_response("Key regenerated; the body is empty apart from a newline."),
            "400": _error("`type` is neither `management` nor `inference`."),
            "401": _unauthorized("API"),
            "404": _error("Token authorization is disabled."),
        },
        parameters=[
            _query_param(
                "type",
                {"type": "string", "enum": ["management", "inference"]},
                "Which key to regenerate.",
            )
        ],
    )


def _management_paths() -> dict[str, Any]:
    paths: dict[str, Any] = _api_description_operations("management", "management")
    paths["/models"] = {"get": _list_models(), "post": _register_model()}
    paths["/models/{model_name}"] = {
        "parameters": _model_path_params(False),
        "get": _describe_model(False),
        "put": _scale_workers(False),
        "delete": _unregister_model(False),
    }
    paths["/models/{model_name}/{model_version}"] = {
        "parameters": _model_path_params(True),
        "get": _describe_model(True),
        "put": _scale_workers(True),
        "delete": _unregister_model(True),
    }
    paths["/models/{model_name}/{model_version}/set-default"] = {
        "parameters": _model_path_params(True),
        "put": _set_default(),
    }
    paths["/token"] = {"get": _token()}
    return paths


def management_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the management API (default port 8081)."""
    return _document(
        version,
        "Management API: register, describe, scale and unregister models; regenerate keys.",
        _management_paths(),
        {"schemas": _management_schemas(), "securitySchemes": _security_schemes()},
    )


# ----------------------------------------------------------------------------------------------
# Metrics API.


def metrics_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of the metrics API (default port 8082; never token protected)."""
    paths: dict[str, Any] = {
        "/": {
            "options": _operation(
                "metricsApiDescriptionOptions",
                "Describe the metrics API",
                "Returns the OpenAPI document of the metrics API.",
                {
                    "200": {
                        "description": "The OpenAPI 3.0.1 document of the metrics API.",
                        "content": _json_content(_free_form_object()),
                    }
                },
                secured=False,
            )
        },
        "/metrics": {
            "get": _operation(
                "getMetrics",
                "Get metrics",
                "Metrics in the Prometheus text exposition format 0.0.4.",
                {
                    "200": {
                        "description": (
                            "Prometheus exposition; content type "
                            "`text/plain; version=0.0.4; charset=utf-8`."
                        ),
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
                parameters=[
                    {
                        "name": "name[]",
                        "in": "query",
                        "required": False,
                        "description": "Only these metric names (repeat the parameter).",
                        "style": "form",
                        "explode": True,
                        "schema": {"type": "array", "items": {"type": "string"}},
                    }
                ],
                secured=False,
            )
        },
    }
    return _document(version, "Metrics API: Prometheus metrics.", paths, {})


# ----------------------------------------------------------------------------------------------
# Route helpers.


def documented_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """``{(METHOD, path)}`` of every operation in ``doc``.

    For example ``("GET", "/models/{model_name}")``; methods are upper case.
    """
    routes: set[tuple[str, str]] = set()
    for path, item in doc.get("paths", {}).items():
        for key in item:
            if key in HTTP_METHODS:
                routes.add((key.upper(), path))
    return routes


# <name>, <converter:name> or <converter(args):name>
_WERKZEUG_VARIABLE: Final = re.compile(r"<(?:[A-Za-z_]\w*(?:\([^)]*\))?:)?([A-Za-z_]\w*)>")


def werkzeug_rule_to_openapi(rule: str) -> str:
    """``/models/<model_name>/<path:rest>`` -> ``/models/{model_name}/{rest}``."""
    return _WERKZEUG_VARIABLE.sub(r"{\1}", rule)
