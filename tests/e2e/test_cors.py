"""CORS on the three HTTP APIs (``cors_allowed_origin``, ``_methods``, ``_headers``)."""

from __future__ import annotations

import httpx
import pytest

from .server import Server

pytestmark = pytest.mark.e2e

ORIGIN = "https://app.example"


@pytest.fixture
def cors(make_server) -> Server:  # type: ignore[no-untyped-def]
    server: Server = make_server(
        tokens=True,
        properties={
            "cors_allowed_origin": ORIGIN,
            "cors_allowed_methods": "GET, POST, PUT, OPTIONS",
            "cors_allowed_headers": "X-Custom-Header, Authorization",
        },
    )
    server.start()
    return server


def test_every_api_answers_with_the_allowed_origin(cors: Server) -> None:
    auth = cors.auth("inference")
    answers = [
        httpx.post(f"{cors.url}/predictions/control", content=b"hi", headers=auth),  # fast path
        httpx.get(f"{cors.url}/ping", headers=auth),  # the Quart app
        httpx.post(f"{cors.url}/predictions/nope", content=b"hi", headers=auth),  # an error
        httpx.get(f"{cors.management_url}/models", headers=cors.auth("management")),
        httpx.get(f"{cors.metrics_url}/metrics"),
    ]
    assert [r.status_code for r in answers] == [200, 200, 404, 200, 200]
    for r in answers:
        assert r.headers["access-control-allow-origin"] == ORIGIN, r.request.url


@pytest.mark.parametrize("api", ["url", "management_url"])
def test_a_preflight_is_answered_without_a_token(cors: Server, api: str) -> None:
    r = httpx.options(
        f"{getattr(cors, api)}/predictions/control"
        if api == "url"
        else f"{cors.management_url}/models",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "X-Custom-Header",
        },
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert r.headers["access-control-allow-methods"] == "GET, POST, PUT, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "X-Custom-Header, Authorization"


def test_without_cors_no_header_is_sent(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server()
    server.start()
    r = httpx.post(f"{server.url}/predictions/control", content=b"hi")
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = httpx.options(
        f"{server.url}/predictions/control",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
