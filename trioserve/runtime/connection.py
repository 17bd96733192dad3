"""A framed connection to one worker process over a trio stream."""

from __future__ import annotations

import trio

from trioserve.core.frames import Frame, FrameDecoder

_READ_SIZE = 1 << 16


class WorkerConnection:
    """Sends and receives frames. Sends are serialised by a lock (several tasks send);
    exactly one task receives."""

    def __init__(self, stream: trio.abc.Stream, max_frame: int) -> None:
        self._stream = stream
        self._decoder = FrameDecoder(max_frame)
        self._ready: list[Frame] = []
        self._send_lock = trio.Lock()

    async def send(self, data: bytes | bytearray) -> None:
        async with self._send_lock:
            await self._stream.send_all(data)

    async def receive(self) -> Frame | None:
        """The next frame, or None when the worker closed the connection.

        Raises :class:`trioserve.core.frames.FrameError` on a malformed frame.
        """
        while not self._ready:
            data = await self._stream.receive_some(_READ_SIZE)
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.pop(0)

    async def aclose(self) -> None:
        await self._stream.aclose()
