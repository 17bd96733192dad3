"""The default portal: grpclib's asyncio loop stepped by a Trio task, on Trio's thread.

The loop never runs by itself (no ``run_forever``): a Trio task, the driver, runs one
non-blocking iteration of it at a time (``BaseEventLoop._run_once`` with the loop marked as
stopping, so that its ``select`` does not wait), and while the loop has nothing ready it
waits in Trio for the loop's selector to become readable (an epoll set is itself pollable:
it is readable when one of its sockets is) or for the loop's next timer. One thread, one
wait over both sides' sockets:

- asyncio → Trio: asyncio callbacks run inside the driver, a Trio task, so they start Trio
  tasks (``nursery.start_soon``) and run :data:`~trioserve.grpc.portal.Start` work directly;
  no token, no wake-up socket, no other thread.
- Trio → asyncio: a reply's future is settled directly and the driver is woken if it is
  parked (cancelling its wait). :meth:`DrivenLoop.run_aio` runs the coroutine inline up to
  its first suspension (a gRPC message whose HTTP/2 window is open is written right there);
  a coroutine that suspends is finished by a task.

Neither thread hops (the loop thread's cost under load) nor a helper thread for Trio's own
I/O wait (Trio's guest mode's cost with one client at a time) are paid. The price is some
private names of asyncio's selector loop (:data:`_LOOP_NAMES`) and the running-loop marker
(``asyncio.events._set_running_loop``); :func:`drivable` checks they all exist, and the
bridge falls back to :class:`~trioserve.grpc.loop_thread.LoopThread` otherwise.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from asyncio import events
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

import outcome
import trio

from trioserve.grpc.portal import Start, Started, TrioCall, settle

T = TypeVar("T")

# How many idle iterations the loop gets at shutdown to run what closing its transports
# scheduled (connection_lost callbacks and the like).
_CLOSING_STEPS = 16


# Iterations of the loop run one after the other while it has callbacks ready (a call's
# answer, then its task's end), before Trio's tasks get their turn.
_STEPS_IN_A_ROW = 5

# The private names of asyncio's selector loop the driver uses.
_LOOP_NAMES = ("_run_once", "_ready", "_scheduled", "_selector", "_stopping", "_thread_id")


def drivable() -> bool:
    """Whether this Python's asyncio loop can be stepped from outside (every private name
    the driver uses is there)."""
    if not hasattr(events, "_set_running_loop"):
        return False
    loop = asyncio.SelectorEventLoop()
    try:
        return all(hasattr(loop, name) for name in _LOOP_NAMES)
    finally:
        loop.close()


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


class Corked:
    """A connection's transport whose writes wait for the end of the loop's iteration (or of
    an inline coroutine): then they go out together, one system call per connection.

    grpclib writes each frame it makes at once: a unary answer's headers, message and
    trailers are three writes, and a burst of answers on one connection three each. Corked,
    a batch's answers on a channel cost one write. Everything else goes to the transport."""

    __slots__ = ("_dirty", "_pending", "_transport")

    def __init__(self, transport: Any, dirty: list[Corked]) -> None:
        self._transport = transport
        self._dirty = dirty  # the portal's list of transports with writes waiting
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if data:
            if not self._pending:
                self._dirty.append(self)
            self._pending.append(data)

    def writelines(self, lines: list[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        pending = self._pending
        if pending:
            self._pending = []
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        size: int = self._transport.get_write_buffer_size()
        return size + sum(len(data) for data in self._pending)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class DrivenLoop:
    """An asyncio loop stepped by a Trio task while :meth:`run` runs."""

    def __init__(self) -> None:
        # Built directly, not through the event-loop policy (which trio-asyncio replaces
        # when it is imported, as a client in the same process may do).
        self._loop: Any = asyncio.SelectorEventLoop()
        self._nursery: trio.Nursery | None = None
        self._parked: trio.CancelScope | None = None  # the driver's wait, while it waits
        self._until_stopped = trio.CancelScope(shield=True)
        self._dirty: list[Corked] = []  # corked transports with writes waiting

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self._loop
        return loop

    async def run(
        self, *, task_status: trio.TaskStatus[DrivenLoop] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Drive the loop until :meth:`stop` (not an outer cancellation: the bridge still
        closes its servers through the loop then); then cancel the Trio tasks started from
        it, give the loop a few last iterations and close it."""
        loop = self._loop
        loop._thread_id = threading.get_ident()  # the loop counts as running, in this thread
        try:
            with self._until_stopped:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._drive)
                    task_status.started(self)
                    await trio.sleep_forever()
        finally:
            self._nursery = None
            try:
                for _ in range(_CLOSING_STEPS):
                    self._step()
                    if not loop._ready:
                        break
                self._step_until(loop.shutdown_asyncgens())
            finally:
                loop._thread_id = None
                loop.close()

    def stop(self) -> None:
        """End :meth:`run` (in Trio)."""
        self._until_stopped.cancel()

    def _enter(self) -> Any:
        """Mark the loop as running here (as ``run_forever`` would) while asyncio code runs;
        returns what :meth:`_leave` needs."""
        events._set_running_loop(self._loop)
        # trio-asyncio, once imported (a client in the same process may use it), answers
        # "which loop runs here" inside Trio from a context variable of the current task.
        patched = sys.modules.get("trio_asyncio._loop")
        return None if patched is None else patched.current_loop.set(self._loop)

    def corked(self, transport: Any) -> Any:
        """``transport`` with its writes gathered until the end of each loop iteration."""
        return Corked(transport, self._dirty)

    def _flush(self) -> None:
        dirty = self._dirty
        while dirty:
            dirty.pop().flush()

    def _leave(self, marked: Any) -> None:
        self._flush()
        if marked is not None:
            sys.modules["trio_asyncio._loop"].current_loop.reset(marked)
        events._set_running_loop(None)

    def _step(self) -> None:
        """One iteration of the loop: ready callbacks, due timers, sockets ready now."""
        loop = self._loop
        marked = self._enter()
        loop._stopping = True  # makes _run_once's select poll instead of wait
        try:
            loop._run_once()
        finally:
            loop._stopping = False
            self._leave(marked)

    def _step_until(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` (which must not wait for I/O) to its end by stepping the loop."""
        task = self._loop.create_task(coro)
        for _ in range(_CLOSING_STEPS):
            if task.done():
                break
            self._step()
        if not task.done():
            task.cancel()
            self._step()

    async def _drive(self) -> None:
        loop = self._loop
        selector = loop._selector.fileno()
        while True:
            for _ in range(_STEPS_IN_A_ROW):
                self._step()
                if not loop._ready:
                    break
            else:
                await trio.lowlevel.checkpoint()
                continue
            deadline = math.inf
            if loop._scheduled:
                delay = loop._scheduled[0]._when - loop.time()
                deadline = trio.current_time() + max(0.0, delay)
            with trio.CancelScope(deadline=deadline) as parked:
                self._parked = parked
                await trio.lowlevel.wait_readable(selector)
            self._parked = None

    def _wake(self) -> None:
        """The loop has work from Trio's side: stop the driver's wait, if it waits."""
        parked = self._parked
        if parked is not None:
            self._parked = None
            parked.cancel()

    def _settle(self, future: asyncio.Future[outcome.Outcome[Any]], result: Any) -> None:
        settle(future, result)
        self._wake()

    # -- asyncio side (inside the driver) -------------------------------------------------

    async def run_trio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Called by an asyncio task: ``await fn(*args)`` as a Trio task, its result here."""
        nursery = self._nursery
        if nursery is None:
            raise RuntimeError("the Trio side has stopped")
        done: asyncio.Future[outcome.Outcome[T]] = self._loop.create_future()
        call = TrioCall()
        nursery.start_soon(call.run, fn, args, lambda result: self._settle(done, result))
        try:
            result = await done
        except asyncio.CancelledError:
            call.cancel()
            raise
        return result.unwrap()

    async def start_trio(self, start: Start, *args: Any) -> Any:
        """Called by an asyncio task: ``start(*args, settle)`` right here (it is Trio code
        too), its outcome here; cancelling the awaiting task calls the cancel it returned."""
        if self._nursery is None:
            raise RuntimeError("the Trio side has stopped")
        done: asyncio.Future[outcome.Outcome[Any]] = self._loop.create_future()
        started = Started()
        started.start(start, args, lambda result: self._settle(done, result))
        try:
            result = await done
        except asyncio.CancelledError:
            started.cancel()
            raise
        return result.unwrap()

    # -- Trio side ----------------------------------------------------------------------------

    async def run_aio(self, coro: Coroutine[Any, Any, T]) -> T:
        """Called in Trio: run ``coro`` on the loop (inline while it does not suspend) and
        return its result."""
        marked = self._enter()
        try:
            pending = coro.send(None)
        except StopIteration as stop:
            value: T = stop.value
            return value
        finally:
            self._leave(marked)
            self._wake()  # what it did may have scheduled loop callbacks
        # Scheduling the task needs no wake-up of its own: the one above came after it
        # (nothing ran in between).
        task = self._loop.create_task(_finish(coro, pending))
        finished = trio.Event()
        task.add_done_callback(lambda _: finished.set())  # runs in the driver, in Trio
        try:
            await finished.wait()
        except trio.Cancelled:
            task.cancel()
            self._wake()
            raise
        answer: T = task.result()
        return answer


__all__ = ["DrivenLoop", "drivable"]
