"""What every TorchServe-style HTTP app shares: error bodies and response headers."""

from __future__ import annotations

import json
import logging
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from trioserve.auth import KeyKind, TokenStore, bearer
from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.http.front import Answer
from trioserve.metrics.registry import ServerMetrics

log = logging.getLogger("trioserve.http")

# Sent on every frontend response, as TorchServe does.
NO_CACHE_HEADERS = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}


def json_text(payload: Any) -> str:
    """TorchServe's JSON style: 2-space indent, no ASCII escaping, trailing newline."""
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"


def json_response(payload: Any, status: int = 200, request_id: str | None = None) -> Response:
    response = Response(json_text(payload), status=status, content_type="application/json")
    response.headers.update(NO_CACHE_HEADERS)
    if request_id is not None:
        response.headers["x-request-id"] = request_id
    return response


def error_answer(error: ServeError, request_id: str | None = None) -> Answer:
    """The TorchServe error body; an error closes the connection, as TorchServe's do."""
    headers = [*NO_CACHE_HEADERS.items(), ("Content-Type", "application/json")]
    if request_id is not None:
        headers.append(("x-request-id", request_id))
    if error.retry_after is not None:
        headers.append(("Retry-After", str(error.retry_after)))
    return Answer(error.status, headers, json_text(error.body()).encode(), close=True)


def answer_response(answer: Answer) -> Response:
    """An answer as a Quart response (the routes the fast path leaves to Quart)."""
    response = Response(answer.body, status=answer.status)
    del response.headers["Content-Type"]
    for key, value in answer.headers:
        response.headers.add(key, value)
    return response


def error_response(error: ServeError, request_id: str | None = None) -> Response:
    return answer_response(error_answer(error, request_id))


def install_error_handlers(app: QuartTrio, max_request_size: int) -> None:
    """Map framework errors and unexpected exceptions to TorchServe error bodies."""

    @app.errorhandler(ServeError)
    async def _serve_error(error: ServeError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        if isinstance(error, NotFound):
            return error_response(errors.resource_not_found())
        if isinstance(error, MethodNotAllowed):
            return error_response(errors.method_not_allowed())
        if isinstance(error, RequestEntityTooLarge):
            return error_response(errors.request_too_large(max_request_size))
        code = error.code or 500
        return error_response(
            ServeError(
                code,
                "BadRequestException" if code < 500 else "InternalServerException",
                error.description or error.name,
            )
        )

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Response:
        log.exception("unexpected error while handling a request")
        return error_response(errors.internal_error(error))


def new_app(name: str, max_request_size: int, metrics: ServerMetrics | None = None) -> QuartTrio:
    app = QuartTrio(name)

    @app.after_request
    async def _finish(response: Response) -> Response:
        if metrics is not None:
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
    install_error_handlers(app, max_request_size)
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
