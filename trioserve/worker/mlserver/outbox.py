"""What the model loop writes to the server, sent once per turn of the loop.

An MLServer model's streams run as tasks on the model loop; a stream runs on until its
window is full or its generator waits, so one turn of the loop yields many intermediate
replies, of many streams. :class:`Outbox` keeps what a turn writes and sends it when the turn
ends, in order: one system call for all of it (and one read in the server), and the
consecutive replies of one batch grouped into one RESPONSE frame (fewer frames to encode here
and to decode there). The server routes each reply of a frame to its request in order
(:class:`trioserve.core.inflight.InFlight`), so the frames carry what one frame per reply
would. A turn adds microseconds to a reply's way out, not a wait for more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from trioserve.core.messages import BatchReply, Reply

# The most intermediate replies, and reply bytes, one RESPONSE frame groups: far within the
# frame limit (at least 1 MiB), so a group never makes FrameLimit fail replies that alone fit.
GROUP_REPLIES: Final = 32
GROUP_BYTES: Final = 64 * 1024


class Outbox:
    """Frames and intermediate replies written on the model loop, sent at the end of its
    turn (``send``: the connection's blocking write; ``encode``: a RESPONSE frame)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[bytes], None],
        encode: Callable[[BatchReply], bytes],
    ) -> None:
        self._loop = loop
        self._send = send
        self._encode = encode
        self._unsent: list[bytes | tuple[int, Reply]] = []

    def write(self, what: bytes | tuple[int, Reply]) -> None:
        """Send a frame, or a stream's intermediate reply (``(batch_id, reply)``), once this
        turn of the loop ends (on the model loop only)."""
        if not self._unsent:
            self._loop.call_soon(self.flush)
        self._unsent.append(what)

    def flush(self) -> None:
        """Send everything written so far, now."""
        if not self._unsent:
            return
        unsent, self._unsent = self._unsent, []
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
        self._send(frames[0] if len(frames) == 1 else b"".join(frames))


__all__ = ["GROUP_BYTES", "GROUP_REPLIES", "Outbox"]
