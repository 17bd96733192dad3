"""An MLServer-style model in the worker: ``model-settings.json`` + an ``MLModel`` class.

:func:`load_mlmodel` imports the ``implementation`` (``module.Class``, the model folder on
``sys.path``), with ``mlserver`` resolving to the real package when it is installed and to
trioserve's :mod:`trioserve.model` otherwise (:mod:`~trioserve.worker.mlserver.mlserver_shim`),
builds its ``ModelSettings`` from the document the server sends, and awaits its ``load()``.

The model's coroutines run as tasks on an asyncio event loop in a thread of its own (the
"model loop"), one task per request, so a batch's requests and any number of streams run
concurrently; the trio thread only hands work over (:meth:`MLModelRunner.submit`,
:meth:`cancel`, :meth:`feed`, :meth:`ack`) and the loop writes the answers itself. A
request is unary (``predict``) or, marked with ``STREAM_HEADER``, a stream: the model's
``predict_stream`` gets an async iterator of requests (the first one, then each
STREAM_INPUT of a streamed input until its end) and every response it yields goes out as an
intermediate reply at the end of the loop's turn (with the other frames of that turn, in one
write); the final reply only marks the end (``END_HEADER``), or
carries the error the generator raised. A model that does not override ``predict_stream``
answers each input of a stream with ``predict``. A CANCEL cancels the request's task and
closes the generator (its ``finally`` runs). At most :data:`STREAM_WINDOW` intermediate
replies of a stream are unread by its client at a time: past that the task stops pulling
from the generator until a STREAM_ACK says the client has read more.

Request and response conversion is in :mod:`trioserve.worker.mlserver.mlmodel_io`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.messages import BatchReply, LoadSpec, Reply, WorkItem, encode_reply
from trioserve.core.oip.transport import END_HEADER, STREAM_HEADER
from trioserve.worker.attached import AttachedConnection
from trioserve.worker.errors import LoadError
from trioserve.worker.mlserver.mlmodel_io import (
    answer_reply,
    failed,
    inference_request,
    merged_request,
    split_replies,
)
from trioserve.worker.mlserver.outbox import Outbox, Send
from trioserve.worker.responses import FrameLimit

log = logging.getLogger("trioserve.worker")

SETTINGS_FILE = "model-settings.json"
STREAM_WINDOW: Final = 16  # intermediate replies of one stream its client has not read
CANCELLED: Final = 499  # the final status of a request whose client went away


class _Stream:
    """The state of one streamed request: its further inputs and its send window."""

    def __init__(self) -> None:
        self.inputs: asyncio.Queue[WorkItem | None] = asyncio.Queue()
        self.window = asyncio.Semaphore(STREAM_WINDOW)


class MLModelRunner:
    """A loaded MLServer-style model and the event loop (in its own thread) it runs on."""

    def __init__(
        self,
        model: Any,
        types: Any,
        send: Callable[[bytes], None],
        encode: Callable[[BatchReply], bytes] = encode_reply,
    ) -> None:
        self.model = model
        self._types = types
        self._send = send
        self._encode = encode  # a RESPONSE frame, within what the server reads
        # A plain selector loop, whatever event loop policy the process has installed (one
        # of trio-asyncio's would make loops that need trio's thread).
        self._loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="trioserve-model-loop", daemon=True
        )
        self._thread.start()
        self._tasks: dict[str, asyncio.Task[Reply]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._streams: dict[str, _Stream] = {}
        self._batches = 0  # batches not answered yet
        # What this turn of the loop writes goes out together once the turn ends.
        self._outbox = Outbox(self._loop, encode)
        self._write = self._outbox.write
        self._idle = threading.Event()
        self._idle.set()
        self.overrides_stream = _overrides(model, "predict_stream")
        settings = getattr(model, "settings", None)
        # MLServer batches adaptively when max_batch_size > 1 and max_batch_time > 0: the
        # server's batcher forms such batches, merged here (others run their requests apart).
        self._adaptive = (
            int(getattr(settings, "max_batch_size", 0) or 0) > 1
            and float(getattr(settings, "max_batch_time", 0) or 0) > 0
        )

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the model loop and wait for its result (any other thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # -- from the trio thread -------------------------------------------------------------

    def submit(
        self, batch_id: int, items: Sequence[WorkItem], origin: AttachedConnection | None = None
    ) -> None:
        """Start answering a batch from ``origin`` (None: the primary connection), on the loop."""
        self._batches += 1
        self._idle.clear()
        # Callbacks run in the order they are scheduled: the batch's streams exist before a
        # STREAM_INPUT or STREAM_ACK that follows the batch is handled.
        self._loop.call_soon_threadsafe(self._open, batch_id, list(items), origin)

    def cancel(self, request_ids: Sequence[str]) -> None:
        self._loop.call_soon_threadsafe(self._cancel, list(request_ids))

    def feed(self, item: WorkItem, end: bool) -> None:
        """The next input of a streamed request (``end``: the last one, if any)."""
        self._loop.call_soon_threadsafe(self._feed, item, end)

    def ack(self, request_id: str, count: int) -> None:
        self._loop.call_soon_threadsafe(self._ack, request_id, count)

    def wait_idle(self) -> None:
        """Block until every batch submitted so far is answered (for a shutdown)."""
        self._idle.wait()

    def close(self) -> None:
        """Await the model's ``unload()`` (when it has one) and stop the loop."""
        unload = getattr(self.model, "unload", None)
        try:
            if callable(unload):
                self.run(unload())
        except Exception:
            log.exception("unload() of %s raised", type(self.model).__name__)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    # -- on the model loop ----------------------------------------------------------------

    def _open(
        self, batch_id: int, items: list[WorkItem], origin: AttachedConnection | None
    ) -> None:
        send = self._send if origin is None else origin.send_from_thread
        unary = [i for i in items if not any(n == STREAM_HEADER for n, _v in i.headers)]
        together: asyncio.Task[dict[str, Reply]] | None = None
        if len(unary) > 1 and self._adaptive:
            together = asyncio.create_task(self._predict_together(unary))
        tasks = []
        for item in items:
            if together is not None and item in unary:
                task = asyncio.create_task(self._share(together, item.request_id))
            else:
                if item not in unary:
                    self._streams[item.request_id] = _Stream()
                task = asyncio.create_task(self._answer(batch_id, item, send))
            self._tasks[item.request_id] = task
            tasks.append(task)
        batch = asyncio.create_task(self._batch(batch_id, items, tasks, send, origin))
        self._running.add(batch)  # the loop keeps only a weak reference
        batch.add_done_callback(self._running.discard)

    async def _batch(
        self,
        batch_id: int,
        items: list[WorkItem],
        tasks: list[asyncio.Task[Reply]],
        send: Send,
        origin: AttachedConnection | None,
    ) -> None:
        try:
            replies: list[Reply] = []
            for item, task in zip(items, tasks, strict=True):
                try:
                    replies.append(await task)
                except asyncio.CancelledError:
                    replies.append(failed(item.request_id, CANCELLED, "the request was cancelled"))
                finally:
                    self._tasks.pop(item.request_id, None)
                    self._streams.pop(item.request_id, None)
            answer = BatchReply(batch_id, 200, "Prediction success", replies, True)
            self._write(send, self._encode(answer))
            self._outbox.flush()  # the batch is answered before it counts as done
        finally:
            if origin is not None:
                origin.answered(items)
            self._batches -= 1
            if self._batches == 0:
                self._idle.set()

    async def _share(self, together: asyncio.Task[dict[str, Reply]], request_id: str) -> Reply:
        return (await asyncio.shield(together))[request_id]

    async def _predict_together(self, items: list[WorkItem]) -> dict[str, Reply]:
        """MLServer's adaptive batching: the batch's unary requests as one ``predict`` call
        (one by one when they cannot be merged); every request gets its own reply."""
        replies: dict[str, Reply] = {}
        requests: list[tuple[WorkItem, Any]] = []
        for item in items:
            try:
                requests.append((item, inference_request(self._types, self.model.name, item)))
            except ServeError as error:
                replies[item.request_id] = failed(item.request_id, _status(error), error.message)
        merged = merged_request(self._types, [r for _i, r in requests]) if requests else None
        if merged is None or len(requests) < 2:
            for item, _request in requests:
                replies[item.request_id] = await self._answer(0, item, self._send)
            return replies
        ids = [item.request_id for item, _request in requests]
        try:
            response = await self.model.predict(merged[0])
            self._check(response, "predict")
            replies.update(zip(ids, split_replies(ids, response, merged[1]), strict=True))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            code = status if isinstance(status, int) and 400 <= status < 600 else 500
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            log.error("a batch of %d requests: %s raised", len(ids), self._name, exc_info=exc)
            replies.update((i, failed(i, code, message)) for i in ids)
        return replies

    async def _answer(self, batch_id: int, item: WorkItem, send: Send) -> Reply:
        """One request's final reply (its stream's answers go out on the way)."""
        mode = next((value for name, value in item.headers if name == STREAM_HEADER), None)
        try:
            request = inference_request(self._types, self.model.name, item)
            if mode is None:
                return self._checked(item.request_id, await self.model.predict(request), "predict")
            await self._stream(batch_id, item, request, send, more=mode == "in")
            return Reply(item.request_id, b"", 200, "", {END_HEADER: "1"}, None)
        except ServeError as error:
            return failed(item.request_id, _status(error), error.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            code = status if isinstance(status, int) and 400 <= status < 600 else 500
            log.error("request %s: %s raised", item.request_id, self._name, exc_info=exc)
            return failed(item.request_id, code, str(exc) or type(exc).__name__)

    async def _stream(
        self, batch_id: int, item: WorkItem, first: Any, send: Send, *, more: bool
    ) -> None:
        inputs = self._inputs(item.request_id, first, more)
        if self.overrides_stream:
            responses = self.model.predict_stream(inputs)
            if not hasattr(responses, "__anext__"):
                raise ServeError(
                    ErrorKind.INTERNAL,
                    f"{self._name}.predict_stream must be an async generator (or return an "
                    f"async iterator), not {type(responses).__name__}",
                    code=500,
                )
        else:
            responses = self._predict_each(inputs)
        stream = self._streams[item.request_id]
        try:
            async for response in responses:
                reply = self._checked(item.request_id, response, "predict_stream")
                await stream.window.acquire()
                self._write(send, (batch_id, reply))
        finally:
            close = getattr(responses, "aclose", None)
            if close is not None:
                await close()

    async def _predict_each(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in inputs:
            yield await self.model.predict(request)

    async def _inputs(self, request_id: str, first: Any, more: bool) -> AsyncIterator[Any]:
        yield first
        if not more:
            return
        queue = self._streams[request_id].inputs
        while (item := await queue.get()) is not None:
            yield inference_request(self._types, self.model.name, item)

    def _checked(self, request_id: str, response: Any, method: str) -> Reply:
        self._check(response, method)
        return answer_reply(request_id, response)

    def _check(self, response: Any, method: str) -> None:
        """A 500 naming the model and the type when ``method`` did not answer a response."""
        if not isinstance(response, self._types.InferenceResponse):
            raise ServeError(
                ErrorKind.INTERNAL,
                f"{self._name}.{method} must answer an InferenceResponse, not "
                f"{type(response).__name__}",
                code=500,
            )

    def _cancel(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            task = self._tasks.get(request_id)
            if task is not None:
                task.cancel()

    def _feed(self, item: WorkItem, end: bool) -> None:
        stream = self._streams.get(item.request_id)
        if stream is None:
            return  # ended or cancelled already
        if item.params:
            stream.inputs.put_nowait(item)
        if end:
            stream.inputs.put_nowait(None)

    def _ack(self, request_id: str, count: int) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            for _ in range(count):
                stream.window.release()

    @property
    def _name(self) -> str:
        return type(self.model).__name__


def load_mlmodel(spec: LoadSpec, send: Callable[[bytes], None]) -> MLModelRunner:
    """Import, build and load the MLServer-style model of ``spec``; ``send`` writes a frame
    to the server from any thread."""
    from trioserve.worker.mlserver import mlserver_shim

    assert spec.model_settings is not None
    mlserver_shim.install()
    model_dir = os.path.abspath(spec.model_dir)
    if model_dir in sys.path:
        sys.path.remove(model_dir)
    sys.path.insert(0, model_dir)
    settings_module = importlib.import_module("mlserver.settings")
    types = importlib.import_module("mlserver.types")
    implementation = _import_class(spec.handler)
    document = {**spec.model_settings, "implementation": implementation}
    try:
        settings = settings_module.ModelSettings.model_validate(document)
    except Exception as exc:
        raise LoadError(f"{SETTINGS_FILE} of {spec.model_name}: {exc}") from exc
    _remember_source(settings, os.path.join(model_dir, SETTINGS_FILE))
    runner = MLModelRunner(implementation(settings), types, send, FrameLimit.of(spec).reply)
    try:
        ready = runner.run(runner.model.load())
        if ready is False:
            raise LoadError(f"{spec.handler}.load() returned False: the model is not ready")
    except BaseException:
        runner.close()
        raise
    runner.model.ready = True
    return runner


def _overrides(model: Any, method: str) -> bool:
    """Whether the model's class defines ``method`` itself (not MLModel's default)."""
    for cls in type(model).__mro__:
        if method in vars(cls):
            return cls.__module__.split(".")[0] not in ("mlserver", "trioserve")
    return False


def _import_class(path: str) -> type[Any]:
    module_name, _, class_name = path.rpartition(".")
    if not module_name:
        raise LoadError(f"implementation {path!r} must be 'module.Class'")
    module = importlib.import_module(module_name)
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        raise LoadError(f"implementation {path!r}: {module_name} has no class {class_name}")
    return found


def _remember_source(settings: Any, path: str) -> None:
    """Where the settings came from, which ``get_model_uri`` resolves relative URIs against
    (MLServer keeps it in the private attribute ``_source``)."""
    try:
        settings._source = path
    except (AttributeError, ValueError, TypeError):
        log.debug("the model settings do not keep their source path")


def _status(error: ServeError) -> int:
    """The reply status of a refusal here: a client's mistake 400, anything else 500."""
    if error.code is not None:
        return error.code
    return 400 if error.kind is ErrorKind.BAD_INPUT else 500


__all__ = ["CANCELLED", "STREAM_WINDOW", "MLModelRunner", "load_mlmodel"]
