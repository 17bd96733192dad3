"""Workers SIGKILLed at random while sequences and plain requests run over HTTP.

The crash tests elsewhere kill one worker at a chosen moment. This one kills workers at
moments nobody chose, under load, because that is where the races are: a request written to a
worker whose death the server has not read yet once made the stateful queue's task raise, and
that took the whole server down (see design.md, "time went backwards"). Every answer must be
a right one or one of the documented failures; the server must live through it and serve
again once its workers are back."""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time

import httpx
import pytest

from .server import Server

pytestmark = pytest.mark.e2e

HEADER = "ts_request_sequence_id"
LOAD_SECONDS = 15.0


def _sequences(server: Server, stop: float, note: collections.Counter[str]) -> None:
    """Sequences of 1..5 then 0 (which ends it), each sum checked; a failure starts a new one."""
    with httpx.Client(base_url=server.url, headers=server.auth("inference"), timeout=120) as h:
        while time.monotonic() < stop:
            sequence_id, total = None, 0
            for value in (1, 2, 3, 4, 5, 0):
                headers = {HEADER: sequence_id} if sequence_id else {}
                r = h.post("/predictions/stateful", content=str(value).encode(), headers=headers)
                if r.status_code == 200:
                    total += value
                    note["ok" if r.text.split()[0] == str(total) else f"wrong sum: {r.text}"] += 1
                    sequence_id = r.headers.get(HEADER, sequence_id)
                    continue
                message = r.json()["message"]
                if r.status_code == 400 and "its worker failed" in message:
                    note["sequence closed: its worker failed"] += 1
                elif r.status_code in (500, 507) and (
                    "Worker died" in message or "its worker failed" in message
                ):
                    note["failed: its worker died"] += 1
                elif r.status_code == 503 and (
                    "maxNumSequence" in message or "no worker is ready" in message
                ):
                    note["503, retry later"] += 1
                    time.sleep(0.2)
                else:
                    note[f"unexpected: {r.status_code} {r.text}"] += 1
                break


def _echoes(server: Server, stop: float, note: collections.Counter[str]) -> None:
    with httpx.Client(base_url=server.url, headers=server.auth("inference"), timeout=120) as h:
        count = 0
        while time.monotonic() < stop:
            count += 1
            body = f"echo {count}".encode()
            r = h.post("/predictions/echo", content=body)
            if r.status_code == 200:
                note["ok" if r.content == body else f"wrong echo: {r.content!r}"] += 1
                continue
            message = r.json()["message"]
            if r.status_code in (500, 507) and "Worker died" in message:
                note["failed: its worker died"] += 1
            elif r.status_code == 503 and "no worker is ready" in message:
                note["503, retry later"] += 1
            else:
                note[f"unexpected: {r.status_code} {r.text}"] += 1
            time.sleep(0.05)


def test_random_worker_kills_under_load_fail_only_their_own_requests(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server("stateful=stateful.mar,echo=echo.mar", tokens=True)
    server.start()
    stop = time.monotonic() + LOAD_SECONDS
    counts = [collections.Counter[str]() for _ in range(6)]
    clients = [threading.Thread(target=_sequences, args=(server, stop, c)) for c in counts[:4]] + [
        threading.Thread(target=_echoes, args=(server, stop, c)) for c in counts[4:]
    ]
    for t in clients:
        t.start()
    rng = random.Random(29)
    kills = 0
    while time.monotonic() < stop - 2:
        time.sleep(rng.uniform(0.5, 2.0))
        workers = server.worker_pids()
        if workers:
            try:
                os.kill(rng.choice(workers), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass  # it had just died of an earlier kill
    for t in clients:
        t.join()
    seen = sum(counts, collections.Counter[str]())
    unexpected = {k: v for k, v in seen.items() if k.startswith(("unexpected", "wrong"))}
    assert kills >= 4 and seen["ok"] > 100, (kills, seen)
    assert not unexpected, unexpected
    assert server.process is not None and server.process.poll() is None, server.log
    # Served again once the workers are back (restart back-off: a few seconds at most here).
    deadline = time.monotonic() + 60
    auth = server.auth("inference")
    while True:
        fresh = httpx.post(f"{server.url}/predictions/stateful", content=b"7", headers=auth)
        echo = httpx.post(f"{server.url}/predictions/echo", content=b"e", headers=auth)
        if fresh.status_code == 200 and echo.status_code == 200:
            break
        assert time.monotonic() < deadline, (fresh.text, echo.text)
        time.sleep(0.5)
    assert fresh.text.split()[0] == "7" and echo.content == b"e"
