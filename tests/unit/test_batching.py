"""The sans-IO batching policy: one example per rule, then a model-based stateful test."""

from __future__ import annotations

import copy
import enum
import math

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from trioserve.core.batching import BatchPolicy, Dispatch, Expire, QueueFull, Reason


def make(
    *, batch_size: int = 4, max_delay: float = 1.0, capacity: int = 100, workers: int = 1
) -> BatchPolicy[str, str]:
    policy: BatchPolicy[str, str] = BatchPolicy(
        batch_size=batch_size, max_delay=max_delay, capacity=capacity
    )
    for i in range(workers):
        policy.worker_idle(f"w{i}")
    return policy


# -- examples, one per rule ------------------------------------------------------------------


def test_has_work_while_items_are_queued_or_expired_unreported() -> None:
    policy = make(batch_size=4)
    assert not policy.has_work
    policy.submit("a", 0.0)
    assert policy.has_work
    policy.worker_idle("w")
    assert [type(d) for d in policy.poll(0.0)] == [Dispatch]
    assert not policy.has_work
    policy.submit("b", 0.0, deadline=-1.0)  # expired on arrival: reported by the next poll
    assert policy.has_work
    assert [type(d) for d in policy.poll(0.0)] == [Expire]
    assert not policy.has_work


def test_lone_request_is_dispatched_at_once() -> None:
    policy = make(max_delay=0.05)
    policy.submit("a", 10.0)
    assert policy.next_wakeup(10.0) == 10.0
    assert policy.poll(10.0) == [Dispatch("w0", ("a",), Reason.IDLE)]
    assert policy.next_wakeup(10.0) is None


def test_items_queued_while_the_only_worker_is_busy_leave_together_when_it_returns() -> None:
    policy = make(batch_size=8, max_delay=5.0)
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.IDLE)]
    for name, now in [("b", 0.1), ("c", 0.2), ("d", 0.3)]:
        policy.submit(name, now)
        assert policy.poll(now) == []
    assert policy.next_wakeup(0.3) is None  # no idle worker: nothing happens by itself
    policy.worker_idle("w0")
    assert policy.poll(0.4) == [Dispatch("w0", ("b", "c", "d"), Reason.IDLE)]


def test_full_batch_goes_at_once_even_with_batches_in_flight() -> None:
    policy = make(batch_size=3, max_delay=10.0, workers=2)
    policy.worker_busy("w1")  # half the workers busy: no eager dispatch
    for name in "abcd":
        policy.submit(name, 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a", "b", "c"), Reason.FULL)]
    assert policy.queued() == ["d"]


def test_a_busy_worker_that_offers_takes_only_a_full_batch_behind() -> None:
    policy = make(batch_size=3, max_delay=0.5)
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.IDLE)]
    policy.worker_prefetch("w0")
    for name in "bc":
        policy.submit(name, 0.1)
    assert policy.poll(1.0) == []  # partial: it waits for the worker (or to fill up)
    assert policy.next_wakeup(1.0) is None
    policy.submit("d", 1.0)
    assert policy.next_wakeup(1.0) == 1.0
    assert policy.poll(1.0) == [Dispatch("w0", ("b", "c", "d"), Reason.FULL)]
    policy.submit("e", 1.1)
    policy.submit("f", 1.1)
    policy.submit("g", 1.1)
    assert policy.poll(1.2) == []  # one batch behind at most: the offer was used
    policy.worker_prefetch("w0")
    assert policy.poll(1.2) == [Dispatch("w0", ("e", "f", "g"), Reason.FULL)]
    policy.requeue("w0")  # the batch behind never reached the worker
    assert policy.queued() == ["e", "f", "g"]


def test_idle_workers_are_served_before_prefetch_offers() -> None:
    policy = make(batch_size=2, max_delay=10.0, workers=2)
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.IDLE)]
    policy.worker_prefetch("w0")
    for name in "bcde":
        policy.submit(name, 0.1)
    assert policy.poll(0.1) == [
        Dispatch("w1", ("b", "c"), Reason.FULL),
        Dispatch("w0", ("d", "e"), Reason.FULL),
    ]
    with pytest.raises(ValueError, match="not busy"):
        policy.worker_prefetch("w2")


def test_an_offer_ends_when_the_worker_changes_state() -> None:
    policy = make(batch_size=2, max_delay=10.0)
    policy.submit("a", 0.0)
    policy.poll(0.0)
    policy.worker_prefetch("w0")
    policy.worker_busy("w0")  # e.g. stopping: it no longer wants a batch behind
    for name in "bc":
        policy.submit(name, 0.1)
    assert policy.poll(0.1) == []


def test_partial_batch_waits_for_the_window_when_half_the_workers_are_busy() -> None:
    policy = make(batch_size=4, max_delay=0.5, workers=2)
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.IDLE)]
    policy.submit("b", 1.0)
    policy.submit("c", 1.2)
    assert policy.poll(1.2) == []
    assert policy.next_wakeup(1.2) == 1.5
    assert policy.poll(math.nextafter(1.5, 0.0)) == []
    assert policy.poll(1.5) == [Dispatch("w1", ("b", "c"), Reason.WINDOW)]


def test_batch_that_fills_before_the_window_goes_at_once() -> None:
    policy = make(batch_size=3, max_delay=0.5, workers=2)
    policy.worker_busy("w1")
    policy.submit("a", 0.0)
    policy.submit("b", 0.1)
    assert policy.poll(0.1) == []
    policy.submit("c", 0.2)
    assert policy.poll(0.2) == [Dispatch("w0", ("a", "b", "c"), Reason.FULL)]


def test_window_counts_from_submission_not_from_when_a_worker_returned() -> None:
    policy = make(batch_size=4, max_delay=0.5, workers=2)
    policy.worker_busy("w0")
    policy.worker_busy("w1")
    policy.submit("a", 0.0)
    assert policy.next_wakeup(0.0) is None
    policy.worker_idle("w0")  # one of two busy: not eager, but "a" has waited long enough
    assert policy.poll(2.0) == [Dispatch("w0", ("a",), Reason.WINDOW)]


def test_eager_while_idle_workers_outnumber_busy_ones() -> None:
    policy = make(batch_size=8, max_delay=1.0, workers=4)
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.IDLE)]  # 0 of 4 busy
    policy.submit("b", 0.0)
    assert policy.poll(0.0) == [Dispatch("w1", ("b",), Reason.IDLE)]  # 1 of 4 busy
    policy.submit("c", 0.0)
    assert policy.poll(0.0) == []  # 2 of 4 busy: wait for the window
    assert policy.poll(1.0) == [Dispatch("w2", ("c",), Reason.WINDOW)]
    policy.worker_idle("w0")
    policy.worker_idle("w1")  # 1 of 4 busy again
    policy.submit("d", 1.5)
    assert policy.poll(1.5) == [Dispatch("w3", ("d",), Reason.IDLE)]


def test_several_full_batches_go_to_the_workers_idle_longest_in_fifo_order() -> None:
    policy = make(batch_size=2, max_delay=1.0, workers=3)
    for name in "abcde":
        policy.submit(name, 0.0)
    assert policy.poll(0.0) == [
        Dispatch("w0", ("a", "b"), Reason.FULL),
        Dispatch("w1", ("c", "d"), Reason.FULL),
    ]
    # Two of three workers busy: the partial rest waits for its window.
    assert policy.poll(0.5) == []
    assert policy.poll(1.0) == [Dispatch("w2", ("e",), Reason.WINDOW)]


def test_cancel_removes_a_queued_item_only() -> None:
    policy = make(batch_size=4, workers=0)
    policy.submit("a", 0.0)
    policy.submit("b", 0.0)
    assert policy.cancel("a") is True
    assert policy.cancel("a") is False
    policy.worker_idle("w0")
    assert policy.poll(0.0) == [Dispatch("w0", ("b",), Reason.IDLE)]
    assert policy.cancel("b") is False  # dispatched: the driver cancels it with the worker


def test_item_expires_in_the_queue_while_every_worker_is_busy() -> None:
    policy = make(workers=1)
    policy.worker_busy("w0")
    policy.submit("a", 0.0, deadline=2.0)
    policy.submit("b", 0.0)
    wake = policy.next_wakeup(0.0)
    assert wake == math.nextafter(2.0, math.inf)  # the deadline itself is still in time
    assert policy.poll(2.0) == []
    assert policy.poll(wake) == [Expire(("a",))]
    policy.worker_idle("w0")
    assert policy.poll(3.0) == [Dispatch("w0", ("b",), Reason.IDLE)]


def test_item_is_dispatched_at_its_deadline_rather_than_expire_beside_an_idle_worker() -> None:
    policy = make(batch_size=4, max_delay=5.0, workers=2)
    policy.worker_busy("w1")
    policy.submit("a", 0.0)
    policy.submit("b", 0.5, deadline=1.0)
    assert policy.next_wakeup(0.5) == 1.0
    assert policy.poll(0.9) == []
    assert policy.poll(1.0) == [Dispatch("w0", ("a", "b"), Reason.DEADLINE)]


def test_already_expired_submission_is_reported_by_the_next_poll() -> None:
    policy = make(workers=1)
    policy.submit("late", 5.0, deadline=4.0)
    assert len(policy) == 0
    assert policy.next_wakeup(5.0) == 5.0
    assert policy.poll(5.0) == [Expire(("late",))]


def test_capacity_refuses_at_once_and_expired_items_free_their_place() -> None:
    policy = make(capacity=2, workers=0)
    policy.submit("a", 0.0, deadline=1.0)
    policy.submit("b", 0.0)
    with pytest.raises(QueueFull) as info:
        policy.submit("c", 0.5)
    assert info.value.capacity == 2
    policy.submit("c", 1.5)  # "a" expired at 1.0+: its place is free
    assert policy.queued() == ["b", "c"]
    assert policy.poll(1.5) == [Expire(("a",))]


def test_requeued_items_go_back_in_submission_order_with_their_original_times() -> None:
    policy = make(batch_size=2, max_delay=1.0, workers=2)
    for name in "abcd":
        policy.submit(name, float("abcd".index(name)) / 10)
    assert [d.items for d in policy.poll(0.3) if isinstance(d, Dispatch)] == [
        ("a", "b"),
        ("c", "d"),
    ]
    policy.submit("e", 0.4)
    policy.requeue("w1")  # c, d never reached w1
    policy.requeue("w0", ["b"])  # a was cancelled meanwhile
    assert policy.queued() == ["b", "c", "d", "e"]
    policy.worker_gone("w1")
    policy.worker_idle("w0")
    assert policy.poll(0.4) == [Dispatch("w0", ("b", "c"), Reason.FULL)]
    with pytest.raises(ValueError, match="no batch"):
        policy.requeue("w1")


def test_gone_worker_gets_nothing() -> None:
    policy = make(workers=2)
    policy.worker_gone("w0")
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w1", ("a",), Reason.IDLE)]
    assert (policy.idle_workers, policy.busy_workers) == (0, 1)


def test_batch_size_one_and_zero_delay() -> None:
    policy = make(batch_size=1, max_delay=0.0, workers=2)
    policy.worker_busy("w1")
    for name in "abc":
        policy.submit(name, 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.FULL)]
    policy = make(batch_size=4, max_delay=0.0, workers=2)
    policy.worker_busy("w1")
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.WINDOW)]


def test_drain_returns_everything_not_yet_decided() -> None:
    policy = make(workers=0)
    policy.submit("a", 0.0, deadline=0.5)
    policy.submit("b", 0.0)
    policy.submit("c", 1.0)  # "a" is now expired, not yet reported
    assert policy.drain() == ["a", "b", "c"]
    assert policy.poll(2.0) == []
    assert policy.next_wakeup(2.0) is None


def test_stale_deadline_entries_do_not_accumulate() -> None:
    policy = make(batch_size=1, workers=1)
    for i in range(10_000):
        policy.submit(str(i), float(i), deadline=1e9)
        (decision,) = policy.poll(float(i))
        assert isinstance(decision, Dispatch)
        policy.worker_idle("w0")
    assert len(policy._deadlines) <= 2 * len(policy) + 65


def test_deadlines_survive_heap_compaction() -> None:
    policy = make(capacity=1000, workers=1)
    policy.worker_busy("w0")
    for i in range(5):
        policy.submit(f"keep{i}", 0.0, deadline=100.0 + i)
    for i in range(500):  # cancelled items leave stale deadline entries behind
        policy.submit(f"churn{i}", 0.0, deadline=50.0)
        assert policy.cancel(f"churn{i}")
    assert policy.next_wakeup(0.0) == math.nextafter(100.0, math.inf)
    assert policy.poll(200.0) == [Expire(tuple(f"keep{i}" for i in range(5)))]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0, "max_delay": 0.1, "capacity": 1},
        {"batch_size": True, "max_delay": 0.1, "capacity": 1},
        {"batch_size": 1, "max_delay": -1.0, "capacity": 1},
        {"batch_size": 1, "max_delay": math.nan, "capacity": 1},
        {"batch_size": 1, "max_delay": math.inf, "capacity": 1},
        {"batch_size": 1, "max_delay": 0.1, "capacity": 0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        BatchPolicy(**kwargs)  # type: ignore[arg-type]


def test_misuse_is_refused() -> None:
    policy = make()
    policy.submit("a", 1.0)
    with pytest.raises(ValueError, match="already queued"):
        policy.submit("a", 1.0)
    with pytest.raises(ValueError, match="backwards"):
        policy.poll(0.5)
    with pytest.raises(ValueError, match="NaN"):
        policy.submit("b", 1.0, deadline=math.nan)
    with pytest.raises(ValueError, match="NaN"):
        policy.next_wakeup(math.nan)
    policy.poll(1.0)
    with pytest.raises(ValueError, match="not"):
        policy.requeue("w0", ["zzz"])


# -- continuous batching: take -----------------------------------------------------------------


def test_take_gives_the_oldest_items_at_once_whatever_the_window() -> None:
    policy = make(batch_size=4, max_delay=10.0, workers=2)
    policy.worker_busy("w1")  # half the workers busy: a partial batch would wait the window
    for name in "abc":
        policy.submit(name, 0.0)
    assert policy.poll(0.0) == []
    assert policy.take("w1", 2, 0.1) == ["a", "b"]  # room 2: two, oldest first
    assert policy.queued() == ["c"]
    assert policy.take("w1", 3, 0.2) == ["c"]  # all that is queued
    assert len(policy) == 0
    assert policy.poll(0.2) == []


def test_take_never_exceeds_the_batch_size() -> None:
    policy = make(batch_size=3, workers=0)
    policy.worker_busy("w0")
    for name in "abcde":
        policy.submit(name, 0.0)
    assert policy.take("w0", 10, 0.0) == ["a", "b", "c"]
    assert policy.queued() == ["d", "e"]


def test_an_idle_worker_that_takes_is_busy_even_with_nothing_to_take() -> None:
    policy = make(batch_size=4, max_delay=1.0, workers=2)
    assert policy.take("w0", 2, 0.0) == []  # empty queue
    assert (policy.idle_workers, policy.busy_workers) == (1, 1)
    assert policy.take("w1", 0, 0.0) == []  # room 0
    assert (policy.idle_workers, policy.busy_workers) == (0, 2)
    policy.submit("a", 0.5)
    assert policy.poll(0.5) == [] and policy.next_wakeup(0.5) is None  # nobody idle
    policy.worker_idle("w1")
    policy.worker_idle("w0")
    assert policy.poll(0.5) == [Dispatch("w1", ("a",), Reason.IDLE)]


def test_take_from_an_idle_worker_leaves_the_others_to_poll() -> None:
    policy = make(batch_size=2, max_delay=1.0, workers=2)
    for name in "abc":
        policy.submit(name, 0.0)
    assert policy.take("w0", 2, 0.0) == ["a", "b"]
    assert (policy.idle_workers, policy.busy_workers) == (1, 1)
    # w0 is busy now: "c" waits for the window of the one idle worker left.
    assert policy.poll(0.0) == []
    assert policy.poll(1.0) == [Dispatch("w1", ("c",), Reason.WINDOW)]


def test_take_withdraws_a_prefetch_offer() -> None:
    policy = make(batch_size=2, max_delay=1.0)
    policy.submit("a", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), Reason.IDLE)]
    policy.worker_prefetch("w0")
    assert policy.take("w0", 1, 0.1) == []
    for name in "bc":
        policy.submit(name, 0.2)
    assert policy.poll(0.2) == []  # a full batch, but the offer is gone
    assert policy.next_wakeup(0.2) is None


def test_requeue_after_a_take_puts_the_items_back_in_order() -> None:
    policy = make(batch_size=4, workers=0)
    policy.worker_busy("w0")
    for i, name in enumerate("abcde"):
        policy.submit(name, i / 10)
    assert policy.take("w0", 3, 0.5) == ["a", "b", "c"]
    policy.submit("f", 0.6)
    policy.requeue("w0", ["c", "a"])  # "b" was cancelled meanwhile
    assert policy.queued() == ["a", "c", "d", "e", "f"]
    assert policy.take("w0", 2, 0.7) == ["a", "c"]
    policy.requeue("w0")  # all of them by default
    assert policy.queued() == ["a", "c", "d", "e", "f"]
    with pytest.raises(ValueError, match="no batch"):
        policy.requeue("w0")


def test_take_leaves_items_past_their_deadline_for_poll_to_expire() -> None:
    policy = make(batch_size=4, workers=0)
    policy.worker_busy("w0")
    policy.submit("a", 0.0, deadline=1.0)
    policy.submit("b", 0.0)
    policy.submit("c", 0.0, deadline=1.0)
    assert policy.take("w0", 1, 1.0) == ["a"]  # the deadline itself is still in time
    assert policy.take("w0", 4, 2.0) == ["b"]
    assert len(policy) == 0 and policy.has_work
    assert policy.poll(2.0) == [Expire(("c",))]


@pytest.mark.parametrize("room", [-1, True, False, 1.0, "2", None])
def test_take_refuses_a_bad_room(room: object) -> None:
    policy = make(workers=1)
    policy.submit("a", 0.0)
    with pytest.raises(ValueError, match="room must be an integer >= 0"):
        policy.take("w0", room, 0.0)  # type: ignore[arg-type]
    assert (policy.idle_workers, policy.busy_workers) == (1, 0)  # nothing changed
    assert policy.queued() == ["a"]


def test_take_refuses_time_going_backwards() -> None:
    policy = make()
    policy.submit("a", 1.0)
    with pytest.raises(ValueError, match="backwards"):
        policy.take("w0", 1, 0.5)
    with pytest.raises(ValueError, match="NaN"):
        policy.take("w0", 1, math.nan)
    assert policy.queued() == ["a"]


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    workers=st.integers(1, 4),
    max_delay=st.floats(0.0, 1.0),
    arrivals=st.lists(st.tuples(st.floats(0.01, 10.0), st.floats(0.0, 1.0)), max_size=30),
)
def test_light_load_never_waits(
    workers: int, max_delay: float, arrivals: list[tuple[float, float]]
) -> None:
    """Each request arrives when the previous one is finished: all go at once, alone."""
    policy = make(batch_size=8, max_delay=max_delay, workers=workers)
    now = 0.0
    for i, (gap, service_share) in enumerate(arrivals):
        now += gap
        policy.submit(str(i), now)
        (decision,) = policy.poll(now)
        assert isinstance(decision, Dispatch)
        assert decision.items == (str(i),)
        assert decision.reason is Reason.IDLE
        now += gap * service_share * 0.99
        policy.worker_idle(decision.worker)


@settings(max_examples=100, deadline=None)
@given(
    workers=st.integers(1, 4),
    batch_size=st.integers(1, 6),
    max_delay=st.floats(0.0, 1.0),
    burst=st.integers(1, 40),
)
def test_a_burst_is_cut_into_full_batches_in_order(
    workers: int, batch_size: int, max_delay: float, burst: int
) -> None:
    policy: BatchPolicy[int, int] = BatchPolicy(
        batch_size=batch_size, max_delay=max_delay, capacity=burst
    )
    for worker in range(workers):
        policy.worker_idle(worker)
    for i in range(burst):
        policy.submit(i, 0.0)
    seen: list[int] = []
    now = 0.0
    while len(seen) < burst:
        decisions = policy.poll(now)
        for decision in decisions:
            assert isinstance(decision, Dispatch)
            assert 1 <= len(decision.items) <= batch_size
            seen.extend(decision.items)
            policy.worker_idle(decision.worker)
        now = policy.next_wakeup(now) or now
    assert seen == list(range(burst))


class St(enum.Enum):
    QUEUED = "queued"
    PENDING = "pending"  # past its deadline, not yet reported
    INFLIGHT = "inflight"
    DONE = "done"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    REJECTED = "rejected"


WORKERS = ["w0", "w1", "w2", "w3"]
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]) | st.floats(0.0, 3.0)
DEADLINES = st.none() | st.sampled_from([-0.5, 0.0, 0.25, 1.0, 3.0]) | st.floats(-1.0, 5.0)


class PolicyMachine(RuleBasedStateMachine):
    """Random interleavings of events at random times against a simple model.

    The model tracks what the policy must hold (queue in order, each item's state, each
    worker's state) and checks every decision: right item states (nothing lost, nothing
    twice), a prefix of the queue, size bound, only to the worker idle longest, the rule that
    applies, never an expired item; after every poll nothing is left due; and next_wakeup is
    exact (checked on copies of the policy) and never later than a window or a deadline.
    """

    def __init__(self) -> None:
        super().__init__()
        self.policy: BatchPolicy[int, str] = BatchPolicy(batch_size=1, max_delay=0, capacity=1)
        self.now = 0.0
        self.next_item = 0
        self.items: dict[int, tuple[float, float | None]] = {}  # submitted, deadline
        self.state: dict[int, St] = {}
        self.queue: list[int] = []
        self.idle: list[str] = []  # longest idle first
        self.busy: set[str] = set()
        self.prefetch: list[str] = []  # busy workers offering to take a full batch behind
        self.inflight: dict[str, list[int]] = {}  # every item each worker holds
        self.last: dict[str, list[int]] = {}  # the batch each worker got last (requeue)

    @initialize(
        batch_size=st.integers(1, 5),
        max_delay=st.sampled_from([0.0, 0.5, 1.0, 2.5]) | st.floats(0.0, 3.0),
        capacity=st.integers(1, 8),
        workers=st.integers(0, 3),
    )
    def setup(self, batch_size: int, max_delay: float, capacity: int, workers: int) -> None:
        self.batch_size, self.max_delay, self.capacity = batch_size, max_delay, capacity
        self.policy = BatchPolicy(batch_size=batch_size, max_delay=max_delay, capacity=capacity)
        for worker in WORKERS[:workers]:
            self.worker_idle(worker)

    # -- model helpers -------------------------------------------------------------------

    def deadline(self, item: int) -> float | None:
        return self.items[item][1]

    def model_expire(self, now: float) -> None:
        for item in list(self.queue):
            deadline = self.deadline(item)
            if deadline is not None and deadline < now:
                self.queue.remove(item)
                self.state[item] = St.PENDING

    def min_deadline(self) -> float | None:
        deadlines = [d for d in map(self.deadline, self.queue) if d is not None]
        return min(deadlines) if deadlines else None

    def expected_reason(self, now: float) -> Reason | None:
        if not (self.idle and self.queue):
            return None
        if len(self.queue) >= self.batch_size:
            return Reason.FULL
        if 2 * len(self.busy) < len(self.busy) + len(self.idle):
            return Reason.IDLE
        if self.items[self.queue[0]][0] + self.max_delay <= now:
            return Reason.WINDOW
        deadline = self.min_deadline()
        if deadline is not None and deadline <= now:
            return Reason.DEADLINE
        return None

    def finish(self, worker: str) -> None:
        for item in self.inflight.pop(worker, []):
            self.state[item] = St.DONE
        self.last.pop(worker, None)
        if worker in self.prefetch:
            self.prefetch.remove(worker)

    # -- the policy under test -----------------------------------------------------------

    def do_poll(self, now: float) -> list[object]:
        decisions = self.policy.poll(now)
        self.model_expire(now)
        pending = sorted(i for i, s in self.state.items() if s is St.PENDING)
        rest = list(decisions)
        if pending:
            assert rest and rest[0] == Expire(tuple(pending))
            rest.pop(0)
            event("expire")
            for item in pending:
                self.state[item] = St.EXPIRED
        for decision in rest:
            assert isinstance(decision, Dispatch), decision
            behind = not self.idle  # idle workers are served first, then prefetch offers
            if behind:
                assert decision.worker == self.prefetch[0], "not to the oldest prefetch offer"
                assert decision.reason is Reason.FULL
                event("dispatch behind")
            else:
                assert decision.reason is self.expected_reason(now)
                event(f"dispatch {decision.reason.value}")
                assert decision.worker == self.idle[0], "not to the worker idle longest"
            size = len(decision.items)
            assert 1 <= size <= self.batch_size
            assert size == (self.batch_size if behind else min(self.batch_size, len(self.queue)))
            assert list(decision.items) == self.queue[:size], "not FIFO"
            for item in decision.items:
                assert self.state[item] is St.QUEUED
                deadline = self.deadline(item)
                assert deadline is None or deadline >= now, "expired item dispatched"
                self.state[item] = St.INFLIGHT
            del self.queue[:size]
            if behind:
                self.prefetch.pop(0)
            else:
                self.idle.pop(0)
                self.busy.add(decision.worker)
            self.inflight.setdefault(decision.worker, []).extend(decision.items)
            self.last[decision.worker] = list(decision.items)
        # Nothing is left due: with an idle worker the queue is short, the workers are
        # mostly busy, the window is open and no deadline has come; no full batch waits
        # beside a prefetch offer.
        assert self.expected_reason(now) is None
        assert not (self.prefetch and len(self.queue) >= self.batch_size)
        assert all((d := self.deadline(i)) is None or d >= now for i in self.queue)
        return list(decisions)

    def check_wakeup(self) -> float | None:
        # has_work: while it is false no poll, now or ever (without new events), decides
        # anything, so the driver may skip waking for a worker's offer.
        if self.queue:
            assert self.policy.has_work
        if not self.policy.has_work:
            event("no work")
            assert copy.deepcopy(self.policy).poll(self.now + 1e9) == []
        wake = self.policy.next_wakeup(self.now)
        if wake is None:
            assert copy.deepcopy(self.policy).poll(self.now + 1e9) == []
        else:
            assert wake >= self.now
            assert copy.deepcopy(self.policy).poll(wake) != []
            if wake > self.now:
                before = math.nextafter(wake, -math.inf)
                assert copy.deepcopy(self.policy).poll(before) == []
        # Delay bound: never later than the window while a worker is idle, nor than a
        # deadline.
        if self.idle and self.queue:
            window = self.items[self.queue[0]][0] + self.max_delay
            assert wake is not None and wake <= max(self.now, window)
        deadline = self.min_deadline()
        if deadline is not None:
            assert wake is not None and wake <= max(self.now, math.nextafter(deadline, 1e300))
        return wake

    # -- rules ---------------------------------------------------------------------------

    @rule(offset=DEADLINES)
    def submit(self, offset: float | None) -> None:
        item = self.next_item
        self.next_item += 1
        deadline = None if offset is None else self.now + offset
        self.items[item] = (self.now, deadline)
        self.model_expire(self.now)
        if len(self.queue) >= self.capacity:
            with pytest.raises(QueueFull):
                self.policy.submit(item, self.now, deadline)
            event("queue full")
            self.state[item] = St.REJECTED
            return
        self.policy.submit(item, self.now, deadline)
        if deadline is not None and deadline < self.now:
            self.state[item] = St.PENDING
        else:
            self.state[item] = St.QUEUED
            self.queue.append(item)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        item = data.draw(st.integers(0, self.next_item), label="item")  # maybe never submitted
        expected = self.state.get(item) in (St.QUEUED, St.PENDING)
        assert self.policy.cancel(item) is expected
        if expected:
            if item in self.queue:
                self.queue.remove(item)
            self.state[item] = St.CANCELLED

    @rule(worker=st.sampled_from(WORKERS))
    def worker_idle(self, worker: str) -> None:
        self.policy.worker_idle(worker)
        self.finish(worker)
        self.busy.discard(worker)
        if worker not in self.idle:
            self.idle.append(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def worker_busy(self, worker: str) -> None:
        self.policy.worker_busy(worker)
        if worker in self.idle:
            self.idle.remove(worker)
        if worker in self.prefetch:
            self.prefetch.remove(worker)
        self.busy.add(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def worker_prefetch(self, worker: str) -> None:
        if worker not in self.busy:
            with pytest.raises(ValueError, match="not busy"):
                self.policy.worker_prefetch(worker)
            return
        self.policy.worker_prefetch(worker)
        event("prefetch offered")
        if worker not in self.prefetch:
            self.prefetch.append(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def worker_gone(self, worker: str) -> None:
        self.policy.worker_gone(worker)
        self.finish(worker)
        self.busy.discard(worker)
        if worker in self.idle:
            self.idle.remove(worker)

    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(WORKERS), label="worker")
        if worker not in self.last:
            with pytest.raises(ValueError, match="no batch"):
                self.policy.requeue(worker)
            return
        batch = self.last.pop(worker)
        chosen = data.draw(
            st.none()
            | st.permutations(batch).flatmap(
                lambda items: st.integers(0, len(items)).map(lambda n: items[:n])
            )
        )
        self.policy.requeue(worker, chosen)
        event("requeue")
        back = batch if chosen is None else chosen
        for item in batch:
            self.state[item] = St.QUEUED if item in back else St.DONE
            self.inflight[worker].remove(item)
        if not self.inflight[worker]:
            del self.inflight[worker]
        self.queue = sorted(self.queue + list(back))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def take(self, worker: str, data: st.DataObject) -> None:
        """Continuous batching: ``worker`` starts a step with ``room`` free slots."""
        room = data.draw(st.integers(0, self.batch_size + 1), label="room")
        got = self.policy.take(worker, room, self.now)
        self.model_expire(self.now)
        size = min(room, self.batch_size, len(self.queue))
        assert got == self.queue[:size], "not the oldest queued items, up to room"
        for item in got:
            assert self.state[item] is St.QUEUED
            deadline = self.deadline(item)
            assert deadline is None or deadline >= self.now, "expired item taken"
            self.state[item] = St.INFLIGHT
        del self.queue[:size]
        if worker in self.idle:
            self.idle.remove(worker)
        if worker in self.prefetch:
            self.prefetch.remove(worker)
        self.busy.add(worker)
        if got:
            self.inflight.setdefault(worker, []).extend(got)
            self.last[worker] = list(got)
        event(f"take {min(len(got), 2)}")

    @rule()
    def poll(self) -> None:
        self.do_poll(self.now)

    @rule(step=STEPS)
    def advance(self, step: float) -> None:
        """A faithful driver: poll at every wake-up until ``now + step``."""
        target = self.now + step
        for _ in range(1000):
            wake = self.check_wakeup()
            if wake is None or wake > target:
                break
            self.now = wake
            self.do_poll(self.now)
        else:
            raise AssertionError("next_wakeup made no progress")
        self.now = target
        assert self.do_poll(self.now) == [], "a wake-up was missed"

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def policy_matches_model(self) -> None:
        assert self.policy.queued() == self.queue
        assert len(self.policy) == len(self.queue)
        assert self.policy.idle_workers == len(self.idle)
        assert self.policy.busy_workers == len(self.busy)
        # Every item is in exactly one place.
        for item, state in self.state.items():
            assert (item in self.queue) == (state is St.QUEUED)
            in_flight = any(item in batch for batch in self.inflight.values())
            assert in_flight == (state is St.INFLIGHT)

    @invariant()
    def wakeup_is_exact(self) -> None:
        self.check_wakeup()

    def teardown(self) -> None:
        """Eventually everything accepted is dispatched, cancelled or expired."""
        if not self.idle and not self.busy:
            self.worker_idle("w0")
        for _ in range(1000):
            if not self.queue and St.PENDING not in self.state.values():
                break
            for worker in sorted(self.busy):
                self.worker_idle(worker)
            self.advance(1e6)
        assert not self.queue
        assert set(self.state.values()) <= {
            St.INFLIGHT,
            St.DONE,
            St.CANCELLED,
            St.EXPIRED,
            St.REJECTED,
        }
        assert len(self.state) == self.next_item


PolicyMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_policy_state_machine = PolicyMachine.TestCase
