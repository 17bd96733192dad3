"""The listening sockets of an HTTP front: TCP (every address the host resolves to) or a
Unix socket file."""

from __future__ import annotations

import os
import socket
import stat

import trio

from trioserve.config import Address


async def open_listeners(
    address: Address, backlog: int
) -> tuple[list[trio.SocketListener], list[str]]:
    if address.is_unix:
        assert address.path is not None
        remove_socket_file(address.path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(address.path)
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        return [trio.SocketListener(sock)], [f"unix:{address.path}"]
    listeners = await trio.open_tcp_listeners(address.port, host=address.host, backlog=backlog)
    bound = []
    for listener in listeners:
        host, port = listener.socket.getsockname()[:2]
        scheme = address.scheme
        bound.append(f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")
    return listeners, bound


def remove_socket_file(path: str) -> None:
    """A stale socket file from an earlier run (never any other kind of file)."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
