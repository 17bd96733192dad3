"""Progress of long copies: a tqdm bar on a terminal, plain lines anywhere else.

Writing a large archive (``trioserve archive``) and downloading a model archive from a URL
(registration through the management API) can take minutes. What a copy shows depends on
where it would show it (:func:`choose_mode`):

- nothing when ``TRIOSERVE_PROGRESS=0`` (or ``off``, ``false``, ``no``), or without a stream;
- for a size under :data:`SMALL`, what the caller asks for: only the final line, or nothing;
- on a terminal: a tqdm bar, then the final line;
- elsewhere (a pipe, a log file): a plain line each time another :data:`STEP_PERCENT` of the
  size is done or :data:`INTERVAL` seconds after the last line, whichever comes first
  (:class:`LineSchedule`), then the final line with the size, the time and the rate.

The choice and the line schedule are sans-IO and tested as such; :class:`Progress` writes.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Final, NoReturn, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "ENV",
    "INTERVAL",
    "SMALL",
    "STEP_PERCENT",
    "LineSchedule",
    "Mode",
    "Progress",
    "choose_mode",
    "format_duration",
    "format_size",
    "progress_enabled",
    "summary",
]

ENV: Final = "TRIOSERVE_PROGRESS"
SMALL: Final = 8 * 1024 * 1024  # bytes: a copy this size or larger shows its progress
STEP_PERCENT: Final = 10
INTERVAL: Final = 10.0  # seconds
_OFF_VALUES: Final = ("0", "off", "false", "no")


class Mode(enum.Enum):
    OFF = "off"  # nothing at all
    SUMMARY = "summary"  # only the final line
    LINES = "lines"  # rate-limited plain lines, then the final line
    BAR = "bar"  # a tqdm bar, then the final line


def progress_enabled(environ: Mapping[str, str]) -> bool:
    """False when ``TRIOSERVE_PROGRESS`` is ``0``, ``off``, ``false`` or ``no``."""
    return environ.get(ENV, "").strip().lower() not in _OFF_VALUES


def choose_mode(
    *,
    enabled: bool,
    tty: bool,
    total: int | None,
    small: Mode = Mode.SUMMARY,
    threshold: int = SMALL,
) -> Mode:
    """What a copy of ``total`` bytes (``None``: not known) shows on a stream.

    ``small`` is the mode of a copy known to be under ``threshold`` bytes; a copy of unknown
    size counts as large, since it may be.
    """
    if not enabled:
        return Mode.OFF
    if total is not None and total < threshold:
        return small
    return Mode.BAR if tty else Mode.LINES


def format_size(size: int) -> str:
    """``512 B``, ``1.5 KiB``, ``64.0 MiB``, ``2.3 GiB``."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def format_duration(seconds: float) -> str:
    """``0.4 s``, ``12.0 s``, ``3 min 05 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def summary(label: str, done: int, elapsed: float) -> str:
    """The final line: ``archived x.mar: 256.0 MiB in 2.1 s (121.9 MiB/s)``."""
    line = f"{label}: {format_size(done)} in {format_duration(elapsed)}"
    if elapsed > 0 and done > 0:
        line += f" ({format_size(int(done / elapsed))}/s)"
    return line


class LineSchedule:
    """When a plain progress line is due, and its text.

    A line is due each time the bytes done reach another ``step`` percent of ``total``, or
    ``interval`` seconds after the previous line (or the start) if bytes were done since;
    without a ``total`` only the latter. No line once ``total`` is reached: the final line
    (:func:`summary`) says that.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        start: float,
        *,
        step: int = STEP_PERCENT,
        interval: float = INTERVAL,
    ) -> None:
        self.label = label
        self.total = total if total else None
        self._step = step
        self._interval = interval
        self._next_percent = step
        self._last_time = start
        self._last_done = 0

    def update(self, done: int, now: float) -> str | None:
        """The line to show now that ``done`` bytes are done, or ``None``."""
        total = self.total
        if total is not None:
            if done >= total:
                return None
            percent = done * 100 // total
            if percent >= self._next_percent:
                self._next_percent = (percent // self._step + 1) * self._step
                return self._line(done, now)
        if now - self._last_time >= self._interval and done > self._last_done:
            return self._line(done, now)
        return None

    def _line(self, done: int, now: float) -> str:
        self._last_time = now
        self._last_done = done
        if self.total is None:
            return f"{self.label}: {format_size(done)} so far"
        percent = done * 100 // self.total
        return f"{self.label}: {format_size(done)} of {format_size(self.total)} ({percent}%)"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # no such method, or a closed stream
        return False


class Progress:
    """The progress of one copy: call :meth:`advance` with each chunk's size, then
    :meth:`finish` when it is complete (or :meth:`close` when it failed: no final line).

    As a context manager it finishes on success and closes on an exception. One thread at a
    time may call it (a download calls it from its worker thread).
    """

    def __init__(
        self,
        label: str,
        done_label: str,
        total: int | None,
        *,
        mode: Mode,
        stream: TextIO | None,
        emit: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = mode
        self.done = 0
        self._done_label = done_label
        self._emit = emit
        self._clock = clock
        self._start = clock()
        self._closed = False
        self._schedule = LineSchedule(label, total, self._start) if mode is Mode.LINES else None
        self._bar: tqdm[NoReturn] | None = None
        if mode is Mode.BAR:
            from tqdm import tqdm as bar  # imported only where a bar is shown

            self._bar = bar(
                total=total,
                desc=label,
                file=stream,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                dynamic_ncols=True,
                leave=True,
                disable=False,
            )

    @classmethod
    def on(
        cls,
        stream: TextIO | None,
        label: str,
        done_label: str,
        total: int | None,
        *,
        emit: Callable[[str], None] | None = None,
        small: Mode = Mode.SUMMARY,
        environ: Mapping[str, str] | None = None,
    ) -> Progress:
        """A progress shown on ``stream`` as :func:`choose_mode` decides (nothing when
        ``stream`` is ``None``). Lines go to ``emit``, by default written to ``stream``."""
        enabled = stream is not None and progress_enabled(
            os.environ if environ is None else environ
        )
        tty = stream is not None and _isatty(stream)
        mode = choose_mode(enabled=enabled, tty=tty, total=total, small=small)
        if emit is None:
            target = stream if stream is not None else sys.stderr

            def emit(line: str) -> None:
                target.write(line + "\n")
                target.flush()

        return cls(label, done_label, total, mode=mode, stream=stream, emit=emit)

    def advance(self, size: int) -> None:
        self.done += size
        if self._bar is not None:
            self._bar.update(size)
        elif self._schedule is not None:
            line = self._schedule.update(self.done, self._clock())
            if line is not None:
                self._emit(line)

    def finish(self) -> None:
        """The copy is complete: close the bar and show the final line."""
        if self._closed:
            return
        self.close()
        if self.mode is not Mode.OFF:
            self._emit(summary(self._done_label, self.done, self._clock() - self._start))

    def close(self) -> None:
        """Close the bar, if any, without a final line."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close()
