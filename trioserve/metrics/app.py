"""The TorchServe metrics API (port 8082): ``/metrics`` and its API description."""

from __future__ import annotations

from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.core import errors
from trioserve.http.common import NO_CACHE_HEADERS, json_response, new_app
from trioserve.metrics.registry import CONTENT_TYPE, ServerMetrics

# TorchServe serves the metrics page whatever the method (HEAD comes with GET).
METRICS_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["code", "type", "message"],
    "properties": {
        "code": {"type": "integer", "description": "HTTP status code."},
        "type": {"type": "string", "description": "Kind of error."},
        "message": {"type": "string", "description": "What went wrong."},
    },
}


def metrics_api_description() -> dict[str, Any]:
    """The OpenAPI 3.0.1 document of the metrics API."""
    return {
        "openapi": "3.0.1",
        "info": {
            "title": "TorchServe APIs",
            "description": "Metrics API of trioserve, a TorchServe-compatible model server",
            "version": __version__,
        },
        "paths": {
            "/metrics": {
                "get": {
                    "description": "Server and model metrics in Prometheus text format 0.0.4.",
                    "operationId": "metrics",
                    "parameters": [
                        {
                            "in": "query",
                            "name": "name[]",
                            "description": "Only the metrics with these names (repeatable).",
                            "required": False,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The metrics",
                            "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
                        },
                        "500": {
                            "description": "Internal Server Error",
                            "content": {"application/json": {"schema": _ERROR_SCHEMA}},
                        },
                    },
                }
            }
        },
    }


def create_metrics_app(
    metrics: ServerMetrics, *, max_request_size: int, count_requests: bool = True
) -> QuartTrio:
    """The metrics API app. With ``count_requests`` its own responses are counted in
    Requests2XX/4XX/5XX, as TorchServe counts every response of every port."""
    app = new_app("trioserve.metrics", max_request_size)

    async def metrics_page(rest: str | None = None) -> Response:
        names = request.args.getlist("name[]")
        response = Response(metrics.exposition(names or None), status=200)
        response.headers["Content-Type"] = CONTENT_TYPE
        response.headers.update(NO_CACHE_HEADERS)
        return response

    app.add_url_rule(
        "/metrics", "metrics", metrics_page, methods=METRICS_METHODS, strict_slashes=False
    )
    app.add_url_rule("/metrics/<path:rest>", "metrics_rest", metrics_page, methods=METRICS_METHODS)

    async def root() -> Response:
        if request.method != "OPTIONS":
            raise errors.method_not_allowed()
        return json_response(metrics_api_description())

    async def api_description() -> Response:
        return json_response(metrics_api_description())

    app.add_url_rule("/", "root", root, methods=ALL_METHODS)
    app.add_url_rule("/api-description", "api_description", api_description, methods=ALL_METHODS)

    if count_requests:

        @app.after_request
        async def _count(response: Response) -> Response:
            metrics.http_status(response.status_code)
            return response

    return app
