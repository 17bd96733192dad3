"""Which in-flight requests the server has cancelled (read from the handler thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class CancelBook:
    """Tracks the request ids of queued and running batches and which were cancelled.

    A CANCEL for an id the worker does not hold is ignored, so the book never grows with
    ids of requests that already finished.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, int] = {}  # request id -> how many queued/running batches hold it
        self._cancelled: set[str] = set()

    def track(self, request_ids: Iterable[str]) -> None:
        live = self._live
        with self._lock:
            for rid in request_ids:
                live[rid] = live.get(rid, 0) + 1

    def cancel(self, request_ids: Iterable[str]) -> list[str]:
        """Mark the ids that are live as cancelled; return those."""
        with self._lock:
            hit = [rid for rid in request_ids if self._live.get(rid, 0) > 0]
            self._cancelled.update(hit)
        return hit

    def release(self, request_ids: Iterable[str]) -> None:
        live = self._live
        cancelled = self._cancelled
        with self._lock:
            for rid in request_ids:
                left = live.get(rid, 0) - 1
                if left > 0:
                    live[rid] = left
                else:
                    live.pop(rid, None)
                    if cancelled:
                        cancelled.discard(rid)

    def is_cancelled(self, request_id: str) -> bool:
        if not self._cancelled:  # nothing was ever cancelled, or all of it is released
            return False
        with self._lock:
            return request_id in self._cancelled
