"""Running a serving command in the foreground: its ready report and its exit status.

``trioserve start --foreground`` and ``trioserve dev`` both run a Trio main function until it
stops, report ``READY ...`` or ``FAILED reason`` to whoever launched them (the file
descriptor named by ``TRIOSERVE_READY_FD``, see :mod:`trioserve.launch`), and turn the way
the run ended into an exit status. Both use this module, so the command line (``cli``) sits
on top and nothing below it imports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable

from trioserve.launch import READY_FD_ENV

__all__ = ["report_ready", "root_cause", "run_until_stopped"]


def report_ready(message: str) -> None:
    """Write ``message`` (one or more lines) to the launcher's ready pipe, once; a process
    that was not started by :func:`trioserve.launch.launch` has none, and says nothing."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    with contextlib.suppress(OSError), os.fdopen(int(fd), "w") as pipe:
        pipe.write(message + "\n")


def run_until_stopped(
    main: Callable[..., Awaitable[None]],
    *args: object,
    ready: Callable[[str], None] = report_ready,
    command: str = "trioserve",
) -> int:
    """``trio.run(main, *args)`` as a serving command runs it; returns the exit status:
    130 on Ctrl-C, 1 when start-up failed (logged, and said to ``ready`` as ``FAILED``)."""
    import trio

    try:
        trio.run(main, *args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # start-up failed (a port in use, say): say why
        logging.getLogger("trioserve").exception("%s failed", command)
        root = root_cause(exc)
        ready(f"FAILED {type(root).__name__}: {root}")
        return 1
    return 0


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
