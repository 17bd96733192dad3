"""Waiting cheaply on the request paths: :class:`Parked` (a ``trio.Event`` cut down to its
one waiter) and :func:`wait_until` (an event or a deadline, no cancel scope without one).

The request paths wait in a few places where exactly one task ever waits and the waking
side only needs "wake it if it is waiting": a job's adapter waiting for the next reply, an
HTTP connection waiting for its next request. A ``trio.Event`` there is an object with a
parking lot per wait, and ``Event.wait`` adds two coroutine frames that every suspension
and every resumption passes through; profiles of the serving process showed that machinery
at a few percent of its CPU. :class:`Parked` is one slot per wait and waits with
``wait_task_rescheduled`` directly.

    parked = Parked()          # in the waiting task, right before waiting
    holder.waiter = parked
    await parked.wait()        # a checkpoint only if cancelled; returns once set()

    holder.waiter.set()        # elsewhere in Trio: wakes the task if it still waits

A ``Parked`` is made for one wait by the task that waits, with no checkpoint between its
creation and :meth:`Parked.wait` (so nothing can set it before the task parks). Cancelling
the waiting task abandons the wait; a later :meth:`Parked.set` does nothing.
"""

from __future__ import annotations

import math

import trio

__all__ = ["Parked", "wait_until"]


class Parked:
    """The current task, parked until :meth:`set`."""

    __slots__ = ("_task",)

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = trio.lowlevel.current_task()

    def set(self) -> None:
        """Wake the task if it still waits (from Trio's thread)."""
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        """Wait until :meth:`set` (or the task is cancelled)."""
        await trio.lowlevel.wait_task_rescheduled(self._abort)


async def wait_until(event: trio.Event, deadline: float) -> bool:
    """Wait for ``event`` until ``deadline`` (Trio's clock); whether it was set. With no
    deadline (``math.inf``) no cancel scope is entered: the request paths' loops wait like
    this several times per request, and entering a scope showed in their profiles."""
    if deadline == math.inf:
        await event.wait()
        return True
    with trio.move_on_at(deadline):
        await event.wait()
        return True
    return False
