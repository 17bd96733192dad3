"""The TorchServe inference API (port 8080): ping, predictions, explanations."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial

import trio
from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.auth import KeyKind, TokenStore
from trioserve.core.errors import ServeError
from trioserve.core.messages import Param, Reply
from trioserve.core.request import InferenceRequest
from trioserve.http.common import (
    DOC_ROUTES,
    NO_CACHE_HEADERS,
    error_response,
    install_token_check,
    json_response,
    new_app,
)
from trioserve.http.openapi import inference_document
from trioserve.metrics import ServerMetrics
from trioserve.runtime.jobs import Job
from trioserve.runtime.manager import ModelManager

# Methods TorchServe accepts on prediction routes (everything but OPTIONS).
PREDICT_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# Request headers never shown to handlers.
HIDDEN_HEADERS = frozenset({"authorization"})


async def read_params() -> list[Param]:
    """The handler inputs of the current request (spec §2.2)."""
    mimetype = request.mimetype
    if mimetype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form
        params = [Param(k, v.encode()) for k, v in form.items(multi=True)]
        files = await request.files
        for key, storage in files.items(multi=True):
            params.append(Param(key, storage.read(), storage.content_type or None))
        return params
    body = await request.get_data(cache=False)
    assert isinstance(body, bytes)
    return [Param("body", body, request.headers.get("Content-Type"))]


def forwarded_headers() -> list[tuple[str, str]]:
    """Request headers with their names as sent, minus credentials."""
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in request.scope["headers"]
        if name.decode("latin-1").lower() not in HIDDEN_HEADERS
    ]


class ReplyBody:
    """The streamed body of a job whose handler sends intermediate responses."""

    def __init__(
        self,
        first: Reply,
        rest: AsyncIterator[tuple[Reply, bool]],
        job: Job,
        on_final: Callable[[], None],
    ) -> None:
        self._first: Reply | None = first
        self._rest = rest
        self._job = job
        self._on_final = on_final

    def __aiter__(self) -> ReplyBody:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            body, self._first = bytes(self._first.body), None
            return body
        try:
            reply, final = await self._rest.__anext__()
        except ServeError as error:
            # Headers are gone already: end the stream with the error text as the last chunk.
            self._job.cancel()
            return f"\n{error.status} {error.message}".encode()
        if final:
            self._on_final()
        return bytes(reply.body)

    async def aclose(self) -> None:
        self._job.cancel()


def reply_response(reply: Reply, body: bytes | ReplyBody, request_id: str) -> Response:
    response = Response(body, status=reply.status)
    del response.headers["Content-Type"]
    response.headers.update(NO_CACHE_HEADERS)
    for key, value in reply.headers.items():
        response.headers[key] = value
    if reply.content_type:
        response.headers["Content-Type"] = reply.content_type
    response.headers["x-request-id"] = request_id
    return response


def _finished(
    metrics: ServerMetrics | None, infer: InferenceRequest, job: Job, began: float
) -> None:
    if metrics is None or job.started_at is None:
        return
    metrics.request_finished(
        infer.model,
        infer.version,
        latency_us=(trio.current_time() - began) * 1e6,
        queue_us=(job.started_at - job.enqueued_at) * 1e6,
    )


async def answer(
    manager: ModelManager, infer: InferenceRequest, metrics: ServerMetrics | None = None
) -> Response:
    """Queue the request and turn the job's replies into a response (streamed if needed)."""
    began = trio.current_time()
    if metrics is not None:
        metrics.request_received(infer.model, infer.version)
    try:
        job = manager.submit(infer)
    except ServeError as error:
        return error_response(error, infer.request_id)
    replies = job.replies()
    try:
        first, final = await replies.__anext__()
    except ServeError as error:
        return error_response(error, infer.request_id)
    except BaseException:
        job.cancel()
        raise
    if final:
        _finished(metrics, infer, job, began)
        return reply_response(first, bytes(first.body), infer.request_id)
    body = ReplyBody(first, replies, job, partial(_finished, metrics, infer, job, began))
    return reply_response(first, body, infer.request_id)


def create_inference_app(
    manager: ModelManager,
    *,
    max_request_size: int,
    tokens: TokenStore | None = None,
    metrics: ServerMetrics | None = None,
) -> QuartTrio:
    app = new_app("trioserve.inference", max_request_size, metrics)
    install_token_check(app, tokens, KeyKind.INFERENCE, exempt=DOC_ROUTES)

    @app.route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        if manager.healthy():
            return json_response({"status": "Healthy"})
        return json_response({"status": "Unhealthy"}, status=500)

    async def predict(model: str, version: str | None, rest: str | None, explain: bool) -> Response:
        params = await read_params()
        headers = forwarded_headers()
        headers.append(("explain", "True" if explain else "False"))
        if rest is not None:
            headers.append(("url_path", rest))
        infer = InferenceRequest(model=model, version=version, params=params, headers=headers)
        return await answer(manager, infer, metrics)

    @app.route("/", methods=["OPTIONS"])
    @app.get("/api-description")
    async def api_description() -> Response:
        return json_response(inference_document(__version__))

    for prefix, explain in (("predictions", False), ("explanations", True)):

        def bind(explain: bool = explain, prefix: str = prefix) -> None:
            async def route(
                model_name: str, model_version: str | None = None, rest: str | None = None
            ) -> Response:
                return await predict(model_name, model_version, rest, explain)

            route.__name__ = f"{prefix}_route"
            app.add_url_rule(f"/{prefix}/<model_name>", view_func=route, methods=PREDICT_METHODS)
            app.add_url_rule(
                f"/{prefix}/<model_name>/<model_version>", view_func=route, methods=PREDICT_METHODS
            )
            app.add_url_rule(
                f"/{prefix}/<model_name>/<model_version>/<path:rest>",
                view_func=route,
                methods=PREDICT_METHODS,
            )

        bind()

    return app
