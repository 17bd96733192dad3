"""Running the server's Trio code as a guest of an asyncio event loop, on one thread
(the ``grpc_same_thread`` setting).

grpclib (the gRPC transport) is an asyncio library; everything else in the server is Trio.
Trio's guest mode (``trio.lowlevel.start_guest_run``) lets both share the main thread: the
asyncio loop is the host, and Trio's scheduler runs in its callbacks. Trio's own I/O wait
runs in a helper thread only while Trio has nothing to run. The gRPC bridge then crosses
between the two without waking another thread or waiting for the GIL
(:class:`trioserve.grpc.guest.GuestPortal`); under plain ``trio.run`` it falls back to a loop
thread. Measured in docs/performance.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")


def run(main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Like ``trio.run(main, *args)``, with Trio a guest of a new asyncio loop that runs
    until ``main`` returns; its result or exception comes back here.

    Ctrl-C is delivered to Trio at a checkpoint (never raised inside asyncio's code), which
    cancels the run and raises ``KeyboardInterrupt`` from here.
    """
    # Built directly, not through the event-loop policy (which trio-asyncio replaces when it
    # is imported, as a client in the same process may do).
    loop = asyncio.SelectorEventLoop()
    done: asyncio.Future[outcome.Outcome[T]] = loop.create_future()

    def finished(result: outcome.Outcome[T]) -> None:
        if not done.done():
            done.set_result(result)

    try:
        asyncio.set_event_loop(loop)
        trio.lowlevel.start_guest_run(
            main,
            *args,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=finished,
            host_uses_signal_set_wakeup_fd=False,
            restrict_keyboard_interrupt_to_checkpoints=True,
        )
        result = loop.run_until_complete(done)
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return result.unwrap()


__all__ = ["run"]
