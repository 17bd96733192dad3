"""Dynamic batching end to end: real workers, concurrent HTTP clients."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .server import Server

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    s: Server = make_server("batch=batch.mar")
    s.start()
    return s


def batch_sizes(server: Server) -> list[int]:
    log = server.workdir / "markers" / "batches.log"
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def fire(server: Server, bodies: list[bytes]) -> list[httpx.Response | None]:
    """Send the bodies concurrently to the model ``batch``; answers in the same order."""
    return fire_to(server, "batch", bodies)


def occupy(server: Server, seconds: float) -> threading.Thread:
    """Keep the single worker busy so that the next requests queue up together."""
    t = threading.Thread(
        target=lambda: httpx.post(
            f"{server.url}/predictions/batch", content=f"sleep:{seconds}".encode(), timeout=30
        )
    )
    t.start()
    deadline = time.monotonic() + 10
    while batch_sizes(server) == [] and time.monotonic() < deadline:
        time.sleep(0.02)
    return t


def test_a_lone_request_does_not_wait_for_the_batch_window(server: Server) -> None:
    started = time.monotonic()
    r = httpx.post(f"{server.url}/predictions/batch", content=b"alone", timeout=30)
    assert r.text == "alone"
    assert time.monotonic() - started < 1.0  # the window is 2 s
    assert batch_sizes(server) == [1]


def test_batches_form_under_concurrent_load_and_answers_go_to_their_requests(
    server: Server,
) -> None:
    busy = occupy(server, 1.0)
    bodies = [f"req-{i}".encode() for i in range(8)]
    answers = fire(server, bodies)
    busy.join()
    assert [a.text if a else None for a in answers] == [b.decode() for b in bodies]
    sizes = batch_sizes(server)
    assert sizes[0] == 1  # the sleeper
    assert sum(sizes[1:]) == 8
    assert max(sizes[1:]) == 4 and len(sizes) <= 4  # batches formed, none over batchSize


def test_a_wrong_length_answer_fails_only_its_batch(server: Server) -> None:
    busy = occupy(server, 0.8)
    first = fire(server, [b"a", b"wrongcount", b"b", b"c"])
    busy.join()
    for r in first:
        assert r is not None and r.status_code == 503
        assert r.json()["message"] == "number of batch response mismatched"
    second = fire(server, [b"d", b"e"])
    assert [r.text for r in second if r] == ["d", "e"]


def test_a_worker_crash_mid_batch_fails_exactly_that_batch(server: Server) -> None:
    busy = occupy(server, 0.8)
    doomed = fire(server, [b"x1", b"crash", b"x2", b"x3"])
    busy.join()
    for r in doomed:
        assert r is not None and r.status_code in (500, 507), r and r.text
        assert r.json()["message"].startswith("Worker died.")
    # the restarted worker serves the next ones
    again = fire(server, [b"y1", b"y2"])
    assert [r.text for r in again if r] == ["y1", "y2"]


def test_tensor_inputs_reach_the_handler_as_one_padded_batch(make_server) -> None:  # type: ignore[no-untyped-def]
    import struct

    server: Server = make_server("tensor=tensor.mar")
    server.start()
    rows = {1: [[1.0, 2.0]], 2: [[3.0, 4.0], [5.0, 6.0]], 3: [[7.0, 8.0]] * 3}
    bodies = [struct.pack(f"<{2 * len(r)}f", *(x for row in r for x in row)) for r in rows.values()]
    first = fire_to(server, "tensor", [b"\0" * 8])  # one alone (the worker then sleeps)
    assert first[0] is not None and first[0].json()["batch"] == [1, 1, 2]
    busy = threading.Thread(target=fire_to, args=(server, "tensor", [b"\0" * 8]))
    busy.start()
    deadline = time.monotonic() + 10
    while len(batch_sizes(server)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # until the worker is running the "busy" batch
    answers = fire_to(server, "tensor", bodies)
    busy.join()
    for answer, expected in zip(answers, rows.values(), strict=True):
        assert answer is not None and answer.status_code == 200, answer and answer.text
        body = answer.json()
        assert body["batch"] == [3, 3, 2]  # one batch, padded to the longest request
        assert body["rows"] == expected
        assert body["padding_is_zero"] is True
    bad = httpx.post(f"{server.url}/predictions/tensor", content=b"\0" * 7, timeout=30)
    assert bad.status_code == 400
    assert "whole number of rows of 8 bytes" in bad.json()["message"]


def fire_to(server: Server, model: str, bodies: list[bytes]) -> list[httpx.Response | None]:
    """Send the bodies concurrently to ``model`` (one thread each); answers in the same order."""
    out: list[httpx.Response | None] = [None] * len(bodies)

    def call(i: int) -> None:
        out[i] = httpx.post(f"{server.url}/predictions/{model}", content=bodies[i], timeout=30)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join()
    return out
