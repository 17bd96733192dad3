"""The one thread every handler call runs in.

Loading and every batch run in the same long-lived thread, so thread-local state a handler
sets up in ``initialize`` (the current CUDA device, for one) is still there for ``handle``.
The trio thread stays free to read frames, answer PINGs and take CANCELs meanwhile; the
handler reaches back into trio with ``trio.from_thread.run(..., trio_token=...)``.

A call costs one wake-up each way and little else: the trio task parks itself
(``wait_task_rescheduled``), the thread takes the call from a ``SimpleQueue`` and, when it is
done, reschedules the task through the trio token with the call's outcome. A call made with
:meth:`HandlerThread.submit` costs less still: nothing waits for it, so the thread wakes no
one when it is done (the batch path: the thread writes the batch's answer itself).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import outcome
import trio

T = TypeVar("T")

log = logging.getLogger("trioserve.worker")

THREAD_NAME = "trioserve-handler"


class HandlerThreadClosed(RuntimeError):
    """The handler thread was closed before the call could run."""


class _Call(Generic[T]):
    __slots__ = ("abandoned", "fn", "task", "token")

    def __init__(
        self,
        fn: Callable[[], T],
        task: trio.lowlevel.Task | None,
        token: trio.lowlevel.TrioToken | None,
    ) -> None:
        self.fn = fn
        self.task = task
        self.token = token
        self.abandoned = False  # the waiting task was cancelled; only touched in trio's thread


def _deliver(call: _Call[Any], result: outcome.Outcome[Any]) -> None:
    """In trio's thread: wake the waiting task with ``result`` (unless it gave up)."""
    if not call.abandoned and call.task is not None:
        trio.lowlevel.reschedule(call.task, outcome.Value(result))


class HandlerThread:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def _loop(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            if self._closed:
                result: outcome.Outcome[Any] = outcome.Error(
                    HandlerThreadClosed("the handler thread was closed")
                )
            else:
                result = outcome.capture(call.fn)
            if call.token is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    call.token.run_sync_soon(_deliver, call, result)
            elif isinstance(result, outcome.Error) and not self._closed:
                # A submitted call handles its own errors; this one escaped it.
                log.error("a call in the handler thread failed", exc_info=result.error)
            del call, result  # do not keep the last batch alive while waiting

    def _start(self) -> None:
        if self._closed:
            raise HandlerThreadClosed("the handler thread is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def pending(self) -> int:
        """How many calls are queued and not yet started."""
        return self._queue.qsize()

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` to run in the handler thread after the calls already queued, and
        return at once; nothing is told when it is done, so ``fn`` deals with its own result
        and errors (an exception escaping it is only logged)."""
        self._start()
        self._queue.put(_Call(fn, None, None))

    async def run(self, fn: Callable[[], T]) -> outcome.Outcome[T]:
        """Run ``fn`` in the handler thread; its result or exception, as an Outcome.

        Cancelling the waiting task does not stop ``fn``: the thread finishes it and the
        outcome is dropped.
        """
        self._start()
        call = _Call(fn, trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
        self._queue.put(call)

        def abort(_: object) -> trio.lowlevel.Abort:
            call.abandoned = True
            return trio.lowlevel.Abort.SUCCEEDED

        result: outcome.Outcome[T] = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def close(self) -> None:
        """Stop taking work; calls still queued fail with :class:`HandlerThreadClosed`, and a
        call still running is not waited for."""
        self._closed = True
        self._queue.put(None)
