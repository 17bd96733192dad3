"""The Open Inference Protocol (KServe v2) over REST, on the inference port.

A thin adapter onto the :class:`~trioserve.runtime.dataplane.Dataplane`, beside
TorchServe's routes in the port's one route table (:data:`OIP_ROUTES`, part of
``http/inference.ROUTES``). Every route is answered by :func:`answer` (the fast path calls
it; the Quart views too, for the requests the fast path hands on): server and model
metadata, liveness and readiness, Triton's model configuration and statistics extensions
(``/config``, ``/stats``: :mod:`trioserve.runtime.triton`), ``infer`` / ``generate`` (one
answer), ``infer_stream`` /
``generate_stream`` (Server-Sent Events, one ``data:`` event per answer), and the OpenAPI
document of these routes (``GET /v2/docs/dataplane.json``, no token: ``api/oip.yaml``, kept in
step with what this module answers). The infer calls themselves are answered by
:mod:`trioserve.http.oip_infer`. Tensors are
decoded and encoded by :mod:`trioserve.core.oip` (JSON and the binary tensor extension);
they reach the worker as work items (:mod:`trioserve.core.oip.transport`).

Every failure answers ``{"error": "..."}`` with the status of its kind (404 unknown model or
version, 400 bad input, 503 not ready...), never a framework's own error page.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trioserve import __version__
from trioserve.auth import KeyKind
from trioserve.core import jsontext
from trioserve.core.errors import ErrorKind, ServeError, internal_error
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, check_elements
from trioserve.core.oip import (
    HEADER_LENGTH_HEADER,
    InferRequest,
    TensorMeta,
    error_body,
    parse_header_length,
    parse_infer_request,
    raw_request,
)
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer
from trioserve.http.errors import http_status
from trioserve.http.oip_infer import JSON_TYPE, infer, infer_stream, refuse_binary_stream_outputs
from trioserve.http.openapi import oip_document
from trioserve.http.routes import Route
from trioserve.runtime import oip_repository
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.oip import (
    SERVER_NAME,
    SERVER_VERSION,
    ModelMetadata,
    declared_inputs,
    is_handler_exception,
    model_metadata,
)
from trioserve.runtime.oip_repository import ModelControl
from trioserve.runtime.triton import model_config, model_statistics

log = logging.getLogger("trioserve.http")

EXTENSIONS: Final = ("binary_tensor_data", "parameters", "model_configuration", "statistics")


def _model_routes(suffix: str, endpoint: str, methods: frozenset[str]) -> list[Route]:
    return [
        Route(endpoint, f"/v2/models/<model_name>{suffix}", methods, KeyKind.INFERENCE, True),
        Route(
            endpoint,
            f"/v2/models/<model_name>/versions/<model_version>{suffix}",
            methods,
            KeyKind.INFERENCE,
            True,
        ),
    ]


GET = frozenset({"GET"})
POST = frozenset({"POST"})

OIP_ROUTES: Final = [
    Route("oip_server", "/v2", GET, KeyKind.INFERENCE, True),
    Route("oip_live", "/v2/health/live", GET, KeyKind.INFERENCE, True),
    Route("oip_ready", "/v2/health/ready", GET, KeyKind.INFERENCE, True),
    # The OpenAPI document of these routes answers without a token, as /api-description does.
    Route("oip_docs", "/v2/docs/dataplane.json", GET, None, True),
    # Before the model routes: as on Triton, a model named "stats" has its metadata hidden.
    Route("oip_stats", "/v2/models/stats", GET, KeyKind.INFERENCE, True),
    *_model_routes("/stats", "oip_stats", GET),
    *_model_routes("/config", "oip_config", GET),
    *_model_routes("", "oip_model", GET),
    *_model_routes("/ready", "oip_model_ready", GET),
    *_model_routes("/infer", "oip_infer", POST),
    *_model_routes("/generate", "oip_infer", POST),
    *_model_routes("/infer_stream", "oip_infer_stream", POST),
    *_model_routes("/generate_stream", "oip_infer_stream", POST),
    # The repository extension: listing needs the inference key, (un)loading the management
    # key and the model API, as TorchServe's register and unregister.
    Route("oip_repository_index", "/v2/repository/index", POST, KeyKind.INFERENCE, True),
    Route(
        "oip_repository_load",
        "/v2/repository/models/<model_name>/load",
        POST,
        KeyKind.MANAGEMENT,
        True,
    ),
    Route(
        "oip_repository_unload",
        "/v2/repository/models/<model_name>/unload",
        POST,
        KeyKind.MANAGEMENT,
        True,
    ),
]
OIP_ENDPOINTS: Final = frozenset(route.endpoint for route in OIP_ROUTES)


def is_oip_path(path: str) -> bool:
    """Whether ``path`` is under ``/v2``, where the failures the Quart app reports itself
    (an unknown path or method, a missing token, too large a body) answer the protocol's
    ``{"error"}`` body too (``http/inference.py``)."""
    return path == "/v2" or path.startswith("/v2/")


def json_answer(status: int, value: object, headers: Iterable[tuple[str, str]] = ()) -> Answer:
    body = json.dumps(value, separators=(",", ":")).encode()
    return Answer(status, [*NO_CACHE_HEADERS.items(), ("Content-Type", JSON_TYPE), *headers], body)


def oip_status(error: ServeError) -> int:
    """The status of ``error`` for an OIP client: as on the rest of the port, except that a
    handler's exception is 500 (what KServe, Triton and MLServer answer), not TorchServe's
    503 "Prediction failed", which tells a KServe client to retry."""
    return 500 if is_handler_exception(error) else http_status(error)


def oip_error(error: ServeError) -> Answer:
    """``{"error": message}`` with the status of the error's kind."""
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", JSON_TYPE)]
    if error.retry_after is not None:
        headers.append(("Retry-After", str(error.retry_after)))
    return Answer(oip_status(error), headers, error_body(error.message))


async def answer(
    dataplane: Dataplane,
    endpoint: str,
    variables: Mapping[str, str],
    headers: Iterable[tuple[bytes, bytes]],
    body: bytes,
    management: ModelControl | None = None,
) -> Answer:
    """The answer to one OIP request (``endpoint`` from :data:`OIP_ROUTES`); the repository
    extension needs ``management`` (without it those routes answer 501)."""
    name = variables.get("model_name")
    version = variables.get("model_version")
    try:
        if endpoint == "oip_server":
            return json_answer(
                200, {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}
            )
        if endpoint == "oip_live":
            return json_answer(200, {"live": True})
        if endpoint == "oip_ready":
            ready = dataplane.healthy()
            return json_answer(200 if ready else 503, {"ready": ready})
        if endpoint == "oip_docs":
            return json_answer(200, oip_document(__version__))
        if endpoint.startswith("oip_repository"):
            return await repository(dataplane, management, endpoint, name, body)
        if endpoint == "oip_stats":
            entries = model_statistics(dataplane, name, version)
            return json_answer(
                200, {"model_stats": [e.stats.json(e.name, e.version) for e in entries]}
            )
        assert name is not None
        model = dataplane.model(name, version)
        if endpoint == "oip_model":
            return json_answer(200, metadata_body(model_metadata(dataplane, model)))
        if endpoint == "oip_config":
            return json_answer(200, model_config(dataplane, model).json())
        if endpoint == "oip_model_ready":
            ready = model.ready_workers > 0
            return json_answer(200 if ready else 503, {"name": name, "ready": ready})
        request = read_request(model, headers, body, dataplane.limits)
        streamed = endpoint == "oip_infer_stream"
        if streamed:
            refuse_binary_stream_outputs(request)
    except ServeError as error:
        return oip_error(error)
    except Exception as exc:  # a bug: still the protocol's error body, not the port's
        return unexpected_error(exc)
    # From here on the request goes to the dataplane, which counts its response class.
    try:
        if streamed:
            result = await infer_stream(dataplane, model, request)
        else:
            result = await infer(dataplane, model, request)
    except ServeError as error:
        result = oip_error(error)
    except Exception as exc:
        result = unexpected_error(exc)
    result.counted = True
    return result


def unexpected_error(exc: Exception) -> Answer:
    """A bug met while answering a KServe-protocol request (v2 or v1): logged with its
    traceback, answered 500 with the protocol's ``{"error"}`` body."""
    log.exception("unexpected error while answering a KServe protocol (v1 or v2) request")
    return oip_error(internal_error(exc))


async def repository(
    dataplane: Dataplane,
    management: ModelControl | None,
    endpoint: str,
    name: str | None,
    body: bytes,
) -> Answer:
    """The repository extension (:mod:`trioserve.runtime.oip_repository`); ``index`` with
    ``{"ready": true}`` lists only the ready versions."""
    if management is None:
        raise ServeError(ErrorKind.NOT_IMPLEMENTED, "the repository extension is not served here")
    options = _json_object(body)
    if endpoint == "oip_repository_index":
        entries = oip_repository.index(dataplane, only_ready=options.get("ready") is True)
        return json_answer(
            200,
            [{"name": e.name, "version": e.version, "state": e.state, "reason": e.reason}
             for e in entries],
        )  # fmt: skip
    assert name is not None
    if endpoint == "oip_repository_load":
        await oip_repository.load(dataplane, management, name)
        return json_answer(200, {"name": name, "load": True})
    await oip_repository.unload(dataplane, management, name)
    return json_answer(200, {"name": name, "unload": True})


def _json_object(body: bytes) -> dict[str, Any]:
    """A repository request's optional JSON object body (empty: ``{}``)."""
    if not body.strip():
        return {}
    try:
        value = jsontext.parse(body)
    except jsontext.JSONError as exc:
        raise ServeError(ErrorKind.BAD_INPUT, f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ServeError(ErrorKind.BAD_INPUT, "the request body must be a JSON object")
    return value


def metadata_body(metadata: ModelMetadata) -> dict[str, Any]:
    """A model's metadata as the REST answer's JSON."""
    return {
        "name": metadata.name,
        "versions": metadata.versions,
        "platform": metadata.platform,
        "inputs": [_tensor_meta(meta) for meta in metadata.inputs],
        "outputs": [_tensor_meta(meta) for meta in metadata.outputs],
    }


def _tensor_meta(meta: TensorMeta) -> dict[str, Any]:
    return {"name": meta.name, "datatype": meta.datatype, "shape": list(meta.shape)}


def read_request(
    model: ModelVersion,
    headers: Iterable[tuple[bytes, bytes]],
    body: bytes,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> InferRequest:
    length_header = HEADER_LENGTH_HEADER.lower().encode()
    raw_length = next((v for k, v in headers if k == length_header), None)
    length = parse_header_length(None if raw_length is None else raw_length.decode("latin-1"))
    if length == 0:
        inputs = declared_inputs(model)
        if len(inputs) != 1:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"a raw binary request ({HEADER_LENGTH_HEADER}: 0) needs a model with exactly "
                f"one declared input; model {model.name!r} declares {len(inputs)} "
                "(model-config tensorInputs)",
            )
        request = raw_request(body, inputs)
        check_elements(sum(tensor.element_count for tensor in request.inputs), limits)
        return request
    return parse_infer_request(body, header_length=length, limits=limits)
