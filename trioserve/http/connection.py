"""One connection of trioserve's HTTP/1.1 server (:mod:`trioserve.http.front`): reading its
requests ahead, answering them in turn, noticing a client that leaves, and closing.

A connection refused mid-request (a body over ``max_request_size``, a malformed head) is
closed the way nginx's "lingering close" does it: the answer is sent, the sending side shut,
and what the client still sends is read and dropped for a while, because closing a socket
with unread bytes makes the kernel reset the connection, and the reset can destroy the
answer before the client reads it (a client uploading a large body then saw "connection
reset" rather than the 413).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import trio

from trioserve.core.http1 import CONTINUE, HttpError, Request, RequestReader
from trioserve.runtime.parking import Parked
from trioserve.sockio import linger, send_eagerly

if TYPE_CHECKING:
    from trioserve.http.front import Front


class FrontConnection:
    """One client connection of a :class:`~trioserve.http.front.Front`: a task that answers
    its requests in turn (through the front's ``dispatch`` and ``refuse``) and a task that
    reads ahead, so that a client that leaves is noticed while its request runs."""

    def __init__(self, front: Front, stream: trio.SocketStream) -> None:
        self.front = front
        self.stream = stream
        self.reader = RequestReader(max_body_size=front.settings.max_request_size)
        self.gone = trio.Event()  # the client closed (or broke) its side
        self.request_scope: trio.CancelScope | None = None
        self.deadline = math.inf  # while waiting for a request: when to give up waiting
        # The answering task waiting for a request, the reading task waiting for room in
        # the buffer: each parked only while it waits (runtime/parking.py).
        self._arrived: Parked | None = None
        self._room: Parked | None = None
        self._now = trio.lowlevel.current_clock().current_time
        self._read_limit = front.settings.max_request_size + 128 * 1024
        # Refused mid-request (a body over the limit, a malformed head): read what the
        # client still sends for a while before closing (sockio.linger).
        self.linger = False
        self.fd = stream.socket.fileno()
        try:
            self.client: Any = stream.socket.getpeername()
            self.server: Any = stream.socket.getsockname()
        except OSError:
            self.client = self.server = None
        if not isinstance(self.client, tuple):
            self.client = None
            self.server = None
        context = front.settings.ssl_context
        self.tls = None if context is None else trio.SSLStream(stream, context, server_side=True)

    def wake(self) -> None:
        arrived, self._arrived = self._arrived, None
        if arrived is not None:
            arrived.set()

    async def send(self, data: bytes) -> None:
        # An answer nearly always fits the socket buffer: no scheduler pass per request.
        # Only this connection's task sends, so nothing interleaves.
        if self.tls is not None:
            await self.tls.send_all(data)
        else:
            await send_eagerly(self.stream, self.fd, data, "sending")

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive)
                try:
                    await self._serve()
                finally:
                    nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away while we were writing (the nursery groups it)
        finally:
            try:
                if self.linger and self.tls is None:
                    await linger(self.stream.socket, self.fd)
            finally:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await trio.aclose_forcefully(self.tls or self.stream)

    async def _receive(self) -> None:
        try:
            while True:
                if self.reader.buffered > self._read_limit:
                    room = self._room = Parked()  # a pipelining client waits for us
                    await room.wait()
                    continue
                if self.tls is not None:
                    data = bytes(await self.tls.receive_some(65536))  # errors: broken resource
                else:
                    # As in send(): wait for the socket, then read without a checkpoint more.
                    await trio.lowlevel.wait_readable(self.stream.socket)
                    try:
                        data = os.read(self.fd, 65536)
                    except BlockingIOError:
                        continue
                if not data:
                    break
                self.reader.feed(data)
                self.wake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        self.gone.set()
        if self.request_scope is not None:
            self.request_scope.cancel()
        self.wake()

    async def _next_request(self) -> Request | None:
        settings = self.front.settings
        now = self._now
        idle_deadline = now() + settings.keep_alive_timeout
        read_deadline: float | None = None
        while True:
            request = self.reader.next_request()
            if request is not None:
                room, self._room = self._room, None
                if room is not None:
                    room.set()
                return request
            started = self.reader.started
            if self.gone.is_set() or (self.front.draining and not started):
                return None
            if started and read_deadline is None:
                read_deadline = now() + settings.read_timeout
            if self.reader.wants_continue():
                await self.send(CONTINUE)
            deadline = idle_deadline if read_deadline is None else read_deadline
            if now() < deadline:
                # No cancel scope per wait (they showed in profiles): the front's timer task
                # wakes a connection whose deadline has passed (Front._expire).
                self.deadline = deadline
                arrived = self._arrived = Parked()
                await arrived.wait()
                self.deadline = math.inf
                continue
            if read_deadline is None:
                return None  # idle for too long: close quietly
            raise HttpError(408, "the request did not arrive in time")

    async def _serve(self) -> None:
        # One cancel scope for the connection's requests, not one per request (entering and
        # leaving a scope showed in profiles): a client that goes away ends the connection
        # anyway, whether a request was running or not.
        front = self.front
        with trio.CancelScope() as scope:
            self.request_scope = scope
            if self.gone.is_set():
                scope.cancel()
            while True:
                try:
                    request = await self._next_request()
                except HttpError as error:
                    await self._send_error(error)
                    self.linger = not self.gone.is_set()
                    return
                if request is None:
                    return
                keep = await front.dispatch(self, request, request.keep_alive)
                if not keep or self.gone.is_set() or front.draining:
                    return

    async def _send_error(self, error: HttpError) -> None:
        await self.front.refuse(self, error)
