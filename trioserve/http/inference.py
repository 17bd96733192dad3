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
from trioserve.core.http1 import Request
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
# Routes whose failures answer their protocol's JSON error and which read no forms.
KSERVE_LIKE = oip.OIP_ENDPOINTS | kserve.V1_ENDPOINTS | openai.OPENAI_ENDPOINTS
# Routes whose requests InferenceFastPath.start submits without a task waiting.
TORCHSERVE_PREDICTIONS = frozenset({"predictions", "explanations"})


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


def reply_headers(
    reply: Reply, request_id: str, sequence: tuple[str, str] | None = None
) -> list[tuple[str, str]]:
    """No-cache headers, then the handler's (replacing any of the same name, in any case),
    then the request id and the ``sequence`` header, if the request belongs to one."""
    merged = {key.lower(): (key, value) for key, value in NO_CACHE_HEADERS.items()}
    for key, value in reply.headers.items():
        merged[key.lower()] = (key, value)
    if reply.content_type:
        merged["content-type"] = ("Content-Type", reply.content_type)
    merged["x-request-id"] = ("x-request-id", request_id)
    if sequence is not None:
        merged[sequence[0].lower()] = sequence
    return list(merged.values())


def _with_sequence(answer: Answer, sequence: tuple[str, str] | None) -> Answer:
    if sequence is not None:
        answer.headers.append(sequence)
    return answer


async def predict(dataplane: Dataplane, infer: InferenceRequest) -> Answer:
    """Submit the request and turn the call's replies into an answer (streamed if needed).

    The answer is marked ``counted``: the dataplane has recorded its response class."""
    try:
        call = dataplane.submit(infer)
    except ServeError as error:
        sequence = _sequence(dataplane, infer.sequence_id)
        return _counted(_with_sequence(error_answer(error, infer.request_id), sequence))
    sequence = _sequence(dataplane, call.sequence_id)
    try:
        first, final = await call.next_reply()
    except ServeError as error:
        return _counted(_with_sequence(error_answer(error, infer.request_id), sequence))
    except BaseException:
        call.cancel()
        raise
    headers = reply_headers(first, infer.request_id, sequence)
    close = first.status >= 400
    if final:
        return Answer(first.status, headers, bytes(first.body), close, counted=True)
    return Answer(first.status, headers, ReplyBody(first, call), close, counted=True)


def _sequence(dataplane: Dataplane, sequence_id: str | None) -> tuple[str, str] | None:
    """The sequence header every answer of a sequence's request carries."""
    return None if not sequence_id else (dataplane.sequence_header, sequence_id)


def _counted(answer: Answer) -> Answer:
    answer.counted = True
    return answer


def _prediction_headers(
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


def _mimetype(content_type: bytes) -> str:
    return content_type.split(b";", 1)[0].strip().lower().decode("latin-1")


class Pending:
    """A prediction submitted by :meth:`InferenceFastPath.start`, its answer not yet known:
    :meth:`poll` gives it once the call's first reply (or its failure) is in."""

    __slots__ = ("_call", "_request_id", "_sequence")

    def __init__(self, call: Call, request_id: str, sequence: tuple[str, str] | None) -> None:
        self._call = call
        self._request_id = request_id
        self._sequence = sequence

    def when_ready(self, wake: Callable[[], object]) -> None:
        self._call.when_ready(wake)

    def cancel(self) -> None:
        self._call.cancel()

    def poll(self) -> Answer | None:
        """The answer (streamed when the handler sends intermediate replies), or None when
        no reply has come yet; as :func:`predict` answers."""
        try:
            item = self._call.poll_reply()
        except ServeError as error:
            answer = error_answer(error, self._request_id)
            return _counted(_with_sequence(answer, self._sequence))
        if item is None:
            return None
        first, final = item
        headers = reply_headers(first, self._request_id, self._sequence)
        close = first.status >= 400
        if final:
            return Answer(first.status, headers, bytes(first.body), close, counted=True)
        return Answer(first.status, headers, ReplyBody(first, self._call), close, counted=True)


class InferenceFastPath:
    """Predictions and explanations with a raw body, answered without Quart (the front's
    fast path): awaited whole (``await fast(request)``), or, for TorchServe's prediction
    routes, begun without a task waiting (:meth:`start`) so that the reply is written by
    whoever delivers it (see :mod:`trioserve.http.connection`)."""

    def __init__(
        self,
        dataplane: Dataplane,
        tokens: TokenStore | None = None,
        management: ModelControl | None = None,
    ) -> None:
        self.dataplane = dataplane
        self.tokens = tokens
        self.management = management
        self.sequence_header = dataplane.sequence_header.lower().encode("latin-1")

    def _refusal(self, endpoint: str, kserve_api: bool, request: Request) -> Answer | None:
        """The answer to a request without the key its route needs (None: it may go on)."""
        if self.tokens is None:
            return None
        try:
            ROUTES.authorize(
                self.tokens,
                endpoint,
                ((n.decode("latin-1"), v.decode("latin-1")) for n, v in request.headers),
            )
        except ServeError as error:
            if endpoint in openai.OPENAI_ENDPOINTS:
                return openai.serve_error_answer(error)
            return oip.oip_error(error) if kserve_api else error_answer(error)
        return None

    def _prediction(
        self, request: Request, endpoint: str, variables: dict[str, str], content_type: bytes | None
    ) -> InferenceRequest:
        rest = variables.get("rest")
        param = Param(
            "body", request.body, None if content_type is None else content_type.decode("latin-1")
        )
        sequence_id = request.header(self.sequence_header)
        return InferenceRequest(
            model=variables["model_name"],
            version=variables.get("model_version"),
            params=[param],
            headers=_prediction_headers(request.headers, endpoint == "explanations", rest),
            sequence_id=sequence_id.decode("latin-1") if sequence_id else None,
        )

    def start(self, request: Request) -> Answer | Pending | None:
        """Submit a TorchServe prediction or explanation without waiting for it: its answer
        at once (a refusal), or the pending call. None for every other request (the
        awaited path or the app answers those)."""
        matched = ROUTES.match(request.method, request.path)
        if matched is None:
            return None
        route, variables = matched
        if route.endpoint not in TORCHSERVE_PREDICTIONS:
            return None
        content_type = request.header(b"content-type")
        if content_type is not None and _mimetype(content_type) in FORMS:
            return None
        refusal = self._refusal(route.endpoint, False, request)
        if refusal is not None:
            return refusal
        infer = self._prediction(request, route.endpoint, variables, content_type)
        dataplane = self.dataplane
        try:
            call = dataplane.submit(infer)
        except ServeError as error:
            sequence = _sequence(dataplane, infer.sequence_id)
            return _counted(_with_sequence(error_answer(error, infer.request_id), sequence))
        return Pending(call, infer.request_id, _sequence(dataplane, call.sequence_id))

    async def __call__(self, request: Request) -> Answer | None:
        matched = ROUTES.match(request.method, request.path)
        if matched is None:
            return None
        route, variables = matched
        # KServe's protocols (v2 and v1) answer {"error"} bodies and read no forms.
        kserve_api = route.endpoint in KSERVE_LIKE
        content_type = request.header(b"content-type")
        if not kserve_api and content_type is not None and _mimetype(content_type) in FORMS:
            return None  # forms go through the Quart app
        refusal = self._refusal(route.endpoint, kserve_api, request)
        if refusal is not None:
            return refusal
        dataplane = self.dataplane
        if route.endpoint in openai.OPENAI_ENDPOINTS:
            return await openai.answer(dataplane, route.endpoint, request.body)
        if route.endpoint in kserve.V1_ENDPOINTS:
            return await kserve.answer(
                dataplane, route.endpoint, variables, request.headers, request.body
            )
        if kserve_api:
            return await oip.answer(
                dataplane, route.endpoint, variables, request.headers, request.body, self.management
            )
        infer = self._prediction(request, route.endpoint, variables, content_type)
        return await predict(dataplane, infer)


def fast_path(
    dataplane: Dataplane,
    *,
    tokens: TokenStore | None = None,
    management: ModelControl | None = None,
) -> InferenceFastPath:
    """The inference port's fast path (:class:`InferenceFastPath`)."""
    return InferenceFastPath(dataplane, tokens, management)


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
                headers=_prediction_headers(request.scope["headers"], explain, rest),
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
