"""Form bodies end to end: curl -F reaches the handler field by field, and a malformed form
is answered 400 saying what is wrong, without the handler running (TorchServe, and trioserve
before, ran it with an empty input), the server and worker unharmed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from trioserve.http.forms import MAX_FORM_PARTS

from .server import Server

pytestmark = pytest.mark.e2e

BOUNDARY = "b0undary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
PART = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="data"\r\n\r\nparams\r\n'
MALFORMED = {
    "no boundary parameter": (
        "multipart/form-data",
        f"{PART}--{BOUNDARY}--\r\n",
        "the Content-Type header has no boundary parameter",
    ),
    "body without the boundary": (MULTIPART, "data=params", "delimiter '--b0undary'"),
    "unterminated part": (MULTIPART, PART[:-2], "part 1 is not terminated"),
    "no closing delimiter": (
        MULTIPART,
        f"{PART}--{BOUNDARY}\r\n",
        "ends after part 1 without the closing delimiter '--b0undary--'",
    ),
    "no Content-Disposition": (
        MULTIPART,
        f"--{BOUNDARY}\r\nContent-Type: text/plain\r\n\r\nparams\r\n--{BOUNDARY}--\r\n",
        "part 1 has no Content-Disposition header",
    ),
    "no name": (
        MULTIPART,
        f"--{BOUNDARY}\r\nContent-Disposition: form-data\r\n\r\nparams\r\n--{BOUNDARY}--\r\n",
        "part 1 has no name",
    ),
    "urlencoded, not UTF-8": (
        "application/x-www-form-urlencoded",
        "data=params&x=\udcff",
        "byte 14 is not UTF-8",
    ),
}


def _rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def _handler_batches(server: Server) -> int:
    """How many batches the control handler has run (it logs each one)."""
    log = server.workdir / "markers" / "batches.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    s: Server = make_server("control=control.mar")
    s.start()
    return s


def test_curl_form_fields_and_files_reach_the_handler(server: Server, tmp_path: Path) -> None:
    upload = tmp_path / "f.txt"
    upload.write_bytes(b"file content\n")
    done = subprocess.run(
        ["curl", "-sS", "-X", "POST", f"{server.url}/predictions/control",
         "-F", "data=params", "-F", f"file=@{upload}", "-F", "empty=",
         "-F", f"img=@{upload};type=image/png"],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert httpx.Response(200, content=done.stdout).json() == {
        "data": "params",
        "empty": "",
        "file": "file content\n",
        "img": "file content\n",
    }


def test_malformed_forms_are_400_and_never_reach_the_handler(server: Server) -> None:
    pids = [server.process.pid, *server.worker_pids()] if server.process else []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        good = client.post("/predictions/control", data={"data": "params", "x": "1"})
        assert good.json() == {"data": "params", "x": "1"}
        ran = _handler_batches(server)
        before = _rss(pids)
        for _round in range(20):
            for problem, (content_type, body, says) in MALFORMED.items():
                answer = client.post(
                    "/predictions/control",
                    content=body.encode("utf-8", "surrogateescape"),
                    headers={"Content-Type": content_type},
                )
                assert answer.status_code == 400, (problem, answer.text)
                payload = answer.json()
                assert payload["type"] == "BadRequestException", problem
                assert payload["message"].startswith("Malformed "), problem
                assert says in payload["message"], (problem, payload["message"])
        # Big ones: a 4 MB part that never ends, a urlencoded form over the field limit.
        huge = client.post(
            "/predictions/control",
            content=PART.encode() + b"x" * 4_000_000,
            headers={"Content-Type": MULTIPART},
        )
        assert huge.status_code == 400 and "not terminated" in huge.json()["message"]
        many = client.post(
            "/predictions/control",
            content=b"&".join([b"a=1"] * (MAX_FORM_PARTS * 100)),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert many.status_code == 413
        assert f"more than {MAX_FORM_PARTS} fields" in many.json()["message"]
        grown = _rss(pids) - before
        assert _handler_batches(server) == ran  # not one of them ran the handler
        # and the server answers a good form right after
        again = client.post("/predictions/control", data={"data": "params", "y": "2"})
        assert again.json() == {"data": "params", "y": "2"}
    assert _handler_batches(server) == ran + 1
    print(f"server and worker RSS grew by {grown / 1e6:.1f} MB")
    assert grown < 50e6
