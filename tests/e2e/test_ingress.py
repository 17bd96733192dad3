"""Ingress processes end to end: a real server with two ingress processes and real workers,
called with http.client (one keep-alive connection each, so the test knows which ingress
process holds it)."""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from .server import Server, wait_gone
from .test_dataplane_metrics import snapshot

pytestmark = pytest.mark.e2e


def _connection(server: Server) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.connect()
    return connection


def _owner(server: Server, connection: http.client.HTTPConnection) -> int:
    """The ingress process holding the server side of ``connection``."""
    assert connection.sock is not None
    local = connection.sock.getsockname()[:2]
    for _ in range(50):  # accepted a moment after connect() returns
        for pid in server.ingress_pids():
            for conn in psutil.Process(pid).net_connections("tcp"):
                if conn.raddr and (conn.raddr.ip, conn.raddr.port) == local:
                    return pid
        time.sleep(0.02)
    raise AssertionError("no ingress process holds the connection")


def _one_per_ingress(server: Server) -> dict[int, list[http.client.HTTPConnection]]:
    """Two connections held by each ingress process."""
    held: dict[int, list[http.client.HTTPConnection]] = {}
    spare: list[http.client.HTTPConnection] = []
    for _ in range(200):
        connection = _connection(server)
        owned = held.setdefault(_owner(server, connection), [])
        (owned if len(owned) < 2 else spare).append(connection)
        if len(held) == 2 and all(len(c) == 2 for c in held.values()):
            break
    for connection in spare:
        connection.close()
    assert len(held) == 2 and all(len(c) == 2 for c in held.values())
    return held


def _wait_for_markers(markers: Path, kind: str, count: int) -> None:
    """Until the handler has written ``count`` markers of ``kind`` (at most 10 s)."""
    deadline = time.monotonic() + 10
    while len(list(markers.glob(f"{kind}-*"))) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def _predict(
    connection: http.client.HTTPConnection, body: bytes, model: str = "control"
) -> tuple[int, bytes]:
    connection.request("POST", f"/predictions/{model}", body=body)
    response = connection.getresponse()
    return response.status, response.read()


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    # control2.mar: the control handler without a model config, so two workers.
    server: Server = make_server(
        "control=control2.mar",
        properties={
            "ingress_processes": "2",
            "default_workers_per_model": "2",
            "enable_model_api": "true",
        },
    )
    server.start()
    assert len(server.ingress_pids()) == 2
    return server


def test_a_request_on_any_ingress_process_reaches_any_worker(server: Server) -> None:
    workers = set(server.worker_pids())
    assert len(workers) == 2
    for owner, (first, second) in _one_per_ingress(server).items():
        # Two requests at once on one ingress process: both workers are idle, each gets one.
        answers: list[tuple[int, bytes]] = []

        def call(connection: http.client.HTTPConnection, into: list[tuple[int, bytes]]) -> None:
            into.append(_predict(connection, b"pid:0.5"))

        threads = [threading.Thread(target=call, args=(c, answers)) for c in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [status for status, _ in answers] == [200, 200], owner
        assert {int(body) for _, body in answers} == workers, owner
        first.close()
        second.close()


def test_a_killed_ingress_process_loses_only_its_requests_and_is_restarted(
    server: Server,
) -> None:
    held = _one_per_ingress(server)
    victim, survivor = list(held)
    outcomes: dict[int, list[object]] = {victim: [], survivor: []}

    def call(owner: int, connection: http.client.HTTPConnection) -> None:
        try:
            outcomes[owner].append(_predict(connection, b"sleep:1.5"))
        except (ConnectionError, http.client.HTTPException) as error:
            outcomes[owner].append(error)

    threads = [
        threading.Thread(target=call, args=(owner, held[owner][0])) for owner in (victim, survivor)
    ]
    for thread in threads:
        thread.start()
    markers = server.workdir / "markers"
    _wait_for_markers(markers, "started", 2)
    os.kill(victim, signal.SIGKILL)
    for thread in threads:
        thread.join()
    # The victim's client saw its connection close; the other's request was answered.
    assert isinstance(outcomes[victim][0], (ConnectionError, http.client.HTTPException))
    assert outcomes[survivor] == [(200, b"slept")]
    # The victim's request was cancelled in the worker (the handler polls is_cancelled).
    _wait_for_markers(markers, "cancelled", 1)
    assert len(list(markers.glob("cancelled-*"))) == 1
    # A new ingress process takes the victim's place, and both serve.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pids = server.ingress_pids()
        if len(pids) == 2 and victim not in pids:
            break
        time.sleep(0.05)
    assert len(server.ingress_pids()) == 2 and victim not in server.ingress_pids()
    assert "ingress process" in server.log and "restarting it" in server.log
    for connections in _one_per_ingress(server).values():
        for connection in connections:
            assert _predict(connection, b"hello") == (200, b"hello")
            connection.close()
    for pair in held.values():
        for connection in pair:
            connection.close()


def test_sigterm_drains_every_ingress_process(server: Server) -> None:
    children = server.child_pids()
    answers: list[tuple[int, bytes]] = []
    held = _one_per_ingress(server)
    threads = [
        threading.Thread(target=lambda c=c[0]: answers.append(_predict(c, b"sleep:1.0")))
        for c in held.values()
    ]
    for thread in threads:
        thread.start()
    markers = server.workdir / "markers"
    _wait_for_markers(markers, "started", 2)
    server.signal(signal.SIGTERM)
    for thread in threads:
        thread.join()
    assert answers == [(200, b"slept"), (200, b"slept")]
    assert server.wait(30) == 0
    assert wait_gone(children) == []
    for pair in held.values():
        for connection in pair:
            connection.close()


def test_management_changes_are_seen_by_every_ingress_process_at_once(server: Server) -> None:
    held = _one_per_ingress(server)
    connections = [pair[0] for pair in held.values()]
    with httpx.Client(base_url=server.management_url, timeout=60) as management:
        for connection in connections:
            assert _predict(connection, b"x", "control2")[0] == 404
        r = management.post(
            "/models", params={"url": "control2.mar", "initial_workers": 1, "synchronous": True}
        )
        assert r.status_code == 200, r.text
        for connection in connections:
            assert _predict(connection, b"x", "control2") == (200, b"x")
        r = management.put("/models/control2", params={"min_worker": 2, "synchronous": True})
        assert r.status_code == 200, r.text
        workers = {w["pid"] for w in management.get("/models/control2").json()[0]["workers"]}
        assert len(workers) == 2
        for connection in connections:
            status, pid = _predict(connection, b"pid", "control2")
            assert status == 200 and int(pid) in workers
        assert management.delete("/models/control2").status_code == 200
        for connection in connections:
            assert _predict(connection, b"x", "control2")[0] == 404
    for pair in held.values():
        for connection in pair:
            connection.close()


def test_metrics_count_the_requests_of_every_ingress_process(server: Server) -> None:
    held = _one_per_ingress(server)
    before = snapshot(server)
    for pair in held.values():
        for connection in pair:
            for _ in range(5):
                assert _predict(connection, b"hello") == (200, b"hello")
            connection.close()
    # A request an ingress process cannot read: refused with 400, counted all the same.
    bad = _connection(server)
    bad.putrequest("POST", "/predictions/control")
    bad.putheader("Content-Length", "nope")
    bad.endheaders()
    assert bad.getresponse().status == 400
    bad.close()
    after = snapshot(server)
    count, total = after["ts_inference_requests_total"]
    assert total - before["ts_inference_requests_total"][1] == 20
    # The 20 predictions and the /metrics answer of the first snapshot.
    assert after["Requests2XX_total"][1] - before["Requests2XX_total"][1] == 21
    assert after["Requests4XX_total"][1] - before["Requests4XX_total"][1] == 1
    assert count == 1
