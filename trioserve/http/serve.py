"""Serving one Quart-trio app on hypercorn's trio worker, as a trio service."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart_trio import QuartTrio

from trioserve.config import Address

log = logging.getLogger("trioserve.http")


def hypercorn_config(address: Address, *, graceful_timeout: float) -> HypercornConfig:
    config = HypercornConfig()
    if address.scheme == "unix":
        config.bind = [f"unix:{address.path}"]
    else:
        host = f"[{address.host}]" if ":" in address.host else address.host
        config.bind = [f"{host}:{address.port}"]
    config.graceful_timeout = graceful_timeout
    config.keep_alive_max_requests = 1_000_000
    config.accesslog = None
    config.errorlog = logging.getLogger("trioserve.hypercorn")
    config.backlog = 1024
    return config


async def serve_app(
    app: QuartTrio,
    address: Address,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    graceful_timeout: float,
    tls: tuple[Path, Path] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown_trigger`` returns, then drain for up to ``graceful_timeout``.

    ``task_status.started`` receives the bound addresses once the socket listens. ``tls``
    (certificate, private key: PEM files) is required for an https address.
    """
    if address.is_tls and tls is None:
        raise ValueError(f"{address.url()}: an https address needs a certificate and key")
    config = hypercorn_config(address, graceful_timeout=graceful_timeout)
    if address.is_tls and tls is not None:
        config.certfile, config.keyfile = str(tls[0]), str(tls[1])
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
