"""A real trioserve process with its gRPC listeners, for end-to-end tests.

``trioserve start --foreground`` serves gRPC on the free ports that
:class:`tests.e2e.server.Server` picks; this name stays for the gRPC tests.
"""

from __future__ import annotations

from .server import Server

GrpcServer = Server
