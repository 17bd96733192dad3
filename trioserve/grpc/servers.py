"""The asyncio side of one gRPC port: its listening socket and grpclib's server.

Used by :mod:`trioserve.grpc.bridge`, whose loop thread runs these coroutines.
"""

from __future__ import annotations

import socket
import ssl
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import grpclib.server
from grpclib.protocol import H2Protocol

# The kernel's queue of connections not yet accepted, for every gRPC listening socket.
LISTEN_BACKLOG = 1024


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (so that the bound port is known for port 0)."""
    family, kind, proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Server(grpclib.server.Server):
    """grpclib's server, keeping track of its connections, its transports wrapped by
    ``wrap``.

    ``Server.close()`` stops listening and cancels running handlers but leaves the client
    connections open (grpclib 0.4); shutdown closes them with :meth:`close_connections`.
    """

    def __init__(self, servables: Sequence[Any], wrap: Callable[[Any], Any]) -> None:
        super().__init__(servables)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        self._wrap = wrap

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        # The transport goes through ``wrap`` (the portal's ``corked``) before grpclib
        # keeps it: an instance attribute, so asyncio's calls find it first.
        made = protocol.connection_made
        wrap = self._wrap
        setattr(protocol, "connection_made", lambda transport: made(wrap(transport)))  # noqa: B010
        return protocol

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None and not connection.is_closing():
                connection.close()


async def start_server(
    servables: Sequence[Any],
    sock: socket.socket,
    tls: ssl.SSLContext | None,
    wrap: Callable[[Any], Any],
) -> Server:
    """grpclib's server on ``sock``, taking one connection each time the socket is ready.

    asyncio's ``backlog`` is two things: the ``listen()`` queue it sets again on the socket,
    and how many connections its accept loop takes in one go. Several serving processes
    share one socket (``serving_processes``); the one that woke first took every connection
    waiting, so a client's burst of connections all landed in one process. Taking one at a
    time lets every process that is woken take its share; ``listen()`` then gets the
    kernel's queue back to :data:`LISTEN_BACKLOG` (asyncio had set it to 1).
    """
    server = Server(servables, wrap)
    await server.start(sock=sock, ssl=tls, backlog=1)
    sock.listen(LISTEN_BACKLOG)
    return server


async def close_server(server: Server) -> None:
    server.close()
    await server.wait_closed()
    server.close_connections()


__all__ = ["Server", "close_server", "listening_socket", "socket_url", "start_server"]
