"""A bidirectional stream answered in order: TorchServe's StreamPredictions2 and the OIP
ModelStreamInfer work the same way.

:func:`answer_in_order` submits each request as it arrives (``accept``, at most
:data:`MAX_PENDING_PER_STREAM` waiting for their turn, so a client that sends faster than it
reads is slowed down) and answers them strictly in their order (``answer``). When the client
half-closes, every request already read is still answered. A message that cannot be read
(malformed, over the size limit) ends the stream with its error, but only after the answers
to every request before it, whatever their timing: the reader queues the failure behind them
and stops reading. However the RPC ends (answered, failed, cancelled, the client gone), every
call still live is cancelled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio

from trioserve.core.errors import ServeError
from trioserve.grpc.calls import ClientGone, Receive, single_error

# How many requests of one stream may wait for their answers before the reader stops reading.
MAX_PENDING_PER_STREAM = 64

Req = TypeVar("Req")
P = TypeVar("P")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Unreadable:
    """Queued in place of a message that could not be read: the stream ends with ``error``
    in its turn."""

    __slots__ = ("error",)

    def __init__(self, error: ServeError) -> None:
        self.error = error


async def answer_in_order(
    receive: Receive[Req],
    accept: Callable[[Req], P],
    answer: Callable[[P], Awaitable[None]],
    call_of: Callable[[P], Cancellable | None],
) -> None:
    """Accept each message of ``receive`` as it comes; ``answer`` each accepted one in turn.
    ``call_of`` gives the call an accepted message started (None: it was refused)."""
    live: set[Cancellable] = set()
    pending_send, pending_recv = trio.open_memory_channel[P | _Unreadable](MAX_PENDING_PER_STREAM)

    async def read_requests() -> None:
        async with pending_send:
            while True:
                try:
                    message = await receive()
                except ClientGone:
                    raise
                except ServeError as error:
                    await pending_send.send(_Unreadable(error))
                    return
                if message is None:
                    return
                pending = accept(message)
                call = call_of(pending)
                if call is not None:
                    live.add(call)
                await pending_send.send(pending)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_requests)
            async with pending_recv:
                try:
                    async for pending in pending_recv:
                        if isinstance(pending, _Unreadable):
                            raise pending.error
                        try:
                            await answer(pending)
                        finally:
                            call = call_of(pending)
                            if call is not None:
                                call.cancel()
                                live.discard(call)
                except BaseException:
                    # The stream ends (client gone, deadline, error): its queued requests go
                    # now, in the same step as the running one, with no checkpoint between
                    # (closing the channel is one, and so is the reading task's crossing back
                    # from the gRPC loop's thread): long enough for the worker the running
                    # one frees to start a request queued behind it.
                    for call in list(live):
                        call.cancel()
                    raise
    except BaseExceptionGroup as group:
        raise single_error(group) from None
    finally:
        for call in live:
            call.cancel()


__all__ = ["MAX_PENDING_PER_STREAM", "answer_in_order"]
