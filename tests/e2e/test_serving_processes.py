"""Several serving processes (``serving_processes = 2``), end to end: real processes sharing
the listening sockets and the workers, real clients. Which process serves a connection is
read from the kernel (psutil: the process holding the server end of it)."""

from __future__ import annotations

import re
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from .server import Server

pytestmark = pytest.mark.e2e

HEADER = "ts_request_sequence_id"


OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


class Conn:
    """One keep-alive HTTP/1.1 connection over a plain socket (its local port known)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        OPEN.append(self.sock)
        self.port = self.sock.getsockname()[1]
        self.buffer = b""

    def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode() + body)
        head = self._until(b"\r\n\r\n").decode()
        lines = head.split("\r\n")
        fields = {
            k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])
        }
        size = int(fields.get("content-length", "0"))
        while len(self.buffer) < size:
            self._read()
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return int(lines[0].split()[1]), fields, body

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            self._read()
        found, self.buffer = self.buffer.split(marker, 1)
        return found

    def close(self) -> None:
        self.sock.close()


def serving_pids(server: Server) -> list[int]:
    assert server.process is not None
    return [server.process.pid, *server.serving_pids()]


def owner(server: Server, conn: Conn) -> int:
    """The serving process that holds the server end of ``conn``."""
    for _ in range(100):
        for pid in serving_pids(server):
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == conn.port and c.laddr.port == server.port:
                    return pid
        time.sleep(0.02)
    raise AssertionError(f"no serving process holds the connection from port {conn.port}")


def spread(server: Server, per_process: int = 2, within: float = 60) -> dict[int, list[Conn]]:
    """Open connections until every serving process holds ``per_process`` of them (a
    serving process started with the server may still be applying its first state when the
    server says it is ready: on a loaded machine that takes a while)."""
    held: dict[int, list[Conn]] = {pid: [] for pid in serving_pids(server)}
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(len(conns) >= per_process for conns in held.values()):
            break
        conn = Conn(server.port)
        status, _h, body = conn.post("/predictions/control2", b"hi")  # accepted and served
        assert status == 200, body
        pid = owner(server, conn)
        if len(held[pid]) < per_process:
            held[pid].append(conn)
        else:
            conn.close()
    assert all(len(conns) >= per_process for conns in held.values()), {
        pid: len(c) for pid, c in held.items()
    }
    return held


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    server: Server = make_server(
        "control2=control2.mar,stateful=stateful.mar,streamsum1=streamsum1.mar",
        properties={
            "serving_processes": "2",
            "default_workers_per_model": "2",
            "enable_model_api": "true",
        },
    )
    server.start()
    return server


def test_two_serving_processes_share_the_port_and_every_worker(server: Server) -> None:
    assert len(server.serving_pids()) == 1
    held = spread(server, per_process=2)
    workers = set(server.worker_pids())
    for pid, conns in held.items():
        # Two requests at once from this process's connections, each holding a worker for
        # 0.3 s: both workers answer this process.
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda c: c.post("/predictions/control2", b"pid:0.3"), conns))
        assert [a[0] for a in answers] == [200, 200]
        seen = {int(a[2]) for a in answers}
        assert seen <= workers and len(seen) == 2, (pid, seen, workers)
    for conns in held.values():
        for conn in conns:
            conn.close()


def test_a_killed_serving_process_costs_only_its_connections_and_is_restarted(
    server: Server,
) -> None:
    held = spread(server, per_process=1)
    assert server.process is not None
    child = next(pid for pid in held if pid != server.process.pid)
    mine = held[server.process.pid][0]
    theirs = held[child][0]
    workers = set(server.worker_pids()) - {child}
    with ThreadPoolExecutor(2) as pool:
        lost = pool.submit(theirs.post, "/predictions/control2", b"pid:1")
        kept = pool.submit(mine.post, "/predictions/control2", b"pid:1")
        time.sleep(0.3)
        psutil.Process(child).send_signal(signal.SIGKILL)
        with pytest.raises((ConnectionError, OSError)):
            lost.result()
        assert kept.result()[0] == 200
    # Restarted, with a new pid; the workers are the same processes and still serve.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = server.serving_pids()
        if pids and child not in pids:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the serving process was not restarted:\n{server.log}")
    assert set(server.worker_pids()) - set(server.serving_pids()) == workers
    held = spread(server, per_process=1)
    for conns in held.values():
        assert conns[0].post("/predictions/control2", b"ok")[2] == b"ok"
        conns[0].close()
    mine.close()


def test_sigterm_drains_every_serving_process(server: Server) -> None:
    held = spread(server, per_process=1)
    with ThreadPoolExecutor(len(held)) as pool:
        running = [pool.submit(c[0].post, "/predictions/control2", b"pid:1") for c in held.values()]
        time.sleep(0.3)
        server.signal(signal.SIGTERM)
        assert [r.result()[0] for r in running] == [200] * len(held)
    assert server.wait(30) == 0


def test_management_changes_are_seen_by_every_process_when_the_call_answers(
    server: Server,
) -> None:
    held = spread(server, per_process=1)
    with httpx.Client(base_url=server.management_url, timeout=60) as manage:
        r = manage.post(
            "/models", params={"url": "echo.mar", "initial_workers": "1", "synchronous": "true"}
        )
        assert r.status_code == 200, r.text
        for conns in held.values():
            status, _fields, body = conns[0].post("/predictions/echo", b"seen")
            assert (status, body) == (200, b"seen")
        r = manage.put("/models/control2", params={"min_worker": "3", "synchronous": "true"})
        assert r.status_code == 200, r.text
        for conns in held.values():
            with ThreadPoolExecutor(3) as pool:
                extra = [Conn(server.port) for _ in range(2)]
                answers = list(
                    pool.map(
                        lambda c: c.post("/predictions/control2", b"pid:0.4"), [conns[0], *extra]
                    )
                )
                for c in extra:
                    c.close()
            assert all(a[0] == 200 for a in answers)
        r = manage.delete("/models/echo")
        assert r.status_code == 200, r.text
        for conns in held.values():
            assert conns[0].post("/predictions/echo", b"gone")[0] == 404
            conns[0].close()


def control2_requests(server: Server) -> float:
    """ts_inference_requests_total of control2, as the metrics port shows it."""
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    counts = re.findall(
        r'ts_inference_requests_total\{[^}]*model_name="control2"[^}]*\} (\S+)', text
    )
    assert counts, text
    return sum(float(c) for c in counts)


def test_metrics_are_the_servers_totals(server: Server) -> None:
    held = spread(server, per_process=2)
    before = control2_requests(server)
    sent = 0
    for conns in held.values():
        for conn in conns:
            for _ in range(3):
                assert conn.post("/predictions/control2", b"x")[0] == 200
                sent += 1
            conn.close()
    # Every request counted once, whichever process answered it (half went to each).
    assert control2_requests(server) - before == sent


def test_sequences_keep_their_sums_with_requests_spread_over_processes(server: Server) -> None:
    held = spread(server, per_process=3)

    def run(client: int) -> list[int]:
        # This client's connections, one held by each process: its requests alternate.
        conns = [held[pid][client] for pid in sorted(held, reverse=client % 2 == 1)]
        sequence_id = None
        sums = []
        for n, value in enumerate([1, 2, 3, 4, 5, 6, 7, 8]):
            headers = {HEADER: sequence_id} if sequence_id else {}
            status, fields, body = conns[n % 2].post(
                "/predictions/stateful", str(value).encode(), headers
            )
            assert status == 200, body
            sequence_id = fields[HEADER]
            sums.append(int(body.split()[0]))
        return sums

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, range(3)))
    assert results == [[1, 3, 6, 10, 15, 21, 28, 36]] * 3


def test_a_continuous_batching_stream_cancels_from_another_process(server: Server) -> None:
    assert server.process is not None
    held = spread(server, per_process=1)
    child = next(pid for pid in held if pid != server.process.pid)
    conn = held[child][0]
    status, fields, _ = conn.post("/predictions/streamsum1", b"2")
    leaving = fields[HEADER]
    status, fields, _ = conn.post("/predictions/streamsum1", b"2")
    other = fields[HEADER]
    # A stream on the child's connection, abandoned after its first answer.
    conn.sock.sendall(
        f"POST /predictions/streamsum1 HTTP/1.1\r\nHost: x\r\n{HEADER}: {leaving}\r\n"
        "Content-Length: 1\r\n\r\n3".encode()
    )
    conn._until(b"\r\n\r\n")
    conn._until(b"\r\n")  # the first chunk's size line
    conn.close()
    time.sleep(0.3)
    again = Conn(server.port)
    status, fields, body = again.post("/predictions/streamsum1", b"4", {HEADER: other})
    assert status == 200 and fields["x-step-batch"] == "1", (fields, body)
    assert again.post("/predictions/streamsum1", b"4", {HEADER: leaving})[2] == b"9"
    again.close()
    for conns in held.values():
        for c in conns:
            c.close()
