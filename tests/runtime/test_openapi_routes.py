"""The served OpenAPI documents describe exactly the routes each app has (the inference
app: TorchServe's inference API and the Open Inference Protocol's routes, two documents)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.http.inference import create_inference_app
from trioserve.http.kserve import V1_ROUTES
from trioserve.http.management import create_management_app
from trioserve.http.metrics import create_metrics_app
from trioserve.http.oip import OIP_ROUTES
from trioserve.http.openai import OPENAI_ROUTES
from trioserve.http.openapi import (
    DOCUMENT_FILES,
    documented_routes,
    documents_folder,
    inference_document,
    management_document,
    oip_document,
    werkzeug_rule_to_openapi,
)
from trioserve.metrics import ServerMetrics


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
    """TorchServe's inference document and the OIP document, together with KServe's v1
    routes and the OpenAI API's (which have no OpenAPI document here: docs/kserve.md and
    docs/openai.md list them), are the app's routes; neither document has a route of the
    other."""
    app = create_inference_app(object(), max_request_size=1000)  # type: ignore[arg-type]
    torchserve = documented_routes(inference_document(__version__))
    oip = documented_routes(oip_document(__version__))
    v1 = {
        (method, werkzeug_rule_to_openapi(route.rule))
        for route in (*V1_ROUTES, *OPENAI_ROUTES)
        for method in route.methods
    }
    assert not torchserve & oip
    assert not (torchserve | oip) & v1
    assert app_routes(app) == torchserve | oip | v1


def test_oip_document_matches_the_oip_routes() -> None:
    routes = {
        (method, werkzeug_rule_to_openapi(route.rule))
        for route in OIP_ROUTES
        for method in route.methods
    }
    assert routes == documented_routes(oip_document(__version__))


def test_oip_routes_need_the_key_the_document_says() -> None:
    doc = oip_document(__version__)
    for route in OIP_ROUTES:
        for method in route.methods:
            op = doc["paths"][werkzeug_rule_to_openapi(route.rule)][method.lower()]
            assert ("security" in op) == (route.key is not None), route


def test_management_document_matches_the_app() -> None:
    app = create_management_app(object(), max_request_size=1000)  # type: ignore[arg-type]
    assert app_routes(app) == documented_routes(management_document(__version__))


async def test_documents_are_served_without_a_token() -> None:
    from trioserve.auth import KeyKind, TokenStore

    def check(doc: Any, title: str = "TorchServe APIs") -> None:
        assert doc["openapi"] == "3.0.1"
        assert doc["info"]["title"] == title

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
        r = await client.get("/v2/docs/dataplane.json")
        assert r.status_code == 200
        check(await r.get_json(), "Open Inference Protocol (REST)")
        assert (await client.get("/ping")).status_code == 401
        r = await client.get("/v2")
        assert r.status_code == 401
        assert set(await r.get_json()) == {"error"}
        auth = {"Authorization": f"Bearer {tokens.key(KeyKind.INFERENCE)}"}
        assert (await client.get("/", headers=auth)).status_code == 405


def make_app(api: str) -> QuartTrio:
    if api in ("inference", "oip"):
        return create_inference_app(object(), max_request_size=1000)  # type: ignore[arg-type]
    if api == "management":
        return create_management_app(object(), max_request_size=1000)  # type: ignore[arg-type]
    return create_metrics_app(ServerMetrics(hostname="test"), max_request_size=1000)


@pytest.mark.parametrize("api", sorted(DOCUMENT_FILES))
async def test_each_app_serves_its_shipped_file(api: str) -> None:
    """``OPTIONS /`` and ``GET /api-description`` answer the YAML file, with the server version
    (the OIP document: ``GET /v2/docs/dataplane.json`` on the inference app)."""
    text = documents_folder().joinpath(DOCUMENT_FILES[api]).read_text(encoding="utf-8")
    expected = yaml.safe_load(text)
    expected["info"]["version"] = __version__
    client = make_app(api).test_client()
    if api == "oip":
        served = [await client.get("/v2/docs/dataplane.json")]
    else:
        served = [await client.options("/"), await client.get("/api-description")]
    for response in served:
        assert response.status_code == 200
        assert await response.get_json() == expected


async def test_an_unexpected_oip_failure_answers_the_error_object() -> None:
    """A bug while answering an OIP route (here: a dataplane without ``healthy``) is the
    documented 500 with ``{"error"}``, not the port's TorchServe body."""
    from trioserve.http import oip

    answer = await oip.answer(object(), "oip_ready", {}, [], b"")  # type: ignore[arg-type]
    assert answer.status == 500
    assert isinstance(answer.body, bytes)
    assert list(json.loads(answer.body)) == ["error"]
