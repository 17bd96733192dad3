"""The one thread every handler call runs in.

Loading and every batch run in the same long-lived thread, so thread-local state a handler
sets up in ``initialize`` (the current CUDA device, for one) is still there for ``handle``.
The trio thread stays free to read frames, answer PINGs and take CANCELs meanwhile; the
handler reaches back into trio with ``trio.from_thread.run(..., trio_token=...)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import outcome
import trio

T = TypeVar("T")


class HandlerThread:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trioserve-handler")

    async def run(self, fn: Callable[[], T]) -> outcome.Outcome[T]:
        """Run ``fn`` in the handler thread; its result or exception, as an Outcome."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: Future[outcome.Outcome[T]]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future: Future[outcome.Outcome[T]] = self._pool.submit(outcome.capture, fn)
        future.add_done_callback(wake)
        await done.wait()
        return future.result()

    def close(self) -> None:
        """Stop taking work; a call still running is not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)
