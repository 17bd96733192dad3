"""download / check_allowed: http(s) models only from allowed URLs, nothing left on failure."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio

from trioserve.archive import ArchiveError
from trioserve.archive.download import check_allowed, download

from ..loopback_http import serving

MAR = b"PK\x03\x04 a small model archive " + bytes(range(256))
LIMIT = 4096
BIG = b"x" * (LIMIT * 4)
DRIP_LENGTH = 1_000_000


@dataclass
class Server:
    base: str
    requests: list[str] = field(default_factory=list)
    drip_bytes_sent: int = 0


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    state: Server
    stop: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client going away mid-body is expected here


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", *, length: bool = True, **headers: str) -> None:
        self.send_response(status)
        if length:
            self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, length: int, delay: float) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        for _ in range(length):
            if self.server.stop.wait(delay):
                return
            self.wfile.write(b"d")
            self.wfile.flush()
            self.server.state.drip_bytes_sent += 1

    def do_GET(self) -> None:
        self.server.state.requests.append(self.path)
        path = self.path.split("?", 1)[0]
        if path in ("/models/echo.mar", "/models/echo.tar.gz", "/models/echo.tgz"):
            self._send(200, MAR)
        elif path == "/models/big_declared.mar":
            self._send(200, BIG)
        elif path == "/models/big_undeclared.mar":
            self._send(200, BIG, length=False)  # HTTP/1.0: the body ends at close
        elif path == "/models/short.mar":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"only part")
        elif path == "/models/redirect.mar":
            self._send(302, Location="/models/echo.mar")
        elif path == "/models/slow.mar":
            self._drip(DRIP_LENGTH, 0.02)
        elif path == "/models/drip.mar":
            self._drip(20, 0.02)
        elif path == "/models/stall.mar":
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.flush()
            self.server.stop.wait(10)
        else:
            self._send(404, b"not found")


@pytest.fixture
def server() -> Iterator[Server]:
    httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
    httpd.stop = threading.Event()
    with serving(httpd) as base:
        httpd.state = Server(base=base)
        try:
            yield httpd.state
        finally:
            httpd.stop.set()  # handlers waiting on it end before the server shuts down


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    return store


def _listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def _allow(server: Server) -> list[str]:
    return [r"http://127\.0\.0\.1:\d+/models/.*"]


async def _fail(url: str, store: Path, allowed: list[str], **kwargs: Any) -> ArchiveError:
    kwargs.setdefault("max_bytes", LIMIT)
    with pytest.raises(ArchiveError) as info:
        await download(url, store, allowed, **kwargs)
    return info.value


# --- check_allowed ----------------------------------------------------------------------


def test_check_allowed_needs_a_full_match() -> None:
    allowed = [r"https://models\.example\.com/.*\.mar", r"http://10\.0\.0\.1/a\.mar"]
    check_allowed("https://models.example.com/x/echo.mar", allowed)
    check_allowed("http://10.0.0.1/a.mar", allowed)
    for url in (
        "https://models.example.com/echo.mar.evil",  # prefix match only
        "https://evil.com/?https://models.example.com/echo.mar",  # match inside
        "http://10.0.0.1/a.mar/../secret",
        "https://models.example.com.evil.com/echo.mar",
    ):
        with pytest.raises(ArchiveError) as info:
            check_allowed(url, allowed)
        assert info.value.status == 404
        assert info.value.message == f"Given URL {url} does not match any allowed URL(s)"


def test_check_allowed_empty_list_refuses_with_hint() -> None:
    for url in ("http://127.0.0.1/echo.mar", "https://example.com/echo.mar", "file:///x.mar"):
        with pytest.raises(ArchiveError) as info:
            check_allowed(url, [])
        assert info.value.status == 404
        assert "does not match any allowed URL(s)" in info.value.message
        assert "allowed_urls" in info.value.message


def test_check_allowed_skips_invalid_patterns() -> None:
    check_allowed("http://a/b.mar", ["(", r"http://a/.*"])
    with pytest.raises(ArchiveError) as info:
        check_allowed("http://a/b.mar", ["(", "[z-a]"])
    assert info.value.status == 404


# --- download: refusals before any network access ----------------------------------------


async def test_refused_url_is_never_contacted(server: Server, store: Path) -> None:
    err = await _fail(f"{server.base}/models/echo.mar", store, [r"http://127\.0\.0\.1:\d+/ok/.*"])
    assert err.status == 404
    assert "does not match any allowed URL(s)" in err.message
    assert server.requests == []
    assert _listing(store) == []


async def test_empty_allow_list_refuses_every_http_url(server: Server, store: Path) -> None:
    for path in ("/models/echo.mar", "/models/echo.tgz"):
        err = await _fail(server.base + path, store, [])
        assert err.status == 404
        assert "allowed_urls" in err.message
    https = await _fail("https://127.0.0.1:1/models/echo.mar", store, [])
    assert https.status == 404
    assert server.requests == []
    assert _listing(store) == []


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1/models/echo.mar", "file:///tmp/echo.mar", "echo.mar", "http:///echo.mar"],
)
async def test_only_http_urls_are_downloaded(store: Path, url: str) -> None:
    err = await _fail(url, store, [".*"])
    assert err.status == 400
    assert _listing(store) == []


@pytest.mark.parametrize(
    "path",
    [
        "/models/",
        "/models/echo.exe",
        "/models/echo.mar.exe",
        "/models/echo.zip",
        "/models/.mar",
        "/models/.hidden.mar",
        "/models/%2e%2e%2fevil.mar",
        "/models/..%2Fevil.mar",
        "/models/a%5Cb.mar",
        "/models/a%00b.mar",
        "/models/a%0ab.mar",
        "/models/%20echo.mar",
        "/models/" + "a" * 300 + ".mar",
    ],
)
async def test_bad_file_name_is_refused(server: Server, store: Path, path: str) -> None:
    err = await _fail(server.base + path, store, _allow(server))
    assert err.status == 400
    assert server.requests == []
    assert _listing(store) == []
    assert _listing(store.parent) == ["store"]


async def test_existing_file_is_409_without_download(server: Server, store: Path) -> None:
    (store / "echo.mar").write_bytes(b"mine")
    err = await _fail(f"{server.base}/models/echo.mar", store, _allow(server))
    assert err.status == 409
    assert err.message == "Model file echo.mar already exists in the model store"
    assert server.requests == []
    assert (store / "echo.mar").read_bytes() == b"mine"
    assert _listing(store) == ["echo.mar"]


async def test_existing_dangling_symlink_is_409(server: Server, store: Path) -> None:
    (store / "echo.mar").symlink_to(store.parent / "elsewhere.mar")
    err = await _fail(f"{server.base}/models/echo.mar", store, _allow(server))
    assert err.status == 409
    assert not (store.parent / "elsewhere.mar").exists()


# --- download: success ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["echo.mar", "echo.tar.gz", "echo.tgz"])
async def test_success_writes_exact_bytes_with_mode_0600(
    server: Server, store: Path, name: str
) -> None:
    path = await download(
        f"{server.base}/models/{name}?token=abc", store, _allow(server), max_bytes=LIMIT
    )
    assert path == store / name
    assert path.read_bytes() == MAR
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _listing(store) == [name]
    assert server.requests == [f"/models/{name}?token=abc"]


async def test_body_exactly_at_the_limit_is_accepted(server: Server, store: Path) -> None:
    path = await download(
        f"{server.base}/models/echo.mar", store, _allow(server), max_bytes=len(MAR)
    )
    assert path.read_bytes() == MAR


# --- download: failures leave nothing behind ------------------------------------------------


@pytest.mark.parametrize("path", ["/models/big_declared.mar", "/models/big_undeclared.mar"])
async def test_too_large_is_413_and_nothing_left(server: Server, store: Path, path: str) -> None:
    err = await _fail(server.base + path, store, _allow(server))
    assert err.status == 413
    assert str(LIMIT) in err.message
    assert _listing(store) == []


async def test_http_404_is_400(server: Server, store: Path) -> None:
    url = f"{server.base}/models/missing.mar"
    err = await _fail(url, store, _allow(server))
    assert err.status == 400
    assert err.message == f"Failed to download {url}: HTTP 404"
    assert _listing(store) == []


async def test_redirect_is_not_followed(server: Server, store: Path) -> None:
    err = await _fail(f"{server.base}/models/redirect.mar", store, _allow(server))
    assert err.status == 400
    assert "HTTP 302" in err.message
    assert "/models/echo.mar" in err.message  # names the Location
    assert server.requests == ["/models/redirect.mar"]
    assert _listing(store) == []


async def test_truncated_body_is_400(server: Server, store: Path) -> None:
    err = await _fail(f"{server.base}/models/short.mar", store, _allow(server))
    assert err.status == 400
    assert "1000" in err.message
    assert _listing(store) == []


async def test_connection_refused_is_400(store: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/models/echo.mar"
    err = await _fail(url, store, [".*"])
    assert err.status == 400
    assert err.message.startswith(f"Failed to download {url}: ")
    assert _listing(store) == []


async def test_stalled_read_times_out_as_400(server: Server, store: Path) -> None:
    err = await _fail(f"{server.base}/models/stall.mar", store, _allow(server), timeout=0.3)
    assert err.status == 400
    assert _listing(store) == []


async def test_file_appearing_during_download_is_409(server: Server, store: Path) -> None:
    async def squat() -> None:
        while not any(n.startswith(".drip.mar.") for n in _listing(store)):
            await trio.sleep(0.005)
        (store / "drip.mar").write_bytes(b"theirs")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(squat)
        err = await _fail(f"{server.base}/models/drip.mar", store, _allow(server))
    assert err.status == 409
    assert (store / "drip.mar").read_bytes() == b"theirs"
    assert _listing(store) == ["drip.mar"]


async def test_cancellation_leaves_nothing_behind(server: Server, store: Path) -> None:
    temp_modes: list[int] = []

    async def watch() -> None:
        while server.drip_bytes_sent < 5:
            await trio.sleep(0.005)
        temp_modes.extend(stat.S_IMODE((store / n).stat().st_mode) for n in _listing(store))

    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        with trio.move_on_after(0.5) as scope:
            await download(
                f"{server.base}/models/slow.mar", store, _allow(server), max_bytes=DRIP_LENGTH
            )
    assert scope.cancelled_caught
    assert time.monotonic() - start < 2
    assert temp_modes == [0o600]  # the partial download was a private temp file
    assert _listing(store) == []
    # The abandoned thread notices, stops reading and still leaves nothing behind.
    sent = server.drip_bytes_sent
    await trio.sleep(0.3)
    assert server.drip_bytes_sent - sent <= 3
    assert _listing(store) == []


async def test_cancelled_before_start_leaves_nothing(server: Server, store: Path) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await download(f"{server.base}/models/echo.mar", store, _allow(server), max_bytes=LIMIT)
    assert _listing(store) == []
    assert server.requests == []
