"""KServe's v1 prediction protocol over REST, on the inference port.

A thin adapter onto the :class:`~trioserve.runtime.dataplane.Dataplane`, beside TorchServe's
and the OIP routes in the port's one route table (:data:`V1_ROUTES`, part of
``http/inference.ROUTES``; the fast path and the Quart views both call :func:`answer`):

- ``GET /v1/models``: ``{"models": [names]}``, every registered model;
- ``GET /v1/models/{name}``: ``{"name", "ready": true}`` (200) when the model's default
  version has a ready worker, 503 otherwise;
- ``POST /v1/models/{name}:predict`` and ``:explain``: ``{"instances": [...]}`` in,
  ``{"predictions": [...]}`` / ``{"explanations": [...]}`` out. The body is checked here
  (:func:`trioserve.core.kserve.instances_of`) and queued as one request marked
  :data:`~trioserve.core.kserve.V1_HEADER`; the worker hands each instance to the handler
  as one row, as TorchServe's ``kserve`` envelope does (:mod:`trioserve.worker.torchserve.kserve`).

Failures answer ``{"error": "..."}`` as KServe's own server does: 404 unknown model, 400 a
body that is not ``{"instances": [...]}`` (or an MLServer model, which speaks v2 only), 503
no ready worker or a full queue (with ``Retry-After``), 500 a handler that failed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Final

from trioserve.auth import KeyKind
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.kserve import EXPLAIN_HEADER, V1_HEADER, instances_of
from trioserve.core.messages import Param, Reply
from trioserve.core.oip import error_body
from trioserve.core.request import InferenceRequest
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer
from trioserve.http.oip import json_answer, oip_error, unexpected_error
from trioserve.http.routes import Route
from trioserve.runtime.dataplane import Dataplane

JSON_TYPE: Final = "application/json"
GET = frozenset({"GET"})
POST = frozenset({"POST"})
# Request headers never shown to handlers (the marker is the server's to set).
HIDDEN_HEADERS: Final = frozenset({b"authorization", V1_HEADER.encode()})

# The fast matcher takes the first rule that fits a path: ":predict" before the bare name.
V1_ROUTES: Final = [
    Route("v1_models", "/v1/models", GET, KeyKind.INFERENCE, True),
    Route("v1_predict", "/v1/models/<model_name>:predict", POST, KeyKind.INFERENCE, True),
    Route("v1_explain", "/v1/models/<model_name>:explain", POST, KeyKind.INFERENCE, True),
    Route("v1_model", "/v1/models/<model_name>", GET, KeyKind.INFERENCE, True),
]
V1_ENDPOINTS: Final = frozenset(route.endpoint for route in V1_ROUTES)


def is_v1_path(path: str) -> bool:
    """Whether ``path`` is under ``/v1``, where every failure answers ``{"error"}``."""
    return path == "/v1" or path.startswith("/v1/")


async def answer(
    dataplane: Dataplane,
    endpoint: str,
    variables: Mapping[str, str],
    headers: Iterable[tuple[bytes, bytes]],
    body: bytes,
) -> Answer:
    """The answer to one v1 request (``endpoint`` from :data:`V1_ROUTES`)."""
    try:
        if endpoint == "v1_models":
            return json_answer(200, model_list(dataplane))
        name = variables["model_name"]
        model = dataplane.model(name)
        if endpoint == "v1_model":
            if model.ready_workers > 0:
                # A model that answers the OpenAI API is OpenAI's model object too.
                extra = openai_model(name) if model.openai is not None else {}
                return json_answer(200, {"name": name, "ready": True, **extra})
            raise ServeError(
                ErrorKind.UNAVAILABLE, f"model {name!r} is not ready: it has no ready worker"
            )
        if model.mlserver is not None:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"model {name!r} is an MLServer model, which speaks the v2 protocol only: "
                f"POST /v2/models/{name}/infer",
            )
        instances_of(body, dataplane.limits)  # a malformed body is refused before it is queued
        explain = endpoint == "v1_explain"
        return await predict(dataplane, name, _forwarded(headers, explain), body)
    except ServeError as error:
        return oip_error(error)
    except Exception as exc:  # a bug: still the protocol's error body
        return unexpected_error(exc)


# OpenAI's model objects need a creation time: the server's start.
STARTED: Final = int(time.time())


def openai_model(name: str) -> dict[str, object]:
    """OpenAI's model object (``client.models.retrieve`` and ``list``)."""
    return {"id": name, "object": "model", "created": STARTED, "owned_by": "trioserve"}


def model_list(dataplane: Dataplane) -> dict[str, object]:
    """KServe v1's ``{"models": [names]}`` with OpenAI's list beside it (``object``,
    ``data``: the models whose default version answers the OpenAI API), so that both
    clients read the one route."""
    names = list(dict.fromkeys(name for name, _version, _model in dataplane.registered()))
    return {
        "models": names,
        "object": "list",
        "data": [openai_model(name) for name in names if dataplane.model(name).openai is not None],
    }


def _forwarded(headers: Iterable[tuple[bytes, bytes]], explain: bool) -> list[tuple[str, str]]:
    """The request's headers for the handler, minus credentials, plus TorchServe's
    ``explain`` entry and the v1 marker."""
    forwarded = [
        (name.decode("latin-1").lower(), value.decode("latin-1"))
        for name, value in headers
        if name.lower() not in HIDDEN_HEADERS
    ]
    forwarded.append((EXPLAIN_HEADER, "True" if explain else "False"))
    forwarded.append((V1_HEADER, "1"))
    return forwarded


async def predict(
    dataplane: Dataplane, name: str, headers: list[tuple[str, str]], body: bytes
) -> Answer:
    """Queue the v1 request and answer with its final reply (marked ``counted``: the
    dataplane has recorded its response class)."""
    infer = InferenceRequest(name, None, [Param("body", body, JSON_TYPE)], headers)
    try:
        call = dataplane.submit(infer)
        async with call:
            final: Reply | None = None
            async for reply, is_final in call.replies():
                if is_final:
                    final = reply
    except ServeError as error:
        return _counted(oip_error(error))
    if final is None:
        return _counted(oip_error(ServeError(ErrorKind.INTERNAL, "the model sent no answer")))
    answer_headers = [
        *NO_CACHE_HEADERS.items(),
        ("Content-Type", final.content_type or JSON_TYPE),
        ("x-request-id", infer.request_id),
    ]
    if final.status >= 400:
        text = bytes(final.body).decode("utf-8", "replace") or final.reason
        answer_headers[-2] = ("Content-Type", JSON_TYPE)
        return Answer(final.status, answer_headers, error_body(text), counted=True)
    return Answer(200, answer_headers, bytes(final.body), counted=True)


def _counted(answer: Answer) -> Answer:
    answer.counted = True
    return answer


__all__ = ["V1_ENDPOINTS", "V1_ROUTES", "answer", "is_v1_path", "predict"]
