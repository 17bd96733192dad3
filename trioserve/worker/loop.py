"""The worker's frame loop: :class:`WorkerLoop`, inside the worker subprocess.

It reads the server's frames, loads the model in the handler thread
(:mod:`trioserve.worker.handler_thread`) and has each batch answered through the model's API:
a TorchServe handler's in the handler thread
(:func:`~trioserve.worker.torchserve.answer.answer_batch`), an MLServer model's on its own
event loop (:mod:`trioserve.worker.mlserver.mlmodel`), which also gets the CANCEL,
STREAM_INPUT and STREAM_ACK frames for it. The loop is the one module of the worker that
knows both APIs. The bytes go through a
:class:`~trioserve.worker.connection.ServerConnection`.

Frames in (server -> worker) and what the worker does:

* LOAD (must come first): load the handler (or MLServer model) in the handler thread, answer
  LOAD_RESULT ``{code: 200, message: "loaded"}`` (an MLServer model's with ``streams``);
  on failure answer the code and exit 1.
* BATCH: its collated tensors (``meta["tensors"]``, see :mod:`trioserve.worker.tensors`) are
  checked first; a batch whose tensors break the contract is answered at once with 400. Then
  it is queued (FIFO, one batch runs at a time). The entry point runs in the handler thread;
  intermediate RESPONSE frames (not final) go out as the handler sends them, then one final
  RESPONSE, then a METRICS frame with the metrics the handler (and the worker) recorded:
  after every batch that leaves the handler thread with nothing queued, and at most every
  ``METRICS_INTERVAL`` while batches keep coming (records are held until the next frame; a
  worker that dies loses at most that interval's). Once the model is loaded, the frame
  reader hands a batch straight to the handler thread, which writes its answer itself.
* CANCEL ``{ids}``: those requests' ``context.is_cancelled()`` turns True. PING ``{n}``:
  PONG ``{n}`` at once, even while a handler runs. SHUTDOWN: batches already received are
  finished, then the worker exits 0; a BATCH after SHUTDOWN is answered at once with 503.

End of stream or a socket error ends the process at once (``os._exit``), even while a handler
runs, as does the death of the parent process (checked every half second).

More serving processes may attach (:meth:`WorkerLoop.attach`; ``listener``: ``--listen``): the
same frames, the same queue, each batch answered on its ``origin``, the attached connection
it came from (None: the primary one, ``--fd``); see :mod:`trioserve.worker.attached`.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import NoReturn, cast

import outcome
import trio

from trioserve.core.frames import Frame, FrameError, Kind, encode
from trioserve.core.messages import (
    BatchReply,
    LoadSpec,
    decode_cancel,
    decode_stream_ack,
    decode_stream_input,
    encode_load_result,
    encode_reply,
)
from trioserve.worker.attached import AttachedConnection
from trioserve.worker.cancellation import CancelBook
from trioserve.worker.connection import ServerConnection, exit_now
from trioserve.worker.errors import load_error
from trioserve.worker.handler_thread import HandlerThread
from trioserve.worker.mlserver.mlmodel import MLModelRunner, load_mlmodel
from trioserve.worker.pending import Pending, PendingBatch, PendingLoad
from trioserve.worker.responses import FrameLimit, error_reply
from trioserve.worker.tensors import TensorSpecError, parse_batch_tensors
from trioserve.worker.torchserve.answer import answer_batch
from trioserve.worker.torchserve.batch import Entry
from trioserve.worker.torchserve.codec import decode_enabled
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.loader import load_spec_handler
from trioserve.worker.torchserve.metrics import MetricsCache
from trioserve.worker.wire import decode_batch

log = logging.getLogger("trioserve.worker")

SERVER_VERSION = "0.12.0"  # what handlers read as system_properties["server_version"]
PARENT_CHECK_INTERVAL = 0.5
# While batches keep coming, metrics records go to the server at most this often, in one
# METRICS frame; a batch the handler thread finishes with nothing queued behind it sends
# whatever is pending at once.
METRICS_INTERVAL = 0.1


def _nothing() -> None:
    """A handler-thread call that returns at once: awaiting it waits for the calls before."""


class WorkerLoop:
    """The worker's trio side: reads frames, answers PING and CANCEL, hands LOAD and BATCH on."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        decode: bool | None = None,
        exit_fn: Callable[[int, str], NoReturn] = exit_now,
        parent_pid: int | None = None,
        listener: trio.socket.SocketType | None = None,
    ) -> None:
        self._conn = ServerConnection(stream, exit_fn)
        self._listener = listener  # where more serving processes attach (--listen)
        self.send = self._conn.send  # bound once: trio's writes
        self._send_from_thread = self._conn.send_from_thread  # the handler thread's
        self._exit = exit_fn
        self._decode = decode_enabled() if decode is None else decode
        self._pending_in, self._pending_out = trio.open_memory_channel[Pending](math.inf)
        self._cancels = CancelBook()
        self._thread = HandlerThread()
        self._parent = os.getppid() if parent_pid is None else parent_pid
        self._load_seen = False
        self._loaded = trio.Event()  # the model is loaded (attached connections wait for it)
        self.shutting_down = False  # SHUTDOWN came on the primary connection
        self.streams: bool | None = None  # the LOAD_RESULT's (encode_load_result)
        # Set once the model is loaded and the batches queued meanwhile are handed over: from
        # then on the frame reader hands batches to the handler thread itself.
        self._direct = False
        self.context: Context | None = None
        self.entry: Entry | MLModelRunner | None = None
        self._spec = LoadSpec("", "", "", "")  # the loaded model's (envelope, limits)
        self._frames = FrameLimit()  # what the server reads: FrameLimit.of(self._spec)
        self._metrics_sent_at = -math.inf  # time.monotonic() of the last METRICS frame
        self._metrics_to: AttachedConnection | None = None  # the last batch's origin

    # -- the task tree ------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SHUTDOWN (0) or a failed load (1)."""
        self._conn.token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._conn.read_frames, self.dispatch)
                nursery.start_soon(self._watch_parent)
                if self._listener is not None:
                    listeners = [trio.SocketListener(self._listener)]
                    nursery.start_soon(trio.serve_listeners, self.attach, listeners)
                status = await self._run_pending()
                nursery.cancel_scope.cancel()
        finally:
            self._thread.close()
        return status

    async def _watch_parent(self) -> None:
        while True:
            await trio.sleep(PARENT_CHECK_INTERVAL)
            if os.getppid() != self._parent:
                self._exit(1, "the parent process died")

    async def attach(self, stream: trio.abc.Stream) -> None:
        """Serve one more serving process on ``stream`` until it detaches or goes away (an
        attached connection); nothing about it ends the process."""
        await AttachedConnection(stream, self).serve()

    async def wait_loaded(self) -> LoadSpec:
        await self._loaded.wait()
        return self._spec

    # -- frames in ----------------------------------------------------------------------------

    async def dispatch(self, frame: Frame, origin: AttachedConnection | None = None) -> None:
        """Handle one frame from the primary connection (or any but LOAD and SHUTDOWN from an
        attached one, ``origin``)."""
        kind = frame.kind
        if kind is Kind.PING:
            await (origin or self._conn).send(encode(Kind.PONG, {"n": frame.meta.get("n")}))
        elif kind is Kind.BATCH:
            await self._on_batch(frame, origin)
        elif kind is Kind.CANCEL:
            try:
                ids = decode_cancel(frame)
            except FrameError as exc:
                log.warning("ignoring a malformed CANCEL frame: %s", exc)
                return
            self.cancel(ids)
        elif kind in (Kind.STREAM_INPUT, Kind.STREAM_ACK):
            self._on_stream_frame(frame)
        elif kind is Kind.LOAD:
            await self._on_load(frame)
        elif kind is Kind.SHUTDOWN:
            if not self.shutting_down:
                log.info("shutdown requested; finishing the batches already received")
                self.shutting_down = True
                self._pending_in.close()
        else:
            log.warning("ignoring a %s frame: the server does not send those", kind.name)

    def cancel(self, request_ids: Sequence[str]) -> None:
        self._cancels.cancel(request_ids)
        if isinstance(self.entry, MLModelRunner):
            self.entry.cancel(request_ids)

    def _on_stream_frame(self, frame: Frame) -> None:
        runner = self.entry
        if not isinstance(runner, MLModelRunner):
            if frame.kind is Kind.STREAM_INPUT:  # (a handler has no use for acks)
                log.warning("ignoring a STREAM_INPUT frame: this model takes no streamed input")
            return
        try:
            if frame.kind is Kind.STREAM_ACK:
                runner.ack(*decode_stream_ack(frame))
            else:
                runner.feed(*decode_stream_input(frame))
        except FrameError as exc:
            log.warning("ignoring a malformed %s frame: %s", frame.kind.name, exc)

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
        self._queue(PendingLoad(spec))

    async def _on_batch(self, frame: Frame, origin: AttachedConnection | None) -> None:
        send = self.send if origin is None else origin.send
        try:
            batch_id, items = decode_batch(frame)
        except FrameError as exc:
            raw_id = frame.meta.get("batch_id")
            if not isinstance(raw_id, int) or isinstance(raw_id, bool):
                why = f"malformed BATCH frame without a batch id: {exc}"
                (self._exit if origin is None else origin.lost)(1, why)
                return
            log.error("rejecting malformed batch %d: %s", raw_id, exc)
            await send(encode_reply(error_reply(raw_id, 400, f"malformed batch: {exc}")))
            return
        try:
            tensors = parse_batch_tensors(frame.meta, frame.blobs, len(items))
        except TensorSpecError as exc:
            log.error("rejecting batch %d: %s", batch_id, exc)
            await send(encode_reply(error_reply(batch_id, 400, f"malformed batch tensors: {exc}")))
            return
        if self.shutting_down:
            await send(encode_reply(error_reply(batch_id, 503, "the worker is shutting down")))
            return
        self._cancels.track(item.request_id for item in items)
        batch = PendingBatch(batch_id, items, tensors, origin)
        if origin is not None:
            origin.received(items)
        if self._direct:
            self._submit(batch)
        else:
            self._queue(batch)

    def _queue(self, pending: Pending) -> None:
        try:
            self._pending_in.send_nowait(pending)
        except trio.ClosedResourceError:  # SHUTDOWN came first
            log.warning("dropping a %s that arrived after SHUTDOWN", type(pending).__name__)

    # -- pending work -------------------------------------------------------------------------

    async def _run_pending(self) -> int:
        async for pending in self._pending_out:
            if isinstance(pending, PendingLoad):
                if not await self._load(pending.spec):
                    return 1
                self._go_direct()
            else:
                self._submit(pending)
        # Batches handed to the handler thread are not awaited one by one: wait for the last.
        await self._thread.run(_nothing)
        if isinstance(self.entry, MLModelRunner):
            await trio.to_thread.run_sync(self.entry.wait_idle)
        return 0

    def _go_direct(self) -> None:
        """Hand the batches queued during the load to the handler thread, then let the frame
        reader hand it the next ones itself (no await in between, so the order holds)."""
        while True:
            try:
                pending = self._pending_out.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if isinstance(pending, PendingBatch):  # a second LOAD never reaches the queue
                self._submit(pending)
        self._direct = True

    def _submit(self, batch: PendingBatch) -> None:
        if isinstance(self.entry, MLModelRunner):  # its own event loop answers
            self._cancels.release([item.request_id for item in batch.items])
            self.entry.submit(batch.batch_id, batch.items, batch.origin)
            return
        self._thread.submit(functools.partial(self._batch_in_thread, batch))

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
            functools.partial(load_mlmodel, spec, self._send_from_thread)
            if spec.model_settings is not None
            else functools.partial(load_spec_handler, spec, context)
        )
        if isinstance(result, outcome.Error):
            code, message = load_error(result.error)
            log.error(
                "loading model %s failed: %s", spec.model_name, message, exc_info=result.error
            )
            await self.send(encode_load_result(code, message))
            return False
        self.context, self._spec, self._frames = context, spec, FrameLimit.of(spec)
        self.entry = cast("Entry | MLModelRunner", result.unwrap())
        if isinstance(self.entry, MLModelRunner):
            self.streams = self.entry.overrides_stream
        await self.send(encode_load_result(200, "loaded", self.streams))
        self._loaded.set()
        await self._send_metrics()
        return True

    def _batch_in_thread(self, batch: PendingBatch) -> None:
        """In the handler thread: run one batch and write its answer (the final RESPONSE and
        the METRICS frame after it in one write: one system call, one wake-up of the server)."""
        origin = batch.origin
        send = self._send_from_thread if origin is None else origin.send_from_thread
        try:
            if origin is not self._metrics_to:  # the records held go to their batches' origin
                if held := self._metrics_frame():
                    (self._metrics_to or self._conn).send_from_thread(held)
                self._metrics_to = origin
            reply = self._reply_to(batch, send)
            # Under load another batch is already queued: its metrics can ride along later.
            flush = self._thread.pending() == 0
            send(self._frames.reply(reply) + self._metrics_frame(flush=flush))
        except Exception as exc:
            # The batch's answer cannot be sent: end the process (or the attached connection),
            # so that the server fails the batch at once and restarts the worker, rather than
            # waiting for the response timeout (nothing else would answer these requests).
            log.error("batch %d: its answer could not be sent", batch.batch_id, exc_info=exc)
            why = f"batch {batch.batch_id}: its answer could not be sent"
            (self._exit if origin is None else origin.lost)(1, why)
        finally:
            self._cancels.release([item.request_id for item in batch.items])
            if origin is not None:
                origin.answered(batch.items)

    def _reply_to(self, batch: PendingBatch, send: Callable[[bytes], None]) -> BatchReply:
        entry, context = self.entry, self.context
        if entry is None or context is None or isinstance(entry, MLModelRunner):
            return error_reply(batch.batch_id, 503, "no model is loaded in this worker")
        if all(self._cancels.is_cancelled(item.request_id) for item in batch.items):
            # Sent behind a running batch and cancelled (client gone, deadline) before it ran.
            return error_reply(batch.batch_id, 503, "every request was cancelled before it ran")
        return answer_batch(
            entry,
            context,
            self._spec,
            batch.batch_id,
            batch.items,
            decode=self._decode,
            cancel_check=self._cancels.is_cancelled,
            tensors=batch.tensors,
            write=send,
            encode=self._frames.reply,
        )

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
        return self._frames.metrics(records)

    async def _send_metrics(self) -> None:
        frame = self._metrics_frame()
        if frame:
            await self.send(frame)
