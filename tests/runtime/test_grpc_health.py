"""grpc.health.v1.Health on the Trio side, with a stand-in dataplane: the status follows
readiness and draining, unknown names are refused, Watch sends changes and ends on drain."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trioserve._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponse,
)
from trioserve._proto.grpc.health.v1 import (
    HealthCheckResponseServingStatus as Status,
)
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.grpc.calls import RpcContext
from trioserve.grpc.health import HealthRpcs


class FakeDataplane:
    def __init__(self) -> None:
        self.ready = True

    def healthy(self) -> bool:
        return self.ready


CONTEXT = RpcContext(method="Check", metadata=())


def make(dataplane: FakeDataplane, draining: list[bool]) -> HealthRpcs:
    return HealthRpcs(dataplane, ["svc.A"], lambda: draining[0], interval=0.01)  # type: ignore[arg-type]


async def test_check_follows_readiness_and_drain() -> None:
    dataplane, draining = FakeDataplane(), [False]
    health = make(dataplane, draining)
    assert health.key_kind_of("Check") is None
    for service in ("", "svc.A"):
        answer = await health.check(HealthCheckRequest(service=service), CONTEXT)
        assert answer.status is Status.SERVING
    dataplane.ready = False
    assert (await health.check(HealthCheckRequest(), CONTEXT)).status is Status.NOT_SERVING
    dataplane.ready, draining[0] = True, True
    assert (await health.check(HealthCheckRequest(), CONTEXT)).status is Status.NOT_SERVING
    with pytest.raises(ServeError) as caught:
        await health.check(HealthCheckRequest(service="svc.B"), CONTEXT)
    assert caught.value.kind is ErrorKind.NOT_FOUND and "svc.B" in caught.value.message


async def test_watch_sends_each_change_and_ends_when_draining() -> None:
    dataplane, draining = FakeDataplane(), [False]
    health = make(dataplane, draining)
    sent: list[Any] = []

    async def send(message: HealthCheckResponse) -> None:
        sent.append(message.status)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(health.watch, HealthCheckRequest(), CONTEXT, send)
            await trio.sleep(0.05)
            dataplane.ready = False
            await trio.sleep(0.05)
            dataplane.ready = True
            await trio.sleep(0.05)
            draining[0] = True  # the watch ends by itself
    assert sent == [Status.SERVING, Status.NOT_SERVING, Status.SERVING, Status.NOT_SERVING]
