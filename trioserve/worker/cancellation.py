"""Which in-flight requests the server has cancelled (read from the handler thread)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable


class CancelBook:
    """Tracks the request ids of queued and running batches and which were cancelled.

    A CANCEL for an id the worker does not hold is ignored, so the book never grows with
    ids of requests that already finished.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: Counter[str] = Counter()
        self._cancelled: set[str] = set()

    def track(self, request_ids: Iterable[str]) -> None:
        with self._lock:
            self._live.update(request_ids)

    def cancel(self, request_ids: Iterable[str]) -> list[str]:
        """Mark the ids that are live as cancelled; return those."""
        with self._lock:
            hit = [rid for rid in request_ids if self._live[rid] > 0]
            self._cancelled.update(hit)
        return hit

    def release(self, request_ids: Iterable[str]) -> None:
        with self._lock:
            for rid in request_ids:
                self._live[rid] -= 1
                if self._live[rid] <= 0:
                    del self._live[rid]
                    self._cancelled.discard(rid)

    def is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled
