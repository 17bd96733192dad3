"""What the model loop writes to the server, sent once per turn of the loop.

An MLServer model's streams run as tasks on the model loop; a stream runs on until its
window is full or its generator waits, so one turn of the loop yields many intermediate
replies, of many streams. :class:`Outbox` keeps what a turn writes and sends it when the turn
ends, in order: one system call for all of it (and one read in the server), and the
consecutive replies of one batch grouped into one RESPONSE frame (fewer frames to encode here
and to decode there). The server routes each reply of a frame to its request in order
(:class:`trioserve.core.inflight.InFlight`), so the frames carry what one frame per reply
would. A turn adds microseconds to a reply's way out, not a wait for more.

A batch is answered on the connection it came from (the worker's primary one or an attached
one, :mod:`trioserve.worker.attached`): what is written names that connection's write, and
each connection gets its share of the turn in one write, in the order written. Batch ids
are per connection, so replies of two connections' batches are never grouped together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeAlias

from trioserve.core.messages import BatchReply, Reply

Send: TypeAlias = Callable[[bytes], None]  # a connection's blocking write, from any thread
Written: TypeAlias = bytes | tuple[int, Reply]  # a frame, or a stream's intermediate reply

# The most intermediate replies, and reply bytes, one RESPONSE frame groups: far within the
# frame limit (at least 1 MiB), so a group never makes FrameLimit fail replies that alone fit.
GROUP_REPLIES: Final = 32
GROUP_BYTES: Final = 64 * 1024


class Outbox:
    """Frames and intermediate replies written on the model loop, sent at the end of its
    turn (``encode``: a RESPONSE frame)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, encode: Callable[[BatchReply], bytes]
    ) -> None:
        self._loop = loop
        self._encode = encode
        self._unsent: list[tuple[Send, Written]] = []

    def write(self, to: Send, what: Written) -> None:
        """Send a frame, or a stream's intermediate reply (``(batch_id, reply)``), with
        ``to`` once this turn of the loop ends (on the model loop only)."""
        if not self._unsent:
            self._loop.call_soon(self.flush)
        self._unsent.append((to, what))

    def flush(self) -> None:
        """Send everything written so far, now: one write for each connection."""
        if not self._unsent:
            return
        unsent, self._unsent = self._unsent, []
        shares: dict[Send, list[Written]] = {}
        for to, what in unsent:
            shares.setdefault(to, []).append(what)
        for to, share in shares.items():
            frames = self._frames(share)
            to(frames[0] if len(frames) == 1 else b"".join(frames))

    def _frames(self, unsent: list[Written]) -> list[bytes]:
        """The frames of one connection's share: consecutive replies of a batch grouped."""
        frames: list[bytes] = []
        group: list[Reply] = []
        group_id = size = 0
        for what in unsent:
            if group and (
                isinstance(what, bytes)
                or what[0] != group_id
                or len(group) == GROUP_REPLIES
                or size + memoryview(what[1].body).nbytes > GROUP_BYTES
            ):
                frames.append(self._encode(BatchReply(group_id, 200, "", group, False)))
                group, size = [], 0
            if isinstance(what, bytes):
                frames.append(what)
            else:
                group_id = what[0]
                group.append(what[1])
                size += memoryview(what[1].body).nbytes
        if group:
            frames.append(self._encode(BatchReply(group_id, 200, "", group, False)))
        return frames


__all__ = ["GROUP_BYTES", "GROUP_REPLIES", "Outbox", "Send", "Written"]
