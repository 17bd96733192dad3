"""The worker's bookkeeping for several connections, as properties: the model loop's Outbox
sends each connection exactly what was written for it, in order, grouping only one batch's
consecutive replies of that connection (batch ids are per connection); an attached
connection's book of unanswered batches holds exactly the request ids of the batches not
yet answered, under any interleaving."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from trioserve.core.frames import FrameDecoder, Kind, encode
from trioserve.core.messages import BatchReply, Reply, decode_reply, encode_reply
from trioserve.worker.attached import AttachedBatches
from trioserve.worker.mlserver.outbox import GROUP_REPLIES, Outbox

CONNECTIONS = 3


@dataclass
class Connection:
    """What one connection's write was called with."""

    writes: list[bytes] = field(default_factory=list)

    def send(self, data: bytes) -> None:
        self.writes.append(data)


# A write: (connection, batch id, None) is a whole frame (a METRICS frame naming the batch),
# (connection, batch id, n) the n-th intermediate reply written in the test.
writes = st.lists(
    st.tuples(
        st.integers(0, CONNECTIONS - 1),
        st.integers(1, 3),
        st.booleans(),
    ),
    max_size=80,
)


@given(writes, st.integers(1, 3))
def test_each_connection_gets_its_own_writes_in_order(
    written: list[tuple[int, int, bool]], flushes: int
) -> None:
    loop = asyncio.new_event_loop()
    try:
        outbox = Outbox(loop, encode_reply)
        connections = [Connection() for _ in range(CONNECTIONS)]
        sends: list[Callable[[bytes], None]] = [c.send for c in connections]
        expected: list[list[tuple[str, int, str]]] = [[] for _ in connections]
        every = max(1, len(written) // flushes)
        flushed = 1  # the last flush
        for n, (to, batch_id, is_frame) in enumerate(written):
            if is_frame:
                outbox.write(sends[to], encode(Kind.METRICS, {"n": n, "batch": batch_id}))
                expected[to].append(("frame", batch_id, str(n)))
            else:
                reply = Reply(f"r{n}", b"%d" % n)
                # A fresh bound method each time, as the worker passes them.
                outbox.write(connections[to].send, (batch_id, reply))
                expected[to].append(("reply", batch_id, f"r{n}"))
            if (n + 1) % every == 0:
                outbox.flush()
                flushed += 1
        outbox.flush()
    finally:
        loop.close()
    for connection, wanted in zip(connections, expected, strict=True):
        got: list[tuple[str, int, str]] = []
        for data in connection.writes:
            for frame in FrameDecoder().feed(data):
                if frame.kind is Kind.METRICS:
                    got.append(("frame", frame.meta["batch"], str(frame.meta["n"])))
                    continue
                answer = decode_reply(frame)
                assert not answer.final and len(answer.replies) <= GROUP_REPLIES
                got.extend(("reply", answer.batch_id, r.request_id) for r in answer.replies)
        assert got == wanted
        assert len(connection.writes) <= flushed  # one write per flush at most


def test_a_final_frame_keeps_its_place_among_a_connections_replies() -> None:
    loop = asyncio.new_event_loop()
    try:
        outbox = Outbox(loop, encode_reply)
        a, b = Connection(), Connection()
        outbox.write(a.send, (1, Reply("a1", b"x")))
        outbox.write(b.send, (1, Reply("b1", b"y")))
        outbox.write(a.send, encode_reply(BatchReply(1, 200, "", [Reply("a1", b"")], True)))
        outbox.write(b.send, (1, Reply("b1", b"z")))
        outbox.flush()
    finally:
        loop.close()
    assert len(a.writes) == len(b.writes) == 1
    a_frames = [decode_reply(f) for f in FrameDecoder().feed(a.writes[0])]
    b_frames = [decode_reply(f) for f in FrameDecoder().feed(b.writes[0])]
    assert [(f.final, [r.request_id for r in f.replies]) for f in a_frames] == [
        (False, ["a1"]),
        (True, ["a1"]),
    ]
    assert [(f.final, [bytes(r.body) for r in f.replies]) for f in b_frames] == [
        (False, [b"y", b"z"])
    ]


# A batch: a few request ids from a small pool (a request id may be in two batches at once,
# as a continuing request is); the steps add batches and end the oldest or newest.
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.lists(st.sampled_from("abcdef"), max_size=4)),
            st.tuples(st.just("end"), st.booleans()),
        ),
        max_size=60,
    )
)
def test_the_book_holds_the_unanswered_batches_request_ids(
    steps: list[tuple[str, list[str] | bool]],
) -> None:
    book = AttachedBatches()
    live: list[list[str]] = []
    for op, arg in steps:
        if op == "add":
            assert isinstance(arg, list)
            book.add(arg)
            live.append(arg)
        elif live:
            ended = live.pop(0 if arg else -1)
            assert book.end(ended) == (not live)
        assert len(book) == len(live)
        held = Counter(rid for batch in live for rid in batch)
        assert sorted(book.request_ids()) == sorted(held)
