"""The TorchServe metrics API (port 8082): ``/metrics`` and its API description."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.core import errors
from trioserve.http.bodies import NO_CACHE_HEADERS
from trioserve.http.common import json_response, new_app
from trioserve.http.openapi import metrics_document
from trioserve.metrics.merge import merge_expositions
from trioserve.metrics.registry import CONTENT_TYPE, ServerMetrics

# TorchServe serves the metrics page whatever the method (HEAD comes with GET).
METRICS_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def create_metrics_app(
    metrics: ServerMetrics,
    *,
    max_request_size: int,
    count_requests: bool = True,
    others: Callable[[], Awaitable[list[bytes]]] | None = None,
) -> QuartTrio:
    """The metrics API app. With ``count_requests`` its own responses are counted in
    Requests2XX/4XX/5XX, as TorchServe counts every response of every port.

    With ``others`` (several serving processes) a scrape awaits ``others()``, the unfiltered
    expositions of the other serving processes, and serves the server's totals: the merge
    of ``metrics`` and theirs (:mod:`trioserve.metrics.merge`), filtered by ``name[]``
    afterwards. ``others()`` bounds its own wait and leaves out a process that does not
    answer. In ``log`` mode nothing is exported, and ``others`` is not called."""
    app = new_app("trioserve.metrics", max_request_size, metrics if count_requests else None)

    async def page(names: list[str]) -> bytes:
        if others is None or metrics.mode == "log":
            return metrics.exposition(names or None)
        theirs = await others()
        if not theirs:
            return metrics.exposition(names or None)
        return merge_expositions([metrics.exposition(), *theirs], names or None)

    async def metrics_page(rest: str | None = None) -> Response:
        body = await page(request.args.getlist("name[]"))
        response = Response(body, status=200)
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

    return app


def metrics_api_description() -> dict[str, Any]:
    """The OpenAPI 3.0.1 document of the metrics API."""
    return metrics_document(__version__)
