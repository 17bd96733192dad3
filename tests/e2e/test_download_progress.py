"""Registering a large model by URL: the server (its stderr a log file) logs the download's
progress every 10 % and a final line with the size and time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from trioserve.archive import write_archive

from ..loopback_http import serving
from .server import Server, running

pytestmark = pytest.mark.e2e
REPO_HANDLERS = Path(__file__).resolve().parents[2] / "handlers"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A 12 MiB stored (uncompressed) archive of the echo model, served over loopback."""
    folder = tmp_path / "served"
    weights = tmp_path / "weights.pt"
    with weights.open("wb") as file:
        file.truncate(12 * 1024 * 1024)
    write_archive(
        model_name="bigecho",
        version="1.0",
        handler=str(REPO_HANDLERS / "echo" / "echo_handler.py"),
        export_path=folder,
        serialized_file=weights,
        archive_format="zip-store",
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
    with serving(httpd) as base:
        yield base


def test_register_by_url_logs_the_progress(tmp_path: Path, served: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    workdir = tmp_path / "server"
    workdir.mkdir()
    properties = {"enable_model_api": "true", "allowed_urls": re.escape(served) + "/.*"}
    with running(Server(workdir, store, "", properties=properties)) as server:
        with httpx.Client(base_url=server.management_url, timeout=60) as client:
            answer = client.post("/models", params={"url": f"{served}/bigecho.mar"})
        assert answer.status_code == 200, answer.text
        log = server.log
    assert (store / "bigecho.mar").is_file()
    steps = re.findall(r"downloading bigecho\.mar: \S+ MiB of 12\.0 MiB \((\d+)%\)", log)
    assert [int(percent) // 10 for percent in steps] == list(range(1, 10)), log
    assert re.search(r"downloaded bigecho\.mar: 12\.0 MiB in \d+\.\d s", log), log
    assert "\r" not in log  # no bar in a log file
