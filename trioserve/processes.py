"""Wiring for ``serving_processes > 1``, on the control process's side.

The control process (serving process 0, the one ``trioserve`` starts) opens the inference
ports' listening sockets itself, before it serves them, so that the other serving processes
can be started with copies (:func:`open_shared`); then :func:`other_processes` builds the
:class:`~trioserve.runtime.serving_control.ServingProcesses` that starts and supervises
them. See docs/design.md, "Serving processes".
"""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from trioserve.assembly import build_dataplane
from trioserve.auth import TokenStore
from trioserve.config import ServerConfig
from trioserve.core import errors
from trioserve.grpc.servers import listening_socket
from trioserve.http.listeners import open_listeners
from trioserve.pythonpath import child_environment
from trioserve.runtime.management import ManagementService
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.mirror import state_of
from trioserve.runtime.serving_control import ServingProcesses, Setup

log = logging.getLogger("trioserve.server")

SERVING_MODULE = "trioserve.serving_process"
# How long a registry change may take to be applied by every serving process, beyond the
# time it may take a model to drain (unregister_timeout).
APPLY_MARGIN = 30.0
BACKLOG = 1024


@dataclass(slots=True)
class Shared:
    """The inference ports' listening sockets, opened once for every serving process."""

    http: tuple[list[trio.SocketListener], list[str]]
    grpc: socket.socket | None

    @property
    def fds(self) -> tuple[int, ...]:
        fds = [listener.socket.fileno() for listener in self.http[0]]
        if self.grpc is not None:
            fds.append(self.grpc.fileno())
        return tuple(fds)

    def close(self) -> None:
        for listener in self.http[0]:
            listener.socket.close()
        if self.grpc is not None:
            self.grpc.close()


async def open_shared(config: ServerConfig) -> Shared:
    http = await open_listeners(config.inference_address, BACKLOG)
    try:
        grpc = listening_socket(config.grpc_inference_address, config.grpc_inference_port)
    except BaseException:
        for listener in http[0]:
            listener.socket.close()
        raise
    return Shared(http, grpc)  # (pass_fds makes the children's copies inheritable)


def other_processes(
    config: ServerConfig,
    manager: ModelManager,
    management: ManagementService,
    tokens: TokenStore | None,
    shared: Shared,
    listen_dir: Path,
    gpus: int,
) -> ServingProcesses:
    http_fds = tuple(listener.socket.fileno() for listener in shared.http[0])
    grpc_fd = None if shared.grpc is None else shared.grpc.fileno()
    level = logging.getLevelName(logging.getLogger("trioserve").getEffectiveLevel())

    def setup(index: int) -> Setup:
        return Setup(index, config, http_fds, grpc_fd, str(listen_dir), level, gpus)

    async def model_call(method: str, args: tuple[Any, ...]) -> object:
        if method == "register":
            return await management.register(args[0])
        if method == "unregister":
            return await management.unregister(args[0], args[1])
        raise errors.ServeError(errors.ErrorKind.NOT_IMPLEMENTED, f"no call {method!r}")

    return ServingProcesses(
        config.serving_processes,
        [sys.executable, "-m", SERVING_MODULE],
        setup,
        shared.fds,
        manager=manager,
        dataplane=build_dataplane(config, manager, None),
        state=lambda: state_of(manager, None if tokens is None else tokens.export()),
        model_call=model_call,
        apply_timeout=config.unregister_model_timeout + APPLY_MARGIN,
        env=child_environment(),
    )


__all__ = ["SERVING_MODULE", "Shared", "open_shared", "other_processes"]
