"""The portal used when Trio runs as a guest of grpclib's asyncio loop, on the same thread.

With ``grpc_same_thread``, ``trioserve start`` runs the server with
:func:`trioserve.asyncio_host.run` (Trio's guest mode): the asyncio loop owns the thread and
Trio's scheduler runs in its callbacks, so the two sides never wait for each other's thread
nor for the GIL. Crossing costs:

- asyncio -> Trio (:meth:`GuestPortal.run_trio`, and the wake-ups of :meth:`run_aio`): a
  call posted to an :class:`_Inbox`. The first post of a burst asks Trio, with one
  ``TrioToken.run_sync_soon`` (a write to Trio's wake-up socket), to drain the inbox; the
  posts that follow before the drain ride along. Under load one wake-up serves many calls.
- Trio -> asyncio: the reply's future is settled directly (same thread). :meth:`run_aio`
  first runs the coroutine inline, up to its first suspension: sending a gRPC message does
  not suspend unless HTTP/2 flow control makes it wait, so a streamed token is written
  without any task or crossing. A coroutine that does suspend is finished by an asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

import outcome
import trio

from trioserve.grpc.portal import Start, Started, TrioCall, settle

T = TypeVar("T")


def hosting_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop this Trio run is a guest of (called in Trio), or None under plain
    ``trio.run``: a guest's tasks run inside the loop's callbacks, so it is running here."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Inbox:
    """Calls from asyncio callbacks into Trio, with one Trio wake-up per burst."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._posted = False

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` in Trio soon. Raises ``trio.RunFinishedError`` once Trio is gone."""
        self._calls.append((fn, args))
        if not self._posted:
            self._token.run_sync_soon(self._drain)
            self._posted = True

    def _drain(self) -> None:  # in Trio
        self._posted = False
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            fn(*args)


class _Resume:
    """Awaitable finishing a coroutine that was started inline and suspended on ``pending``
    (the future it yielded): the rest runs as if the task had started it."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._pending
        while True:
            try:
                sent = yield pending
            except BaseException as exc:  # the task is cancelled: into the coroutine
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _finish(coro: Coroutine[Any, Any, T], pending: Any) -> T:
    result: T = await _Resume(coro, pending)
    return result


class GuestPortal:
    """Crossings between grpclib's loop and Trio on one thread, while :meth:`run` runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inbox: _Inbox | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def run(
        self, *, task_status: trio.TaskStatus[GuestPortal] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve crossings until cancelled (the tasks started from asyncio are cancelled with
        it)."""
        self._inbox = _Inbox(trio.lowlevel.current_trio_token())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self._nursery = None

    # -- asyncio side -------------------------------------------------------------------------

    async def run_trio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Called by an asyncio task: ``await fn(*args)`` in Trio, its result here."""
        inbox = self._inbox
        if inbox is None:
            raise RuntimeError("the Trio side has stopped")
        done: asyncio.Future[outcome.Outcome[T]] = self._loop.create_future()
        call = TrioCall()
        try:
            inbox.post(self._spawn, call, fn, args, done)
        except trio.RunFinishedError:
            raise RuntimeError("the Trio side has stopped") from None
        try:
            result = await done
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                inbox.post(call.cancel)
            raise
        return result.unwrap()

    def _spawn(
        self,
        call: TrioCall,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        done: asyncio.Future[outcome.Outcome[Any]],
    ) -> None:  # in Trio
        nursery = self._nursery
        if nursery is None:
            settle(done, outcome.Error(RuntimeError("the Trio side has stopped")))
        else:
            nursery.start_soon(call.run, fn, args, lambda result: settle(done, result))

    async def start_trio(self, start: Start, *args: Any) -> Any:
        """Called by an asyncio task: ``start(*args, settle)`` in a Trio callback (no task),
        its outcome here; cancelling the awaiting task calls the cancel it returned."""
        inbox = self._inbox
        if inbox is None:
            raise RuntimeError("the Trio side has stopped")
        done: asyncio.Future[outcome.Outcome[Any]] = self._loop.create_future()
        started = Started()
        try:
            inbox.post(started.start, start, args, lambda result: settle(done, result))
        except trio.RunFinishedError:
            raise RuntimeError("the Trio side has stopped") from None
        try:
            result = await done
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                inbox.post(started.cancel)
            raise
        return result.unwrap()

    # -- Trio side ----------------------------------------------------------------------------

    async def run_aio(self, coro: Coroutine[Any, Any, T]) -> T:
        """Called in Trio: run ``coro`` on the loop (inline while it does not suspend) and
        return its result."""
        try:
            pending = coro.send(None)
        except StopIteration as stop:
            value: T = stop.value
            return value
        task = self._loop.create_task(_finish(coro, pending))
        finished = trio.Event()
        inbox = self._inbox
        assert inbox is not None

        def wake(_: asyncio.Task[T]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                inbox.post(finished.set)

        task.add_done_callback(wake)
        try:
            await finished.wait()
        except trio.Cancelled:
            task.cancel()
            raise
        return task.result()


__all__ = ["GuestPortal", "hosting_loop"]
