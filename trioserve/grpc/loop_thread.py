"""The fallback portal: an asyncio event loop in a thread of its own.

grpclib is an asyncio library. It used to run on a trio-asyncio loop, which drives every
asyncio callback through Trio's scheduler: about 1.2 ms of server CPU per unary call went
to that machinery alone (grpclib on a plain asyncio loop costs ~0.75 ms per call for the
same work on this machine). Here grpclib gets a plain ``asyncio`` loop in a daemon thread,
and the rpc implementations stay Trio code in Trio's thread. Crossing costs one wake-up of
the other side per direction (the default :class:`~trioserve.grpc.driven.DrivenLoop`
avoids both; this one serves where asyncio lacks what the driver needs):

- :meth:`LoopThread.run_trio` (asyncio side): run a Trio async function as a task of the
  portal's nursery and await its outcome. Cancelling the awaiting asyncio task (grpclib does
  at a deadline or a stream reset) cancels the Trio task's scope.
- :meth:`LoopThread.run_aio` (Trio side): run a coroutine on the loop and await its result.
  A Trio cancellation cancels the coroutine.

The two threads share the GIL, and contend for it under load: about 80-120 µs per unary
call more than the driven loop (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import outcome
import trio

from trioserve.grpc.portal import Start, Started, TrioCall, settle

T = TypeVar("T")

THREAD_NAME = "trioserve-grpc-loop"


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The thread: run ``loop`` until stopped, then close it there (no loop work, however
    short, is left for Trio's thread)."""
    try:
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


class LoopThread:
    """An asyncio loop running in its own thread while :meth:`run` runs (in Trio)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._until_stopped = trio.CancelScope(shield=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the loop thread is not running"
        return self._loop

    async def run(
        self, *, task_status: trio.TaskStatus[LoopThread] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the thread and serve crossings until :meth:`stop` (not an outer
        cancellation: the bridge still closes its servers through the loop then); then stop
        the loop (after the Trio tasks started from it have ended) and join the thread."""
        # Built directly, not through the event-loop policy (which trio-asyncio replaces when
        # it is imported, as a client in the same process may do).
        loop = asyncio.SelectorEventLoop()
        started = threading.Event()
        loop.call_soon(started.set)
        thread = threading.Thread(target=_run_loop, args=(loop,), name=THREAD_NAME, daemon=True)
        thread.start()
        try:
            await trio.to_thread.run_sync(started.wait)
            self._loop = loop
            self._token = trio.lowlevel.current_trio_token()
            with self._until_stopped:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started(self)
                    await trio.sleep_forever()
        finally:
            self._nursery = None
            loop.call_soon_threadsafe(loop.stop)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)

    def stop(self) -> None:
        """End :meth:`run` (in Trio)."""
        self._until_stopped.cancel()

    def corked(self, transport: Any) -> Any:
        """``transport`` as it is: the loop runs by itself here, so nothing would flush."""
        return transport

    # -- asyncio side -------------------------------------------------------------------------

    async def run_trio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Called in the loop thread: ``await fn(*args)`` in Trio, its result here."""
        token = self._token
        if token is None:
            raise RuntimeError("the Trio side has stopped")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[outcome.Outcome[T]] = loop.create_future()
        call = TrioCall()

        def settle_there(result: outcome.Outcome[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(settle, done, result)

        def spawn() -> None:
            nursery = self._nursery
            if nursery is None:
                settle_there(outcome.Error(RuntimeError("the Trio side has stopped")))
            else:
                nursery.start_soon(call.run, fn, args, settle_there)

        token.run_sync_soon(spawn)
        try:
            result = await done
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(call.cancel)
            raise
        return result.unwrap()

    async def start_trio(self, start: Start, *args: Any) -> Any:
        """Called in the loop thread: ``start(*args, settle)`` in a Trio callback (no task),
        its outcome here; cancelling the awaiting task calls the cancel it returned."""
        token = self._token
        if token is None:
            raise RuntimeError("the Trio side has stopped")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[outcome.Outcome[Any]] = loop.create_future()
        started = Started()

        def settle_there(result: outcome.Outcome[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(settle, done, result)

        try:
            token.run_sync_soon(started.start, start, args, settle_there)
        except trio.RunFinishedError:
            raise RuntimeError("the Trio side has stopped") from None
        try:
            result = await done
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(started.cancel)
            raise
        return result.unwrap()

    # -- Trio side ----------------------------------------------------------------------------

    async def run_aio(self, coro: Coroutine[Any, Any, T]) -> T:
        """Called in Trio: run ``coro`` on the loop and return its result."""
        token = trio.lowlevel.current_trio_token()
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        finished = trio.Event()

        def wake(_: Future[T]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

        future.add_done_callback(wake)
        try:
            await finished.wait()
        except trio.Cancelled:
            future.cancel()
            raise
        return future.result()


__all__ = ["LoopThread"]
