"""``grpc.health.v1.Health`` on the gRPC inference port, for Kubernetes' gRPC probes and
``grpc_health_probe``; no key guards it (a probe carries none, like ``/ping``).

The empty service name is the whole server, SERVING when every model that should have
workers has a ready one (the readiness of ``/v2/health/ready``), NOT_SERVING otherwise and
once the server drains. The names of the services on the port answer the same; any other
name is NOT_FOUND for ``Check`` and SERVICE_UNKNOWN for ``Watch``, as the protocol says.
``Watch`` sends the status at once and again whenever it changes (checked every
:data:`WATCH_INTERVAL` seconds); a draining server sends NOT_SERVING and ends the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Final

import trio

from trioserve._proto.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)
from trioserve.auth import KeyKind
from trioserve.core.errors import ErrorKind, ServeError, quote
from trioserve.grpc.calls import Method, RpcContext, Send, ServerStreaming, Unary
from trioserve.runtime.dataplane import Dataplane

Status = HealthCheckResponseServingStatus
WATCH_INTERVAL: Final = 1.0


class HealthRpcs:
    """``grpc.health.v1.Health``: ``Check`` and ``Watch``."""

    base: ClassVar[type[Any]] = HealthBase

    def __init__(
        self,
        dataplane: Dataplane,
        services: Iterable[str],
        draining: Callable[[], bool],
        interval: float = WATCH_INTERVAL,
    ) -> None:
        self._dataplane = dataplane
        self._services = frozenset(("", *services))
        self._draining = draining
        self._interval = interval

    def key_kind_of(self, method: str) -> KeyKind | None:
        return None

    def methods(self) -> dict[str, Method]:
        return {"Check": Unary(self.check), "Watch": ServerStreaming(self.watch)}

    def status(self, service: str) -> HealthCheckResponseServingStatus:
        if service not in self._services:
            return Status.SERVICE_UNKNOWN
        if self._draining() or not self._dataplane.healthy():
            return Status.NOT_SERVING
        return Status.SERVING

    async def check(self, request: HealthCheckRequest, _context: RpcContext) -> HealthCheckResponse:
        status = self.status(request.service)
        if status is Status.SERVICE_UNKNOWN:
            raise ServeError(ErrorKind.NOT_FOUND, f"unknown service {quote(request.service)}")
        return HealthCheckResponse(status=status)

    async def watch(
        self,
        request: HealthCheckRequest,
        _context: RpcContext,
        send: Send[HealthCheckResponse],
    ) -> None:
        sent: HealthCheckResponseServingStatus | None = None
        while True:
            status = self.status(request.service)
            if status != sent:
                await send(HealthCheckResponse(status=status))
                sent = status
            if self._draining():
                return
            await trio.sleep(self._interval)


__all__ = ["WATCH_INTERVAL", "HealthRpcs"]
