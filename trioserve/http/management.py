"""The TorchServe management API (port 8081): thin routes onto ManagementService."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.auth import KeyKind, TokenStore, bearer
from trioserve.core import errors, jsontext
from trioserve.http.common import DOC_ROUTES, install_token_check, json_response, new_app
from trioserve.http.openapi import management_document
from trioserve.metrics import ServerMetrics
from trioserve.runtime.management import ManagementService, Outcome, int_param


def outcome_response(outcome: Outcome) -> Response:
    return json_response(outcome.body, outcome.status)


async def register_params() -> Mapping[str, Any]:
    """Query parameters, or a JSON object body (``Content-Type: application/json``)."""
    params: dict[str, Any] = dict(request.args.items())
    if request.mimetype == "application/json":
        raw = await request.get_data(as_text=False)
        if raw.strip():
            try:
                body = jsontext.parse(raw)
            except jsontext.JSONError as exc:
                raise errors.bad_request(f"The request body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise errors.bad_request("The JSON request body must be an object.")
            params.update(body)
    return params


def create_management_app(
    service: ManagementService,
    *,
    max_request_size: int,
    tokens: TokenStore | None = None,
    metrics: ServerMetrics | None = None,
    tokens_changed: Callable[[], Awaitable[None]] | None = None,
) -> QuartTrio:
    """``tokens_changed``: awaited after ``/token`` replaced a key, before it answers (the
    other serving processes take the new key)."""
    app = new_app("trioserve.management", max_request_size, metrics)
    install_token_check(app, tokens, KeyKind.MANAGEMENT, exempt=DOC_ROUTES | {("GET", "/token")})

    @app.route("/", methods=["OPTIONS"])
    @app.get("/api-description")
    async def api_description() -> Response:
        return json_response(management_document(__version__))

    @app.get("/token")
    async def token() -> Response:
        if tokens is None:
            raise errors.resource_not_found()
        # Rewriting the key file fsyncs: keep it off the event loop.
        await trio.to_thread.run_sync(
            tokens.regenerate, request.args.get("type", ""), bearer(request.headers.items())
        )
        if tokens_changed is not None:
            await tokens_changed()
        return Response("\n", status=200, content_type="text/plain")

    @app.get("/models")
    async def list_models() -> Response:
        args = request.args
        return outcome_response(
            service.list_models(int_param(args, "limit"), int_param(args, "next_page_token"))
        )

    @app.post("/models")
    async def register() -> Response:
        return outcome_response(await service.register(await register_params()))

    @app.get("/models/<model_name>")
    @app.get("/models/<model_name>/<model_version>")
    async def describe(model_name: str, model_version: str | None = None) -> Response:
        customized = request.args.get("customized", "false").lower() == "true"
        return outcome_response(await service.describe(model_name, model_version, customized))

    @app.put("/models/<model_name>")
    @app.put("/models/<model_name>/<model_version>")
    async def scale(model_name: str, model_version: str | None = None) -> Response:
        return outcome_response(await service.scale(model_name, model_version, request.args))

    @app.put("/models/<model_name>/<model_version>/set-default")
    async def set_default(model_name: str, model_version: str) -> Response:
        return outcome_response(await service.set_default(model_name, model_version))

    @app.delete("/models/<model_name>")
    @app.delete("/models/<model_name>/<model_version>")
    async def unregister(model_name: str, model_version: str | None = None) -> Response:
        return outcome_response(await service.unregister(model_name, model_version))

    return app
