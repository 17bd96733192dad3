"""Stateful sequences end to end: real workers (2, batchSize 4), a running-sum handler
written like TorchServe's stateful example, HTTP and gRPC clients."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from trioserve.client import Client, prediction_request

from .server import Server

pytestmark = pytest.mark.e2e

HEADER = "ts_request_sequence_id"


@pytest.fixture
def server(make_server) -> Server:  # type: ignore[no-untyped-def]
    server: Server = make_server("stateful=stateful.mar", tokens=True)
    server.start()
    return server


def client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=server.auth("inference"), timeout=30)


def run_sequence(server: Server, values: list[int]) -> tuple[str, list[int], set[str]]:
    """One sequence over HTTP: (its id, the sums answered, the worker pids that answered)."""
    with client(server) as http:
        first = http.post("/predictions/stateful", content=str(values[0]).encode())
        assert first.status_code == 200, first.text
        sequence_id = first.headers[HEADER]
        answers = [first.text.split()]
        for value in values[1:]:
            r = http.post(
                "/predictions/stateful", content=str(value).encode(), headers={HEADER: sequence_id}
            )
            assert r.status_code == 200, r.text
            assert r.headers[HEADER] == sequence_id
            answers.append(r.text.split())
    return sequence_id, [int(a[0]) for a in answers], {a[1] for a in answers}


def test_concurrent_sequences_keep_their_sums_order_and_worker(server: Server) -> None:
    values = [2, 4, 6, 8, 10]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _i: run_sequence(server, values), range(4)))
    for sequence_id, sums, pids in results:
        assert sequence_id.startswith("ts-seq-")
        assert sums == [2, 6, 12, 20, 30]
        assert len(pids) == 1  # pinned to one worker for its life
    assert len({r[0] for r in results}) == 4


def test_a_client_id_opens_a_sequence_and_an_ended_one_is_refused(server: Server) -> None:
    with client(server) as http:
        opened = http.post("/predictions/stateful", content=b"5", headers={HEADER: "mine-1"})
        assert opened.status_code == 200 and opened.text.split()[0] == "5"
        assert opened.headers[HEADER] == "mine-1"
        ended = http.post("/predictions/stateful", content=b"0", headers={HEADER: "mine-1"})
        assert ended.status_code == 200 and ended.text.split()[0] == "5"
        refused = http.post("/predictions/stateful", content=b"1", headers={HEADER: "mine-1"})
        assert refused.status_code == 400
        assert '"mine-1"' in refused.json()["message"] and "ended" in refused.json()["message"]
        assert refused.headers[HEADER] == "mine-1"


def test_max_num_sequence_refuses_then_recovers_and_idle_sequences_expire(
    server: Server,
) -> None:
    with client(server) as http:
        ids = []
        for _ in range(4):
            r = http.post("/predictions/stateful", content=b"1")
            assert r.status_code == 200
            ids.append(r.headers[HEADER])
        full = http.post("/predictions/stateful", content=b"1")
        assert full.status_code == 503 and "maxNumSequence" in full.json()["message"]
        assert full.headers.get("Retry-After") == "1"
        # Ending one frees its slot at once.
        assert http.post("/predictions/stateful", content=b"0", headers={HEADER: ids[0]}).is_success
        assert http.post("/predictions/stateful", content=b"1").status_code == 200
        # Idle longer than sequenceMaxIdleMSec (1.5 s): closed, and said so.
        time.sleep(2.5)
        late = http.post("/predictions/stateful", content=b"1", headers={HEADER: ids[1]})
        assert late.status_code == 400 and "idle" in late.json()["message"]
        assert http.post("/predictions/stateful", content=b"1").status_code == 200


def test_grpc_stream_is_one_sequence_with_a_minted_id(server: Server) -> None:
    async def scenario() -> list[tuple[str, str, int]]:
        async with Client(
            inference_port=server.grpc_inference_port,
            inference_token=server.key("inference"),
            timeout=30,
        ) as grpc_client:
            requests = [
                prediction_request("stateful", {"data": str(v).encode()}, sequence_id="")
                for v in (3, 4, 5)
            ]
            return [
                (r.sequence_id, r.prediction.decode(), r.status.code if r.status else 0)
                async for r in grpc_client.stream_predictions2(requests)
            ]

    answers = asyncio.run(scenario())
    assert [a[2] for a in answers] == [0, 0, 0]
    assert [int(a[1].split()[0]) for a in answers] == [3, 7, 12]
    assert len({a[0] for a in answers}) == 1 and answers[0][0].startswith("ts-seq-")
    assert len({a[1].split()[1] for a in answers}) == 1


def test_a_worker_crash_fails_exactly_the_sequences_pinned_to_it(server: Server) -> None:
    with client(server) as http:
        by_worker: dict[str, list[str]] = {}
        for _ in range(4):
            r = http.post("/predictions/stateful", content=b"1")
            assert r.status_code == 200
            by_worker.setdefault(r.text.split()[1], []).append(r.headers[HEADER])
        victim_pid, victims = next(iter(by_worker.items()))
        os.kill(int(victim_pid), signal.SIGKILL)
        for sequence_id in victims:
            # A request that races the server noticing the death fails with the death itself
            # (sent to the dying worker: "Worker died"; queued behind it: the sequence closed
            # because its worker failed); from then on the sequence is closed, and says why.
            lost = http.post("/predictions/stateful", content=b"1", headers={HEADER: sequence_id})
            if lost.status_code != 400:
                message = lost.json()["message"]
                assert lost.status_code in (500, 507), lost.text
                assert "Worker died" in message or "its worker failed" in message, lost.text
                lost = http.post(
                    "/predictions/stateful", content=b"1", headers={HEADER: sequence_id}
                )
            assert lost.status_code == 400, lost.text
            assert "its worker failed" in lost.json()["message"], lost.text
        for pid, survivors in by_worker.items():
            if pid == victim_pid:
                continue
            for sequence_id in survivors:
                kept = http.post(
                    "/predictions/stateful", content=b"1", headers={HEADER: sequence_id}
                )
                assert kept.status_code == 200 and kept.text.split() == ["2", pid], kept.text


def test_describe_shows_the_sequence_settings(server: Server) -> None:
    r = httpx.get(
        f"{server.management_url}/models/stateful",
        headers=server.auth("management"),
        timeout=30,
    )
    (model,) = r.json()
    assert (model["stateful"], model["sequenceMaxIdleMSec"], model["maxNumSequence"]) == (
        True,
        1500,
        4,
    )
    assert model["maxSequenceJobQueueSize"] == 10


def test_grpc_sequence_end_key_closes_the_sequence(server: Server) -> None:
    async def scenario() -> tuple[list[str], int, str]:
        async with Client(
            inference_port=server.grpc_inference_port,
            inference_token=server.key("inference"),
            timeout=30,
        ) as grpc_client:
            sums = []
            last = {"data": b"2", "ts_request_sequence_end": b"true"}
            first = [
                prediction_request("stateful", {"data": b"5"}, sequence_id="g-1"),
                prediction_request("stateful", last, sequence_id="g-1"),
            ]
            async for response in grpc_client.stream_predictions2(first):
                sums.append(response.prediction.decode().split()[0])
            again = [prediction_request("stateful", {"data": b"1"}, sequence_id="g-1")]
            (refused,) = [r async for r in grpc_client.stream_predictions2(again)]
            return sums, refused.status.code, refused.status.message

    sums, code, message = asyncio.run(scenario())
    assert sums == ["5", "7"]
    assert code == 3 and '"g-1"' in message and "ended" in message  # INVALID_ARGUMENT


def test_sigterm_drains_open_sequences(server: Server) -> None:
    """Sequences busy when SIGTERM comes: every answer given is right, requests cut off are
    refused (503) or find the listener closed, none is lost, and the server exits 0."""
    stop_at = time.monotonic() + 0.4

    def busy_sequence(_i: int) -> tuple[list[int], list[int]]:
        sums: list[int] = []
        refused: list[int] = []
        with client(server) as http:
            first = http.post("/predictions/stateful", content=b"1")
            assert first.status_code == 200
            sequence_id = first.headers[HEADER]
            sums.append(int(first.text.split()[0]))
            for _ in range(200):
                try:
                    r = http.post(
                        "/predictions/stateful", content=b"1", headers={HEADER: sequence_id}
                    )
                except httpx.TransportError:
                    break  # the listener closed: nothing was accepted
                if r.status_code != 200:
                    refused.append(r.status_code)
                    break
                sums.append(int(r.text.split()[0]))
                if time.monotonic() > stop_at + 5:
                    break
        return sums, refused

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(busy_sequence, i) for i in range(4)]
        time.sleep(max(0.0, stop_at - time.monotonic()))
        server.signal(signal.SIGTERM)
        results = [f.result(timeout=60) for f in futures]
    assert server.wait(30) == 0
    for sums, refused in results:
        assert sums == list(range(1, len(sums) + 1))  # in order, nothing skipped or repeated
        assert len(sums) > 1
        assert set(refused) <= {503}
