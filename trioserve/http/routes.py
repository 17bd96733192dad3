"""One route table per HTTP port: the fast path and the Quart app both read it.

A :class:`RouteTable` lists every route of an API once (endpoint, werkzeug-style rule,
methods, the key it needs, whether the fast path may answer it). From it:

- the Quart app gets its URL rules (:meth:`RouteTable.install`), with the view of each
  endpoint;
- the fast path matches requests (:meth:`RouteTable.match`) with compiled patterns that
  follow werkzeug's default converters (``<name>``: one non-empty segment, ``<path:name>``:
  the rest, not starting with ``/``). werkzeug's own matcher costs ~20 µs per request here,
  ten times this one, which is why the fast path does not use it; a test checks that both
  agree on every route;
- both check tokens through :meth:`RouteTable.authorize`, so a route's key is stated once.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quart import request
from quart_trio import QuartTrio

from trioserve.auth import KeyKind, TokenStore, bearer

_VARIABLE = re.compile(r"<(?:(path):)?([A-Za-z_][A-Za-z0-9_]*)>")


@dataclass(frozen=True, slots=True)
class Route:
    """One URL rule of an API."""

    endpoint: str
    rule: str  # werkzeug syntax: "/predictions/<model_name>/<path:rest>"
    methods: frozenset[str]
    key: KeyKind | None  # the key a request needs; None: answered without a token
    fast: bool = False  # the fast path may answer it (it may still hand a request on)


def _compile(rule: str) -> re.Pattern[str]:
    pattern, end = [], 0
    for match in _VARIABLE.finditer(rule):
        pattern.append(re.escape(rule[end : match.start()]))
        converter, name = match.groups()
        pattern.append(f"(?P<{name}>[^/].*)" if converter == "path" else f"(?P<{name}>[^/]+)")
        end = match.end()
    pattern.append(re.escape(rule[end:]))
    return re.compile("".join(pattern) + r"\Z")


def _first_segment(path: str) -> str:
    return path.split("/", 2)[1] if path.startswith("/") else ""


class RouteTable:
    """The routes of one API and the key its unknown routes need (``default_key``)."""

    def __init__(self, routes: Iterable[Route], *, default_key: KeyKind) -> None:
        self.routes = tuple(routes)
        self.default_key = default_key
        self._keys: dict[str | None, KeyKind | None] = {}
        for route in self.routes:
            if self._keys.setdefault(route.endpoint, route.key) != route.key:
                raise ValueError(f"endpoint {route.endpoint!r} is given two keys")
        # The fast routes by their first path segment (always a literal in this table).
        self._fast: dict[str, list[tuple[Route, re.Pattern[str]]]] = {}
        for route in self.routes:
            if route.fast:
                if _VARIABLE.search(_first_segment(route.rule)):
                    raise ValueError(f"fast route {route.rule!r} must start with a literal")
                self._fast.setdefault(_first_segment(route.rule), []).append(
                    (route, _compile(route.rule))
                )

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The fast route answering ``method path`` and its variables, or None: the first
        that fits both, as werkzeug picks (``GET /v1/models/m:predict`` is the model ``m:predict``
        of ``/v1/models/<model_name>``, not a wrong method for ``:predict``).

        Raw paths with percent-escapes are left alone (the app decodes them)."""
        if "%" in path:
            return None
        for route, pattern in self._fast.get(_first_segment(path), ()):
            if method in route.methods:
                found = pattern.match(path)
                if found is not None:
                    return route, found.groupdict()
        return None

    def authorize(
        self,
        store: TokenStore | None,
        endpoint: str | None,
        headers: Iterable[tuple[str, str]],
    ) -> None:
        """Raise unless the request carries the key its endpoint needs (``None``: a path
        no route matched, which needs ``default_key``). Nothing is checked without a store."""
        if store is None:
            return
        key = self._keys.get(endpoint, self.default_key)
        if key is not None:
            store.check(key, bearer(headers))

    def install(
        self,
        app: QuartTrio,
        views: Mapping[str, Callable[..., Awaitable[Any]]],
        tokens: TokenStore | None,
    ) -> None:
        """Add every route to ``app`` with its endpoint's view, and the token check."""
        missing = {route.endpoint for route in self.routes} - set(views)
        if missing:
            raise ValueError(f"no view for endpoints {sorted(missing)}")
        for route in self.routes:
            app.add_url_rule(
                route.rule,
                endpoint=route.endpoint,
                view_func=views[route.endpoint],
                methods=sorted(route.methods),
            )
        if tokens is None:
            return

        @app.before_request
        async def _check_token() -> None:
            self.authorize(tokens, request.endpoint, request.headers.items())
