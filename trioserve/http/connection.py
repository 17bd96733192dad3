"""One connection of trioserve's HTTP/1.1 server (:mod:`trioserve.http.front`): reading its
requests ahead, answering them in turn, noticing a client that leaves, and closing.

Two tasks: one reads ahead, one answers. A request the front can *start* (a TorchServe
prediction, :class:`~trioserve.http.front.StartsRequests`) is submitted by the reading task
as soon as it is whole, and its answer is written by whoever delivers the reply (the
worker's reading task, through ``when_ready``), so such a request wakes no task of its
connection but the reading one: three task switches per request became one, which was the
largest share of the serving process's per-request cost left (docs/performance.md). The
answering task only steps in when an answer cannot be written at once (a streamed answer, a
full socket) and for every other request. Requests stay in order: while a started request
is unanswered no other one is taken.

A connection refused mid-request (a body over ``max_request_size``, a malformed head) is
closed the way nginx's "lingering close" does it: the answer is sent, the sending side shut,
and what the client still sends is read and dropped for a while, because closing a socket
with unread bytes makes the kernel reset the connection, and the reset can destroy the
answer before the client reads it (a client uploading a large body then saw "connection
reset" rather than the 413).
"""

from __future__ import annotations

import logging
import math
import os
from typing import TYPE_CHECKING, Any

import trio

from trioserve.core import errors
from trioserve.core.http1 import CONTINUE, HttpError, Request, RequestReader
from trioserve.http.bodies import Answer
from trioserve.runtime.parking import Parked
from trioserve.sockio import linger, send_eagerly, write_nowait

if TYPE_CHECKING:
    from trioserve.http.front import Begun, Front

log = logging.getLogger("trioserve.http")


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
        self._idle_deadline = math.inf  # set when the answering task waits for a request
        # A started request (Front.start) being answered outside the answering task, and
        # what it is waiting for; what the answering task must finish for it (bytes the
        # socket did not take, or a streamed answer); a request the reading task took but
        # left to the answering task (or the error reading it); the connection must close.
        self._started: Request | None = None
        self._begun: Begun | None = None
        self._handoff: tuple[Request, bytes | Answer, bool] | None = None
        self._taken: Request | HttpError | None = None
        self._closing = False
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
            self._abandon()
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
                if self._arrived is not None and self._idle() and self.tls is None:
                    self._take()
                else:
                    self.wake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        self.gone.set()
        self._abandon()
        if self.request_scope is not None:
            self.request_scope.cancel()
        self.wake()

    # -- started requests --------------------------------------------------------------

    def _idle(self) -> bool:
        """Nothing is being answered and nothing is left for the answering task."""
        return (
            self._started is None
            and self._handoff is None
            and self._taken is None
            and not self._closing
        )

    def _take(self) -> None:
        """In the reading task, the answering task waiting: start the next request if it is
        whole and the front can start it, else wake the answering task for it."""
        try:
            request = self.reader.next_request()
        except HttpError as error:
            self._taken = error
            self.wake()
            return
        if request is None:
            self.wake()  # part of a request: the answering task keeps its deadline
            return
        if not self._start(request):
            self._taken = request
            self.wake()

    def _start(self, request: Request) -> bool:
        """Start ``request`` without a task waiting for it, if the front can; whether it
        did (the answer is then written by :meth:`_finish`)."""
        started = self.front.start(request)
        if started is None:
            return False
        self._started = request
        self.deadline = math.inf  # not idle: the front's timer leaves the connection be
        if isinstance(started, Answer):
            self._finish(request, started)
            return True
        answer = started.poll()
        if answer is not None:
            self._finish(request, answer)
            return True
        self._begun = started
        started.when_ready(self._ready)
        return True

    def _ready(self) -> None:
        """The started request may have its answer (called by whoever delivered it)."""
        begun, request = self._begun, self._started
        if begun is None or request is None:
            return  # abandoned meanwhile
        try:
            answer = begun.poll()
            if answer is None:
                begun.when_ready(self._ready)
                return
            self._begun = None
            self._finish(request, answer)
        except Exception as exc:
            # Raised in the task that delivered the reply (a worker's frame reader), which
            # must not fail for one answer: the client gets a 500 that says so, written by
            # the answering task, and the connection closes after it.
            log.exception("unexpected error while answering a request")
            self._abandon()
            failure = self.front.error_body(errors.internal_error(exc), request.path)
            failure.close = True
            self._hand_over(request, failure, False)

    def _finish(self, request: Request, answer: Answer) -> None:
        """Write the started request's answer now if it is whole and the socket takes it,
        else leave it to the answering task."""
        if not isinstance(answer.body, bytes):
            self._hand_over(request, answer, request.keep_alive)
            return
        data, keep = self.front.encode_answer(request.method, answer, keep_alive=request.keep_alive)
        try:
            sent = write_nowait(self.fd, data, "sending")
        except trio.BrokenResourceError:
            self._closing = True
            self._started = None
            self.wake()
            return
        if sent < len(data):
            self._hand_over(request, data[sent:], keep)
            return
        self._started = None
        self._idle_deadline = self._now() + self.front.settings.keep_alive_timeout
        if not keep or self.front.draining or self.gone.is_set():
            self._closing = True
            self.wake()
        elif self.reader.buffered:
            self.wake()  # a pipelined request: the answering task takes it
        elif self._arrived is not None:
            self.deadline = self._idle_deadline

    def _hand_over(self, request: Request, rest: bytes | Answer, keep: bool) -> None:
        self._handoff = (request, rest, keep)
        self.wake()

    async def _send_handoff(self) -> bool:
        """Finish what a started request's answer left to the answering task; whether the
        connection may carry another request."""
        assert self._handoff is not None
        request, rest, keep = self._handoff
        self._handoff = None
        try:
            if isinstance(rest, bytes):
                await self.send(rest)
            else:
                keep = await self.front.write_answer(
                    self, request.method, request.http_version, rest, keep_alive=keep
                )
        finally:
            self._started = None
        return keep

    def _abandon(self) -> None:
        """The connection is going: a started request's answer is no longer wanted."""
        begun, self._begun = self._begun, None
        if begun is not None:
            begun.cancel()

    async def _next_request(self) -> Request | None:
        """The next request; None when the connection should close, or when a started
        request left its answer to this task (``_handoff``)."""
        settings = self.front.settings
        now = self._now
        self._idle_deadline = now() + settings.keep_alive_timeout
        read_deadline: float | None = None
        while True:
            if self._handoff is not None or self._closing:
                return None
            if self._started is not None:
                # A started request is being answered: wait, without a deadline.
                arrived = self._arrived = Parked()
                await arrived.wait()
                continue
            taken, self._taken = self._taken, None
            if isinstance(taken, HttpError):
                raise taken
            request = taken or self.reader.next_request()
            if request is not None:
                room, self._room = self._room, None
                if room is not None:
                    room.set()
                return request
            started = self.reader.started
            if self.gone.is_set() or (self.front.draining and not started):
                return None
            if not started:
                read_deadline = None  # a request started by the reading task came whole
            elif read_deadline is None:
                read_deadline = now() + settings.read_timeout
            if self.reader.wants_continue():
                await self.send(CONTINUE)
            deadline = self._idle_deadline if read_deadline is None else read_deadline
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
                    if self._handoff is None:
                        return
                    keep = await self._send_handoff()
                elif self.tls is None and self._start(request):
                    continue
                else:
                    keep = await front.dispatch(self, request, request.keep_alive)
                if not keep or self.gone.is_set() or front.draining:
                    return

    async def _send_error(self, error: HttpError) -> None:
        await self.front.refuse(self, error)
