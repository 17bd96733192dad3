"""The bundled demo models, served the way the Quick start serves them, driven by curl."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from trioserve.demo import build_demo_store

from .server import Server

pytestmark = pytest.mark.e2e
SAMPLE = Path(__file__).resolve().parents[2] / "handlers" / "classifier" / "sample.json"


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("demo")
    store = root / "store"
    build_demo_store(store)
    server = Server(root, store, "all")
    server.start()
    yield server
    server.stop()
    server.kill()


def curl(*args: str) -> bytes:
    out = subprocess.run(
        ["curl", "-sS", "--fail-with-body", *args], capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def test_classifier_returns_labelled_probabilities(demo_server: Server) -> None:
    body = json.loads(
        curl(
            "-X",
            "POST",
            f"{demo_server.url}/predictions/classifier",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            f"@{SAMPLE}",
        )
    )
    assert set(body) == {"cat", "dog", "bird", "fish"}
    assert abs(sum(body.values()) - 1.0) < 1e-5
    assert list(body.values()) == sorted(body.values(), reverse=True)
    # deterministic weights: the same answer every time
    again = json.loads(
        curl(
            "-X",
            "POST",
            f"{demo_server.url}/predictions/classifier",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            f"@{SAMPLE}",
        )
    )
    assert again == body


def test_classifier_rejects_a_wrong_input_size(demo_server: Server) -> None:
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-X",
            "POST",
            f"{demo_server.url}/predictions/classifier",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "[1, 2]",
        ],
        capture_output=True,
        timeout=60,
    )
    assert json.loads(out.stdout)["code"] == 503


def test_streaming_tokens_arrive_one_by_one_with_curl_n(demo_server: Server) -> None:
    proc = subprocess.Popen(
        [
            "curl",
            "-sS",
            "-N",
            "-X",
            "POST",
            f"{demo_server.url}/predictions/streaming",
            "-H",
            "Content-Type: text/plain",
            "--data-binary",
            "one two three four",
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    arrivals: list[tuple[float, bytes]] = []
    while True:
        chunk = proc.stdout.read1(1024)
        if not chunk:
            break
        arrivals.append((time.monotonic(), chunk))
    proc.stdout.close()
    assert proc.wait(30) == 0
    text = b"".join(c for _, c in arrivals)
    assert text == b"one two three four [done]"
    assert len(arrivals) >= 3  # not one buffered blob
    assert arrivals[-1][0] - arrivals[0][0] >= 0.1


def test_echo_round_trips_json(demo_server: Server) -> None:
    body = curl(
        "-X",
        "POST",
        f"{demo_server.url}/predictions/echo",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        '{"a": [1, 2]}',
    )
    assert json.loads(body) == {"a": [1, 2]}


PLAIN = "Content-Type: text/plain"


def test_stateful_sums_a_sequence_with_curl(demo_server: Server) -> None:
    url = f"{demo_server.url}/predictions/stateful"
    command = ["curl", "-sS", "--fail-with-body", "-D", "-", "-X", "POST", url, "-H", PLAIN]
    first = subprocess.run(
        [*command, "--data-binary", "2"], capture_output=True, timeout=60, check=True
    ).stdout.decode()
    head, _, body = first.partition("\r\n\r\n")
    assert body == "2"
    (line,) = [h for h in head.split("\r\n") if h.lower().startswith("ts_request_sequence_id:")]
    sequence = line.split(":", 1)[1].strip()
    header = f"ts_request_sequence_id: {sequence}"
    for value, total in (("4", b"6"), ("6", b"12"), ("0", b"12")):
        assert curl("-X", "POST", url, "-H", PLAIN, "-H", header, "--data-binary", value) == total
    ended = subprocess.run(
        ["curl", "-sS", "-X", "POST", url, "-H", PLAIN, "-H", header, "--data-binary", "1"],
        capture_output=True,
        timeout=60,
    ).stdout
    assert json.loads(ended)["code"] == 400


def test_stateful_stream_streams_and_cancels_with_curl(demo_server: Server) -> None:
    url = f"{demo_server.url}/predictions/stateful_stream"
    first = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "-D", "-", "-X", "POST", url, "-H", PLAIN,
         "--data-binary", "2"],
        capture_output=True, timeout=60, check=True,
    ).stdout.decode()  # fmt: skip
    head, _, body = first.partition("\r\n\r\n")
    assert body == "2"
    (line,) = [h for h in head.split("\r\n") if h.lower().startswith("ts_request_sequence_id:")]
    header = f"ts_request_sequence_id: {line.split(':', 1)[1].strip()}"
    # An odd value streams six answers (one per 100 ms step), chunked.
    streamed = subprocess.run(
        ["curl", "-sS", "-N", "-D", "-", "-X", "POST", url, "-H", PLAIN, "-H", header,
         "--data-binary", "3"],
        capture_output=True, timeout=60, check=True,
    ).stdout.decode()  # fmt: skip
    head, _, body = streamed.partition("\r\n\r\n")
    assert "transfer-encoding: chunked" in head.lower()
    assert body == "5" * 6
    # -1 sent while a stream runs ends it early; 0 ends the sequence.
    with subprocess.Popen(
        ["curl", "-sS", "-N", "-X", "POST", url, "-H", PLAIN, "-H", header, "--data-binary", "1"],
        stdout=subprocess.PIPE,
    ) as stream:
        assert stream.stdout is not None
        assert stream.stdout.read(1) == b"6"
        cancel = curl("-X", "POST", url, "-H", PLAIN, "-H", header, "--data-binary", "-1")
        rest = stream.stdout.read()
    assert cancel == b"-1" and 1 <= len(rest) <= 3 and set(rest.decode()) == {"6"}
    assert curl("-X", "POST", url, "-H", PLAIN, "-H", header, "--data-binary", "0") == b"6"


def test_textgen_streams_tokens_over_sse_with_curl(demo_server: Server) -> None:
    """The MLServer-style demo folder: curl -N to generate_stream gets one SSE event per
    word, the same words as the unary generate route answers at once."""
    body = json.dumps(
        {
            "inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["hello"]}],
            "parameters": {"max_tokens": 5},
        }
    )
    streamed = curl(
        "-N", "-X", "POST", f"{demo_server.url}/v2/models/textgen/generate_stream",
        "-H", "Content-Type: application/json", "--data-binary", body,
    ).decode()  # fmt: skip
    events = [json.loads(line[5:]) for line in streamed.splitlines() if line.startswith("data:")]
    words = [event["outputs"][0]["data"][0] for event in events]
    assert len(words) == 5
    whole = json.loads(
        curl(
            "-X", "POST", f"{demo_server.url}/v2/models/textgen/generate",
            "-H", "Content-Type: application/json", "--data-binary", body,
        )
    )  # fmt: skip
    assert whole["outputs"][0]["data"] == [" ".join(words)]
