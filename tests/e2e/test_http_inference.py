"""End to end: a real server process, real worker subprocesses, real HTTP clients."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from .server import Server, wait_gone
from .test_metrics import samples

pytestmark = pytest.mark.e2e


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert list(body) == ["code", "type", "message"]
    assert body["code"] == response.status_code
    return body["code"], body["type"], body["message"]


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    s = make_server("control=control.mar,tsstyle.mar")
    s.start()
    return s


def test_ping_and_raw_body_round_trip(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        ping = client.get("/ping")
        assert ping.status_code == 200 and ping.json() == {"status": "Healthy"}
        r = client.post(
            "/predictions/control", content=b"hello", headers={"Content-Type": "text/plain"}
        )
        assert r.status_code == 200
        assert r.content == b"hello"
        assert len(r.headers["x-request-id"]) == 36
        assert r.headers["Cache-Control"] == "no-cache; no-store, must-revalidate, private"
        assert r.headers["Pragma"] == "no-cache"
        assert "content-type" not in r.headers  # the handler set none
        # versioned route and any method but OPTIONS
        assert client.put("/predictions/control/1.0", content=b"v").content == b"v"


def test_headers_url_path_explain_and_no_token_leak(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post(
            "/predictions/control/1.0/a/b",
            content=b"headers",
            headers={"X-Trace": "t1", "Authorization": "Bearer secret"},
        )
        seen = r.json()
        assert r.headers["content-type"] == "application/json"
        assert seen["url_path"] == "a/b"
        assert seen["explain"] == "False"
        assert seen["x-trace"] == "t1"  # h11 lowercases header names
        assert not any(k.lower() == "authorization" for k in seen)
        r = client.post("/explanations/control", content=b"headers")
        assert r.json()["explain"] == "True"


def test_multipart_and_urlencoded_become_named_inputs(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/predictions/control", data={"data": "params", "x": "1"})
        assert r.json() == {"data": "params", "x": "1"}
        r = client.post(
            "/predictions/control",
            data={"data": "params"},
            files={"file": ("f.txt", b"filedata", "text/plain")},
        )
        assert r.json() == {"data": "params", "file": "filedata"}


def test_errors_have_torchserve_bodies(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert error_of(client.post("/predictions/nope", content=b"x")) == (
            404,
            "ModelNotFoundException",
            "Model not found: nope",
        )
        assert error_of(client.post("/predictions/control/9.9", content=b"x")) == (
            404,
            "ModelVersionNotFoundException",
            "Model version: 9.9 does not exist for model: control",
        )
        code, kind, _ = error_of(client.get("/no/such/path"))
        assert (code, kind) == (404, "ResourceNotFoundException")
        code, kind, _ = error_of(client.request("OPTIONS", "/predictions/control"))
        assert (code, kind) == (405, "MethodNotAllowedException")
        r = client.post("/predictions/control", content=b"raise")
        assert error_of(r) == (503, "InternalServerException", "Prediction failed")
        r = client.post("/predictions/control", content=b"pexc:418")
        assert error_of(r) == (418, "InternalServerException", "custom failure")
        r = client.post("/predictions/control", content=b"status:299")
        assert r.status_code == 299 and r.headers["X-Custom"] == "yes"
        # the worker survived every one of those
        assert client.post("/predictions/control", content=b"still here").content == b"still here"


def test_request_larger_than_max_request_size_is_413(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(properties={"max_request_size": "1000"})
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/predictions/control", content=b"x" * 5000)
        code, _, message = error_of(r)
        assert code == 413 and "1000" in message
        assert client.post("/predictions/control", content=b"ok").content == b"ok"


def test_streaming_chunks_arrive_one_by_one(server: Server) -> None:
    arrivals: list[tuple[float, bytes]] = []
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("POST", "/predictions/control", content=b"stream:3") as r,
    ):
        assert r.status_code == 200
        assert r.headers["transfer-encoding"] == "chunked"
        for chunk in r.iter_raw():
            arrivals.append((time.monotonic(), chunk))
    assert b"".join(c for _, c in arrivals) == b"part0;part1;part2;end"
    assert len(arrivals) >= 3
    # chunks were produced 0.2 s apart and were not buffered until the end
    assert arrivals[-1][0] - arrivals[0][0] > 0.3


def test_streaming_with_curl_no_buffer(server: Server) -> None:
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "-X",
            "POST",
            f"{server.url}/predictions/control",
            "-H",
            "Content-Type: text/plain",
            "--data-binary",
            "stream:2",
        ],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"part0;part1;end"


def test_unmodified_torchserve_handler_runs_from_a_mar(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/predictions/tsstyle", content=b"hello")
        assert r.status_code == 200
        assert r.json() == {"text": "ts:HELLO", "model": "tsstyle"}


def test_kill_9_during_request_fails_it_cleanly_and_next_succeeds(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        pid_before = client.post("/predictions/control", content=b"pid").text
        r = client.post("/predictions/control", content=b"crash")
        code, kind, message = error_of(r)
        assert code in (500, 507) and kind == "InternalServerException"
        assert message.startswith("Worker died.")
        r = client.post("/predictions/control", content=b"pid")
        assert r.status_code == 200 and r.text != pid_before


def test_response_timeout_restarts_the_worker(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        pid_before = client.post("/predictions/control", content=b"pid").text
        started = time.monotonic()
        r = client.post("/predictions/control", content=b"sleep:20")
        assert time.monotonic() - started < 10
        code, _, message = error_of(r)
        assert code == 500 and "response_timeout (2 s)" in message
        assert wait_gone([int(pid_before)]) == []
        r = client.post("/predictions/control", content=b"pid")
        assert r.status_code == 200 and r.text != pid_before


def test_startup_timeout_and_broken_load_are_reported(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server("slowload.mar,broken.mar")
    report = server.start()
    assert report.startswith("READY")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        ping = client.get("/ping")
        assert ping.status_code == 500 and ping.json() == {"status": "Unhealthy"}
        code, _, message = error_of(client.post("/predictions/slowload", content=b"x"))
        assert code == 503 and "startup_timeout (1 s)" in message
        code, _, message = error_of(client.post("/predictions/broken", content=b"x"))
        assert code == 503 and "weights are missing" in message


def test_client_disconnect_cancels_queued_and_running_requests(server: Server) -> None:
    markers = server.workdir / "markers"

    def doomed(body: bytes) -> None:
        try:
            httpx.post(f"{server.url}/predictions/control", content=body, timeout=0.5)
        except httpx.TimeoutException:
            pass  # the client gives up and closes its connection

    running = threading.Thread(target=doomed, args=(b"sleep:1.8",))
    running.start()
    deadline = time.monotonic() + 10
    while not list(markers.glob("started-*")) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the handler runs it
    queued = threading.Thread(target=doomed, args=(b"crash",))  # must never run
    queued.start()
    running.join()
    queued.join()
    deadline = time.monotonic() + 5
    while not list(markers.glob("cancelled-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(markers.glob("cancelled-*"))) == 1  # the running one was told to stop
    with httpx.Client(base_url=server.url, timeout=30) as client:
        pid = client.post("/predictions/control", content=b"pid").text
        # the queued "crash" was dropped: the same worker is still alive
        time.sleep(0.3)
        assert client.post("/predictions/control", content=b"pid").text == pid


def test_queue_full_is_503_with_retry_after(make_server) -> None:  # type: ignore[no-untyped-def]
    server = make_server(properties={"job_queue_size": "1"})
    server.start()
    markers = server.workdir / "markers"
    results: list[int] = []

    def call() -> None:
        results.append(
            httpx.post(
                f"{server.url}/predictions/control", content=b"sleep:1.5", timeout=30
            ).status_code
        )

    def pending() -> int:
        described = httpx.get(f"{server.management_url}/models/control", timeout=30).json()
        return int(described[0]["jobQueueStatus"]["pendingRequests"])

    def received() -> float:
        found = samples(httpx.get(f"{server.metrics_url}/metrics", timeout=30).text)
        counts = found.get("ts_inference_requests_total", [])
        return sum(v for labels, v in counts if labels.get("model_name") == "control")

    def wait_for(check, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 10
        while not check() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert check(), f"{what}: {results}\n{server.log}"

    # One request at a time: the first must be running (its handler has started) before the
    # second arrives, and the second must be with the worker before the third arrives.
    # The second waits behind the running one at the (only) worker; the third waits in the
    # queue (its one slot, pendingRequests 1); the fourth finds the queue full.
    threads = [threading.Thread(target=call) for _ in range(3)]
    threads[0].start()
    wait_for(lambda: any(markers.glob("started-*")), "the first request never started")
    threads[1].start()
    # the server has the second request (counted on arrival) and none is pending: it was
    # sent behind the running one
    wait_for(lambda: received() == 2, "the second request never arrived")
    assert pending() == 0
    threads[2].start()
    wait_for(lambda: pending() == 1, "the third request never queued")
    r = httpx.post(f"{server.url}/predictions/control", content=b"x", timeout=30)
    for t in threads:
        t.join()
    code, _, message = error_of(r)
    assert code == 503 and "job_queue_size" in message
    assert r.headers["Retry-After"]
    assert sorted(results) == [200, 200, 200]


def test_sigterm_drains_in_flight_requests_then_stops_workers(server: Server) -> None:
    workers = server.worker_pids()
    assert workers
    result: list[httpx.Response] = []
    t = threading.Thread(
        target=lambda: result.append(
            httpx.post(f"{server.url}/predictions/control", content=b"sleep:1.5", timeout=30)
        )
    )
    t.start()
    markers = server.workdir / "markers"
    deadline = time.monotonic() + 10
    while not list(markers.glob("started-*")) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the handler runs it
    server.signal(signal.SIGTERM)
    t.join()
    assert result[0].status_code == 200 and result[0].text == "slept"
    assert server.wait(30) == 0
    assert wait_gone(workers) == []
    assert "trioserve stopped" in server.log


@pytest.mark.parametrize("state", ["loading", "idle", "busy"])
def test_sigkill_of_the_server_leaves_no_workers(make_server, state: str) -> None:  # type: ignore[no-untyped-def]
    server = make_server("control=control.mar,slowload.mar")
    server.start()
    if state == "busy":

        def call() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server is killed under it
                httpx.post(f"{server.url}/predictions/control", content=b"sleep:1.8", timeout=30)

        threading.Thread(target=call, daemon=True).start()
        time.sleep(0.3)
    if state == "loading":
        # slowload's worker restarts and loads again after its startup timeout
        time.sleep(0.2)
    workers = server.worker_pids()
    assert len(workers) >= 1
    assert server.process is not None
    server.process.kill()
    server.process.wait(10)
    assert wait_gone(workers, timeout=10) == []


def test_background_start_and_stop_commands(tmp_path: Path, store: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\n"
        "management_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\n"
        "grpc_inference_port=0\ngrpc_management_port=0\n"
        "disable_token_authorization=true\n"
    )
    env = {
        "TRIOSERVE_PID_FILE": str(tmp_path / "ts.pid"),
        "LOG_LOCATION": str(tmp_path / "logs"),
        "PATH": "/usr/bin:/bin",
    }
    env = {**os.environ, **env}
    start = subprocess.run(
        [
            sys.executable,
            "-m",
            "trioserve",
            "--start",
            "--ts-config",
            str(config),
            "--model-store",
            str(store),
            "--models",
            "control=control.mar",
            "--ncs",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=tmp_path,
    )
    assert start.returncode == 0, start.stderr
    assert "trioserve started" in start.stdout
    # The command prints the bound addresses, so port 0 tells us where it listens.
    found = re.search(r"inference=http://127\.0\.0\.1:(\d+)", start.stdout)
    assert found, start.stdout
    port = int(found[1])
    pid = int((tmp_path / "ts.pid").read_text())
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/predictions/control", content=b"bg", timeout=30)
        assert r.text == "bg"
        again = subprocess.run(
            [sys.executable, "-m", "trioserve", "start", "--ts-config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        assert again.returncode == 1 and "already running" in again.stderr
        kids = [p.pid for p in psutil.Process(pid).children(recursive=True)]
        stop = subprocess.run(
            [sys.executable, "-m", "trioserve", "stop"],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
        )
        assert stop.returncode == 0, stop.stderr
        assert wait_gone([pid, *kids]) == []
        assert not (tmp_path / "ts.pid").exists()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_bad_config_value_stops_startup_with_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("job_queue_size=ten\n")
    out = subprocess.run(
        [sys.executable, "-m", "trioserve", "start", "--foreground", "--ts-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "job_queue_size" in out.stderr and "ten" in out.stderr


def test_port_in_use_fails_startup_with_the_reason(make_server) -> None:  # type: ignore[no-untyped-def]
    first = make_server()
    first.start()
    second = make_server()
    config = second.workdir / "config.properties"
    config.write_text(f"inference_address={first.url}\n")
    out = subprocess.run(
        [sys.executable, "-m", "trioserve", "start", "--ts-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "TRIOSERVE_PID_FILE": str(second.workdir / "p"),
            "LOG_LOCATION": str(second.workdir),
        },
    )
    assert out.returncode == 1
    assert "failed to start" in out.stderr and "address already in use" in out.stderr.lower()


def test_an_error_with_an_unread_body_does_not_stall_the_next_request(server: Server) -> None:
    # Found by schemathesis: a 405 left the body unread and the keep-alive connection hung.
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for method in ("TRACE", "QUERY", "OPTIONS", "POST"):
            conn.request(
                method,
                "/predictions/nope",
                body=b'""',
                headers={"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            response.read()
            assert response.status in (404, 405)
            assert response.getheader("Connection") == "close"
    finally:
        conn.close()
