"""The gRPC listening socket hands out one connection per pass of the asyncio loop, so that
serving processes sharing it (``serving_processes``) each take their share of a burst
(``trioserve/grpc/servers.py``)."""

from __future__ import annotations

import asyncio
import socket

from trioserve.grpc.servers import close_server, listening_socket, start_server


async def _accept_passes(waiting: int) -> list[int]:
    """Connections the server has taken after each loop pass, ``waiting`` queued first."""
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(waiting)]
    try:
        server = await start_server([], sock, None, lambda transport: transport)
        counts = []
        for _ in range(8 * waiting):
            await asyncio.sleep(0)
            counts.append(len(server._protocols))
        await close_server(server)
        return counts
    finally:
        for client in clients:
            client.close()
        sock.close()


def test_a_burst_of_connections_is_taken_one_per_loop_pass() -> None:
    counts = asyncio.run(_accept_passes(4))
    assert counts[-1] == 4, counts  # every connection was taken in the end
    steps = [after - before for before, after in zip([0, *counts], counts, strict=False)]
    assert max(steps) == 1, counts  # never two in one pass
