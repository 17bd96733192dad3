"""The TorchServe inference API (port 8080): ping, predictions, explanations."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import trio
from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.auth import KeyKind, TokenStore, bearer
from trioserve.core.errors import ServeError
from trioserve.core.http1 import Request
from trioserve.core.messages import Param, Reply
from trioserve.core.request import InferenceRequest
from trioserve.http.common import (
    DOC_ROUTES,
    NO_CACHE_HEADERS,
    answer_response,
    error_answer,
    install_token_check,
    json_response,
    new_app,
)
from trioserve.http.front import Answer, FastPath
from trioserve.http.openapi import inference_document
from trioserve.metrics import ServerMetrics
from trioserve.runtime.jobs import Job
from trioserve.runtime.manager import ModelManager

# Methods TorchServe accepts on prediction routes (everything but OPTIONS).
PREDICT_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# Request headers never shown to handlers.
HIDDEN_HEADERS = frozenset({b"authorization"})
# Bodies whose fields become the handler's inputs (parsed by Quart).
FORMS = frozenset({"multipart/form-data", "application/x-www-form-urlencoded"})


async def read_params() -> list[Param]:
    """The handler inputs of the current request (spec §2.2)."""
    if request.mimetype in FORMS:
        form = await request.form
        params = [Param(k, v.encode()) for k, v in form.items(multi=True)]
        files = await request.files
        for key, storage in files.items(multi=True):
            params.append(Param(key, storage.read(), storage.content_type or None))
        return params
    body = await request.get_data(cache=False)
    assert isinstance(body, bytes)
    return [Param("body", body, request.headers.get("Content-Type"))]


class ReplyBody:
    """The streamed body of a job whose handler sends intermediate responses."""

    def __init__(self, first: Reply, job: Job, on_final: Callable[[], None]) -> None:
        self._first: Reply | None = first
        self._job = job
        self._on_final = on_final
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
            reply, final = await self._job.next_reply()
        except ServeError as error:
            # Headers are gone already: end the stream with the error text as the last chunk.
            self._done = True
            self._job.cancel()
            return f"\n{error.status} {error.message}".encode()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if final:
            self._done = True
            self._on_final()
        return bytes(reply.body)

    async def aclose(self) -> None:
        self._job.cancel()


def reply_headers(reply: Reply, request_id: str) -> list[tuple[str, str]]:
    """No-cache headers, then the handler's (replacing any of the same name, in any case)."""
    merged = {key.lower(): (key, value) for key, value in NO_CACHE_HEADERS.items()}
    for key, value in reply.headers.items():
        merged[key.lower()] = (key, value)
    if reply.content_type:
        merged["content-type"] = ("Content-Type", reply.content_type)
    merged["x-request-id"] = ("x-request-id", request_id)
    return list(merged.values())


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


async def predict(
    manager: ModelManager, infer: InferenceRequest, metrics: ServerMetrics | None = None
) -> Answer:
    """Queue the request and turn the job's replies into an answer (streamed if needed)."""
    began = trio.current_time()
    if metrics is not None:
        metrics.request_received(infer.model, infer.version)
    try:
        job = manager.submit(infer)
    except ServeError as error:
        return error_answer(error, infer.request_id)
    try:
        first, final = await job.next_reply()
    except ServeError as error:
        return error_answer(error, infer.request_id)
    except BaseException:
        job.cancel()
        raise
    headers = reply_headers(first, infer.request_id)
    close = first.status >= 400
    if final:
        _finished(metrics, infer, job, began)
        return Answer(first.status, headers, bytes(first.body), close)
    body = ReplyBody(first, job, partial(_finished, metrics, infer, job, began))
    return Answer(first.status, headers, body, close)


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


def prediction_route(method: str, path: str) -> tuple[str, str | None, str | None, bool] | None:
    """``(model, version, rest, explain)`` for a plain predictions/explanations path.

    None for anything the fast path leaves to Quart: other routes and methods, and paths
    with percent-escapes or empty segments (Quart decodes, merges or refuses those)."""
    if method not in PREDICT_METHODS or "%" in path:
        return None
    if path.startswith("/predictions/"):
        explain, tail = False, path[13:]
    elif path.startswith("/explanations/"):
        explain, tail = True, path[14:]
    else:
        return None
    parts = tail.split("/", 2)
    if "" in parts:
        return None
    model = parts[0]
    version = parts[1] if len(parts) > 1 else None
    rest = parts[2] if len(parts) > 2 else None
    return model, version, rest, explain


def fast_path(
    manager: ModelManager,
    *,
    tokens: TokenStore | None = None,
    metrics: ServerMetrics | None = None,
) -> FastPath:
    """Predictions and explanations with a raw body, answered without Quart."""

    async def answer(request: Request) -> Answer | None:
        route = prediction_route(request.method, request.path)
        if route is None:
            return None
        content_type = request.header(b"content-type")
        if content_type is not None and _mimetype(content_type) in FORMS:
            return None  # Quart parses forms
        if tokens is not None:
            try:
                tokens.check(
                    KeyKind.INFERENCE,
                    bearer((n.decode("latin-1"), v.decode("latin-1")) for n, v in request.headers),
                )
            except ServeError as error:
                return error_answer(error)
        model, version, rest, explain = route
        param = Param(
            "body", request.body, None if content_type is None else content_type.decode("latin-1")
        )
        infer = InferenceRequest(
            model=model,
            version=version,
            params=[param],
            headers=_prediction_headers(request.headers, explain, rest),
        )
        return await predict(manager, infer, metrics)

    return answer


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

    async def predict_route(
        model: str, version: str | None, rest: str | None, explain: bool
    ) -> Response:
        params = await read_params()
        headers = _prediction_headers(request.scope["headers"], explain, rest)
        infer = InferenceRequest(model=model, version=version, params=params, headers=headers)
        return answer_response(await predict(manager, infer, metrics))

    @app.route("/", methods=["OPTIONS"])
    @app.get("/api-description")
    async def api_description() -> Response:
        return json_response(inference_document(__version__))

    for prefix, explain in (("predictions", False), ("explanations", True)):

        def bind(explain: bool = explain, prefix: str = prefix) -> None:
            async def route(
                model_name: str, model_version: str | None = None, rest: str | None = None
            ) -> Response:
                return await predict_route(model_name, model_version, rest, explain)

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
