"""Restart back-off for crashed workers (sans-IO).

TorchServe waits 0, 1, 1, 2, 3, 5, 8, ... seconds between restarts. trioserve uses the same
Fibonacci shape, capped, and forgets past failures once a worker has stayed up long enough.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    cap: float = 60.0
    healthy_after: float = 30.0
    _prev: float = 0.0
    _cur: float = 0.0
    failures: int = 0

    def next_delay(self) -> float:
        """The delay before the next restart; call once per failure."""
        delay = self._cur
        if self.failures == 0:
            self._prev, self._cur = 0.0, 1.0
        else:
            self._prev, self._cur = self._cur, min(self.cap, self._prev + self._cur)
        self.failures += 1
        return delay

    def record_uptime(self, seconds: float) -> None:
        """A worker that ran this long before failing resets the sequence."""
        if seconds >= self.healthy_after:
            self.reset()

    def reset(self) -> None:
        self._prev = self._cur = 0.0
        self.failures = 0
