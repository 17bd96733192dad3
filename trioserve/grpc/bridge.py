"""trioserve's gRPC transport: grpclib on an asyncio loop, bridged to Trio.

grpclib is an asyncio library. :func:`serve_grpc` runs its servers on an asyncio loop that a
Trio task steps, on Trio's thread (:class:`~trioserve.grpc.driven.DrivenLoop`), or, where
asyncio lacks what that needs, on a loop in a thread of its own
(:class:`~trioserve.grpc.loop_thread.LoopThread`). Either way they are
started and stopped by the caller's nursery, so they start, drain and stop like the HTTP
listeners.
For every call grpclib runs an asyncio handler from this module; the handler decodes the
request, then crosses into Trio once (``run_trio``) to run the rpc's implementation, which
is ordinary Trio code (:mod:`trioserve.grpc.inference`, :mod:`trioserve.grpc.management`).
Streams get Trio-flavoured ``send``/``receive`` callables that cross back (``run_aio``) for
each message.

Cancellation travels the same way: grpclib cancels a handler's asyncio task when the call's
deadline (``grpc-timeout``) passes or the client resets the stream; the crossing turns that
into a Trio cancellation of the implementation, whose ``finally`` cancels the job.

What grpclib lacks is added here: an inbound message limit (``max_request_size``), checked
against the length prefix before the message is read; the token check on the
``authorization`` metadata; and a graceful drain. Each call counts as in flight until its
trailers are sent; on shutdown new calls are refused, the calls in flight get a grace period,
the ones left are aborted with UNAVAILABLE, and the client connections are closed (grpclib's
``Server.close()`` would cancel the calls without an answer and leave connections open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpclib.const
import grpclib.server
import h2.exceptions
import trio
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from trioserve.auth import TokenStore
from trioserve.core.errors import ServeError
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits
from trioserve.grpc.calls import (
    BidiStreaming,
    ClientGone,
    Dispatcher,
    Gate,
    Method,
    RpcContext,
    ServerStreaming,
    Service,
    Unary,
    client_went_away,
    message_too_large,
    missing_message,
)
from trioserve.grpc.decode import RequestDecoder, request_decoder
from trioserve.grpc.driven import DrivenLoop, drivable
from trioserve.grpc.errors import grpc_code
from trioserve.grpc.loop_thread import LoopThread
from trioserve.grpc.portal import Portal
from trioserve.grpc.servers import (
    Server,
    close_server,
    listening_socket,
    socket_url,
    start_server,
)

log = logging.getLogger("trioserve.grpc")

HostPort = tuple[str, int]

# How long closing the servers may take once the drain is over (handlers are cancelled).
CLOSE_TIMEOUT = 5.0

_CARDINALITY: dict[type[Any], grpclib.const.Cardinality] = {
    Unary: grpclib.const.Cardinality.UNARY_UNARY,
    ServerStreaming: grpclib.const.Cardinality.UNARY_STREAM,
    BidiStreaming: grpclib.const.Cardinality.STREAM_STREAM,
}


def _text_metadata(stream: grpclib.server.Stream[Any, Any]) -> tuple[tuple[str, str], ...]:
    if stream.metadata is None:
        return ()
    return tuple((k, v) for k, v in stream.metadata.items() if isinstance(v, str))


def _peer(stream: grpclib.server.Stream[Any, Any]) -> str | None:
    address = stream.peer.addr()
    return None if address is None else f"{address[0]}:{address[1]}"


class _Servable:
    """One service for grpclib: the generated base's routes, each bound to a bridge handler.

    The generated base supplies every rpc's path, cardinality and message types; the
    implementation must provide exactly those rpcs, with matching kinds. Each rpc's request
    messages are read through the strict decoder of its request type (``decoders``).
    """

    def __init__(
        self,
        generated: Mapping[str, grpclib.const.Handler],
        service: Service,
        bridge: _Bridge,
    ) -> None:
        methods = dict(service.methods())
        mapping: dict[str, grpclib.const.Handler] = {}
        self.decoders: dict[str, RequestDecoder] = {}
        for path, route in generated.items():
            name = path.rsplit("/", 1)[-1]
            method = methods.pop(name, None)
            if method is None:
                raise TypeError(f"{type(service).__name__} does not implement rpc {name}")
            if _CARDINALITY[type(method)] is not route.cardinality:
                raise TypeError(f"rpc {name} is {route.cardinality.name}")
            decode = request_decoder(route.request_type, bridge.limits)
            self.decoders[path] = decode
            call = partial(bridge.handle, service, name, method, decode)
            mapping[path] = grpclib.const.Handler(
                call, route.cardinality, route.request_type, route.reply_type
            )
        if methods:
            raise TypeError(f"rpcs not in the proto: {', '.join(sorted(methods))}")
        self._mapping = mapping

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return self._mapping


class _InFlight:
    """Calls being answered, counted on the asyncio side so that a call counts until its
    trailers are sent."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class _Bridge:
    """The asyncio handlers grpclib calls; each crosses into Trio once."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        max_request_size: int,
        portal: Portal,
        limits: RequestLimits = DEFAULT_LIMITS,
    ) -> None:
        self.limits = limits  # what one request may declare: its decoders count before parsing
        self._dispatcher = dispatcher
        self._limit = max_request_size
        self._portal = portal
        self.in_flight = _InFlight()

    async def handle(
        self,
        service: Service,
        name: str,
        method: Method,
        decode: RequestDecoder,
        stream: grpclib.server.Stream[Any, Any],
    ) -> None:
        """Answer one call, trailers included (so it is done when this returns)."""
        self.in_flight.enter()
        status: Status
        message: str | None
        try:
            try:
                await self._answer(service, name, method, decode, stream)
            except ClientGone:
                # grpclib is cancelling this call (its stream is gone): end as cancelled,
                # which is what grpclib expects of a handler it cancels.
                raise asyncio.CancelledError() from None
            except ServeError as error:
                status, message = Status(grpc_code(error)), error.message
            except GRPCError as error:
                status, message = error.status, error.message
            else:
                status, message = Status.OK, None
            with contextlib.suppress(StreamTerminatedError, h2.exceptions.StreamClosedError):
                await stream.send_trailing_metadata(status=status, status_message=message)
            # The connection may have been lost while the trailers were written, and grpclib
            # then cancels this task; it expects the handler to end as cancelled.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError()
        finally:
            self.in_flight.leave()

    async def _answer(
        self,
        service: Service,
        name: str,
        method: Method,
        decode: RequestDecoder,
        stream: grpclib.server.Stream[Any, Any],
    ) -> None:
        context = RpcContext(
            method=name,
            metadata=_text_metadata(stream),
            peer=_peer(stream),
            timeout=None if stream.deadline is None else stream.deadline.time_remaining(),
        )
        dispatcher = self._dispatcher
        portal = self._portal
        dispatcher.authorize(service.key_kind_of(name), context)
        if isinstance(method, Unary):
            request = await self._recv(stream, decode)
            if request is None:
                raise missing_message()
            if method.start is not None and context.timeout is None:
                reply = await portal.start_trio(dispatcher.start_unary, method, request, context)
            else:
                reply = await portal.run_trio(dispatcher.unary, method, request, context)
            await stream.send_message(reply)
        elif isinstance(method, ServerStreaming):
            request = await self._recv(stream, decode)
            if request is None:
                raise missing_message()
            send = partial(_send_from_trio, portal, stream)
            await portal.run_trio(dispatcher.server_streaming, method, request, context, send)
        else:
            send = partial(_send_from_trio, portal, stream)

            async def receive() -> Any | None:  # in Trio
                return await portal.run_aio(self._recv(stream, decode))

            await portal.run_trio(dispatcher.bidi_streaming, method, receive, context, send)

    async def _recv(
        self, stream: grpclib.server.Stream[Any, Any], decode: RequestDecoder
    ) -> Any | None:
        """The next request message, refused before it is read if it exceeds the limit.

        grpclib has no inbound size limit, so this reads the gRPC length prefix itself from
        the call's HTTP/2 stream (``Stream._stream``, stable in grpclib 0.4); the message is
        decoded strictly (:mod:`trioserve.grpc.decode`: malformed bytes are INVALID_ARGUMENT).
        """
        h2_stream = stream._stream
        try:
            prefix = await h2_stream.recv_data(5)
        except StreamTerminatedError:
            raise client_went_away() from None
        if not prefix:
            return None
        compressed, size = struct.unpack(">?I", prefix)
        if compressed:
            raise GRPCError(Status.UNIMPLEMENTED, "Compression is not supported")
        if size > self._limit:
            raise message_too_large(size, self._limit)
        try:
            data = await h2_stream.recv_data(size)
        except StreamTerminatedError:
            raise client_went_away() from None
        return decode(data)


async def _send(stream: grpclib.server.Stream[Any, Any], message: Any) -> None:
    try:
        await stream.send_message(message)
    except (StreamTerminatedError, h2.exceptions.StreamClosedError):
        # h2 raises the second when the client reset the stream before grpclib noticed
        # (a client cancelling a stream between two of its messages).
        raise client_went_away() from None


async def _send_from_trio(
    portal: Portal, stream: grpclib.server.Stream[Any, Any], message: Any
) -> None:
    """A stream's ``send`` for the Trio implementation: one crossing per message."""
    await portal.run_aio(_send(stream, message))


def _portal() -> DrivenLoop | LoopThread:
    """Where grpclib's loop runs: stepped by Trio on its thread, or (an asyncio without the
    private names the driver needs) in a thread of its own."""
    return DrivenLoop() if drivable() else LoopThread()


_PLACES: dict[type[Any], str] = {
    DrivenLoop: "an asyncio loop Trio steps",
    LoopThread: "a loop thread",
}


@dataclass(frozen=True, slots=True)
class _Listener:
    api: str
    server: Server
    url: str


@dataclass(frozen=True, slots=True)
class GrpcListener:
    """One gRPC port: its API name (``"grpc_inference"``), address and services."""

    api: str
    address: HostPort
    services: Sequence[Service]
    tls: ssl.SSLContext | None = None  # enable_grpc_ssl
    # A listening socket opened already (several serving processes share one); closed
    # with the server, while the processes that share it keep their own copies.
    sock: socket.socket | None = None


async def serve_grpc(
    listeners_plan: Sequence[GrpcListener],
    *,
    tokens: TokenStore | None,
    max_request_size: int,
    limits: RequestLimits = DEFAULT_LIMITS,
    shutdown_trigger: Callable[[], Awaitable[None]],
    graceful_timeout: float = 10.0,
    task_status: trio.TaskStatus[dict[str, list[str]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve each planned gRPC port until shutdown.

    ``task_status.started`` receives ``{"grpc_inference": ["host:port"], ...}`` once every
    socket listens (a port of 0 reports the port the system chose). When
    ``shutdown_trigger`` returns, new calls are refused with UNAVAILABLE while the calls in
    flight get up to ``graceful_timeout`` seconds to finish; then the servers close
    (cancelling what is left, which cancels its requests) and this returns.
    """
    gate = Gate()
    async with trio.open_nursery() as nursery:
        # The portal outlives an outer cancellation until stop(): closing the servers in
        # the finally below still needs the loop.
        portal: Portal = await nursery.start(_portal().run)
        listeners: list[_Listener] = []
        try:
            log.info("gRPC: grpclib runs on %s", _PLACES[type(portal)])
            bridge = _Bridge(Dispatcher(gate, tokens), max_request_size, portal, limits)
            for planned in listeners_plan:
                api = planned.api
                sock = planned.sock or listening_socket(*planned.address)
                url = socket_url(sock)
                try:
                    servables = [
                        _Servable(service.base().__mapping__(), service, bridge)
                        for service in planned.services
                    ]
                    server = await portal.run_aio(
                        start_server(servables, sock, planned.tls, portal.corked)
                    )
                except BaseException:
                    sock.close()
                    raise
                listeners.append(_Listener(api, server, url))
                log.info("gRPC %s API listening on %s", api.removeprefix("grpc_"), url)
            task_status.started({listener.api: [listener.url] for listener in listeners})
            await shutdown_trigger()
            gate.close()
            with trio.move_on_after(graceful_timeout) as drain:
                await portal.run_aio(bridge.in_flight.wait_idle())
            if drain.cancelled_caught:
                log.warning(
                    "gRPC: %d calls still running after %g s; aborting them",
                    bridge.in_flight.count,
                    graceful_timeout,
                )
                gate.abort_all()
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await portal.run_aio(bridge.in_flight.wait_idle())
        finally:
            gate.close()
            gate.abort_all()
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                for listener in listeners:
                    await portal.run_aio(close_server(listener.server))
            portal.stop()
            nursery.cancel_scope.cancel()
            log.info("gRPC listeners closed")


__all__ = ["GrpcListener", "HostPort", "serve_grpc"]
