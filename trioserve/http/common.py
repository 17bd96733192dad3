"""What every TorchServe-style Quart app shares: error handlers, response headers, the
status counters, and the token check of the apps that have no route table."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from trioserve.auth import KeyKind, TokenStore, bearer
from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.http.bodies import NO_CACHE_HEADERS, Answer, json_text
from trioserve.http.errors import error_answer, protocol_error_answer
from trioserve.metrics.registry import ServerMetrics

log = logging.getLogger("trioserve.http")


def json_response(payload: Any, status: int = 200, request_id: str | None = None) -> Response:
    response = Response(json_text(payload), status=status, content_type="application/json")
    response.headers.update(NO_CACHE_HEADERS)
    if request_id is not None:
        response.headers["x-request-id"] = request_id
    return response


def answer_response(answer: Answer) -> Response:
    """An answer as a Quart response (the routes the fast path leaves to Quart)."""
    if answer.counted:
        g.status_counted = True  # the dataplane counted its response class
    response = Response(answer.body, status=answer.status)
    del response.headers["Content-Type"]
    for key, value in answer.headers:
        response.headers.add(key, value)
    return response


def error_response(error: ServeError, request_id: str | None = None) -> Response:
    return answer_response(error_answer(error, request_id))


# Builds the answer to a failure; called in the request's context, so it may look at the
# request (the inference port answers its OIP paths with the protocol's own error body).
ErrorAnswer = Callable[[ServeError], Answer]


def install_error_handlers(
    app: QuartTrio, max_request_size: int, answer_error: ErrorAnswer = error_answer
) -> None:
    """Map framework errors and unexpected exceptions to error bodies (TorchServe's, unless
    ``answer_error`` says otherwise)."""

    def respond(error: ServeError) -> Response:
        return answer_response(answer_error(error))

    @app.errorhandler(ServeError)
    async def _serve_error(error: ServeError) -> Response:
        return respond(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        if isinstance(error, NotFound):
            return respond(errors.resource_not_found())
        if isinstance(error, MethodNotAllowed):
            return respond(errors.method_not_allowed())
        if isinstance(error, RequestEntityTooLarge):
            return respond(errors.request_too_large(max_request_size))
        return answer_response(
            protocol_error_answer(error.code or 500, error.description or error.name)
        )

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Response:
        log.exception("unexpected error while handling a request")
        return respond(errors.internal_error(error))


def new_app(
    name: str,
    max_request_size: int,
    metrics: ServerMetrics | None = None,
    *,
    answer_error: ErrorAnswer = error_answer,
) -> QuartTrio:
    app = QuartTrio(name)

    @app.after_request
    async def _finish(response: Response) -> Response:
        if metrics is not None and not g.get("status_counted", False):
            metrics.http_status(response.status_code)
        if response.status_code >= 400:
            # As TorchServe: an error closes the connection. An error may leave the request
            # body unread, and a keep-alive connection would then stall the next request.
            response.headers["Connection"] = "close"
        return response

    app.config["MAX_CONTENT_LENGTH"] = max_request_size
    app.config["RESPONSE_TIMEOUT"] = None  # streams may run long; the model has its own timeout
    app.config["BODY_TIMEOUT"] = 60
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    install_error_handlers(app, max_request_size, answer_error)
    return app


# The API description routes answer without a token, as TorchServe's do.
DOC_ROUTES = frozenset({("OPTIONS", "/"), ("GET", "/api-description")})


def install_token_check(
    app: QuartTrio,
    store: TokenStore | None,
    kind: KeyKind,
    *,
    exempt: frozenset[tuple[str, str]] = frozenset(),
) -> None:
    """Require ``Authorization: Bearer <key of kind>`` on every route but ``exempt``
    (method, path) pairs. With no store (token auth disabled) nothing is checked."""
    if store is None:
        return

    @app.before_request
    async def _check_token() -> None:
        if (request.method, request.path) in exempt:
            return
        store.check(kind, bearer(request.headers.items()))
