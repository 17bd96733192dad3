"""Port 8080's one route table: the fast path's matcher agrees with werkzeug (what the
Quart app routes with) on every fast route, and one token rule serves both."""

from __future__ import annotations

from pathlib import Path

import pytest
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule

from trioserve.auth import KeyKind, TokenStore
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.http.inference import ROUTES, create_inference_app
from trioserve.http.routes import Route, RouteTable

PATHS = [
    "/predictions/m",
    "/predictions/m/1.0",
    "/predictions/m/1.0/a/b",
    "/predictions/m/1.0/a//b",
    "/predictions/m/",
    "/predictions//1.0",
    "/predictions",
    "/predictions/",
    "/explanations/m",
    "/explanations/m/2",
    "/explanations/m/2/x",
    "/ping",
    "/",
    "/api-description",
    "/predictionsx/m",
    "/other/m",
    "/v1/models",
    "/v1/models/m",
    "/v1/models/m:predict",
    "/v1/models/m:explain",
    "/v1/models/m.v2-x:predict",
    "/v1/models/:predict",
    "/v1/models/m:other",
    "/v1/models/m/extra",
]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def werkzeug_match(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    rules = [Rule(r.rule, endpoint=r.endpoint, methods=sorted(r.methods)) for r in ROUTES.routes]
    try:
        endpoint, args = Map(rules).bind("localhost").match(path, method)
    except HTTPException:
        return None
    return str(endpoint), {k: str(v) for k, v in args.items()}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", PATHS)
def test_the_fast_matcher_agrees_with_werkzeug(method: str, path: str) -> None:
    fast = ROUTES.match(method, path)
    expected = werkzeug_match(method, path)
    if fast is not None:
        route, variables = fast
        assert (route.endpoint, variables) == expected
    elif expected is not None:
        # Left to the app: a route the fast path does not answer, or a method it leaves.
        matched = [r for r in ROUTES.routes if r.endpoint == expected[0]]
        assert not all(r.fast for r in matched) or method not in matched[0].methods


def test_percent_escapes_are_left_to_the_app() -> None:
    assert ROUTES.match("POST", "/predictions/m%2Fx") is None


def test_the_app_serves_every_route_of_the_table() -> None:
    app = create_inference_app(object(), max_request_size=100)  # type: ignore[arg-type]
    served = {(rule.rule, rule.endpoint) for rule in app.url_map.iter_rules()}
    assert {(r.rule, r.endpoint) for r in ROUTES.routes} <= served


def test_one_token_rule_for_every_route(tmp_path: Path) -> None:
    store = TokenStore.create(tmp_path / "key_file.json", expiration_min=60)
    key = store.key(KeyKind.INFERENCE)
    ROUTES.authorize(store, "api_description", [])  # documents need no token
    ROUTES.authorize(store, "predictions", [("Authorization", f"Bearer {key}")])
    for endpoint in ("predictions", "ping", None):  # None: no route matched
        with pytest.raises(ServeError) as refused:
            ROUTES.authorize(store, endpoint, [])
        assert refused.value.kind is ErrorKind.UNAUTHENTICATED
    ROUTES.authorize(None, "predictions", [])  # token authorization off


def test_a_table_refuses_an_endpoint_with_two_keys() -> None:
    routes = [
        Route("x", "/a", frozenset({"GET"}), KeyKind.INFERENCE),
        Route("x", "/b", frozenset({"GET"}), None),
    ]
    with pytest.raises(ValueError, match="two keys"):
        RouteTable(routes, default_key=KeyKind.INFERENCE)
