"""The worker's frame loop.

Frames in (server -> worker) and what the worker does:

* LOAD (must come first): load the handler in the handler thread, answer LOAD_RESULT
  ``{code: 200, message: "loaded"}``; on failure answer the error code and exit with status 1.
* BATCH: its collated tensors (``meta["tensors"]``, see :mod:`trioserve.worker.tensors`) are
  checked first; a batch whose tensors break the contract is answered at once with 400. Then
  it is queued (FIFO, one batch runs at a time). The entry point runs in the handler thread;
  intermediate RESPONSE frames (not final) go out as the handler sends them, then one final
  RESPONSE, then a METRICS frame with the metrics the handler (and the worker) recorded:
  after every batch that leaves the handler thread with nothing queued, and at most every
  ``METRICS_INTERVAL`` while batches keep coming (records are held until the next frame; a
  worker that dies loses at most that interval's). Once the model is loaded, a batch goes
  straight from the frame reader to the handler thread, which also writes its answer (see
  :meth:`Worker._batch_in_thread`): trio's thread is woken once per batch (the frame coming
  in), not three times.
* CANCEL ``{ids}``: those requests' ``context.is_cancelled()`` turns True.
* PING ``{n}``: PONG ``{n}`` at once, even while a handler runs.
* SHUTDOWN: batches already received are finished, then the worker exits 0. A BATCH after
  SHUTDOWN is answered at once with 503.

End of stream or a socket error ends the process at once (``os._exit``), even while a handler
runs, as does the death of the parent process (checked every half second).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

import outcome
import trio

from trioserve.collate import aligned_buffer
from trioserve.core.frames import Frame, FrameDecoder, FrameError, Kind, encode
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    WorkItem,
    decode_cancel,
    encode_load_result,
    encode_reply,
)
from trioserve.worker.batch import Entry, prepare, run_batch
from trioserve.worker.cancellation import CancelBook
from trioserve.worker.codec import decode_enabled
from trioserve.worker.context import Context
from trioserve.worker.errors import PREDICTION_FAILED, load_error
from trioserve.worker.handler_thread import HandlerThread
from trioserve.worker.loader import load_handler
from trioserve.worker.metrics import MetricsCache
from trioserve.worker.replies import error_reply
from trioserve.worker.streaming import IntermediateChannel
from trioserve.worker.tensors import BatchTensor, TensorSpecError, parse_batch_tensors
from trioserve.worker.wire import decode_batch

log = logging.getLogger("trioserve.worker")

SERVER_VERSION = "0.12.0"  # what handlers read as system_properties["server_version"]
PARENT_CHECK_INTERVAL = 0.5
READ_SIZE = 1 << 20
# How often trio's thread retries the socket's write lock while the handler thread holds it
# (it holds it for one write, or while the server is not reading).
WRITE_LOCK_POLL = 0.0005
# While batches keep coming, metrics records go to the server at most this often, in one
# METRICS frame; a batch the handler thread finishes with nothing queued behind it sends
# whatever is pending at once.
METRICS_INTERVAL = 0.1


def exit_now(status: int, why: str) -> NoReturn:
    """End the process immediately, whatever threads are running."""
    log.info("worker exiting (%d): %s", status, why)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


@dataclass(slots=True)
class LoadJob:
    spec: LoadSpec


@dataclass(slots=True)
class BatchJob:
    batch_id: int
    items: list[WorkItem]
    tensors: dict[str, BatchTensor] = field(default_factory=dict)


Job = LoadJob | BatchJob


def _nothing() -> None:
    """A handler-thread call that returns at once: awaiting it waits for the calls before."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the non-blocking ``fd``, waiting (in this thread) for room."""
    view = memoryview(data)
    poller: select.poll | None = None
    while view.nbytes:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(fd, select.POLLOUT)
            poller.poll()
            continue
        view = view[sent:]


class Worker:
    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        decode: bool | None = None,
        exit_fn: Callable[[int, str], NoReturn] = exit_now,
        parent_pid: int | None = None,
    ) -> None:
        self._stream = stream
        # Over a socket stream, its socket, for the fast paths of send() and _receive().
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._exit = exit_fn
        self._decode = decode_enabled() if decode is None else decode
        self._send_lock = trio.StrictFIFOLock()
        # Over a socket, the handler thread writes batch answers itself: this lock keeps its
        # frames and trio's whole and apart.
        self._write_lock = threading.Lock()
        self._jobs_in, self._jobs_out = trio.open_memory_channel[Job](math.inf)
        self._cancels = CancelBook()
        self._thread = HandlerThread()
        self._token: trio.lowlevel.TrioToken | None = None
        self._parent = os.getppid() if parent_pid is None else parent_pid
        self._load_seen = False
        self._shutting_down = False
        # Set once the model is loaded and the batches queued meanwhile are handed over: from
        # then on the frame reader hands batches to the handler thread itself.
        self._direct = False
        self.context: Context | None = None
        self.entry: Entry | None = None
        self._metrics_sent_at = -math.inf  # time.monotonic() of the last METRICS frame

    # -- writing ------------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write one or more whole frames; frames never interleave.

        Over a socket, when no other write is under way, the frame is first written
        straight to the (non-blocking) socket: almost always all of it goes at once and the
        task does not pass through trio's scheduler. What the socket does not take at once
        is sent with the stream's ``send_all``, still holding the locks.
        """
        if self._send_lock.locked():
            await self._send_lock.acquire()
        else:
            self._send_lock.acquire_nowait()
        try:
            if self._socket is None:
                await self._send_all(data)
            else:
                await self._send_socket(self._socket.fileno(), data)
        finally:
            self._send_lock.release()

    async def _send_all(self, data: bytes | memoryview) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._exit(0, f"the server connection is gone ({type(exc).__name__})")

    async def _send_socket(self, fd: int, data: bytes) -> None:
        """Write ``data`` to the socket under the write lock shared with the handler thread."""
        lock = self._write_lock
        # A threading lock cannot wake a trio task, and waiting for it in a worker thread
        # could not be cancelled; it is held briefly, so poll (and stay cancellable).
        while not lock.acquire(blocking=False):  # noqa: ASYNC110
            await trio.sleep(WRITE_LOCK_POLL)
        try:
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._exit(0, f"the server connection is gone ({type(exc).__name__})")
            if sent < len(data):
                await self._send_all(memoryview(data)[sent:])
        finally:
            lock.release()

    async def _receive(
        self, buffer: bytearray, *, wait_first: bool = False
    ) -> bytes | bytearray | memoryview:
        """The next bytes from the server (empty at end of stream).

        Over a socket they are read into ``buffer``, reused for every read, instead of into
        a fresh ``READ_SIZE`` bytes object each time (which costs a large allocation, page
        faults and a shrink per read); the decoder copies them out before the next read.
        With ``wait_first`` (the last read ended on a frame boundary, so the server is most
        likely waiting for an answer) it waits for the socket to be readable before reading,
        which saves the read that would fail with EAGAIN.
        """
        sock = self._socket
        if sock is None:
            return await self._stream.receive_some(READ_SIZE)
        if not wait_first:
            size = await sock.recv_into(buffer)
            return memoryview(buffer)[:size]
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                size = os.readv(sock.fileno(), [buffer])
            except BlockingIOError:  # a spurious wake-up
                continue
            return memoryview(buffer)[:size]

    def _send_from_thread(self, data: bytes) -> None:
        """Blocking send for the handler thread; returns once the frame is written.

        Over a socket the thread writes it itself, under the write lock, without waking trio's
        thread; over any other stream trio writes it.
        """
        sock = self._socket
        if sock is None:
            trio.from_thread.run(self.send, data, trio_token=self._token)
            return
        try:
            with self._write_lock:
                write_all(sock.fileno(), data)
        except OSError as exc:
            self._exit(0, f"the server connection is gone ({type(exc).__name__})")

    # -- the task tree ------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SHUTDOWN (0) or a failed load (1)."""
        self._token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_loop)
                nursery.start_soon(self._watch_parent)
                status = await self._run_jobs()
                nursery.cancel_scope.cancel()
        finally:
            self._thread.close()
        return status

    async def _watch_parent(self) -> None:
        while True:
            await trio.sleep(PARENT_CHECK_INTERVAL)
            if os.getppid() != self._parent:
                self._exit(1, "the parent process died")

    async def _read_loop(self) -> None:
        # Frames land in 64-byte-aligned storage: the blobs (collated batch tensors among
        # them) are then aligned in memory, not only within the frame.
        decoder = FrameDecoder(allocate=aligned_buffer)
        buffer = bytearray(READ_SIZE if self._socket is not None else 0)
        while True:
            try:
                data = await self._receive(buffer, wait_first=decoder.pending == 0)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._exit(0, f"the server connection failed ({type(exc).__name__})")
            if not data:
                self._exit(0, "the server closed the connection")
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                self._exit(1, f"malformed frame from the server: {exc}")
            for frame in frames:
                await self._dispatch(frame)

    # -- frames in ----------------------------------------------------------------------------

    async def _dispatch(self, frame: Frame) -> None:
        kind = frame.kind
        if kind is Kind.PING:
            await self.send(encode(Kind.PONG, {"n": frame.meta.get("n")}))
        elif kind is Kind.BATCH:
            await self._on_batch(frame)
        elif kind is Kind.CANCEL:
            try:
                ids = decode_cancel(frame)
            except FrameError as exc:
                log.warning("ignoring a malformed CANCEL frame: %s", exc)
                return
            self._cancels.cancel(ids)
        elif kind is Kind.LOAD:
            await self._on_load(frame)
        elif kind is Kind.SHUTDOWN:
            if not self._shutting_down:
                log.info("shutdown requested; finishing the batches already received")
                self._shutting_down = True
                self._jobs_in.close()
        else:
            log.warning("ignoring a %s frame: the server does not send those", kind.name)

    async def _on_load(self, frame: Frame) -> None:
        if self._load_seen:
            log.error("ignoring a second LOAD frame: this worker already has a model")
            await self.send(
                encode_load_result(500, "this worker already loaded a model; start a new one")
            )
            return
        self._load_seen = True
        try:
            spec = LoadSpec.from_meta(frame.meta)
        except FrameError as exc:
            await self.send(encode_load_result(500, f"malformed LOAD frame: {exc}"))
            self._exit(1, f"malformed LOAD frame: {exc}")
        self._queue(LoadJob(spec))

    async def _on_batch(self, frame: Frame) -> None:
        try:
            batch_id, items = decode_batch(frame)
        except FrameError as exc:
            raw_id = frame.meta.get("batch_id")
            if not isinstance(raw_id, int) or isinstance(raw_id, bool):
                self._exit(1, f"malformed BATCH frame without a batch id: {exc}")
            log.error("rejecting malformed batch %d: %s", raw_id, exc)
            await self.send(encode_reply(error_reply(raw_id, 400, f"malformed batch: {exc}")))
            return
        try:
            tensors = parse_batch_tensors(frame.meta, frame.blobs, len(items))
        except TensorSpecError as exc:
            log.error("rejecting batch %d: %s", batch_id, exc)
            await self.send(
                encode_reply(error_reply(batch_id, 400, f"malformed batch tensors: {exc}"))
            )
            return
        if self._shutting_down:
            await self.send(encode_reply(error_reply(batch_id, 503, "the worker is shutting down")))
            return
        self._cancels.track(item.request_id for item in items)
        job = BatchJob(batch_id, items, tensors)
        if self._direct:
            self._submit(job)
        else:
            self._queue(job)

    def _queue(self, job: Job) -> None:
        try:
            self._jobs_in.send_nowait(job)
        except trio.ClosedResourceError:  # SHUTDOWN came first
            log.warning("dropping a %s that arrived after SHUTDOWN", type(job).__name__)

    # -- jobs ---------------------------------------------------------------------------------

    async def _run_jobs(self) -> int:
        async for job in self._jobs_out:
            if isinstance(job, LoadJob):
                if not await self._load(job.spec):
                    return 1
                self._go_direct()
            else:
                self._submit(job)
        # Batches handed to the handler thread are not awaited one by one: wait for the last.
        await self._thread.run(_nothing)
        return 0

    def _go_direct(self) -> None:
        """Hand the batches queued during the load to the handler thread, then let the frame
        reader hand it the next ones itself (no await in between, so the order holds)."""
        while True:
            try:
                job = self._jobs_out.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if isinstance(job, BatchJob):  # a second LOAD never reaches the queue
                self._submit(job)
        self._direct = True

    def _submit(self, job: BatchJob) -> None:
        self._thread.submit(functools.partial(self._batch_in_thread, job))

    async def _load(self, spec: LoadSpec) -> bool:
        context = Context(
            spec.model_name,
            spec.model_dir,
            spec.manifest,
            spec.batch_size,
            spec.gpu_id,
            SERVER_VERSION,
            spec.limit_max_image_pixels,
            metrics=MetricsCache(spec.model_name),
            model_yaml_config=spec.model_yaml_config,
        )
        log.info("loading model %s with handler %s", spec.model_name, spec.handler)
        result = await self._thread.run(
            functools.partial(load_handler, spec.handler, spec.model_dir, context, spec.envelope)
        )
        if isinstance(result, outcome.Error):
            code, message = load_error(result.error)
            log.error(
                "loading model %s failed: %s", spec.model_name, message, exc_info=result.error
            )
            await self.send(encode_load_result(code, message))
            return False
        self.context = context
        self.entry = result.unwrap()
        await self.send(encode_load_result(200, "loaded"))
        await self._send_metrics()
        return True

    def _batch_in_thread(self, job: BatchJob) -> None:
        """In the handler thread: run one batch and write its answer.

        The final RESPONSE and the METRICS frame that follows it go out in one write: one
        system call and one wake-up of the server instead of two.
        """
        try:
            reply = self._reply_to(job)
            # Under load another batch is already queued: its metrics can ride along later.
            flush = self._thread.pending() == 0
            self._send_from_thread(encode_reply(reply) + self._metrics_frame(flush=flush))
        except Exception as exc:
            # The batch's answer cannot be sent: end the process, so that the server fails
            # the batch at once and restarts the worker, rather than waiting for the
            # response timeout (nothing else would answer these requests).
            log.error("batch %d: its answer could not be sent", job.batch_id, exc_info=exc)
            self._exit(1, f"batch {job.batch_id}: its answer could not be sent")
        finally:
            self._cancels.release([item.request_id for item in job.items])

    def _reply_to(self, job: BatchJob) -> BatchReply:
        entry, context = self.entry, self.context
        if entry is None or context is None:
            return error_reply(job.batch_id, 503, "no model is loaded in this worker")
        channel = IntermediateChannel(job.batch_id, self._send_from_thread)
        try:
            data = prepare(
                context,
                job.items,
                decode=self._decode,
                cancel_check=self._cancels.is_cancelled,
                channel=channel,
                tensors=job.tensors,
            )
            return run_batch(entry, context, job.batch_id, job.items, data)
        except BaseException as exc:  # run_batch catches the handler's; this is the worker's
            log.error("batch %d could not be run", job.batch_id, exc_info=exc)
            return error_reply(job.batch_id, *PREDICTION_FAILED)
        finally:
            context.end_batch()

    def _metrics_frame(self, *, flush: bool = True) -> bytes:
        """A METRICS frame with the records since the last one; empty bytes when none, or
        when ``flush`` is false and the last frame went out less than METRICS_INTERVAL ago."""
        metrics = self.context.metrics if self.context is not None else None
        if not isinstance(metrics, MetricsCache):
            return b""
        now = time.monotonic()
        if not flush and now - self._metrics_sent_at < METRICS_INTERVAL:
            return b""
        self._metrics_sent_at = now
        records = metrics.drain()
        if not records:
            return b""
        return encode(Kind.METRICS, {"metrics": records})

    async def _send_metrics(self) -> None:
        frame = self._metrics_frame()
        if frame:
            await self.send(frame)
