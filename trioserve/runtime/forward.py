"""Forwarded requests: a serving process asks the control process to run a request.

Stateful models (sequence batching) and continuous-batching models are served for every
serving process by the control process, which owns their sequences and running batches
(docs/design.md, "Serving processes", says why). A serving process that receives a request for
one of them hands it over the link (:class:`Forwarder`, in the serving process) and the
control process runs it through its own dataplane (:class:`ForwardedCalls`), sending back
each reply as it comes. A client that leaves cancels the request there; a streamed request's
further inputs follow it; the control process sends a streamed request at most ``WINDOW``
intermediate replies beyond those its client has read.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import trio

from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.link_frames import Frame
from trioserve.core.model_settings import ModelSettings
from trioserve.core.request import InferenceRequest
from trioserve.core.serving_frames import (
    CANCEL,
    FAILED,
    INPUT,
    READ,
    REPLY,
    SUBMIT,
    RequestTuple,
    error_from,
    error_tuple,
    reply_from,
    reply_tuple,
    request_from,
    request_tuple,
)
from trioserve.runtime.dataplane import Call, Dataplane
from trioserve.runtime.jobs import Job

log = logging.getLogger("trioserve.serving")

# Intermediate replies of a streamed request sent beyond those its client has read.
WINDOW = 16

Post = Callable[[Frame], None]


class Forwarder:
    """The serving process's side: each forwarded request is a :class:`Job` whose replies
    come over the link."""

    def __init__(self, post: Post) -> None:
        self._post = post
        self._jobs: dict[int, Job] = {}
        self._numbers = itertools.count(1)
        self._closed: ServeError | None = None

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, request: InferenceRequest) -> Job:
        if self._closed is not None:
            raise self._closed
        number = next(self._numbers)
        job = Job(request)
        job.start(lambda _job: self._cancel(number))
        self._jobs[number] = job
        now = trio.current_time()
        remaining = None if request.deadline is None else max(0.0, request.deadline - now)
        self._post((SUBMIT, number, request_tuple(request, remaining)))
        if request.streamed:
            post = self._post
            job.stream_to(lambda frame: post((INPUT, number, frame)), lambda: post((READ, number)))
        return job

    def _cancel(self, number: int) -> None:
        if self._jobs.pop(number, None) is not None:
            self._post((CANCEL, number))

    def on_frame(self, frame: Frame) -> None:
        """A REPLY or FAILED frame for one of this process's forwarded requests."""
        kind, number = frame[0], frame[1]
        job = self._jobs.get(number)
        if job is None:  # cancelled meanwhile
            return
        if kind == REPLY:
            final = bool(frame[3])
            if final:
                del self._jobs[number]
            job.deliver(reply_from(frame[2]), final=final)
        elif kind == FAILED:
            del self._jobs[number]
            job.fail(error_from(frame[2:]))

    def close(self, error: ServeError) -> None:
        """The link is gone: every forwarded request fails with ``error``, and so does every
        new one."""
        self._closed = error
        jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            job.fail(error)


class _Forwarded:
    __slots__ = ("call", "read", "wake")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.read = 0  # intermediate replies its client has read
        self.wake = trio.Event()


class ForwardedCalls:
    """The control process's side for one serving process: runs what it forwards."""

    def __init__(self, dataplane: Dataplane, post: Post, nursery: trio.Nursery) -> None:
        # ``dataplane`` records no metrics: the serving process that forwarded a request
        # counts it, as it counts its own.
        self._dataplane = dataplane
        self._post = post
        self._nursery = nursery
        self._calls: dict[int, _Forwarded] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def on_frame(self, frame: Frame) -> None:
        kind, number = frame[0], frame[1]
        if kind == SUBMIT:
            self._submit(number, frame[2])
            return
        forwarded = self._calls.get(number)
        if forwarded is None:
            return  # answered already
        if kind == CANCEL:
            forwarded.call.cancel()
            forwarded.wake.set()
        elif kind == INPUT:
            forwarded.call.send_input_frame(frame[2])
        elif kind == READ:
            forwarded.read += 1
            forwarded.wake.set()

    def _submit(self, number: int, fields: RequestTuple) -> None:
        try:
            request = request_from(fields, trio.current_time())
            call = self._dataplane.submit(request)
        except ServeError as error:
            self._post((FAILED, number, *error_tuple(error)))
            return
        except Exception as exc:  # a bug: the request fails, the link stays
            log.exception("a forwarded request could not be submitted")
            failure = errors.ServeError(errors.ErrorKind.INTERNAL, f"forwarding failed: {exc!r}")
            self._post((FAILED, number, *error_tuple(failure)))
            return
        forwarded = self._calls[number] = _Forwarded(call)
        self._nursery.start_soon(self._pump, number, forwarded)

    async def _pump(self, number: int, forwarded: _Forwarded) -> None:
        call = forwarded.call
        streamed = call.request.streamed
        sent = 0
        try:
            while True:
                reply, final = await call.next_reply()
                self._post((REPLY, number, reply_tuple(reply), final))
                if final:
                    return
                sent += 1
                while streamed and sent - forwarded.read >= WINDOW:
                    await forwarded.wake.wait()
                    forwarded.wake = trio.Event()
        except ServeError as error:
            self._post((FAILED, number, *error_tuple(error)))
        except (trio.ClosedResourceError, trio.EndOfChannel):
            pass  # cancelled by its client
        finally:
            call.cancel()
            self._calls.pop(number, None)

    def close(self) -> None:
        """The link is gone: every request it forwarded is cancelled."""
        for forwarded in list(self._calls.values()):
            forwarded.call.cancel()
            forwarded.wake.set()


def forwarded_model(settings: ModelSettings) -> bool:
    """Whether the control process serves this model version for every serving process:
    its requests share state across requests (sequences) or run batches (continuous)."""
    return bool(settings.sequence is not None or settings.continuous_batching)


__all__ = ["WINDOW", "ForwardedCalls", "Forwarder", "forwarded_model"]
