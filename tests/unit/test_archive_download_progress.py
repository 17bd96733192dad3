"""What a model download shows while it runs: a bar when the server's stream is a terminal,
rate-limited lines in the log otherwise, and a final line with the size and time."""

from __future__ import annotations

import io
import logging
import os
import re
import termios
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trioserve.archive import ArchiveError
from trioserve.archive._progress import ENV
from trioserve.archive.download import download

from ..loopback_http import serving

MiB = 1024 * 1024
BIG = 12 * MiB
LOGGER = "trioserve.archive.download"
BAR_UPDATE = re.compile(r"\r(?!\n)")  # tqdm redraws with a bare '\r' (a tty adds '\r\n')


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self, size: int, *, declared: int | None) -> None:
        self.send_response(200)
        if declared is not None:
            self.send_header("Content-Length", str(declared))
        self.end_headers()
        block = bytes(MiB)
        for start in range(0, size, MiB):
            self.wfile.write(block[: min(MiB, size - start)])

    def do_GET(self) -> None:
        if self.path == "/big.mar":
            self._body(BIG, declared=BIG)
        elif self.path == "/unsized.mar":
            self._body(BIG, declared=None)  # HTTP/1.0: the body ends when the server closes
        elif self.path == "/small.mar":
            self._body(1000, declared=1000)
        elif self.path == "/cut.mar":
            self._body(3 * MiB, declared=BIG)
        else:
            self.send_error(404)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client may hang up on a cut body


@pytest.fixture
def base() -> Iterator[str]:
    with serving(_Server(("127.0.0.1", 0), _Handler)) as url:
        yield url


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(ENV, raising=False)
    store = tmp_path / "store"
    store.mkdir()
    return store


class _Terminal:
    """A pseudo-terminal: ``stream`` writes to it, ``shown()`` is what it received."""

    def __init__(self) -> None:
        self._master, slave = os.openpty()
        termios.tcsetwinsize(slave, (24, 100))
        self.stream = os.fdopen(slave, "w")
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._drain)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: the slave end is closed
                return
            if not data:
                return
            self._chunks.append(data)

    def shown(self) -> str:
        self.close()
        return b"".join(self._chunks).decode()

    def close(self) -> None:
        if not self.stream.closed:
            self.stream.close()
            self._reader.join(10)
            os.close(self._master)


@pytest.fixture
def terminal() -> Iterator[Callable[[], _Terminal]]:
    """Opens pseudo-terminals; each is closed at the end, even when a test fails early."""
    opened: list[_Terminal] = []

    def open_one() -> _Terminal:
        opened.append(_Terminal())
        return opened[-1]

    yield open_one
    for one in opened:
        one.close()


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _percent_steps(messages: list[str], name: str) -> list[int]:
    """The tens of percent each progress line reports (the read sizes vary)."""
    steps = []
    for message in messages:
        pattern = rf"downloading {re.escape(name)}: \S+ MiB of 12\.0 MiB \((\d+)%\)"
        match = re.fullmatch(pattern, message)
        assert match is not None, message
        steps.append(int(match[1]) // 10)
    return steps


async def _get(base: str, name: str, store: Path, **kwargs: Any) -> Path:
    return await download(f"{base}/{name}", store, [".*"], max_bytes=64 * MiB, **kwargs)


async def test_terminal_gets_a_bar_and_the_log_the_final_line(
    base: str, store: Path, caplog: pytest.LogCaptureFixture, terminal: Callable[[], _Terminal]
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    tty = terminal()
    path = await _get(base, "big.mar", store, stream=tty.stream)
    shown = tty.shown()
    assert path.stat().st_size == BIG
    assert "downloading big.mar: 100%|" in shown
    assert "12.0M/12.0M" in shown
    assert BAR_UPDATE.search(shown), repr(shown)
    [final] = _messages(caplog)
    assert re.fullmatch(r"downloaded big\.mar: 12\.0 MiB in \d+\.\d s \(.*/s\)", final)


async def test_a_log_file_gets_lines_every_ten_percent(
    base: str, store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    stream = io.StringIO()  # the server's stderr redirected to a file: not a terminal
    await _get(base, "big.mar", store, stream=stream)
    assert stream.getvalue() == ""
    messages = _messages(caplog)
    # about 192 reads, one line per 10 %: not one per read
    assert _percent_steps(messages[:-1], "big.mar") == list(range(1, 10))
    assert messages[-1].startswith("downloaded big.mar: 12.0 MiB in ")


async def test_unknown_size_and_small_files_log_the_final_line_only(
    base: str, store: Path, caplog: pytest.LogCaptureFixture, terminal: Callable[[], _Terminal]
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    await _get(base, "unsized.mar", store, stream=io.StringIO())
    # no percentages without a size; a line every 10 s, and this took less
    assert [m.split(" in ")[0] for m in _messages(caplog)] == ["downloaded unsized.mar: 12.0 MiB"]
    caplog.clear()
    tty = terminal()
    await _get(base, "small.mar", store, stream=tty.stream)
    assert tty.shown() == ""  # no bar for 1000 bytes
    assert [m.split(" in ")[0] for m in _messages(caplog)] == ["downloaded small.mar: 1000 B"]


async def test_a_failed_download_has_no_final_line(
    base: str, store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    with pytest.raises(ArchiveError, match="ended after 3145728 of 12582912 bytes"):
        await _get(base, "cut.mar", store, stream=io.StringIO())
    assert _percent_steps(_messages(caplog), "cut.mar") == [1, 2]  # and no final line
    assert os.listdir(store) == []


async def test_progress_can_be_silenced(
    base: str,
    store: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    terminal: Callable[[], _Terminal],
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    tty = terminal()
    await _get(base, "big.mar", store, stream=tty.stream, progress=False)
    assert tty.shown() == ""
    monkeypatch.setenv(ENV, "0")
    (store / "big.mar").unlink()
    tty = terminal()
    await _get(base, "big.mar", store, stream=tty.stream)
    assert tty.shown() == ""
    assert _messages(caplog) == []
