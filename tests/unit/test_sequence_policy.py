"""The sans-IO sequence batching policy: one example per rule, then a model-based stateful
test over random interleavings of events at random times."""

from __future__ import annotations

import copy
import enum
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from trioserve.core.model_settings import RegisterOptions, ServerDefaults, YamlSettings, decide
from trioserve.core.sequence_decisions import ClosedIds, ExpiryTimers
from trioserve.core.sequences import (
    CloseReason,
    Dispatch,
    Expired,
    SequenceClosed,
    SequenceError,
    SequencePolicy,
    SequenceQueueFull,
    TooManySequences,
)


def make(
    *,
    batch_size: int = 2,
    max_sequences: int = 4,
    max_queue: int = 10,
    idle: float | None = None,
    lifetime: float | None = None,
    closed_capacity: int = 10_000,
    workers: int = 1,
) -> SequencePolicy[str, str]:
    policy: SequencePolicy[str, str] = SequencePolicy(
        batch_size=batch_size,
        max_sequences=max_sequences,
        max_queue_per_sequence=max_queue,
        idle_timeout=idle,
        lifetime=lifetime,
        closed_capacity=closed_capacity,
    )
    for i in range(workers):
        policy.worker_idle(f"w{i}", 0.0)
    return policy


def start(policy: SequencePolicy[str, str], sid: str, *items: str, now: float = 0.0) -> None:
    policy.open(sid, now)
    for item in items:
        policy.submit(sid, item, now)


# -- opening -------------------------------------------------------------------------------


def test_open_without_an_id_mints_one_and_the_id_then_joins_it() -> None:
    policy = make()
    sid, new = policy.open(None, 0.0)
    assert new and sid.startswith("ts-seq-") and len(sid) == len("ts-seq-") + 36
    assert policy.open(sid, 1.0) == (sid, False)
    assert policy.open_count == 1 and policy.is_open(sid)
    other, _ = policy.open(None, 1.0)
    assert other != sid


def test_a_never_seen_client_id_opens_a_sequence_with_that_id() -> None:
    policy = make()
    assert policy.open("abc", 0.0) == ("abc", True)
    assert policy.open("abc", 0.0) == ("abc", False)
    with pytest.raises(ValueError, match="empty"):
        policy.open("", 0.0)


def test_too_many_sequences_names_the_limit_and_a_closed_slot_is_free_at_once() -> None:
    policy = make(max_sequences=2)
    policy.open("a", 0.0)
    policy.open("b", 0.0)
    assert policy.open("a", 0.0) == ("a", False)  # joining needs no slot
    with pytest.raises(TooManySequences, match=r"maxNumSequence is 2") as error:
        policy.open("c", 0.0)
    assert error.value.limit == 2 and "end a sequence" in str(error.value)
    with pytest.raises(TooManySequences):
        policy.open(None, 0.0)
    assert policy.end("a", 0.0) == []
    assert policy.open("c", 0.0) == ("c", True)
    assert policy.open_count == 2


def test_a_closed_id_is_refused_saying_why_it_closed() -> None:
    policy = make()
    policy.open("abc", 0.0)
    policy.end("abc", 1.0)
    for call in (lambda: policy.open("abc", 2.0), lambda: policy.submit("abc", "x", 2.0)):
        with pytest.raises(SequenceClosed) as error:
            call()
        assert error.value.sequence_id == "abc" and error.value.reason is CloseReason.ENDED
        assert str(error.value) == (
            'Sequence "abc" is closed (ended by its handler or client); start a new sequence '
            "without the ts_request_sequence_id header."
        )
    assert policy.open_count == 0


def test_submit_to_a_never_opened_id_is_refused() -> None:
    policy = make()
    with pytest.raises(SequenceClosed, match=r'"nope" is not open') as error:
        policy.submit("nope", "x", 0.0)
    assert error.value.reason is None
    assert isinstance(error.value, SequenceError)


def test_the_header_named_in_messages_is_configurable() -> None:
    policy: SequencePolicy[str, str] = SequencePolicy(
        batch_size=1, max_sequences=1, max_queue_per_sequence=1, id_header="x-seq"
    )
    assert "without the x-seq header" in str(policy.closed_error("a"))


# -- queueing and dispatch -----------------------------------------------------------------


def test_a_full_sequence_queue_names_max_sequence_job_queue_size() -> None:
    policy = make(max_queue=2, workers=0)
    start(policy, "s", "a", "b")
    with pytest.raises(SequenceQueueFull, match=r"maxSequenceJobQueueSize is 2") as error:
        policy.submit("s", "c", 0.0)
    assert error.value.sequence_id == "s" and error.value.limit == 2
    assert policy.queued("s") == ["a", "b"]
    with pytest.raises(ValueError, match="already queued"):
        policy.submit("s", "a", 0.0)


def test_one_request_of_a_sequence_in_flight_at_a_time_in_order() -> None:
    policy = make(batch_size=4, workers=2)
    start(policy, "s", "a", "b", "c")
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), ("s",))]
    policy.worker_idle("w0", 0.5)  # idle before the answer is read: still one in flight
    assert policy.poll(0.5) == []
    assert policy.next_wakeup(0.5) is None
    policy.done("s", 1.0)
    assert policy.next_wakeup(1.0) == 1.0
    assert policy.poll(1.0) == [Dispatch("w0", ("b",), ("s",))]  # its worker, not w1
    policy.done("s", 2.0)
    policy.worker_idle("w0", 2.0)
    assert policy.poll(2.0) == [Dispatch("w0", ("c",), ("s",))]
    policy.open("t", 2.0)
    with pytest.raises(ValueError, match="no request in flight"):
        policy.done("t", 2.0)


def test_a_batch_takes_the_heads_of_different_sequences_oldest_ready_first() -> None:
    policy = make(batch_size=2, workers=0)
    start(policy, "a", "a1", "a2")
    start(policy, "b", "b1")
    start(policy, "c", "c1")
    policy.worker_idle("w0", 0.0)
    assert policy.poll(0.0) == [Dispatch("w0", ("a1", "b1"), ("a", "b"))]
    policy.done("a", 1.0)  # a is ready again, behind c
    policy.done("b", 1.0)
    policy.worker_idle("w0", 1.0)
    assert policy.poll(1.0) == [Dispatch("w0", ("c1", "a2"), ("c", "a"))]


def test_ready_sequences_take_turns_so_a_busy_one_cannot_starve_another() -> None:
    policy = make(batch_size=1)
    start(policy, "a", "a1", "a2", "a3")
    assert policy.poll(0.0) == [Dispatch("w0", ("a1",), ("a",))]
    start(policy, "b", "b1", now=0.5)  # ready while a1 runs: ahead of a2
    for now, (answered, item, sid) in enumerate(
        [("a", "b1", "b"), ("b", "a2", "a"), ("a", "a3", "a")], start=1
    ):
        policy.done(answered, float(now))
        policy.worker_idle("w0", float(now))
        assert policy.poll(float(now)) == [Dispatch("w0", (item,), (sid,))]


def test_a_worker_takes_at_most_batch_size_while_another_idle_worker_waits() -> None:
    policy = make(batch_size=1)
    start(policy, "a", "a1", "a2")
    start(policy, "b", "b1", "b2")
    assert policy.poll(0.0) == [Dispatch("w0", ("a1",), ("a",))]
    policy.done("a", 1.0)
    policy.worker_idle("w0", 1.0)
    assert policy.poll(1.0) == [Dispatch("w0", ("b1",), ("b",))]  # b was ready first
    policy.done("b", 2.0)
    policy.worker_idle("w0", 2.0)
    policy.worker_idle("w1", 2.0)  # a and b both live on w0
    assert policy.poll(2.0) == [Dispatch("w0", ("a2",), ("a",))]
    assert policy.pinned("w1") == 0 and policy.queued("b") == ["b2"]


def test_no_worker_no_dispatch_and_a_busy_worker_takes_nothing() -> None:
    policy = make(workers=0)
    start(policy, "a", "a1")
    assert policy.has_work
    assert policy.poll(0.0) == [] and policy.next_wakeup(0.0) is None
    policy.worker_busy("w0", 0.0)
    assert policy.poll(0.0) == []
    policy.worker_idle("w0", 1.0)
    assert policy.poll(1.0) == [Dispatch("w0", ("a1",), ("a",))]
    assert not policy.has_work


# -- pinning -------------------------------------------------------------------------------


def test_a_sequence_is_pinned_to_the_worker_with_fewest_pinned_ties_to_idle_first() -> None:
    policy = make(batch_size=4, workers=0)
    policy.worker_idle("w1", 0.0)
    policy.worker_idle("w0", 0.0)  # w1 has been idle longer
    start(policy, "a", "a1")
    start(policy, "b", "b1")
    start(policy, "c", "c1")
    decisions = policy.poll(0.0)
    assert decisions == [
        Dispatch("w1", ("a1", "c1"), ("a", "c")),
        Dispatch("w0", ("b1",), ("b",)),
    ]
    assert (policy.pinned("w1"), policy.pinned("w0")) == (2, 1)
    assert policy.worker_of("c") == "w1" and policy.worker_of("zzz") is None


def test_a_pinned_sequence_waits_for_its_worker_while_another_is_idle() -> None:
    policy = make(batch_size=4, workers=2)
    start(policy, "a", "a1", "a2")
    assert policy.poll(0.0) == [Dispatch("w0", ("a1",), ("a",))]
    policy.done("a", 1.0)
    assert policy.poll(1.0) == []  # w1 is idle, but a lives on w0
    policy.worker_idle("w0", 2.0)
    assert policy.poll(2.0) == [Dispatch("w0", ("a2",), ("a",))]


def test_a_new_sequence_waits_for_its_least_loaded_worker_when_it_is_busy() -> None:
    policy = make(batch_size=4, workers=2)
    start(policy, "a", "a1")
    start(policy, "b", "b1")
    assert len(policy.poll(0.0)) == 2  # a on w0, b on w1
    policy.end("b", 0.0)  # w1 now has no sequence, but is busy
    policy.done("a", 0.0)
    policy.worker_idle("w0", 0.0)
    start(policy, "c", "c1")
    assert policy.poll(0.0) == []  # w0 idle with 1 pinned; w1 busy with 0: c waits for w1
    policy.worker_idle("w1", 1.0)
    assert policy.poll(1.0) == [Dispatch("w1", ("c1",), ("c",))]


def test_a_gone_worker_closes_its_sequences_and_hands_back_their_queued_items() -> None:
    policy = make(batch_size=4, workers=2)
    start(policy, "a", "a1", "a2", "a3")
    start(policy, "b", "b1")
    policy.poll(0.0)
    assert policy.worker_of("a") == "w0"
    closed = policy.worker_gone("w0", 1.0)
    assert [(c.sequence_id, c.items, c.reason) for c in closed] == [
        ("a", ("a2", "a3"), CloseReason.WORKER_FAILED)
    ]
    assert "its worker failed" in closed[0].message
    assert policy.open_count == 1 and policy.pinned("w0") == 0 and policy.pinned("w1") == 1
    with pytest.raises(SequenceClosed, match="its worker failed"):
        policy.submit("a", "a4", 2.0)
    policy.done("a", 2.0)  # the answer of a1 arrives late: ignored
    assert policy.sequence_of("a2") is None and policy.sequence_of("b1") is None


# -- closing -------------------------------------------------------------------------------


def test_an_idle_sequence_expires_at_its_idle_timeout_exactly() -> None:
    policy = make(idle=30.0)
    start(policy, "abc", "x", now=10.0)
    assert policy.poll(10.0) == [Dispatch("w0", ("x",), ("abc",))]
    assert policy.next_wakeup(10.0) is None  # busy: no idle clock
    policy.done("abc", 15.0)
    policy.worker_idle("w0", 15.0)
    assert policy.next_wakeup(15.0) == 45.0
    assert policy.poll(math.nextafter(45.0, 0.0)) == []
    [expired] = policy.poll(45.0)
    message = (
        'Sequence "abc" is closed (idle for more than 30 s, sequenceMaxIdleMSec); start a new '
        "sequence without the ts_request_sequence_id header."
    )
    assert expired == Expired("abc", (), message, CloseReason.IDLE)
    assert policy.open_count == 0 and policy.next_wakeup(45.0) is None
    with pytest.raises(SequenceClosed, match=r"idle for more than 30 s"):
        policy.open("abc", 46.0)


def test_a_new_request_restarts_the_idle_clock() -> None:
    policy = make(idle=5.0)
    policy.open("a", 0.0)
    assert policy.next_wakeup(0.0) == 5.0
    policy.submit("a", "a1", 4.0)
    policy.poll(4.0)
    policy.done("a", 6.0)
    assert policy.next_wakeup(6.0) == 11.0
    assert policy.poll(10.0) == []


def test_a_cancelled_last_request_leaves_the_sequence_idle_from_then() -> None:
    policy = make(idle=5.0, workers=0)
    start(policy, "a", "a1", "a2")
    assert policy.cancel("a1", 1.0) and not policy.cancel("a1", 1.0)
    assert policy.next_wakeup(1.0) is None
    assert policy.cancel("a2", 2.0)
    assert policy.next_wakeup(2.0) == 7.0
    assert not policy.cancel("never")


def test_a_sequence_older_than_its_lifetime_expires_its_queue_and_its_in_flight_finishes() -> None:
    policy = make(lifetime=60.0, idle=1000.0)
    start(policy, "s", "a", "b", "c")
    policy.poll(0.0)
    assert policy.next_wakeup(0.0) == 60.0
    [expired] = policy.poll(60.0)
    assert (expired.items, expired.reason) == (("b", "c"), CloseReason.LIFETIME)
    assert "older than 60 s, sequenceTimeoutMSec" in expired.message
    assert policy.open_count == 0 and policy.pinned("w0") == 0
    policy.done("s", 61.0)  # the in-flight "a" finishes; nothing more is sent
    policy.worker_idle("w0", 61.0)
    assert policy.poll(61.0) == []


def test_an_expiry_found_by_another_call_frees_the_slot_and_poll_reports_it() -> None:
    policy = make(max_sequences=1, lifetime=10.0, workers=0)
    start(policy, "a", "a1")
    assert policy.open("b", 10.0) == ("b", True)  # a expired at 10.0 exactly
    with pytest.raises(SequenceClosed, match="older than 10 s"):
        policy.submit("a", "a2", 10.0)
    assert policy.cancel("a1") is True  # still cancellable until reported
    assert policy.poll(10.0) == [
        Expired("a", (), policy.closed_error("a").args[0], CloseReason.LIFETIME)
    ]


def test_end_hands_back_queued_items_and_the_in_flight_one_finishes() -> None:
    policy = make()
    start(policy, "s", "a", "b", "c")
    policy.poll(0.0)
    assert policy.end("s", 1.0) == ["b", "c"]
    assert policy.end("s", 1.0) == [] and policy.end("never", 1.0) == []
    assert not policy.cancel("b")
    policy.done("s", 2.0)
    assert policy.open_count == 0


def test_closed_ids_are_remembered_up_to_a_bound_oldest_forgotten_first() -> None:
    policy = make(closed_capacity=2)
    for sid in ("a", "b", "c"):
        policy.open(sid, 0.0)
        policy.end(sid, 0.0)
    assert policy.open("a", 1.0) == ("a", True)  # forgotten: opens anew
    for sid in ("b", "c"):
        with pytest.raises(SequenceClosed):
            policy.open(sid, 1.0)
    memory = ClosedIds(0)
    memory.add("x", CloseReason.ENDED)
    assert "x" not in memory and len(memory) == 0


# -- continuous batching: park, stream_done, take ------------------------------------------


def test_a_parked_request_lets_its_sequences_next_request_join_the_running_batch() -> None:
    policy = make(batch_size=2)
    start(policy, "s", "a", "b")
    assert policy.poll(0.0) == [Dispatch("w0", ("a",), ("s",))]
    assert policy.take("w0", 1, 0.5) is None  # "a" is in flight: "b" waits
    policy.park("s", 1.0)  # "a" answered "more to come": it goes on, "b" may go
    assert policy.has_work
    assert policy.take("w0", 1, 1.0) == Dispatch("w0", ("b",), ("s",))
    # "a" (parked) and "b" both run; the next one waits for "b".
    policy.submit("s", "c", 1.5)
    assert policy.take("w0", 1, 1.5) is None
    policy.done("s", 2.0)  # "b" answered, "a" still parked
    assert policy.take("w0", 1, 2.0) == Dispatch("w0", ("c",), ("s",))


def test_with_batch_size_1_a_cancel_joins_its_sequences_running_stream() -> None:
    # TorchServe's sequence continuous batching test config: batchSize 1, two workers,
    # maxNumSequence 2. A step holds up to batch_capacity requests, the running ones
    # counted (the supervisor's room is batch_capacity - running).
    yaml = YamlSettings(
        batch_size=1, min_workers=2, max_workers=2, max_num_sequence=2,
        sequence_batching=True, continuous_batching=True,
    )  # fmt: skip
    settings = decide(
        name="m", version="1.0", handler="h.py", runtime="python",
        options=RegisterOptions(url="m.mar"), yaml=yaml,
        defaults=ServerDefaults(default_workers=1, job_queue_size=10, response_timeout=120,
                                startup_timeout=120),
    )  # fmt: skip
    assert settings.sequence is not None and settings.sequence.max_sequences == 2
    policy = make(batch_size=settings.batch_capacity, max_sequences=2, workers=2)
    start(policy, "s", "open")
    assert policy.poll(0.0) == [Dispatch("w0", ("open",), ("s",))]
    policy.done("s", 0.5)
    policy.worker_idle("w0", 0.5)
    policy.submit("s", "stream", 1.0)
    assert policy.poll(1.0) == [Dispatch("w0", ("stream",), ("s",))]
    policy.park("s", 2.0)  # its first chunk: the client sends the cancel
    policy.submit("s", "cancel", 2.5)
    running = 1
    room = settings.batch_capacity - running
    assert policy.take("w0", room, 3.0) == Dispatch("w0", ("cancel",), ("s",))
    # The stream and the cancel fill w0's step; a new sequence goes to the idle w1.
    start(policy, "t", "t1", now=3.5)
    assert policy.take("w0", settings.batch_capacity - 2, 4.0) is None
    assert policy.poll(4.0) == [Dispatch("w1", ("t1",), ("t",))]


def test_a_parked_sequence_gets_its_next_request_through_poll_too() -> None:
    policy = make(batch_size=2)
    start(policy, "s", "a")
    policy.poll(0.0)
    policy.park("s", 1.0)
    policy.submit("s", "b", 1.5)  # queued after the park: ready at once
    assert policy.next_wakeup(1.5) is None  # w0 is busy
    policy.worker_idle("w0", 2.0)
    assert policy.next_wakeup(2.0) == 2.0
    assert policy.poll(2.0) == [Dispatch("w0", ("b",), ("s",))]


def test_a_sequence_does_not_idle_while_it_has_a_parked_request() -> None:
    policy = make(idle=5.0)
    start(policy, "s", "a")
    policy.poll(0.0)
    policy.park("s", 1.0)
    assert policy.next_wakeup(1.0) is None  # no idle clock while it streams
    assert policy.poll(100.0) == [] and policy.is_open("s")
    policy.stream_done("s", 100.0)  # nothing queued or in flight: idle from now
    assert policy.next_wakeup(100.0) == 105.0
    assert policy.poll(math.nextafter(105.0, 0.0)) == []
    [expired] = policy.poll(105.0)
    assert isinstance(expired, Expired)
    assert (expired.sequence_id, expired.items, expired.reason) == ("s", (), CloseReason.IDLE)


def test_a_sequence_idles_only_once_every_request_has_ended() -> None:
    policy = make(idle=5.0, batch_size=2)
    start(policy, "s", "a", "b")
    policy.poll(0.0)
    policy.park("s", 1.0)
    assert policy.take("w0", 1, 1.0) == Dispatch("w0", ("b",), ("s",))
    policy.park("s", 2.0)  # two parked streams
    policy.submit("s", "c", 3.0)
    assert policy.cancel("c", 4.0)  # nothing queued, but streams still run
    assert policy.next_wakeup(4.0) is None
    policy.stream_done("s", 10.0)
    assert policy.next_wakeup(10.0) is None
    policy.stream_done("s", 20.0)
    assert policy.next_wakeup(20.0) == 25.0
    assert policy.is_open("s")


def test_a_request_answered_while_another_is_parked_does_not_idle_the_sequence() -> None:
    policy = make(idle=5.0, batch_size=2)
    start(policy, "s", "a", "b")
    policy.poll(0.0)
    policy.park("s", 1.0)
    policy.take("w0", 1, 1.0)
    policy.done("s", 2.0)  # "b" answered; "a" still streams
    assert policy.next_wakeup(2.0) is None
    assert policy.poll(50.0) == [] and policy.is_open("s")
    policy.stream_done("s", 50.0)
    assert policy.next_wakeup(50.0) == 55.0


def test_stream_done_with_a_request_in_flight_leaves_the_sequence_busy() -> None:
    policy = make(idle=5.0, batch_size=2)
    start(policy, "s", "a", "b")
    policy.poll(0.0)
    policy.park("s", 1.0)
    policy.take("w0", 1, 1.0)
    policy.stream_done("s", 2.0)  # "a" ended; "b" still in flight
    assert policy.next_wakeup(2.0) is None
    policy.done("s", 3.0)
    assert policy.next_wakeup(3.0) == 8.0


def test_a_parked_sequence_still_closes_at_its_lifetime() -> None:
    policy = make(lifetime=10.0, idle=1000.0)
    start(policy, "s", "a", "b", "c")
    policy.poll(0.0)
    policy.park("s", 1.0)
    [expired] = policy.poll(10.0)
    assert isinstance(expired, Expired)
    assert (expired.items, expired.reason) == (("b", "c"), CloseReason.LIFETIME)
    policy.stream_done("s", 11.0)  # its stream ends later: ignored
    assert policy.open_count == 0


def test_park_and_stream_done_are_refused_out_of_turn_and_ignored_once_closed() -> None:
    policy = make()
    start(policy, "s", "a")
    policy.open("t", 0.0)
    with pytest.raises(ValueError, match="no request in flight"):
        policy.park("t", 0.0)
    with pytest.raises(ValueError, match="no parked request"):
        policy.stream_done("t", 0.0)
    policy.poll(0.0)
    with pytest.raises(ValueError, match="no parked request"):
        policy.stream_done("s", 0.0)  # in flight is not parked
    policy.park("s", 1.0)
    with pytest.raises(ValueError, match="no request in flight"):
        policy.park("s", 1.0)  # parked already; nothing else in flight
    with pytest.raises(ValueError, match="no request in flight"):
        policy.done("s", 1.0)
    policy.stream_done("s", 2.0)
    with pytest.raises(ValueError, match="no parked request"):
        policy.stream_done("s", 2.0)
    assert policy.end("s", 3.0) == []
    policy.park("s", 3.0)  # closed: both ignored
    policy.stream_done("s", 3.0)
    policy.park("never", 3.0)
    policy.stream_done("never", 3.0)
    assert policy.open_ids() == ["t"]


def test_take_gives_up_to_room_heads_of_its_ready_sequences_oldest_ready_first() -> None:
    policy = make(batch_size=4)
    start(policy, "a", "a1", "a2", "a3")
    start(policy, "b", "b1", "b2")
    start(policy, "c", "c1", "c2")
    assert policy.poll(0.0) == [Dispatch("w0", ("a1", "b1", "c1"), ("a", "b", "c"))]
    for sid in ("c", "a", "b"):
        policy.park(sid, 1.0)
    assert policy.take("w0", 2, 1.0) == Dispatch("w0", ("c2", "a2"), ("c", "a"))
    # One per sequence: "a3" waits for "a2".
    assert policy.take("w0", 4, 1.0) == Dispatch("w0", ("b2",), ("b",))
    assert policy.take("w0", 4, 1.0) is None
    policy.park("a", 2.0)
    assert policy.take("w0", 4, 2.0) == Dispatch("w0", ("a3",), ("a",))


def test_take_never_gives_a_sequence_pinned_to_another_worker() -> None:
    policy = make(batch_size=4, workers=2)
    start(policy, "a", "a1", "a2")
    start(policy, "b", "b1", "b2")
    assert policy.poll(0.0) == [
        Dispatch("w0", ("a1",), ("a",)),
        Dispatch("w1", ("b1",), ("b",)),
    ]
    policy.park("a", 1.0)
    policy.park("b", 1.0)
    assert policy.take("w0", 4, 1.0) == Dispatch("w0", ("a2",), ("a",))
    assert policy.take("w0", 4, 1.0) is None  # "b2" is ready, but lives on w1
    assert policy.queued("b") == ["b2"]
    assert policy.take("w1", 4, 1.0) == Dispatch("w1", ("b2",), ("b",))


def test_take_pins_a_new_sequence_only_to_a_least_loaded_worker() -> None:
    policy = make(batch_size=4, workers=2)
    start(policy, "a", "a1")
    start(policy, "b", "b1")
    policy.poll(0.0)  # a on w0, b on w1: one pin each
    start(policy, "c", "c1", now=1.0)
    # A tie: the worker that takes wins it (it has room now).
    assert policy.take("w1", 2, 1.0) == Dispatch("w1", ("c1",), ("c",))
    assert (policy.pinned("w0"), policy.pinned("w1")) == (1, 2)
    start(policy, "d", "d1", now=2.0)
    assert policy.take("w1", 2, 2.0) is None  # w0 has fewer: "d" waits for it
    assert policy.worker_of("d") is None and policy.has_work
    assert policy.take("w0", 2, 2.0) == Dispatch("w0", ("d1",), ("d",))
    assert policy.worker_of("d") == "w0"


def test_take_counts_the_pins_it_makes_while_it_fills() -> None:
    policy = make(batch_size=4, workers=0)
    policy.worker_busy("w0", 0.0)
    policy.worker_busy("w1", 0.0)
    for sid in ("a", "b", "c"):
        start(policy, sid, f"{sid}1")
    # w0 takes "a" (a tie it wins), then w1 has fewer pins: "b" and "c" wait for w1.
    assert policy.take("w0", 3, 0.0) == Dispatch("w0", ("a1",), ("a",))
    assert policy.take("w1", 3, 0.0) == Dispatch("w1", ("b1", "c1"), ("b", "c"))


def test_a_worker_that_takes_is_busy_and_out_of_polls_plan() -> None:
    policy = make(batch_size=4)
    start(policy, "a", "a1")
    start(policy, "b", "b1")
    assert policy.next_wakeup(0.0) == 0.0  # w0 is idle with work ready
    assert policy.take("w0", 1, 0.0) == Dispatch("w0", ("a1",), ("a",))
    assert policy.poll(0.0) == []  # "b1" is ready for w0, but w0 is busy
    assert policy.next_wakeup(0.0) is None
    policy.worker_idle("w0", 1.0)
    assert policy.poll(1.0) == [Dispatch("w0", ("b1",), ("b",))]


def test_take_with_no_room_or_nothing_ready_gives_none_and_the_worker_is_busy() -> None:
    policy = make(batch_size=4)
    start(policy, "a", "a1")
    assert policy.take("w0", 0, 0.0) is None  # room 0
    assert policy.poll(0.0) == [] and policy.queued("a") == ["a1"]
    policy.worker_idle("w0", 1.0)
    policy.end("a", 1.0)
    assert policy.take("w0", 4, 1.0) is None  # nothing ready
    start(policy, "b", "b1", now=2.0)
    assert policy.poll(2.0) == [] and policy.next_wakeup(2.0) is None  # w0 is busy
    assert policy.take("w0", 4, 2.0) == Dispatch("w0", ("b1",), ("b",))


@pytest.mark.parametrize("room", [-1, True, 1.0, "2", None])
def test_take_refuses_a_bad_room(room: object) -> None:
    policy = make()
    start(policy, "a", "a1")
    with pytest.raises(ValueError, match="room must be an integer >= 0"):
        policy.take("w0", room, 0.0)  # type: ignore[arg-type]
    assert policy.queued("a") == ["a1"] and policy.worker_of("a") is None


def test_take_refuses_time_going_backwards() -> None:
    policy = make()
    policy.open("a", 5.0)
    with pytest.raises(ValueError, match="backwards"):
        policy.take("w0", 1, 4.0)


# -- arguments and time --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("batch_size", 0),
        ("batch_size", True),
        ("max_sequences", 0),
        ("max_queue_per_sequence", 0),
        ("idle_timeout", 0),
        ("idle_timeout", math.inf),
        ("lifetime", -1.0),
        ("lifetime", math.nan),
        ("closed_capacity", -1),
    ],
)
def test_arguments_are_checked(name: str, value: object) -> None:
    kwargs: dict[str, object] = {
        "batch_size": 1,
        "max_sequences": 1,
        "max_queue_per_sequence": 1,
        name: value,
    }
    with pytest.raises(ValueError, match=name):
        SequencePolicy(**kwargs)


def test_time_must_not_go_backwards() -> None:
    policy = make()
    policy.open("a", 5.0)
    with pytest.raises(ValueError, match="backwards"):
        policy.poll(4.0)
    with pytest.raises(ValueError, match="NaN"):
        policy.poll(math.nan)


def test_expiry_timers_drop_stale_timers_and_stay_small() -> None:
    live: set[str] = set()
    timers: ExpiryTimers[str] = ExpiryTimers(lambda due, kind, subject: subject in live)
    for i in range(1000):
        timers.push(float(i), 0, f"s{i}")
    live.add("s999")
    timers.push(2000.0, 1, "s999")
    assert len(timers._heap) < 200
    assert timers.next_due() == 999.0
    assert list(timers.pop_due(1500.0)) == [(0, "s999")]
    assert timers.next_due() == 2000.0


# -- the model-based stateful test ---------------------------------------------------------


class St(enum.Enum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    PARKED = "parked"  # answered "more to come": still in its worker's running batch
    RETURNED = "returned"  # handed back on end, expiry or worker loss
    CANCELLED = "cancelled"
    REFUSED = "refused"


@dataclass
class Seq:
    opened: float
    idle_since: float | None
    queue: list[int] = field(default_factory=list)
    in_flight: int | None = None
    parked: list[int] = field(default_factory=list)  # continuous batching: its open streams
    streamed: bool = False  # a request of it was ever parked
    worker: str | None = None


WORKERS = ["w0", "w1", "w2"]
IDS = ["s0", "s1", "s2", "s3", "s4", "s5"]
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]) | st.floats(0.0, 4.0)
TIMEOUTS = st.none() | st.sampled_from([1.0, 2.0, 5.0, 10.0]) | st.floats(0.25, 12.0)


class SequenceMachine(RuleBasedStateMachine):
    """Random events at random times against a model of what the policy must hold.

    Every decision is checked: a dispatch goes to an idle worker, holds at most batch_size
    heads of different ready sequences in ready order, each the oldest queued request of its
    sequence (so order is kept and one request is in flight per sequence), only to the
    worker the sequence is pinned to, or for a new pin to a least-loaded worker; a worker
    never skips a ready sequence of its own for a younger one, so each waits a bounded number
    of its worker's turns. Expiries are exactly those due. Every item ends exactly once.

    Continuous batching: a request in flight may be parked (answered "more to come"): its
    sequence's next request may then go while it streams, and the sequence is not idle until
    its streams are done; ``take`` is checked as a dispatch to one worker with ``room`` slots.
    A turn a ready sequence sits out is one whose slots all went to sequences ahead of it in
    the ready order, each at most once, so the slots of the turns it sits out are bounded by
    ``max_sequences - 1`` (for polls alone: ``(max_sequences - 1) // batch_size`` turns).
    """

    def __init__(self) -> None:
        super().__init__()
        self.policy: SequencePolicy[int, str] = SequencePolicy(
            batch_size=1, max_sequences=1, max_queue_per_sequence=1
        )
        self.now = 0.0
        self.next_item = 0
        self.state: dict[int, St] = {}
        self.open: dict[str, Seq] = {}
        self.closed: OrderedDict[str, CloseReason] = OrderedDict()
        self.minted: list[str] = []
        self.ready: list[str] = []  # sequences with work queued and none in flight, in order
        self.idle: list[str] = []  # idle first, first
        self.known: set[str] = set()
        # The slots of its worker's turns (polls and takes) a ready sequence sat out.
        self.skipped: dict[str, int] = {}

    @initialize(
        batch_size=st.integers(1, 4),
        max_sequences=st.integers(1, 6),
        max_queue=st.integers(1, 4),
        idle_timeout=TIMEOUTS,
        lifetime=TIMEOUTS,
        closed_capacity=st.sampled_from([0, 1, 3, 100]),
        workers=st.sampled_from([1, 1, 2, 3, 0]),
        backlog=st.lists(st.integers(0, 4), max_size=6),
    )
    def setup(
        self,
        batch_size: int,
        max_sequences: int,
        max_queue: int,
        idle_timeout: float | None,
        lifetime: float | None,
        closed_capacity: int,
        workers: int,
        backlog: list[int],
    ) -> None:
        """The policy, its first workers, and sequences opened with requests queued."""
        self.batch_size, self.max_sequences, self.max_queue = batch_size, max_sequences, max_queue
        self.idle_timeout, self.lifetime, self.capacity = idle_timeout, lifetime, closed_capacity
        self.policy = SequencePolicy(
            batch_size=batch_size,
            max_sequences=max_sequences,
            max_queue_per_sequence=max_queue,
            idle_timeout=idle_timeout,
            lifetime=lifetime,
            closed_capacity=closed_capacity,
        )
        for worker in WORKERS[:workers]:
            self.worker_idle(worker)
        for sid, count in zip(IDS, backlog, strict=False):
            self.open_sequence(sid)
            for _ in range(count):
                self.submit_one(sid)

    # -- model helpers -------------------------------------------------------------------

    def ids(self) -> list[str]:
        return [*IDS, *self.minted, "never-opened"]

    def pins(self, worker: str) -> int:
        return sum(seq.worker == worker for seq in self.open.values())

    def due(self, seq: Seq) -> tuple[float, CloseReason]:
        lifetime = math.inf if self.lifetime is None else seq.opened + self.lifetime
        idle = math.inf
        if self.idle_timeout is not None and seq.idle_since is not None:
            idle = seq.idle_since + self.idle_timeout
        return (lifetime, CloseReason.LIFETIME) if lifetime <= idle else (idle, CloseReason.IDLE)

    def close(self, sid: str, reason: CloseReason, items: tuple[int, ...]) -> None:
        seq = self.open.pop(sid)
        assert items == tuple(seq.queue), "not the queued items, in order"
        for item in items:
            assert self.state[item] is St.QUEUED
            self.state[item] = St.RETURNED
        for item in seq.parked:  # left to finish, as the one in flight
            self.state[item] = St.DISPATCHED
        if sid in self.ready:
            self.ready.remove(sid)
        self.skipped.pop(sid, None)
        if self.capacity:
            self.closed[sid] = reason
            self.closed.move_to_end(sid)
            while len(self.closed) > self.capacity:
                self.closed.popitem(last=False)

    def leave_ready(self, sid: str) -> None:
        self.ready.remove(sid)
        self.skipped.pop(sid, None)

    # -- the policy under test -----------------------------------------------------------

    def do_poll(self, now: float) -> list[object]:
        decisions = self.policy.poll(now)
        due = {sid: r for sid, seq in self.open.items() if (r := self.due(seq))[0] <= now}
        expired = [d for d in decisions if isinstance(d, Expired)]
        assert decisions[: len(expired)] == expired, "expiries come first"
        assert {e.sequence_id: e.reason for e in expired} == {s: r for s, (_, r) in due.items()}
        for decision in expired:
            event(f"expired {decision.reason.value}")
            if self.open[decision.sequence_id].streamed:
                event(f"expired {decision.reason.value} after streaming")
            assert f'"{decision.sequence_id}"' in decision.message
            self.close(decision.sequence_id, decision.reason, decision.items)
        ready = list(self.ready)
        idle = list(self.idle)
        before = {worker: self.pins(worker) for worker in self.known}
        new_pins: list[tuple[int, str]] = []  # (position in the ready order, worker)
        served: set[str] = set()
        for decision in decisions[len(expired) :]:
            assert isinstance(decision, Dispatch), decision
            worker = decision.worker
            assert worker in idle and worker not in served, "not an idle worker"
            served.add(worker)
            self.check_dispatch(decision, self.batch_size, ready, new_pins)
        for worker in set(idle) - served:
            assert not any(self.open[s].worker == worker for s in ready), "idle beside work"
        self.check_pins(new_pins, before)
        for decision in decisions[len(expired) :]:
            assert isinstance(decision, Dispatch)
            self.idle.remove(decision.worker)
            self.apply_dispatch(decision)
        self.count_skips(ready, dict.fromkeys(idle, self.batch_size))
        return list(decisions)

    def check_dispatch(
        self,
        decision: Dispatch[int, str],
        room: int,
        ready: list[str],
        new_pins: list[tuple[int, str]],
    ) -> None:
        """A batch to a worker with ``room`` slots, against the ready order before it."""
        worker = decision.worker
        assert 1 <= len(decision.items) <= room
        assert len(set(decision.sequence_ids)) == len(decision.items), "two of a sequence"
        positions = [ready.index(sid) for sid in decision.sequence_ids]
        assert positions == sorted(positions), "not oldest ready first"
        for item, sid, position in zip(
            decision.items, decision.sequence_ids, positions, strict=True
        ):
            seq = self.open[sid]
            assert seq.in_flight is None, "two requests of a sequence in flight"
            assert seq.queue[0] == item, "out of order"
            assert seq.worker in (None, worker), "not its pinned worker"
            if seq.worker is None:
                new_pins.append((position, worker))
                event("pinned")
        # No ready sequence of this worker is skipped for a younger one.
        left = [s for s in ready if self.open[s].worker == worker]
        left = [s for s in left if s not in decision.sequence_ids]
        if left:
            assert len(decision.items) == room
            assert ready.index(left[0]) > max(positions)
        event(f"dispatch of {len(decision.items)}")

    def check_pins(self, new_pins: list[tuple[int, str]], before: dict[str, int]) -> None:
        """A new pin goes to a worker with the fewest pins at that point of the ready order."""
        for position, worker in new_pins:

            def load(w: str, position: int = position) -> int:
                return before[w] + sum(p < position and v == w for p, v in new_pins)

            assert all(load(worker) <= load(other) for other in self.known), "unbalanced pin"

    def apply_dispatch(self, decision: Dispatch[int, str]) -> None:
        for item, sid in zip(decision.items, decision.sequence_ids, strict=True):
            seq = self.open[sid]
            seq.queue.pop(0)
            seq.in_flight = item
            seq.worker = decision.worker
            self.state[item] = St.DISPATCHED
            self.leave_ready(sid)

    def count_skips(self, ready: list[str], turns: dict[str, int]) -> None:
        """Bounded waiting: the slots of the turns (worker -> its slots) a ready sequence of
        that worker sat out all went to sequences ahead of it, each once."""
        for sid in ready:
            seq = self.open.get(sid)
            if seq is not None and sid in self.ready and seq.worker in turns:
                self.skipped[sid] = self.skipped.get(sid, 0) + turns[seq.worker]
                event("ready sequence sat out a turn")
                assert self.skipped[sid] <= self.max_sequences - 1, "starved"

    def check_wakeup(self) -> float | None:
        wake = self.policy.next_wakeup(self.now)
        earliest = min((self.due(seq)[0] for seq in self.open.values()), default=math.inf)
        if wake is None:
            assert earliest == math.inf
            assert copy.deepcopy(self.policy).poll(self.now + 1e9) == []
            return None
        assert wake >= self.now
        if wake > self.now:
            assert wake == earliest
            assert copy.deepcopy(self.policy).poll(math.nextafter(wake, -math.inf)) == []
        assert copy.deepcopy(self.policy).poll(wake) != []
        return wake

    # -- rules ---------------------------------------------------------------------------

    @rule(sid=st.none() | st.sampled_from(IDS))
    def open_sequence(self, sid: str | None) -> None:
        if sid is not None and sid in self.open:
            assert self.policy.open(sid, self.now) == (sid, False)
            return
        if sid is not None and sid in self.closed:
            with pytest.raises(SequenceClosed, match=f'"{sid}"') as error:
                self.policy.open(sid, self.now)
            assert error.value.reason is self.closed[sid]
            event("closed id refused")
            return
        if len(self.open) >= self.max_sequences:
            with pytest.raises(TooManySequences, match=f"maxNumSequence is {self.max_sequences}"):
                self.policy.open(sid, self.now)
            event("too many sequences")
            return
        got, new = self.policy.open(sid, self.now)
        assert new and (got == sid or (sid is None and got.startswith("ts-seq-")))
        if sid is None:
            self.minted.append(got)
        self.open[got] = Seq(opened=self.now, idle_since=self.now)

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        """Submit a few requests, mostly to open sequences."""
        for _ in range(data.draw(st.integers(1, 3), label="count")):
            choices = st.sampled_from(self.ids())
            if self.open:
                choices = st.sampled_from(
                    list(self.open)
                )  # in opening order: minted ids vary | choices
            self.submit_one(data.draw(choices, label="sid"))

    def submit_one(self, sid: str) -> None:
        item = self.next_item
        self.next_item += 1
        seq = self.open.get(sid)
        if seq is None:
            with pytest.raises(SequenceClosed, match=f'"{sid}"'):
                self.policy.submit(sid, item, self.now)
            self.state[item] = St.REFUSED
            return
        if len(seq.queue) >= self.max_queue:
            with pytest.raises(SequenceQueueFull, match="maxSequenceJobQueueSize"):
                self.policy.submit(sid, item, self.now)
            event("sequence queue full")
            self.state[item] = St.REFUSED
            return
        self.policy.submit(sid, item, self.now)
        self.state[item] = St.QUEUED
        seq.queue.append(item)
        seq.idle_since = None
        if seq.in_flight is None and len(seq.queue) == 1:
            self.ready.append(sid)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        item = data.draw(st.integers(0, self.next_item), label="item")
        expected = self.state.get(item) is St.QUEUED
        assert self.policy.cancel(item) is expected
        if not expected:
            return
        self.state[item] = St.CANCELLED
        sid, seq = next((s, q) for s, q in self.open.items() if item in q.queue)
        seq.queue.remove(item)
        if not seq.queue:
            if sid in self.ready:
                self.leave_ready(sid)
            if seq.in_flight is None and not seq.parked:
                seq.idle_since = self.now

    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        busy = [s for s, seq in self.open.items() if seq.in_flight is not None]
        sid = data.draw(st.sampled_from(busy) if busy else st.sampled_from(self.ids()))
        seq = self.open.get(sid)
        if seq is not None and seq.in_flight is None:
            with pytest.raises(ValueError, match="no request in flight"):
                self.policy.done(sid, self.now)
            return
        self.policy.done(sid, self.now)
        if seq is not None:
            self.answered(sid)

    def answered(self, sid: str) -> None:
        """The model of ``done``: the request in flight ended."""
        seq = self.open[sid]
        assert seq.in_flight is not None
        seq.in_flight = None
        if seq.queue:
            self.ready.append(sid)
        elif not seq.parked:
            seq.idle_since = self.now

    @rule(data=st.data())
    def park(self, data: st.DataObject) -> None:
        """Continuous batching: a request in flight was answered "more to come"."""
        busy = [s for s, seq in self.open.items() if seq.in_flight is not None]
        sid = data.draw(st.sampled_from(busy) if busy else st.sampled_from(self.ids()))
        seq = self.open.get(sid)
        if seq is not None and seq.in_flight is None:
            with pytest.raises(ValueError, match="no request in flight"):
                self.policy.park(sid, self.now)
            return
        self.policy.park(sid, self.now)  # ignored once closed
        if seq is not None:
            self.parked(sid)

    def parked(self, sid: str) -> None:
        """The model of ``park``: the request in flight streams on; the next may go."""
        seq = self.open[sid]
        assert seq.in_flight is not None
        self.state[seq.in_flight] = St.PARKED
        seq.parked.append(seq.in_flight)
        seq.in_flight = None
        seq.streamed = True
        if seq.queue:
            self.ready.append(sid)
        event("parked")

    @rule(data=st.data())
    def stream_done(self, data: st.DataObject) -> None:
        """Continuous batching: a parked request ended."""
        streaming = [s for s, seq in self.open.items() if seq.parked]
        sid = data.draw(st.sampled_from(streaming) if streaming else st.sampled_from(self.ids()))
        seq = self.open.get(sid)
        if seq is not None and not seq.parked:
            with pytest.raises(ValueError, match="no parked request"):
                self.policy.stream_done(sid, self.now)
            return
        self.policy.stream_done(sid, self.now)  # ignored once closed
        if seq is not None:
            self.stream_ended(sid, data.draw(st.integers(0, len(seq.parked) - 1)))

    def stream_ended(self, sid: str, index: int) -> None:
        """The model of ``stream_done``: one of the sequence's parked requests ended."""
        seq = self.open[sid]
        self.state[seq.parked.pop(index)] = St.DISPATCHED
        if not seq.parked and seq.in_flight is None and not seq.queue:
            seq.idle_since = self.now
        event("stream done")

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def take(self, worker: str, data: st.DataObject) -> None:
        """Continuous batching: ``worker`` starts a step with ``room`` free slots."""
        room = data.draw(st.integers(0, self.batch_size), label="room")
        ready = list(self.ready)
        self.known.add(worker)
        before = {w: self.pins(w) for w in self.known}
        decision = self.policy.take(worker, room, self.now)
        if worker in self.idle:
            self.idle.remove(worker)
        new_pins: list[tuple[int, str]] = []
        taken: tuple[str, ...] = ()
        if decision is not None:
            assert decision.worker == worker
            self.check_dispatch(decision, room, ready, new_pins)
            taken = decision.sequence_ids
            event(f"take of {len(decision.items)}")
        else:
            event("take of none")
        self.check_pins(new_pins, before)
        if room and len(taken) < room:
            # Room left: nothing ready of its own was left, nor a new sequence it is a
            # least-loaded worker for (at that point of the ready order; it wins ties).
            for position, sid in enumerate(ready):
                if sid in taken:
                    continue
                owner = self.open[sid].worker
                assert owner != worker, "a ready sequence of its own left"
                if owner is None:
                    mine = before[worker] + sum(p < position for p, _ in new_pins)
                    assert any(before[w] < mine for w in self.known if w != worker), (
                        "a new sequence left beside a least-loaded worker with room"
                    )
        if decision is not None:
            self.apply_dispatch(decision)
        self.count_skips(ready, {worker: room})

    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.ids()), label="sid")
        items = self.policy.end(sid, self.now)
        if sid in self.open:
            self.close(sid, CloseReason.ENDED, tuple(items))
            event("ended")
        else:
            assert items == []

    @rule(worker=st.sampled_from(WORKERS))
    def worker_idle(self, worker: str) -> None:
        self.policy.worker_idle(worker, self.now)
        self.known.add(worker)
        if worker not in self.idle:
            self.idle.append(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def worker_busy(self, worker: str) -> None:
        self.policy.worker_busy(worker, self.now)
        self.known.add(worker)
        if worker in self.idle:
            self.idle.remove(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def worker_gone(self, worker: str) -> None:
        closed = self.policy.worker_gone(worker, self.now)
        pinned = {sid for sid, seq in self.open.items() if seq.worker == worker}
        assert {c.sequence_id for c in closed} == pinned
        for c in closed:
            assert c.reason is CloseReason.WORKER_FAILED and "worker failed" in c.message
            self.close(c.sequence_id, c.reason, c.items)
            event("closed by worker loss")
        self.known.discard(worker)
        if worker in self.idle:
            self.idle.remove(worker)

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
        assert self.policy.open_count == len(self.open) <= self.max_sequences
        for worker in WORKERS:
            assert self.policy.pinned(worker) == self.pins(worker)
        for sid, seq in self.open.items():
            assert self.policy.queued(sid) == seq.queue
            assert self.policy.worker_of(sid) == seq.worker
            for item in seq.queue:
                assert self.policy.sequence_of(item) == sid
        queued = sum(len(seq.queue) for seq in self.open.values())
        assert sum(state is St.QUEUED for state in self.state.values()) == queued
        assert self.policy.has_work == bool(self.ready)

    @invariant()
    def wakeup_is_exact(self) -> None:
        self.check_wakeup()

    def teardown(self) -> None:
        """Liveness: while every worker keeps becoming idle and answering (or answering "more
        to come", every other round), every queued item is dispatched within a bounded
        number of rounds; then the streams end, and every item ended once."""
        if not self.known:
            self.worker_idle("w0")
        rounds = 0
        while any(seq.queue for seq in self.open.values()):
            rounds += 1
            assert rounds <= self.max_sequences * self.max_queue, "starved"
            for sid in [s for s, q in self.open.items() if q.in_flight is not None]:
                if rounds % 2:
                    self.policy.park(sid, self.now)
                    self.parked(sid)
                else:
                    self.policy.done(sid, self.now)
                    self.answered(sid)
            for worker in sorted(self.known):
                self.worker_idle(worker)
            self.do_poll(self.now)
            self.check_wakeup()
        # The last requests are answered, then the streams end one at a time: a sequence
        # idles only after its last.
        for sid in [s for s, q in self.open.items() if q.in_flight is not None]:
            self.policy.done(sid, self.now)
            self.answered(sid)
        self.check_wakeup()
        for sid, seq in self.open.items():
            while seq.parked:
                self.policy.stream_done(sid, self.now)
                self.stream_ended(sid, 0)
                self.check_wakeup()
        assert set(self.state.values()) <= {
            St.DISPATCHED,
            St.RETURNED,
            St.CANCELLED,
            St.REFUSED,
        }
        assert len(self.state) == self.next_item
        event(f"items dispatched: {min(list(self.state.values()).count(St.DISPATCHED), 9)}")


SequenceMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None
)
test_sequence_policy_state_machine = SequenceMachine.TestCase


def test_take_is_capped_at_the_batch_size_and_a_refused_room_changes_nothing() -> None:
    policy: SequencePolicy[str, str] = SequencePolicy(
        batch_size=2, max_sequences=8, max_queue_per_sequence=4
    )
    policy.worker_idle("w", 0.0)
    for n in range(3):
        sequence_id, _ = policy.open(None, 0.0)
        policy.submit(sequence_id, f"r{n}", 0.0)
    with pytest.raises(ValueError, match="room"):
        policy.take("w", -1, 0.0)
    assert policy.next_wakeup(0.0) == 0.0  # still idle, with work for it
    taken = policy.take("w", 5, 0.0)
    assert taken is not None and taken.items == ("r0", "r1")  # never more than batch_size
