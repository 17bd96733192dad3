"""What one worker process was sent and still owes answers for (sans-IO).

:class:`InFlight` is the batch-and-reply bookkeeping of one worker supervisor
(``runtime/supervisor.py``): the batches sent to the worker process and not ended, in the
order they were sent, and every job sent and not ended yet, by request id. It holds no trio,
reads the clock only through the callable it is given and does no I/O; the supervisor writes
and reads the frames and calls it::

    batch_id = inflight.send(jobs)       # before the BATCH frame is written
    inflight.unsend(batch_id)            # the write failed: the jobs to queue again
    inflight.reply(reply)                # each decoded RESPONSE; True if it ended a batch
    inflight.running                     # the batch the process runs, and since when
    inflight.abandon()                   # the process is going away: batches to queue again
    inflight.fail_all(error)             # ... and the jobs of the running batch fail
    inflight.take_continuing()           # continuous batching: the jobs for the next step

The rules
---------

* The first batch sent and not ended runs; those sent after it wait behind it in the process,
  not started (the supervisor sends at most one, see ``BatchPolicy.worker_prefetch``). A
  batch's ``started`` is when it was sent, and for a batch that waited behind another, when
  the one before it ended: ``response_timeout`` counts from there.
* Each reply item goes to the job in flight with its request id; the final reply of a batch
  ends the batch, and every job of it that got no answer fails with TorchServe's "number of
  batch response mismatched" (503). A reply whose ``code`` is not 200 ends the batch and
  fails all its unanswered jobs with that code and message. A reply to a batch no longer
  listed (already ended, or abandoned) is dropped.
* A job leaves flight with its final answer, its failure, or its cancellation: a job's cancel
  callback is this book's, which forgets the job and calls ``on_cancel(request_id)`` so that
  the supervisor tells the process. A job in flight is one the book knows; the job's own
  state is not consulted.
* A batch that never reached the process (``unsend``), or never started in it (behind the
  running one when the process goes away: ``abandon``), hands back its jobs still in flight,
  un-started, for the supervisor to put back at the head of the queue. The running batch's
  jobs stay in flight after ``abandon`` until ``fail_all``: answers that arrive meanwhile are
  dropped, the jobs fail with the process's error.

Continuous batching (``continuous=True``, TorchServe's ``continuousBatching``): a batch is one
*step* of a running batch. A final reply item whose headers say ``ts_stream_next: true``
(the handler's stopping criterion answered False) is delivered as an intermediate answer and
its job stays in flight, *continuing*: :meth:`InFlight.take_continuing` hands the continuing
jobs still wanted to the supervisor, which sends them again at the head of the next step
(``send(jobs, resumed=continuing)``; the worker gets them without parameters, as
TorchServe's "cached in backend" requests). ``ts_stream_next: false`` or no such header ends
the job. The header is the worker's and is removed from what the job receives. A client
that goes away between steps takes its job out of flight, so it is not resumed.

Jobs are any objects with the worker-facing half of ``runtime.jobs.Job``
(:class:`InFlightJob`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.messages import BatchReply, Reply

__all__ = ["STREAM_NEXT_HEADER", "InFlight", "InFlightJob", "SentBatch"]

# Set by the worker on a continuous-batching step's reply item: "true" = more steps follow.
STREAM_NEXT_HEADER = "ts_stream_next"


class InFlightJob(Protocol):
    """A job as the bookkeeping sees it (``runtime.jobs.Job``)."""

    @property
    def request_id(self) -> str: ...

    def start(self, on_cancel: Callable[[Self], None]) -> None:
        """Sent to a worker; ``on_cancel`` is called if the client gives it up."""

    def unstart(self) -> None:
        """It never reached the worker, or never started there: it will be queued again."""

    def deliver(self, reply: Reply, *, final: bool) -> None:
        """One reply; the final one ends the job."""

    def fail(self, error: ServeError) -> None:
        """The job ends with ``error``."""


J = TypeVar("J", bound=InFlightJob)


@dataclass(slots=True, eq=False)
class SentBatch(Generic[J]):
    """A batch sent to the worker process and not ended yet."""

    batch_id: int
    jobs: list[J]
    started: float  # when it started running (or was sent, while it waits behind another)
    resumed: int = 0  # continuous batching: the first ``resumed`` jobs continue a stream


def _mismatch() -> ServeError:
    return errors.prediction_failed(503, "number of batch response mismatched")


class InFlight(Generic[J]):
    """The batches and jobs one worker process was sent and has not answered yet."""

    __slots__ = (
        "_batch_id",
        "_batches",
        "_cancel",
        "_clock",
        "_continuing",
        "_continuous",
        "_jobs",
        "_on_batch_end",
        "_on_cancel",
    )

    def __init__(
        self,
        *,
        on_cancel: Callable[[str], None],
        clock: Callable[[], float],
        continuous: bool = False,
        on_batch_end: Callable[[int, float], None] | None = None,
    ) -> None:
        """``on_cancel(request_id)``: a job in flight was cancelled by its client (the
        process should be told); ``clock``: the time ``started`` is read from;
        ``continuous``: each batch is a step of a continuous batch (see the module);
        ``on_batch_end(size, seconds)``: a batch the process answered (code 200) ended, after
        running that long (the statistics extension's compute time)."""
        self._on_cancel = on_cancel
        self._on_batch_end = on_batch_end
        self._continuous = continuous
        # Continuous batching: jobs answered "more to come" by the last step, in step order.
        self._continuing: list[J] = []
        self._clock = clock
        self._jobs: dict[str, J] = {}
        # In the order sent: the first runs; any behind it has not started.
        self._batches: deque[SentBatch[J]] = deque()
        self._batch_id = 0
        self._cancel = self._cancelled  # bound once: every job sent gets this callback

    # -- observation -------------------------------------------------------------------

    def __len__(self) -> int:
        """How many batches were sent and have not ended (the running one included)."""
        return len(self._batches)

    @property
    def running(self) -> SentBatch[J] | None:
        """The batch the process runs (the first sent and not ended), if any."""
        return self._batches[0] if self._batches else None

    @property
    def job_count(self) -> int:
        """How many jobs are in flight."""
        return len(self._jobs)

    @property
    def has_continuing(self) -> bool:
        """Whether a job answered "more to come" by the last step is still wanted."""
        table = self._jobs
        return any(table.get(job.request_id) is job for job in self._continuing)

    # -- events ------------------------------------------------------------------------

    def send(self, jobs: list[J], *, resumed: Sequence[J] = ()) -> int:
        """``jobs`` are about to be written to the process as one batch: they start and are
        in flight from now (listed before the write, whose answer may be read before the
        write returns). ``resumed``: continuing jobs (from :meth:`take_continuing`), already
        in flight, that go first in the batch. Returns the batch's id."""
        on_cancel = self._cancel
        table = self._jobs
        for job in jobs:
            job.start(on_cancel)
            table[job.request_id] = job
        self._batch_id += 1
        batch = [*resumed, *jobs] if resumed else jobs
        self._batches.append(SentBatch(self._batch_id, batch, self._clock(), len(resumed)))
        return self._batch_id

    def take_continuing(self) -> list[J]:
        """Continuous batching: the jobs the last step answered "more to come" and still in
        flight (their clients are still there), in order, for the next step; forgotten here."""
        table = self._jobs
        wanted = [job for job in self._continuing if table.get(job.request_id) is job]
        self._continuing = []
        return wanted

    def unsend(self, batch_id: int) -> list[J]:
        """Batch ``batch_id`` never reached the process (its write failed): it is forgotten,
        and its jobs still in flight come back un-started, in order, to be queued again
        (resumed jobs excepted: their stream lives in the process; they stay in flight, for
        :meth:`fail_all`)."""
        for sent in self._batches:
            if sent.batch_id == batch_id:
                self._batches.remove(sent)
                return self._take_back(sent.jobs[sent.resumed :])
        return []

    def reply(self, reply: BatchReply) -> bool:
        """Route one RESPONSE to its jobs. True if it ended a batch (the batch behind it, if
        any, runs from now)."""
        batch_id = reply.batch_id
        for sent in self._batches:
            if sent.batch_id == batch_id:
                break
        else:
            return False  # an answer to a batch already ended (failed, timed out): dropped
        if reply.code != 200:
            self._end(sent, errors.prediction_failed(reply.code, reply.message))
            return True
        final = reply.final
        # The batch's end, read before the answers are delivered: an adapter may write its
        # answer from the delivery (a gRPC unary call), which is not the worker's time.
        ran = self._clock() - sent.started if final and self._on_batch_end is not None else 0.0
        table = self._jobs
        continuing: set[str] = set()
        for item in reply.replies:
            job = table.get(item.request_id)
            more = False
            if final and self._continuous:
                more = item.headers.pop(STREAM_NEXT_HEADER, None) == "true"
            if job is not None:
                job.deliver(item, final=final and not more)
                if more:
                    continuing.add(item.request_id)
                    self._continuing.append(job)
            if final and not more:
                table.pop(item.request_id, None)
        if final:
            if self._on_batch_end is not None:
                self._on_batch_end(len(sent.jobs), ran)
            # Every job answered is out of flight (continuing ones excepted); any job left
            # had no answer in the batch.
            self._end(sent, None, keep=continuing)
            return True
        return False

    def abandon(self) -> list[list[J]]:
        """The process is going away: every batch is forgotten (later answers are dropped).
        Returns, batch by batch, the jobs of those that never started (behind the running
        one), un-started, to be queued again. The running batch's jobs stay in flight, for
        :meth:`fail_all`."""
        behind = list(self._batches)[1:]
        self._batches.clear()
        self._continuing = []
        return [self._take_back(sent.jobs) for sent in behind]

    def fail_all(self, error: ServeError) -> None:
        """Every job in flight fails with ``error``."""
        jobs = list(self._jobs.values())
        self._jobs.clear()
        self._continuing = []
        for job in jobs:
            job.fail(error)

    # -- internals ---------------------------------------------------------------------

    def _cancelled(self, job: J) -> None:
        self._jobs.pop(job.request_id, None)
        self._on_cancel(job.request_id)

    def _take_back(self, jobs: list[J]) -> list[J]:
        table = self._jobs
        back = [job for job in jobs if table.get(job.request_id) is job]
        for job in back:
            del table[job.request_id]
            job.unstart()
        return back

    def _end(
        self, sent: SentBatch[J], error: ServeError | None, *, keep: AbstractSet[str] = frozenset()
    ) -> None:
        """``sent`` ended: its jobs still in flight (but those in ``keep``, continuing) fail
        with ``error`` (None: the reply count mismatch), and the batch behind it (if any)
        runs from now."""
        table = self._jobs
        for job in sent.jobs:
            if job.request_id in keep:
                continue
            if table.pop(job.request_id, None) is not None:
                if error is None:
                    error = _mismatch()
                job.fail(error)
        was_running = self._batches[0] is sent
        self._batches.remove(sent)
        if was_running and self._batches:
            self._batches[0].started = self._clock()
