"""Stop strings and token counts over a stream of text pieces (sans-IO).

A model sends its text in pieces (one per streamed answer). The server applies the request's
``stop`` strings itself: the text ends just before the earliest place where one of them
begins, even when it is split over pieces. :class:`StopScanner` holds back the tail of the
text that could still turn into a stop string (never more than the longest stop string less
one character), so every piece of text it lets out is final. :class:`PieceCounter` adds
``max_tokens`` (the generation ends after that many pieces) and what ``usage`` and
``finish_reason`` report.
"""

from __future__ import annotations

from typing import Literal

FinishReason = Literal["stop", "length"]


class StopScanner:
    """Feed pieces; each call gives the text that can go out now (see the module)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        match = self._earliest(text)
        partial = self._partial_start(text)
        if match is not None and (partial is None or match <= partial):
            self.stopped = True
            self._held = ""
            return text[:match]
        keep = len(text) if partial is None else partial
        self._held = text[keep:]
        return text[:keep]

    def flush(self) -> str:
        """The text held back, once the model has ended (cut at a stop string in it)."""
        if self.stopped:
            return ""
        text, self._held = self._held, ""
        match = self._earliest(text)
        if match is not None:
            self.stopped = True
            return text[:match]
        return text

    def _earliest(self, text: str) -> int | None:
        found = [i for i in (text.find(stop) for stop in self._stops) if i >= 0]
        return min(found) if found else None

    def _partial_start(self, text: str) -> int | None:
        """Where the earliest tail of ``text`` that is a proper prefix of a stop string
        begins (it may yet become that stop string)."""
        earliest: int | None = None
        for stop in self._stops:
            start = text.find(stop[0], max(0, len(text) - len(stop) + 1))
            while start != -1 and (earliest is None or start < earliest):
                if stop.startswith(text[start:]):  # a tail shorter than the stop string
                    earliest = start
                    break
                start = text.find(stop[0], start + 1)
        return earliest


class PieceCounter:
    """The text of a generation from its pieces: the ``separator`` between pieces, the stop
    strings, ``max_tokens``; :attr:`done` once nothing more should be read."""

    def __init__(self, stops: tuple[str, ...], max_tokens: int | None, separator: str = "") -> None:
        self._scanner = StopScanner(stops)
        self._max_tokens = max_tokens
        self._separator = separator
        self.tokens = 0

    @property
    def done(self) -> bool:
        return self._scanner.stopped or (
            self._max_tokens is not None and self.tokens >= self._max_tokens
        )

    def feed(self, piece: str) -> str:
        if self.done:
            return ""
        if self.tokens and self._separator:
            piece = self._separator + piece
        self.tokens += 1
        return self._scanner.feed(piece)

    def flush(self) -> str:
        return self._scanner.flush()

    @property
    def finish_reason(self) -> FinishReason:
        if self._scanner.stopped:
            return "stop"
        if self._max_tokens is not None and self.tokens >= self._max_tokens:
            return "length"
        return "stop"


__all__ = ["FinishReason", "PieceCounter", "StopScanner"]
