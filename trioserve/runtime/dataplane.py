"""The inference dataplane: the one path from every protocol adapter to the models.

An adapter (TorchServe HTTP, TorchServe gRPC, and the protocols that come after them) turns
its wire format into an :class:`~trioserve.core.request.InferenceRequest` and calls
:meth:`Dataplane.submit`. The dataplane resolves the model version, routes a request that
belongs to a sequence, admits it (a refused request raises a
:class:`~trioserve.core.errors.ServeError` at once: not found, no worker, queue full, ...)
and returns a :class:`Call`: the request's replies, read with :meth:`Call.next_reply`
(intermediate ones first, then the final one) or :meth:`Call.replies`.

A call belongs to the task that submitted it. ``async with dataplane.submit(request) as
call`` (or a ``finally: call.cancel()``) ties it to that task's scope: when the task leaves
early (client gone, gRPC deadline, shutdown) the call is cancelled, which takes a queued
request out of its queue or has the worker running it told to stop. A request's deadline
(``InferenceRequest.deadline``, trio clock) is honoured in the queue (it is failed there,
unrun) and while its replies are awaited.

Metrics are recorded here, once, at the same points for every protocol: the request count
when a known model version is asked, the inference and queue latency when the final reply
is read (latency counted from :meth:`Dataplane.submit`), and the response class
(``Requests2XX``/``4XX``/``5XX``) when the request's outcome is decided: its first reply,
or its error. A call cancelled before either has no class (no answer was sent). Triton's
statistics (``ModelVersion.stats``, :mod:`trioserve.core.model_stats`) count each request
of a known model version once its outcome is known: a final reply (success, or failure for
a handler's error status), its error, its refusal at admission, or its cancellation before
the final reply (a failure: the client left, or ended a stream by cancelling it).

``limits`` (:class:`~trioserve.core.limits.RequestLimits`) are what one request may expand
to; the adapters check what they parse against them, and :meth:`Dataplane.submit` checks
every request's input count (form fields and gRPC ``input`` entries too).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Protocol

import trio

from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, check_inputs
from trioserve.core.messages import Param, Reply, encode_stream_input
from trioserve.core.model_stats import ModelStats
from trioserve.core.request import InferenceRequest, Outcome
from trioserve.core.sequences import mint_sequence_id
from trioserve.runtime.jobs import Job, each_reply
from trioserve.runtime.manager import ModelManager
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.sequence_batcher import SequenceBatcher
from trioserve.runtime.sequences import SequenceHeaders


def outcome_of_error(error: ServeError) -> Outcome:
    return Outcome.CLIENT_ERROR if error.client_fault else Outcome.SERVER_ERROR


class RequestMetrics(Protocol):
    """What the dataplane records (``trioserve.metrics.ServerMetrics`` provides it)."""

    def request_received(self, model: str, version: str | None) -> None: ...

    def request_finished(
        self, model: str, version: str | None, *, latency_us: float, queue_us: float
    ) -> None: ...

    def request_outcome(self, outcome: Outcome) -> None: ...


class Dataplane:
    """Admits inference requests for every adapter and hands back their calls."""

    def __init__(
        self,
        manager: ModelManager,
        metrics: RequestMetrics | None = None,
        *,
        sequences: SequenceHeaders | None = None,
        limits: RequestLimits = DEFAULT_LIMITS,
        forward: Callable[[InferenceRequest], Job] | None = None,
    ) -> None:
        self.manager = manager
        self.metrics = metrics
        self.sequences = sequences or SequenceHeaders()
        self.limits = limits
        # In a serving process other than the control process: submits a request for a
        # model the control process serves for everyone (runtime/forward.py).
        self.forward = forward

    @property
    def sequence_header(self) -> str:
        """The request (and response) header that carries a sequence id."""
        return self.sequences.id_header

    def healthy(self) -> bool:
        """Every model version that should have workers has a ready one."""
        return self.manager.healthy()

    def model(self, name: str, version: str | None = None) -> ModelVersion:
        """The model version a request naming ``name`` (and ``version``) reaches;
        NOT_FOUND when there is none."""
        return self.manager.get(name, version)

    def registered(self) -> list[tuple[str, str, ModelVersion]]:
        """Every registered model version: (name, version, model)."""
        return [(name, version, entry.model) for name, version, entry in self.manager.registry]

    def versions(self, name: str) -> list[str]:
        """The registered versions of model ``name``, oldest first (NOT_FOUND: none)."""
        return [version for version, _entry in self.manager.registry.versions(name)]

    def submit(self, request: InferenceRequest) -> Call:
        """Admit ``request``; raises :class:`ServeError` if it cannot be queued."""
        began = trio.current_time()
        metrics = self.metrics
        model: ModelVersion | None = None
        try:
            model = self.manager.get(request.model, request.version)
            if metrics is not None:
                metrics.request_received(request.model, request.version)
            check_inputs(len(request.params), self.limits)
            if model.forwarded and self.forward is not None:
                return self._forward(model, request, began)
            stateful = model.queue if isinstance(model.queue, SequenceBatcher) else None
            if stateful is not None:
                # A stateful model: every request belongs to a sequence, opened when the
                # request names none (or one never seen), joined when it names an open one.
                request.sequence_id, started = stateful.open(request.sequence_id or None)
                self.sequences.mark(request, started=started)
            elif request.sequence_id == "":
                raise errors.bad_request("Parameter sequenceId is required.")
            elif request.sequence_id is not None:
                self.sequences.mark(request, started=False)  # shown to the handler, echoed
            job = model.submit(request)
        except ServeError as error:
            if metrics is not None:
                metrics.request_outcome(outcome_of_error(error))
            if model is not None:
                model.stats.request_failed(_ns_since(began), _now_ms())
            raise
        return Call(
            job,
            began,
            metrics,
            request.sequence_id,
            stateful=stateful is not None,
            stats=model.stats,
        )

    def _forward(self, model: ModelVersion, request: InferenceRequest, began: float) -> Call:
        """Hand ``request`` to the control process, which serves ``model`` for every serving
        process. A stateful model's new sequence gets its id here, so that the adapter knows
        it at once; the control process opens the sequence under that id."""
        assert self.forward is not None
        stateful = model.settings.sequence is not None
        if stateful:
            if not request.sequence_id:
                request.sequence_id = mint_sequence_id()
        elif request.sequence_id == "":
            raise errors.bad_request("Parameter sequenceId is required.")
        job = self.forward(request)
        return Call(
            job, began, self.metrics, request.sequence_id, stateful=stateful, stats=model.stats
        )


def _ns_since(began: float) -> int:
    return int((trio.current_time() - began) * 1e9)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Call:
    """One admitted request, as its adapter sees it: replies in, cancellation out."""

    __slots__ = ("_began", "_decided", "_job", "_metrics", "_stats", "sequence_id", "stateful")

    def __init__(
        self,
        job: Job,
        began: float,
        metrics: RequestMetrics | None,
        sequence_id: str | None = None,
        *,
        stateful: bool = False,
        stats: ModelStats | None = None,
    ) -> None:
        self._job = job
        self._stats = stats  # the model version's Triton statistics; None once counted
        self._began = began
        self._metrics = metrics
        self._decided = False  # the response class is recorded
        self.sequence_id = sequence_id  # the sequence the replies belong to, if any
        self.stateful = stateful  # the model keeps per-sequence state (sequence batching)

    @property
    def request(self) -> InferenceRequest:
        return self._job.request

    @property
    def request_id(self) -> str:
        return self._job.request.request_id

    async def next_reply(self) -> tuple[Reply, bool]:
        """The next reply and whether it is the final one.

        Raises the request's :class:`ServeError` if it failed (a deadline that passes while
        waiting is one), ``trio.EndOfChannel`` after the final reply and
        ``trio.ClosedResourceError`` once the call was cancelled."""
        deadline = self._job.request.deadline
        try:
            if deadline is None:
                reply, final = await self._job.next_reply()
            else:
                with trio.move_on_at(deadline) as waiting:
                    reply, final = await self._job.next_reply()
                if waiting.cancelled_caught:
                    self._job.cancel()
                    raise errors.deadline_exceeded()
        except ServeError as error:
            self._decide(outcome_of_error(error))
            self._failed()
            raise
        self._decide(Outcome.of_status(reply.status))
        if final:
            self._finished(reply)
        return reply, final

    def replies(self) -> AsyncIterator[tuple[Reply, bool]]:
        """Each reply with its ``final`` flag, the final one last."""
        return each_reply(self.next_reply)

    def poll_reply(self) -> tuple[Reply, bool] | None:
        """:meth:`next_reply` without waiting (None: nothing yet) and without the deadline,
        which the caller enforces; :meth:`when_ready` says when to poll again."""
        try:
            item = self._job.poll()
        except ServeError as error:
            self._decide(outcome_of_error(error))
            self._failed()
            raise
        if item is not None:
            reply, final = item
            self._decide(Outcome.of_status(reply.status))
            if final:
                self._finished(reply)
        return item

    def when_ready(self, wake: Callable[[], object]) -> None:
        """Call ``wake()`` once, in Trio, when :meth:`poll_reply` has news."""
        self._job.when_ready(wake)

    def cancel(self) -> None:
        """The adapter no longer wants the answer. Safe to call in any state, repeatedly.
        A request cancelled before its outcome is known counts as failed in the statistics."""
        self._failed()
        self._job.cancel()

    def send_input(
        self,
        params: list[Param],
        *,
        end: bool = False,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """One more input of a streamed request (``end``: the last; ``params`` may then be
        empty). Inputs reach the worker in order, once the request is running there."""
        frame = encode_stream_input(self.request_id, params, end=end, headers=headers)
        self._job.send_input(frame)

    def send_input_frame(self, frame: bytes) -> None:
        """:meth:`send_input` with the input already a STREAM_INPUT frame (one a serving
        process forwarded)."""
        self._job.send_input(frame)

    async def __aenter__(self) -> Call:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cancel()

    # -- metrics --------------------------------------------------------------------------

    def _decide(self, outcome: Outcome) -> None:
        if not self._decided:
            self._decided = True
            if self._metrics is not None:
                self._metrics.request_outcome(outcome)

    # Each request is counted once in the statistics: ``_stats`` is dropped once it is.

    def _failed(self) -> None:
        stats = self._stats
        if stats is not None:
            self._stats = None
            stats.request_failed(_ns_since(self._began), _now_ms())

    def _finished(self, reply: Reply) -> None:
        job, metrics, stats = self._job, self._metrics, self._stats
        if stats is not None:
            self._stats = None
            if reply.status >= 400:
                stats.request_failed(_ns_since(self._began), _now_ms())
            else:
                queued = 0 if job.started_at is None else job.started_at - job.enqueued_at
                stats.request_succeeded(_ns_since(self._began), int(queued * 1e9), _now_ms())
        if metrics is None or job.started_at is None:
            return
        request = job.request
        metrics.request_finished(
            request.model,
            request.version,
            latency_us=(trio.current_time() - self._began) * 1e6,
            queue_us=(job.started_at - job.enqueued_at) * 1e6,
        )


__all__ = ["Call", "Dataplane", "RequestMetrics"]
