"""TorchServe's gRPC APIs (inference on 7070, management on 7071) on grpclib.

:func:`serve_grpc` is the service the server starts in its listeners nursery. The rpc
implementations (:mod:`.inference`, :mod:`.management`) are Trio code over the same
transport-neutral core as the HTTP routes; :mod:`.bridge` and :mod:`.loop_thread` are the
only modules that deal with asyncio (grpclib runs on an asyncio loop in its own thread).
"""

from trioserve.grpc.bridge import GrpcListener, HostPort, serve_grpc

__all__ = ["GrpcListener", "HostPort", "serve_grpc"]
