"""trioserve's own HTTP/1.1 server on the inference port, at the wire: curl and raw sockets."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from .server import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, store: Path):  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("front")
    (workdir / "markers").mkdir()
    s = Server(
        workdir,
        store,
        "control=control.mar",
        properties={"max_request_size": "100000"},
        env={"TRIOSERVE_TEST_MARKERS": str(workdir / "markers")},
    )
    s.start()
    yield s
    s.stop()
    s.kill()


def exchange(server: Server, data: bytes, *, timeout: float = 10) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def responses(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split raw bytes into responses (every response here has a Content-Length)."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        out.append((status, headers, raw[:length]))
        raw = raw[length:]
    return out


curl = shutil.which("curl") or "curl"


def test_curl_gets_100_continue_for_a_large_body(server: Server, tmp_path: Path) -> None:
    body = tmp_path / "body.bin"
    body.write_bytes(b"x" * 5000)
    out = subprocess.run(
        [curl, "-sv", "-H", "Expect: 100-continue", "-H", "Content-Type: application/octet-stream",
         "--data-binary", f"@{body}", f"{server.url}/predictions/control"],
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert b"Expect: 100-continue" in out.stderr
    assert b"HTTP/1.1 100 Continue" in out.stderr
    assert out.stdout == b"x" * 5000


def test_curl_can_send_a_chunked_body(server: Server, tmp_path: Path) -> None:
    body = tmp_path / "body.bin"
    body.write_bytes(b"chunked body " * 300)
    out = subprocess.run(
        [curl, "-s", "-H", "Transfer-Encoding: chunked", "-H", "Content-Type: text/plain",
         "--data-binary", f"@{body}",
         f"{server.url}/predictions/control"],
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"chunked body " * 300


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    one = b"POST /predictions/control HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\none"
    two = b"POST /predictions/control HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\ntwo"
    last = b"GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    answers = responses(exchange(server, one + two + last))
    assert [(status, body) for status, _, body in answers[:2]] == [(200, b"one"), (200, b"two")]
    assert answers[2][0] == 200 and json.loads(answers[2][2]) == {"status": "Healthy"}
    assert answers[2][1]["connection"] == "close"


def test_http_1_0_without_host_is_served_and_closed(server: Server) -> None:
    raw = exchange(server, b"POST /predictions/control HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
    ((status, headers, body),) = responses(raw)
    assert (status, body) == (200, b"hi")
    assert headers["connection"] == "close"


def test_a_stream_to_an_http_1_0_client_ends_with_the_connection(server: Server) -> None:
    raw = exchange(
        server, b"POST /predictions/control HTTP/1.0\r\nContent-Length: 8\r\n\r\nstream:2"
    )
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower()
    assert body == b"part0;part1;end"


def test_malformed_requests_get_a_torchserve_error_and_the_connection_closes(
    server: Server,
) -> None:
    for data, status, words in [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "request line"),
        (b"POST /predictions/control HTTP/1.1\r\n\r\n", 400, "Host"),
        (
            b"POST /predictions/control HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            400,
            "both",
        ),
        (b"GET / HTTP/3.0\r\nHost: t\r\n\r\n", 505, "HTTP/1."),
    ]:
        ((got, headers, body),) = responses(exchange(server, data))
        error = json.loads(body)
        assert got == status == error["code"], body
        assert words in error["message"]
        assert headers["connection"] == "close"


def test_an_oversized_body_is_refused_before_it_is_sent(server: Server) -> None:
    head = b"POST /predictions/control HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n"
    ((status, headers, body),) = responses(exchange(server, head))  # no body sent at all
    assert status == 413
    assert json.loads(body)["message"] == (
        "Request body is larger than max_request_size (100000 bytes)."
    )
    assert headers["connection"] == "close"


def test_forms_and_other_routes_still_reach_the_quart_app(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/predictions/control", data={"body": "params"})
        assert r.status_code == 200 and r.json() == {"body": "params"}
        assert client.get("/api-description").json()["openapi"] == "3.0.1"
        missing = client.get("/no/such/route")
        assert missing.status_code == 404
        assert missing.json()["type"] == "ResourceNotFoundException"
        head = client.head("/ping")
        assert head.status_code == 200 and head.content == b""


def test_keep_alive_carries_many_requests_on_one_connection(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for i in range(20):
            body = f"round {i}".encode()
            sock.sendall(
                b"POST /predictions/control HTTP/1.1\r\nHost: t\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            raw = b""
            while b"\r\n\r\n" not in raw or not raw.endswith(body):
                raw += sock.recv(65536)
            assert raw.startswith(b"HTTP/1.1 200 OK") and raw.endswith(body)


def test_the_inference_api_can_listen_on_a_unix_socket(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "inference.sock"
    unix: Server = make_server(properties={"inference_address": f"unix:{path}"})
    report = unix.start()
    assert f"inference=unix:{path}" in report
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, base_url="http://trioserve", timeout=30) as client:
        assert client.post("/predictions/control", content=b"over uds").text == "over uds"
        assert client.get("/ping").json() == {"status": "Healthy"}
    unix.stop()
    assert not path.exists()  # the socket file is removed at shutdown
