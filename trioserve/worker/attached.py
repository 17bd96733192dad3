"""Attached connections: more serving processes sharing one worker process.

A worker started with ``--listen PATH`` binds a Unix socket there (:func:`listen_socket`)
before its model loads and accepts connections on it for its whole life. Each accepted
connection is an :class:`AttachedConnection`: another serving process's supervisor drives it
with exactly the frames it would send a worker of its own, and the worker answers them as
it answers the primary connection (the ``--fd`` one, from the process that started it),
with these differences:

* LOAD loads nothing: it is answered with the primary's LOAD_RESULT once the primary's load
  has finished (at once if it has). A LOAD for another model than the one loaded gets 500,
  one that comes while the worker is shutting down (the primary's SHUTDOWN) 503.
* BATCH joins the worker's one queue; the batch's RESPONSE frames and the METRICS frame
  after it go back on the connection it came from. Batch ids are the connection's own (the
  same id may be in use on several connections at once); request ids are unique across
  connections, so CANCEL, STREAM_INPUT and STREAM_ACK need no routing.
* SHUTDOWN detaches: the batches already received on the connection are finished and
  answered, later ones are refused (503), then the worker closes the connection and goes on.
* End of stream, a broken socket, a malformed frame or a failed write ends the connection,
  never the process: its requests still queued or running are cancelled (as by CANCEL), and
  whatever is still written for it is dropped.

The primary connection keeps its rules: its end, or the parent's death, ends the process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import stat
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

import trio

from trioserve.core.frames import Frame, FrameError, Kind
from trioserve.core.messages import LoadSpec, WorkItem, encode_load_result, encode_reply
from trioserve.worker.connection import WRITE_LOCK_POLL, ServerConnection
from trioserve.worker.responses import error_reply

log = logging.getLogger("trioserve.worker")

LISTEN_BACKLOG = 16
_numbers = itertools.count(1)  # names attached connections in the log


def listen_socket(path: str) -> socket.socket:
    """A Unix stream socket listening at ``path`` (mode 0600), a stale socket file there
    removed first; anything else at ``path`` is an error (``OSError``)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class Host(Protocol):
    """What an attached connection needs of the worker's frame loop."""

    shutting_down: bool  # the primary connection asked the worker to finish and exit
    streams: bool | None  # the loaded model's, as the primary's LOAD_RESULT says

    async def dispatch(self, frame: Frame, origin: AttachedConnection | None = None) -> None:
        """Handle a BATCH, CANCEL, STREAM_INPUT, STREAM_ACK or PING from ``origin``."""

    def cancel(self, request_ids: Sequence[str]) -> None:
        """Cancel these requests, wherever they came from."""

    async def wait_loaded(self) -> LoadSpec:
        """The spec of the model loaded, once it is."""
        ...


class AttachedBatches:
    """The batches an attached connection has handed the worker and that are not answered
    yet, and the request ids they hold (sans-IO; any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._ids: dict[str, int] = {}  # request id -> how many of the batches hold it

    def __len__(self) -> int:
        return self._count

    def add(self, request_ids: Iterable[str]) -> None:
        with self._lock:
            self._count += 1
            for rid in request_ids:
                self._ids[rid] = self._ids.get(rid, 0) + 1

    def end(self, request_ids: Iterable[str]) -> bool:
        """One batch answered (or dropped); whether none is left."""
        with self._lock:
            self._count -= 1
            for rid in request_ids:
                left = self._ids.get(rid, 0) - 1
                if left > 0:
                    self._ids[rid] = left
                else:
                    self._ids.pop(rid, None)
            return self._count == 0

    def request_ids(self) -> list[str]:
        with self._lock:
            return list(self._ids)


class AttachedConnection(ServerConnection):
    """One serving process's connection to this worker, besides the primary one."""

    def __init__(self, stream: trio.abc.Stream, host: Host) -> None:
        super().__init__(stream, self.lost)
        self.name = f"attached connection {next(_numbers)}"
        self.token = self._trio = trio.lowlevel.current_trio_token()
        self.batches = AttachedBatches()
        self.detaching = False  # SHUTDOWN came: finish its batches, then close
        self.gone = False  # whatever is written to it now is dropped
        self._host = host
        self._reading = trio.CancelScope()

    async def serve(self) -> None:
        """Read and answer the connection's frames until it detaches or goes away, then
        close it; raises nothing on its account."""
        log.info("%s: opened", self.name)
        try:
            async with trio.open_nursery() as nursery:
                with self._reading:
                    await self.read_frames(lambda frame: self._on_frame(frame, nursery))
                nursery.cancel_scope.cancel()
        except Exception:  # (a task's error comes as an ExceptionGroup; cancellation passes)
            log.exception("%s: handling its frames failed", self.name)
        finally:
            with trio.CancelScope(shield=True):
                await self._close()

    def lost(self, status: int, why: str) -> None:
        """The connection cannot go on (any thread): replies for it are dropped from now on,
        and its reading ends (then :meth:`serve` cancels its requests and closes it)."""
        if self.gone:
            return
        self.gone = True
        log.log(logging.INFO if status == 0 else logging.WARNING, "%s: %s", self.name, why)
        with contextlib.suppress(trio.RunFinishedError):
            self._trio.run_sync_soon(self._reading.cancel)

    # -- writing: dropped once the connection is gone ------------------------------------------

    async def send(self, data: bytes) -> None:
        if not self.gone:
            await super().send(data)

    def send_from_thread(self, data: bytes) -> None:
        if not self.gone:
            super().send_from_thread(data)

    # -- its batches --------------------------------------------------------------------------

    def received(self, items: Sequence[WorkItem]) -> None:
        """A batch from this connection is queued (trio's thread)."""
        self.batches.add(item.request_id for item in items)

    def answered(self, items: Sequence[WorkItem]) -> None:
        """A batch from this connection is answered, or its answer dropped (any thread)."""
        if self.batches.end(item.request_id for item in items):
            with contextlib.suppress(trio.RunFinishedError):
                self._trio.run_sync_soon(self._idle)

    def _idle(self) -> None:
        if self.detaching and not self.batches:
            self._reading.cancel()

    # -- frames in ----------------------------------------------------------------------------

    async def _on_frame(self, frame: Frame, nursery: trio.Nursery) -> None:
        kind = frame.kind
        if kind is Kind.LOAD:
            nursery.start_soon(self._answer_load, frame)
        elif kind is Kind.SHUTDOWN:
            if not self.detaching:
                log.info("%s: detaching once its batches are answered", self.name)
                self.detaching = True
                self._idle()
        elif kind is Kind.BATCH and self.detaching:
            batch_id = frame.meta.get("batch_id")
            if type(batch_id) is not int:
                self.lost(1, "malformed BATCH frame without a batch id")
                return
            reply = error_reply(batch_id, 503, "this connection to the worker is detaching")
            await self.send(encode_reply(reply))
        else:
            await self._host.dispatch(frame, self)

    async def _answer_load(self, frame: Frame) -> None:
        try:
            asked = LoadSpec.from_meta(frame.meta)
        except FrameError as exc:
            await self.send(encode_load_result(500, f"malformed LOAD frame: {exc}"))
            return
        spec = await self._host.wait_loaded()
        if (asked.model_name, asked.model_version) != (spec.model_name, spec.model_version):
            message = (
                f"this worker serves {spec.model_name} version {spec.model_version}, not "
                f"{asked.model_name} version {asked.model_version}"
            )
            log.error("%s: %s", self.name, message)
            await self.send(encode_load_result(500, message))
        elif self._host.shutting_down:
            await self.send(encode_load_result(503, "the worker is shutting down"))
        else:
            await self.send(encode_load_result(200, "loaded", self._host.streams))

    # -- the end ------------------------------------------------------------------------------

    async def _close(self) -> None:
        """Cancel the connection's requests still queued or running, then close it."""
        self.gone = True
        live = self.batches.request_ids()
        if live:
            log.info("%s: cancelling its %d requests left", self.name, len(live))
            self._host.cancel(live)
        sock = self._socket
        if sock is None:
            await self._stream.aclose()
            log.info("%s: closed", self.name)
            return
        # A thread blocked writing to it gives up; the descriptor is closed under the write
        # lock, so that no thread writes to a descriptor number reused meanwhile.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        lock = self._write_lock
        while not lock.acquire(blocking=False):  # noqa: ASYNC110
            await trio.sleep(WRITE_LOCK_POLL)
        try:
            sock.close()
        finally:
            lock.release()
        log.info("%s: closed", self.name)


__all__ = ["AttachedBatches", "AttachedConnection", "Host", "listen_socket"]
