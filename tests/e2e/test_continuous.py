"""Continuous batching over stateful sequences, end to end: real workers running the demo
``stateful_stream`` handler (TorchServe's sequence continuous batching conventions: even
values answer once, odd values stream one answer per step, ``0`` ends the sequence, ``-1``
cancels its running stream), HTTP and gRPC clients.

``streamsum``: 2 workers, batchSize 4; ``streamsum1``: the same on one worker, so that every
sequence shares one running batch. Steps take 100 ms; a stream is 6 answers; sequences idle
out after 500 ms and live at most 4 s.

``tscancel``: TorchServe's own test config for its example (batchSize 1, two workers,
maxNumSequence 2) with a handler of the example's protocol (``ts_cancel_handler.py``)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from trioserve.client import Client, prediction_request

from .server import Server

pytestmark = pytest.mark.e2e

HEADER = "ts_request_sequence_id"


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    server: Server = make_server("streamsum=streamsum.mar,streamsum1=streamsum1.mar")
    server.start()
    return server


def http(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30)


def post(client: httpx.Client, model: str, value: int, sequence_id: str | None) -> httpx.Response:
    headers = {HEADER: sequence_id} if sequence_id else {}
    return client.post(f"/predictions/{model}", content=str(value).encode(), headers=headers)


def open_sequence(client: httpx.Client, model: str, value: int = 2) -> str:
    first = post(client, model, value, None)
    assert first.status_code == 200, first.text
    return first.headers[HEADER]


class ChunkedReply:
    """One streamed HTTP answer read chunk by chunk over a plain socket, so each chunk of
    the chunked body (one answer of the handler) is seen on its own."""

    def __init__(
        self, server: Server, model: str, value: int, sequence_id: str, *, json: bool = False
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        body = (f'{{"input": {value}}}' if json else str(value)).encode()
        kind = "Content-Type: application/json\r\n" if json else ""
        self.sock.sendall(
            f"POST /predictions/{model} HTTP/1.1\r\nHost: x\r\n{HEADER}: {sequence_id}\r\n"
            f"{kind}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self.buffer = b""
        head = self._until(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {
            k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])
        }

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.buffer += data
        found, self.buffer = self.buffer.split(marker, 1)
        return found

    def chunks(self) -> Iterator[bytes]:
        """Each chunk of the body, up to the last."""
        while True:
            size = int(self._until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                self._until(b"\r\n")
                return
            while len(self.buffer) < size + 2:
                self.buffer += self.sock.recv(65536)
            chunk, self.buffer = self.buffer[:size], self.buffer[size + 2 :]
            yield chunk

    def close(self) -> None:
        self.sock.close()


def test_concurrent_sequences_sum_in_order(server: Server) -> None:
    def run(values: list[int]) -> list[int]:
        with http(server) as client:
            sequence_id = open_sequence(client, "streamsum", values[0])
            sums = [values[0]]
            for value in values[1:]:
                r = post(client, "streamsum", value, sequence_id)
                assert r.status_code == 200, r.text
                assert r.headers[HEADER] == sequence_id
                sums.append(int(r.text))
            return sums

    runs = [[2, 4, 6, 8, 10], [4, 8, 12, 16, 20]] * 2
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, runs))
    assert results == [[2, 6, 12, 20, 30], [4, 12, 24, 40, 60]] * 2


def test_zero_ends_the_sequence(server: Server) -> None:
    with http(server) as client:
        sequence_id = open_sequence(client, "streamsum")
        assert [post(client, "streamsum", v, sequence_id).text for v in (4, 6, 8)] == [
            "6", "12", "20"
        ]  # fmt: skip
        ended = post(client, "streamsum", 0, sequence_id)
        assert ended.status_code == 200 and ended.text == "20"
        refused = post(client, "streamsum", 2, sequence_id)
        assert refused.status_code == 400 and "ended" in refused.json()["message"]


def test_an_odd_value_streams_one_answer_per_step(server: Server) -> None:
    with http(server) as client:
        sequence_id = open_sequence(client, "streamsum1")
        stream = ChunkedReply(server, "streamsum1", 3, sequence_id)
        assert stream.status == 200 and stream.headers["transfer-encoding"] == "chunked"
        assert stream.headers[HEADER.lower()] == sequence_id
        assert list(stream.chunks()) == [b"5"] * 6
        stream.close()
        assert post(client, "streamsum1", 4, sequence_id).text == "9"


def test_a_new_request_joins_the_running_batch_between_steps(server: Server) -> None:
    with http(server) as client:
        streaming, other = open_sequence(client, "streamsum1"), open_sequence(client, "streamsum1")
        stream = ChunkedReply(server, "streamsum1", 3, streaming)
        chunks = stream.chunks()
        assert next(chunks) == b"5"
        joined = post(client, "streamsum1", 4, other)
        # Answered in a step of the running batch, beside the stream still going on.
        assert joined.status_code == 200 and joined.text == "6"
        assert joined.headers["x-step-batch"] == "2"
        assert [b"5", *chunks] == [b"5"] * 6
        stream.close()


def test_minus_one_cancels_the_sequences_running_stream(server: Server) -> None:
    with http(server) as client:
        sequence_id = open_sequence(client, "streamsum1")
        stream = ChunkedReply(server, "streamsum1", 3, sequence_id)
        chunks = stream.chunks()
        assert next(chunks) == b"5"
        cancel = post(client, "streamsum1", -1, sequence_id)
        assert cancel.status_code == 200 and cancel.text == "-1"
        rest = list(chunks)
        # The cancel joined the running batch: the stream ended early, at its next step.
        assert 1 <= len(rest) <= 3 and set(rest) == {b"5"}
        stream.close()
        # The sequence goes on with its state.
        assert post(client, "streamsum1", 4, sequence_id).text == "9"


def test_with_batch_size_1_the_cancel_joins_and_stops_its_sequences_running_stream(
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    # TorchServe's test_infer_stateful_cancel: open a sequence, stream {"input": 3}, send -1
    # while it runs (here: once its first answer came), then 0; more times than
    # maxNumSequence, so each ended sequence must have freed its slot. A step holds up to
    # twice batchSize requests: the -1 joins the stream's running batch and stops it.
    server: Server = make_server("tscancel=tscancel.mar")
    server.start()
    with http(server) as client:
        for _ in range(3):
            sequence_id = open_sequence(client, "tscancel")
            stream = ChunkedReply(server, "tscancel", 3, sequence_id, json=True)
            assert stream.status == 200 and stream.headers["transfer-encoding"] == "chunked"
            chunks = stream.chunks()
            assert next(chunks) == b"5"
            cancel = post(client, "tscancel", -1, sequence_id)
            assert cancel.status_code == 200 and cancel.text == "-1"
            assert cancel.headers[HEADER] == sequence_id
            rest = list(chunks)
            stream.close()
            # Stopped early: the stream had 200 more answers to give.
            assert 1 <= len(rest) < 200 and set(rest) == {b"5"}
            ended = post(client, "tscancel", 0, sequence_id)
            assert ended.status_code == 200 and ended.text == "5"
            refused = post(client, "tscancel", 2, sequence_id)
            assert refused.status_code == 400 and "ended" in refused.json()["message"]


def test_a_client_leaving_mid_stream_takes_its_request_out_of_the_running_batch(
    server: Server,
) -> None:
    with http(server) as client:
        leaving, other = open_sequence(client, "streamsum1"), open_sequence(client, "streamsum1")
        stream = ChunkedReply(server, "streamsum1", 3, leaving)
        assert next(stream.chunks()) == b"5"
        stream.close()  # five more steps were due
        time.sleep(0.25)
        alone = post(client, "streamsum1", 4, other)
        assert alone.status_code == 200 and alone.headers["x-step-batch"] == "1"
        # The leaving client's sequence is still open, with its state.
        assert post(client, "streamsum1", 4, leaving).text == "9"


def test_a_streaming_sequence_is_not_idle(server: Server) -> None:
    # The stream (6 steps of 100 ms) outlasts sequenceMaxIdleMSec (500 ms): the sequence
    # stays open while its request runs, and idles from its last answer.
    with http(server) as client:
        sequence_id = open_sequence(client, "streamsum1")
        stream = ChunkedReply(server, "streamsum1", 3, sequence_id)
        assert len(list(stream.chunks())) == 6
        stream.close()
        assert post(client, "streamsum1", 2, sequence_id).text == "7"
        time.sleep(1.0)
        late = post(client, "streamsum1", 2, sequence_id)
        assert late.status_code == 400 and "sequenceMaxIdleMSec" in late.json()["message"]


def test_a_sequence_closes_at_its_lifetime(server: Server) -> None:
    with http(server) as client:
        sequence_id = open_sequence(client, "streamsum")
        opened = time.monotonic()
        total = 2
        while time.monotonic() - opened < 3.5:  # busy all along: never idle
            r = post(client, "streamsum", 2, sequence_id)
            total += 2
            assert r.status_code == 200 and r.text == str(total)
            time.sleep(0.2)
        time.sleep(max(0.0, 4.3 - (time.monotonic() - opened)))
        late = post(client, "streamsum", 2, sequence_id)
        assert late.status_code == 400 and "sequenceTimeoutMSec" in late.json()["message"]
        assert open_sequence(client, "streamsum")  # its slot is free


def test_grpc_stream_carries_a_sequence_with_a_streaming_request(server: Server) -> None:
    async def scenario() -> list[tuple[str, str]]:
        async with Client(inference_port=server.grpc_inference_port, timeout=30) as grpc_client:
            requests = [
                prediction_request("streamsum", {"data": str(v).encode()}, sequence_id="")
                for v in (2, 3, 4)
            ]
            return [
                (r.sequence_id, r.prediction.decode())
                async for r in grpc_client.stream_predictions2(requests)
            ]

    answers = asyncio.run(scenario())
    values = [a[1] for a in answers]
    # In request order: 2's answer, 3's six, then 4's. The 4 joined the running batch at
    # the step after 3's first answer, so 3's later answers show the sum with it.
    assert len(values) == 8 and values[:2] == ["2", "5"] and values[-1] == "9"
    assert set(values[2:7]) <= {"5", "9"}
    assert len({a[0] for a in answers}) == 1 and answers[0][0].startswith("ts-seq-")


def test_sigterm_finishes_running_streams_before_exiting(server: Server) -> None:
    with http(server) as client:
        sequence_id = open_sequence(client, "streamsum1")
        stream = ChunkedReply(server, "streamsum1", 3, sequence_id)
        chunks = stream.chunks()
        assert next(chunks) == b"5"
        server.signal(signal.SIGTERM)
        assert [b"5", *chunks] == [b"5"] * 6  # drained, not cut
        stream.close()
    assert server.wait(30) == 0


def test_metrics_count_open_sequences_and_describe_shows_the_settings(server: Server) -> None:
    with http(server) as client:
        opened = [open_sequence(client, "streamsum1") for _ in range(3)]
        post(client, "streamsum1", 0, opened[0])  # ended: closed at once
        text = httpx.get(f"{server.metrics_url}/metrics", timeout=10).text
        assert 'ts_open_sequences{model_name="streamsum1",model_version="1.0"} 2.0' in text
        assert 'ts_open_sequences{model_name="streamsum",model_version="1.0"} 0.0' in text
    (described,) = httpx.get(f"{server.management_url}/models/streamsum1", timeout=10).json()
    assert described["continuousBatching"] is True and described["stateful"] is True
    assert described["sequenceMaxIdleMSec"] == 500 and described["sequenceTimeoutMSec"] == 4000
    assert described["maxNumSequence"] == 8 and described["batchSize"] == 4
