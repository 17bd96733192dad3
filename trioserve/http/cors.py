"""CORS on the HTTP APIs (TorchServe's ``cors_allowed_origin``, ``_methods``, ``_headers``).

Off unless ``cors_allowed_origin`` is set. Then every answer of the inference, management
and metrics APIs carries ``Access-Control-Allow-Origin`` with that value, and a preflight
request (``OPTIONS`` with ``Access-Control-Request-Method``) is answered 200 at once, before
any token check (a browser sends no credentials with it), with the allowed methods and
headers when they are configured.
"""

from __future__ import annotations

from dataclasses import dataclass

from quart import Response, request
from quart_trio import QuartTrio


@dataclass(frozen=True)
class Cors:
    origin: str
    methods: str | None = None
    headers: str | None = None

    def answer_headers(self) -> list[tuple[str, str]]:
        """What every answer carries."""
        return [("Access-Control-Allow-Origin", self.origin)]

    def preflight_headers(self) -> list[tuple[str, str]]:
        """What the answer to a preflight request carries."""
        headers = self.answer_headers()
        if self.methods:
            headers.append(("Access-Control-Allow-Methods", self.methods))
        if self.headers:
            headers.append(("Access-Control-Allow-Headers", self.headers))
        return headers


def is_preflight(method: str, has_request_method: bool) -> bool:
    return method == "OPTIONS" and has_request_method


def install_cors(app: QuartTrio, cors: Cors | None) -> None:
    """Answer preflight requests first (before the token check) and add the origin header
    to every answer of ``app``."""
    if cors is None:
        return

    async def preflight() -> Response | None:
        if is_preflight(request.method, "Access-Control-Request-Method" in request.headers):
            return Response(b"", 200, headers=dict(cors.preflight_headers()))
        return None

    # Before every other before_request function: the token check must not refuse it.
    app.before_request_funcs.setdefault(None, []).insert(0, preflight)

    @app.after_request
    async def allow_origin(response: Response) -> Response:
        for name, value in cors.answer_headers():
            response.headers[name] = value
        return response


__all__ = ["Cors", "install_cors", "is_preflight"]
