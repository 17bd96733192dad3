"""The TorchServe inference API (port 8080): ping, predictions, explanations.

A thin adapter onto the :class:`~trioserve.runtime.dataplane.Dataplane`: each prediction
becomes an :class:`InferenceRequest`, and the call's replies become the answer (one body,
or a chunked stream when the handler sends intermediate replies). :data:`ROUTES` is the
port's one route table: the fast path of :mod:`trioserve.http.front` answers the routes it
marks fast, the Quart app serves all of them, and both check tokens through it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import trio
from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.auth import KeyKind, TokenStore
from trioserve.core.errors import ServeError
from trioserve.core.messages import Param, Reply
from trioserve.core.request import InferenceRequest
from trioserve.http import kserve, oip, openai
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer
from trioserve.http.common import answer_response, json_response, new_app
from trioserve.http.errors import error_answer, http_status
from trioserve.http.forms import FORM_TYPES, parse_form
from trioserve.http.openapi import inference_document
from trioserve.http.routes import Route, RouteTable
from trioserve.metrics import ServerMetrics
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.oip_repository import ModelControl

# Methods TorchServe accepts on prediction routes (everything but OPTIONS).
PREDICT_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# Request headers never shown to handlers.
HIDDEN_HEADERS = kserve.HIDDEN_HEADERS  # credentials, the v1 marker
# Bodies whose fields become the handler's inputs (http/forms.py, on the Quart path).
FORMS = FORM_TYPES


def _prediction_routes(endpoint: str) -> list[Route]:
    methods = frozenset(PREDICT_METHODS)
    prefix = f"/{endpoint}/<model_name>"
    return [
        Route(endpoint, rule, methods, KeyKind.INFERENCE, fast=True)
        for rule in (prefix, f"{prefix}/<model_version>", f"{prefix}/<model_version>/<path:rest>")
    ]


ROUTES = RouteTable(
    [
        Route("ping", "/ping", frozenset({"GET", "POST"}), KeyKind.INFERENCE),
        # The API description answers without a token, as TorchServe's does.
        Route("api_description", "/", frozenset({"OPTIONS"}), None),
        Route("api_description", "/api-description", frozenset({"GET"}), None),
        *_prediction_routes("predictions"),
        *_prediction_routes("explanations"),
        *oip.OIP_ROUTES,
        *openai.OPENAI_ROUTES,
        *kserve.V1_ROUTES,
    ],
    default_key=KeyKind.INFERENCE,
)


async def read_params() -> list[Param]:
    """The handler inputs of the current request (spec §2.2): a form's fields, parsed
    strictly (a malformed form is a 400 that says why), else the body."""
    body = await request.get_data(cache=False)
    assert isinstance(body, bytes)
    content_type = request.headers.get("Content-Type")
    if content_type is not None and request.mimetype in FORMS:
        return parse_form(content_type, body)
    return [Param("body", body, content_type)]


class ReplyBody:
    """The streamed body of a call whose handler sends intermediate responses."""

    def __init__(self, first: Reply, call: Call) -> None:
        self._first: Reply | None = first
        self._call = call
        self._done = False

    def __aiter__(self) -> ReplyBody:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            body, self._first = bytes(self._first.body), None
            return body
        if self._done:
            raise StopAsyncIteration
        try:
            reply, final = await self._call.next_reply()
        except ServeError as error:
            # Headers are gone already: end the stream with the error text as the last chunk.
            self._done = True
            self._call.cancel()
            return f"\n{http_status(error)} {error.message}".encode()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if final:
            self._done = True
        return bytes(reply.body)

    async def aclose(self) -> None:
        self._call.cancel()


_NO_CACHE_PAIRS = tuple(NO_CACHE_HEADERS.items())
_REPLY_NAMES = frozenset(
    {*(key.lower() for key in NO_CACHE_HEADERS), "content-type", "x-request-id"}
)


def reply_headers(
    reply: Reply, request_id: str, sequence: tuple[str, str] | None = None
) -> list[tuple[str, str]]:
    """No-cache headers, then the handler's (replacing any of the same name, in any case),
    then the request id and the ``sequence`` header, if the request belongs to one."""
    if not reply.headers and (sequence is None or sequence[0].lower() not in _REPLY_NAMES):
        # The usual answer (no handler headers): the same list, without the merge.
        plain = list(_NO_CACHE_PAIRS)
        if reply.content_type:
            plain.append(("Content-Type", reply.content_type))
        plain.append(("x-request-id", request_id))
        if sequence is not None:
            plain.append(sequence)
        return plain
    merged = {key.lower(): (key, value) for key, value in NO_CACHE_HEADERS.items()}
    for key, value in reply.headers.items():
        merged[key.lower()] = (key, value)
    if reply.content_type:
        merged["content-type"] = ("Content-Type", reply.content_type)
    merged["x-request-id"] = ("x-request-id", request_id)
    if sequence is not None:
        merged[sequence[0].lower()] = sequence
    return list(merged.values())


def with_sequence(answer: Answer, sequence: tuple[str, str] | None) -> Answer:
    if sequence is not None:
        answer.headers.append(sequence)
    return answer


def submit(dataplane: Dataplane, infer: InferenceRequest) -> Call | Answer:
    """Admit the request: its call, or the (counted) answer to its refusal."""
    try:
        return dataplane.submit(infer)
    except ServeError as error:
        sequence = sequence_header_of(dataplane, infer.sequence_id)
        return counted(with_sequence(error_answer(error, infer.request_id), sequence))


async def predict(dataplane: Dataplane, infer: InferenceRequest) -> Answer:
    """Submit the request and turn the call's replies into an answer (streamed if needed).

    The answer is marked ``counted``: the dataplane has recorded its response class."""
    call = submit(dataplane, infer)
    if isinstance(call, Answer):
        return call
    sequence = sequence_header_of(dataplane, call.sequence_id)
    try:
        first, final = await call.next_reply()
    except ServeError as error:
        return counted(with_sequence(error_answer(error, infer.request_id), sequence))
    except BaseException:
        call.cancel()
        raise
    return first_answer(first, final, call, infer.request_id, sequence)


def first_answer(
    first: Reply, final: bool, call: Call, request_id: str, sequence: tuple[str, str] | None
) -> Answer:
    """The answer a call's first reply starts: whole when it is the final one, else a
    stream of the replies to come. Marked ``counted`` (the dataplane recorded its class)."""
    headers = reply_headers(first, request_id, sequence)
    close = first.status >= 400
    if final:
        return Answer(first.status, headers, bytes(first.body), close, counted=True)
    return Answer(first.status, headers, ReplyBody(first, call), close, counted=True)


def sequence_header_of(dataplane: Dataplane, sequence_id: str | None) -> tuple[str, str] | None:
    """The sequence header every answer of a sequence's request carries."""
    return None if not sequence_id else (dataplane.sequence_header, sequence_id)


def counted(answer: Answer) -> Answer:
    answer.counted = True
    return answer


def prediction_headers(
    headers: Iterable[tuple[bytes, bytes]], explain: bool, rest: str | None
) -> list[tuple[str, str]]:
    """Request headers for the handler (names lowercased), minus credentials, plus
    TorchServe's ``explain`` and ``url_path`` entries."""
    forwarded = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in headers
        if name.lower() not in HIDDEN_HEADERS
    ]
    forwarded.append(("explain", "True" if explain else "False"))
    if rest is not None:
        forwarded.append(("url_path", rest))
    return forwarded


def error_for_path(error: ServeError, path: str | None) -> Answer:
    """The inference port's answer to a failure: the OIP error body on an OIP path,
    TorchServe's elsewhere (and when the path is unknown)."""
    if path is not None and openai.is_openai_path(path):
        return openai.serve_error_answer(error)
    if path is not None and (oip.is_oip_path(path) or kserve.is_v1_path(path)):
        return oip.oip_error(error)
    return error_answer(error)


def _answer_error(error: ServeError) -> Answer:
    """The Quart app's answer to a failure (see :func:`error_for_path`)."""
    return error_for_path(error, request.path)


def create_inference_app(
    dataplane: Dataplane,
    *,
    max_request_size: int,
    tokens: TokenStore | None = None,
    metrics: ServerMetrics | None = None,
    management: ModelControl | None = None,
) -> QuartTrio:
    """The Quart app of the inference port: every route of :data:`ROUTES` (the OIP
    repository extension needs ``management``)."""
    app = new_app("trioserve.inference", max_request_size, metrics, answer_error=_answer_error)

    async def ping() -> Response:
        if dataplane.healthy():
            return json_response({"status": "Healthy"})
        return json_response({"status": "Unhealthy"}, status=500)

    async def api_description() -> Response:
        return json_response(inference_document(__version__))

    def prediction_view(explain: bool) -> Callable[..., Awaitable[Response]]:
        async def view(
            model_name: str, model_version: str | None = None, rest: str | None = None
        ) -> Response:
            infer = InferenceRequest(
                model=model_name,
                version=model_version,
                params=await read_params(),
                headers=prediction_headers(request.scope["headers"], explain, rest),
                sequence_id=request.headers.get(dataplane.sequence_header) or None,
            )
            return answer_response(await predict(dataplane, infer))

        return view

    def oip_view(endpoint: str) -> Callable[..., Awaitable[Response]]:
        async def view(**variables: str) -> Response:
            body = await request.get_data(cache=False)
            assert isinstance(body, bytes)
            answer = await oip.answer(
                dataplane, endpoint, variables, request.scope["headers"], body, management
            )
            return answer_response(answer)

        return view

    async def v1_view(**variables: str) -> Response:
        body = await request.get_data(cache=False)
        assert isinstance(body, bytes)
        endpoint = request.endpoint or ""
        return answer_response(
            await kserve.answer(dataplane, endpoint, variables, request.scope["headers"], body)
        )

    async def openai_view() -> Response:
        body = await request.get_data(cache=False)
        assert isinstance(body, bytes)
        return answer_response(await openai.answer(dataplane, request.endpoint or "", body))

    ROUTES.install(
        app,
        {
            **dict.fromkeys(openai.OPENAI_ENDPOINTS, openai_view),
            **{endpoint: oip_view(endpoint) for endpoint in oip.OIP_ENDPOINTS},
            **dict.fromkeys(kserve.V1_ENDPOINTS, v1_view),
            "ping": ping,
            "api_description": api_description,
            "predictions": prediction_view(explain=False),
            "explanations": prediction_view(explain=True),
        },
        tokens,
    )
    return app
