"""How the gRPC bridge crosses between grpclib's asyncio loop and Trio: the :class:`Portal`.

Two portals exist; the bridge picks the first that works here:

- :class:`~trioserve.grpc.driven.DrivenLoop` (the default): a Trio task steps the asyncio
  loop on Trio's thread; crossing is a plain call, since asyncio's callbacks run inside
  that task.
- :class:`~trioserve.grpc.loop_thread.LoopThread` (the fallback, for an asyncio without the
  private names the driver needs): the loop runs in a thread of its own and each crossing
  wakes the other thread.

Both give the bridge the same operations: ``run_trio`` (asyncio side: run a Trio async
function as a task of the portal's nursery and await its outcome; cancelling the awaiting
asyncio task cancels the Trio task), ``start_trio`` (asyncio side: the same for work that
needs no task of its own, a :data:`Start`, run in a Trio callback, which saves a unary call
the task, its cancel scopes and their scheduling) and ``run_aio`` (Trio
side: run a coroutine on the loop; a Trio cancellation cancels it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import outcome
import trio

from trioserve.grpc.calls import Settle

T = TypeVar("T")


# Starts work in Trio without a task of its own: ``start(*args, settle)`` runs synchronously
# in Trio and returns a function that cancels the work; ``settle`` gets its outcome.
Start = Callable[..., Callable[[], None]]


class Portal(Protocol):
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    async def run_trio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    async def start_trio(self, start: Start, *args: Any) -> Any: ...

    def stop(self) -> None: ...

    def corked(self, transport: Any) -> Any: ...

    async def run_aio(self, coro: Coroutine[Any, Any, T]) -> T: ...


class TrioCall:
    """One Trio task started from the asyncio side: its scope, once it runs."""

    __slots__ = ("cancelled", "scope")

    def __init__(self) -> None:
        self.scope: trio.CancelScope | None = None
        self.cancelled = False

    def cancel(self) -> None:  # in Trio
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    async def run(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        settle: Settle,
    ) -> None:
        """Run ``fn(*args)`` in this call's scope and hand its outcome to ``settle``; a
        cancelled call settles as asyncio's ``CancelledError``."""
        result: outcome.Outcome[Any] = outcome.Error(asyncio.CancelledError())
        try:
            with trio.CancelScope() as scope:
                self.scope = scope
                if self.cancelled:
                    scope.cancel()
                result = outcome.Value(await fn(*args))
        except Exception as exc:
            result = outcome.Error(exc)
        finally:
            settle(result)


class Started:
    """Work begun by a portal's ``start_trio`` without a task, and the way to cancel it."""

    __slots__ = ("_cancel", "_cancelled")

    def __init__(self) -> None:
        self._cancel: Callable[[], None] | None = None
        self._cancelled = False

    def start(self, start: Start, args: tuple[Any, ...], tell: Settle) -> None:  # in Trio
        if self._cancelled:
            return
        try:
            self._cancel = start(*args, tell)
        except Exception as exc:
            tell(outcome.Error(exc))

    def cancel(self) -> None:  # in Trio
        self._cancelled = True
        if self._cancel is not None:
            self._cancel()


def settle(future: asyncio.Future[outcome.Outcome[Any]], result: outcome.Outcome[Any]) -> None:
    if not future.done():
        future.set_result(result)


__all__ = ["Portal", "Start", "Started", "TrioCall", "settle"]
