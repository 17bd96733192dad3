"""The batch-and-reply bookkeeping of a worker supervisor (core/inflight.py), without trio."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trioserve.core import errors
from trioserve.core.errors import ServeError
from trioserve.core.inflight import STREAM_NEXT_HEADER, InFlight
from trioserve.core.messages import BatchReply, Reply


class FakeJob:
    """A job that records what the book does to it (``runtime.jobs.Job``'s worker side)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.events: list[Any] = []
        self.on_cancel: Callable[[FakeJob], None] | None = None
        self.error: ServeError | None = None
        self.replies: list[Reply] = []  # every reply delivered, as received

    def start(self, on_cancel: Callable[[FakeJob], None]) -> None:
        self.on_cancel = on_cancel
        self.events.append("start")

    def unstart(self) -> None:
        self.on_cancel = None
        self.events.append("unstart")

    def deliver(self, reply: Reply, *, final: bool) -> None:
        self.replies.append(reply)
        self.events.append((bytes(reply.body), final))

    def fail(self, error: ServeError) -> None:
        self.error = error
        self.events.append("fail")

    def cancel(self) -> None:
        """The client went away (what ``Job.cancel`` does for a running job)."""
        assert self.on_cancel is not None
        self.on_cancel(self)
        self.events.append("cancelled")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def told() -> list[str]:
    """The request ids the book asked the supervisor to cancel in the process."""
    return []


@pytest.fixture
def book(clock: Clock, told: list[str]) -> InFlight[FakeJob]:
    return InFlight(on_cancel=told.append, clock=clock)


def jobs(*ids: str) -> list[FakeJob]:
    return [FakeJob(rid) for rid in ids]


def final(batch_id: int, *answers: str, code: int = 200, message: str = "") -> BatchReply:
    return BatchReply(batch_id, code, message, [Reply(a, a.encode()) for a in answers], True)


def partial(batch_id: int, *answers: str) -> BatchReply:
    return BatchReply(batch_id, 200, "", [Reply(a, a.encode()) for a in answers], False)


def same(error: ServeError | None, expected: ServeError) -> bool:
    return error is not None and vars(error) == vars(expected)


MISMATCH = "number of batch response mismatched"


# -- sending ------------------------------------------------------------------------------------


def test_a_batch_sent_starts_its_jobs_and_runs(book: InFlight[FakeJob], clock: Clock) -> None:
    batch = jobs("a", "b")
    assert len(book) == 0 and book.running is None and not book
    assert book.send(batch) == 1
    assert [j.events for j in batch] == [["start"], ["start"]]
    running = book.running
    assert running is not None
    assert (running.batch_id, running.jobs, running.started) == (1, batch, 100.0)
    assert (len(book), book.job_count) == (1, 2)
    clock.now = 101.0
    assert book.send(jobs("c")) == 2  # ids count up; the first batch still runs
    assert book.running is running and len(book) == 2


def test_unsend_gives_back_the_jobs_still_in_flight_unstarted(book: InFlight[FakeJob]) -> None:
    batch = jobs("a", "b", "c")
    batch_id = book.send(batch)
    batch[1].cancel()
    back = book.unsend(batch_id)
    assert back == [batch[0], batch[2]]  # in order, without the cancelled one
    assert batch[0].events == ["start", "unstart"]
    assert batch[1].events == ["start", "cancelled"]
    assert (len(book), book.job_count) == (0, 0)
    assert book.unsend(batch_id) == []  # already forgotten


# -- replies ------------------------------------------------------------------------------------


def test_the_final_reply_ends_the_batch(book: InFlight[FakeJob]) -> None:
    batch = jobs("a", "b")
    book.send(batch)
    assert book.reply(final(1, "b", "a")) is True
    assert [j.events for j in batch] == [["start", (b"a", True)], ["start", (b"b", True)]]
    assert (len(book), book.job_count, book.running) == (0, 0, None)


def test_intermediate_replies_keep_the_batch_running(book: InFlight[FakeJob]) -> None:
    (job,) = batch = jobs("a")
    book.send(batch)
    assert book.reply(partial(1, "a")) is False
    assert book.reply(partial(1, "a")) is False
    assert book.job_count == 1 and len(book) == 1
    assert book.reply(final(1, "a")) is True
    assert job.events == ["start", (b"a", False), (b"a", False), (b"a", True)]


def test_jobs_the_final_reply_leaves_unanswered_fail(book: InFlight[FakeJob]) -> None:
    batch = jobs("a", "b", "c")
    book.send(batch)
    assert book.reply(final(1, "b")) is True
    assert batch[1].events == ["start", (b"b", True)]
    for job in (batch[0], batch[2]):
        assert job.events == ["start", "fail"]
        assert same(job.error, errors.prediction_failed(503, MISMATCH))
    assert batch[0].error is batch[2].error  # one error for the batch
    assert book.job_count == 0


def test_a_failed_batch_fails_every_job_still_in_flight(book: InFlight[FakeJob]) -> None:
    batch = jobs("a", "b")
    book.send(batch)
    book.reply(partial(1, "a"))  # "a" streamed a part, then the batch failed
    assert book.reply(final(1, code=507, message="out of memory")) is True
    for job in batch:
        assert job.events[-1] == "fail"
        assert same(job.error, errors.prediction_failed(507, "out of memory"))
    assert (len(book), book.job_count) == (0, 0)


def test_a_reply_to_a_batch_no_longer_listed_is_dropped(book: InFlight[FakeJob]) -> None:
    (job,) = batch = jobs("a")
    book.send(batch)
    assert book.reply(final(7, "a")) is False
    assert job.events == ["start"]
    assert book.reply(final(1, "a")) is True
    assert book.reply(final(1, "a")) is False  # a second final: the batch has ended
    assert job.events == ["start", (b"a", True)]


def test_the_batch_behind_runs_from_when_the_one_before_ends(
    book: InFlight[FakeJob], clock: Clock
) -> None:
    book.send(jobs("a"))
    clock.now = 100.5
    book.send(jobs("b"))
    first = book.running
    assert first is not None and first.batch_id == 1
    clock.now = 103.0
    assert book.reply(final(1, "a")) is True
    running = book.running
    assert running is not None and running.batch_id == 2
    assert running.started == 103.0  # its response_timeout counts from here, not 100.5


def test_a_batch_behind_ending_first_leaves_the_running_one_alone(
    book: InFlight[FakeJob], clock: Clock
) -> None:
    book.send(jobs("a"))
    book.send(jobs("b"))
    clock.now = 105.0
    assert book.reply(final(2, "b")) is True
    running = book.running
    assert running is not None and (running.batch_id, running.started) == (1, 100.0)


# -- cancellation -------------------------------------------------------------------------------


def test_a_cancelled_job_leaves_flight_and_the_process_is_told(
    book: InFlight[FakeJob], told: list[str]
) -> None:
    batch = jobs("a", "b")
    book.send(batch)
    batch[0].cancel()
    assert told == ["a"]
    assert book.job_count == 1
    # Its answer, if the process still sends one, reaches nobody; it does not fail either.
    assert book.reply(final(1, "a", "b")) is True
    assert batch[0].events == ["start", "cancelled"]
    assert batch[1].events == ["start", (b"b", True)]


# -- the process going away ---------------------------------------------------------------------


def test_abandon_requeues_the_batch_behind_and_keeps_the_running_jobs(
    book: InFlight[FakeJob],
) -> None:
    running, behind = jobs("a", "b"), jobs("c", "d")
    book.send(running)
    book.send(behind)
    behind[1].cancel()
    assert book.abandon() == [[behind[0]]]
    assert behind[0].events == ["start", "unstart"]
    assert len(book) == 0 and book.running is None
    assert book.job_count == 2  # the running batch's jobs, until they fail
    assert book.reply(final(1, "a", "b")) is False  # late answers are dropped
    book.fail_all(errors.worker_died("gone"))
    for job in running:
        assert job.events == ["start", "fail"]
        assert same(job.error, errors.worker_died("gone"))
    assert book.job_count == 0


def test_abandon_with_nothing_behind(book: InFlight[FakeJob]) -> None:
    assert book.abandon() == []
    book.send(jobs("a"))
    assert book.abandon() == []
    assert book.job_count == 1


def test_the_book_serves_the_next_process_after_a_failure(book: InFlight[FakeJob]) -> None:
    book.send(jobs("a"))
    book.abandon()
    book.fail_all(errors.worker_died())
    (job,) = batch = jobs("b")
    assert book.send(batch) == 2  # batch ids never repeat
    assert book.reply(final(2, "b")) is True
    assert job.events == ["start", (b"b", True)]


# -- continuous batching ------------------------------------------------------------------------


@pytest.fixture
def steps(clock: Clock, told: list[str]) -> InFlight[FakeJob]:
    """A book whose batches are steps of a continuous batch."""
    return InFlight(on_cancel=told.append, clock=clock, continuous=True)


def answer(request_id: str, stream_next: str | None = None, **headers: str) -> Reply:
    """One reply item; ``stream_next``: the worker's ``ts_stream_next`` header, if any."""
    if stream_next is not None:
        headers[STREAM_NEXT_HEADER] = stream_next
    return Reply(request_id, request_id.encode(), headers=headers)


def step(batch_id: int, *replies: Reply, final: bool = True) -> BatchReply:
    return BatchReply(batch_id, 200, "", list(replies), final)


def test_more_to_come_keeps_the_job_in_flight_for_the_next_step(
    steps: InFlight[FakeJob],
) -> None:
    a, b, c = batch = jobs("a", "b", "c")
    steps.send(batch)
    assert not steps.has_continuing
    ended = steps.reply(step(1, answer("a", "true", x="1"), answer("b", "false"), answer("c")))
    assert ended is True  # the step has ended; "a" goes on in the next one
    assert a.events == ["start", (b"a", False)]
    assert b.events == ["start", (b"b", True)]
    assert c.events == ["start", (b"c", True)]  # no header: the job ends
    # The header is the worker's: the jobs never see it (other headers pass).
    assert a.replies[-1].headers == {"x": "1"}
    assert b.replies[-1].headers == {} and c.replies[-1].headers == {}
    assert (len(steps), steps.running, steps.job_count) == (0, None, 1)
    assert steps.has_continuing
    assert steps.take_continuing() == [a]
    assert steps.take_continuing() == []  # handed over once
    assert not steps.has_continuing
    assert steps.job_count == 1  # still in flight: its stream lives in the process
    assert a.events == ["start", (b"a", False)]


def test_continuing_jobs_come_in_the_order_of_the_steps_reply(
    steps: InFlight[FakeJob],
) -> None:
    batch = jobs("a", "b", "c")
    steps.send(batch)
    steps.reply(step(1, answer("c", "true"), answer("a", "true"), answer("b", "true")))
    assert steps.take_continuing() == [batch[2], batch[0], batch[1]]
    assert steps.job_count == 3


def test_intermediate_replies_of_a_step_neither_end_nor_continue_a_job(
    steps: InFlight[FakeJob],
) -> None:
    (a,) = batch = jobs("a")
    steps.send(batch)
    # Only the step's final reply says whether a request goes on.
    assert steps.reply(step(1, answer("a", "true"), final=False)) is False
    assert steps.reply(step(1, answer("a"), final=False)) is False
    assert not steps.has_continuing and steps.job_count == 1 and len(steps) == 1
    assert steps.reply(step(1, answer("a", "true"))) is True
    assert a.events == ["start", (b"a", False), (b"a", False), (b"a", False)]
    assert steps.take_continuing() == [a]  # once


def test_resumed_jobs_go_first_in_the_next_step_without_starting_again(
    steps: InFlight[FakeJob], clock: Clock
) -> None:
    a, b = first = jobs("a", "b")
    steps.send(first)
    steps.reply(step(1, answer("a", "true"), answer("b", "true")))
    resumed = steps.take_continuing()
    assert resumed == [a, b]
    clock.now = 102.0
    (c,) = new = jobs("c")
    assert steps.send(new, resumed=resumed) == 2
    running = steps.running
    assert running is not None
    assert (running.batch_id, running.jobs, running.started, running.resumed) == (
        2,
        [a, b, c],
        102.0,
        2,
    )
    assert a.events == ["start", (b"a", False)]  # not started again
    assert c.events == ["start"]
    assert steps.job_count == 3 and len(steps) == 1
    # This step ends "b" and continues "a" and "c".
    assert steps.reply(step(2, answer("a", "true"), answer("b", "false"), answer("c", "true")))
    assert b.events == ["start", (b"b", False), (b"b", True)]
    assert steps.job_count == 2
    resumed = steps.take_continuing()
    assert resumed == [a, c]
    # A step of resumed jobs only; it ends them both.
    assert steps.send([], resumed=resumed) == 3
    assert steps.reply(step(3, answer("a", "false"), answer("c")))
    assert a.events == ["start", (b"a", False), (b"a", False), (b"a", True)]
    assert c.events == ["start", (b"c", False), (b"c", True)]
    assert (steps.job_count, len(steps), steps.has_continuing) == (0, 0, False)
    assert steps.take_continuing() == []


def test_a_continuing_job_whose_client_left_is_not_resumed(
    steps: InFlight[FakeJob], told: list[str]
) -> None:
    a, b = batch = jobs("a", "b")
    steps.send(batch)
    steps.reply(step(1, answer("a", "true"), answer("b", "true")))
    a.cancel()  # between the steps
    assert told == ["a"]
    assert steps.job_count == 1 and steps.has_continuing
    assert steps.take_continuing() == [b]
    b.cancel()
    assert told == ["a", "b"]
    assert steps.job_count == 0 and not steps.has_continuing
    assert steps.take_continuing() == []


def test_continuing_jobs_all_gone_leave_nothing_to_resume(
    steps: InFlight[FakeJob], told: list[str]
) -> None:
    (a,) = batch = jobs("a")
    steps.send(batch)
    steps.reply(step(1, answer("a", "true")))
    a.cancel()
    assert told == ["a"]
    assert not steps.has_continuing
    assert steps.take_continuing() == []
    assert a.events == ["start", (b"a", False), "cancelled"]


def test_a_resumed_job_cancelled_during_its_step_gets_no_more_answers(
    steps: InFlight[FakeJob], told: list[str]
) -> None:
    a, b = batch = jobs("a", "b")
    steps.send(batch)
    steps.reply(step(1, answer("a", "true"), answer("b", "true")))
    steps.send([], resumed=steps.take_continuing())
    a.cancel()
    assert told == ["a"] and steps.job_count == 1
    # The process answered before it heard: the answer reaches nobody and "a" is not resumed.
    assert steps.reply(step(2, answer("a", "true"), answer("b", "true")))
    assert a.events == ["start", (b"a", False), "cancelled"]
    assert steps.take_continuing() == [b]


def test_an_error_reply_to_a_step_fails_its_resumed_jobs_too(
    steps: InFlight[FakeJob],
) -> None:
    a, b = first = jobs("a", "b")
    steps.send(first)
    steps.reply(step(1, answer("a", "true"), answer("b", "true")))
    (c,) = new = jobs("c")
    steps.send(new, resumed=steps.take_continuing())
    failed = BatchReply(2, 507, "out of memory", [], True)
    assert steps.reply(failed) is True
    for job in (a, b, c):
        assert job.events[-1] == "fail"
        assert same(job.error, errors.prediction_failed(507, "out of memory"))
    assert (steps.job_count, len(steps), steps.has_continuing) == (0, 0, False)
    assert steps.take_continuing() == []


def test_a_step_reply_that_omits_a_resumed_job_fails_it(steps: InFlight[FakeJob]) -> None:
    a, b = first = jobs("a", "b")
    steps.send(first)
    steps.reply(step(1, answer("a", "true"), answer("b", "true")))
    (c,) = new = jobs("c")
    steps.send(new, resumed=steps.take_continuing())
    assert steps.reply(step(2, answer("b", "true"), answer("c", "false"))) is True
    assert a.events == ["start", (b"a", False), "fail"]
    assert same(a.error, errors.prediction_failed(503, MISMATCH))
    assert c.events == ["start", (b"c", True)]
    assert steps.job_count == 1
    assert steps.take_continuing() == [b]


def test_unsend_of_a_step_hands_back_only_its_new_jobs(steps: InFlight[FakeJob]) -> None:
    (a,) = first = jobs("a")
    steps.send(first)
    steps.reply(step(1, answer("a", "true")))
    c, d = new = jobs("c", "d")
    batch_id = steps.send(new, resumed=steps.take_continuing())
    assert steps.unsend(batch_id) == [c, d]
    assert c.events == d.events == ["start", "unstart"]
    # The resumed job's stream lives in the process: it stays in flight, not handed back.
    assert a.events == ["start", (b"a", False)]
    assert (len(steps), steps.job_count, steps.has_continuing) == (0, 1, False)
    assert steps.reply(step(batch_id, answer("a", "false"))) is False  # forgotten batch
    steps.fail_all(errors.worker_died("gone"))
    assert a.events == ["start", (b"a", False), "fail"]
    assert same(a.error, errors.worker_died("gone"))
    assert steps.job_count == 0


def test_fail_all_forgets_the_continuing_jobs(steps: InFlight[FakeJob]) -> None:
    a, b = batch = jobs("a", "b")
    steps.send(batch)
    steps.reply(step(1, answer("a", "true"), answer("b", "true")))
    steps.fail_all(errors.worker_died("gone"))
    for job in (a, b):
        assert job.events == ["start", (job.request_id.encode(), False), "fail"]
    assert (steps.job_count, steps.has_continuing) == (0, False)
    assert steps.take_continuing() == []


def test_abandon_forgets_the_continuing_jobs_until_fail_all(steps: InFlight[FakeJob]) -> None:
    (a,) = batch = jobs("a")
    steps.send(batch)
    steps.reply(step(1, answer("a", "true")))
    assert steps.abandon() == []
    assert not steps.has_continuing and steps.take_continuing() == []
    assert steps.job_count == 1  # it fails with the process
    steps.fail_all(errors.worker_died("gone"))
    assert a.events == ["start", (b"a", False), "fail"]
    assert steps.job_count == 0


def test_the_stream_header_means_nothing_without_continuous_batching(
    book: InFlight[FakeJob],
) -> None:
    a, b = batch = jobs("a", "b")
    book.send(batch)
    assert book.reply(step(1, answer("a", "true"), answer("b", "false")))
    assert a.events == ["start", (b"a", True)]
    assert b.events == ["start", (b"b", True)]
    assert a.replies[-1].headers == {STREAM_NEXT_HEADER: "true"}  # passed on untouched
    assert b.replies[-1].headers == {STREAM_NEXT_HEADER: "false"}
    assert (book.job_count, book.has_continuing) == (0, False)
    assert book.take_continuing() == []
