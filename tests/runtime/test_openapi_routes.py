"""The served OpenAPI documents describe exactly the routes each app has."""

from __future__ import annotations

from typing import Any

from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.http.inference import create_inference_app
from trioserve.http.management import create_management_app
from trioserve.http.openapi import (
    documented_routes,
    inference_document,
    management_document,
    werkzeug_rule_to_openapi,
)


def app_routes(app: QuartTrio) -> set[tuple[str, str]]:
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        for method in rule.methods or ():
            if method == "HEAD":  # added by werkzeug for every GET
                continue
            routes.add((method, werkzeug_rule_to_openapi(rule.rule)))
    return routes


def test_inference_document_matches_the_app() -> None:
    app = create_inference_app(object(), max_request_size=1000)  # type: ignore[arg-type]
    assert app_routes(app) == documented_routes(inference_document(__version__))


def test_management_document_matches_the_app() -> None:
    app = create_management_app(object(), max_request_size=1000)  # type: ignore[arg-type]
    assert app_routes(app) == documented_routes(management_document(__version__))


async def test_documents_are_served_without_a_token() -> None:
    from trioserve.auth import KeyKind, TokenStore

    def check(doc: Any) -> None:
        assert doc["openapi"] == "3.0.1"
        assert doc["info"]["title"] == "TorchServe APIs"

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        tokens = TokenStore.create(Path(tmp) / "key_file.json", expiration_min=5)
        app = create_inference_app(object(), max_request_size=1000, tokens=tokens)  # type: ignore[arg-type]
        client = app.test_client()
        r = await client.options("/")
        assert r.status_code == 200
        check(await r.get_json())
        r = await client.get("/api-description")
        check(await r.get_json())
        assert (await client.get("/ping")).status_code == 401
        auth = {"Authorization": f"Bearer {tokens.key(KeyKind.INFERENCE)}"}
        assert (await client.get("/", headers=auth)).status_code == 405
