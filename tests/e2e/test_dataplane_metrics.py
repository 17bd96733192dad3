"""One dataplane under every protocol: the same request over HTTP and over gRPC moves the
same metric series by the same amounts (request count, latency and queue counters,
response classes), and a refused request is classed the same way both ways."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from trioserve.client import Client

from .server import Server
from .test_metrics import samples

pytestmark = pytest.mark.e2e

SERIES = (
    ("ts_inference_requests_total", {"model_name": "control", "model_version": "default"}),
    ("ts_inference_latency_microseconds_total", {"model_name": "control"}),
    ("ts_queue_latency_microseconds_total", {"model_name": "control"}),
    ("Requests2XX_total", {}),
    ("Requests4XX_total", {}),
    ("Requests5XX_total", {}),
)


def snapshot(server: Server) -> dict[str, tuple[int, float]]:
    """For each series: how many samples match its labels, and their sum."""
    found = samples(httpx.get(f"{server.metrics_url}/metrics", timeout=30).text)
    out = {}
    for name, labels in SERIES:
        matching = [
            v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
        ]
        out[name] = (len(matching), sum(matching))
    return out


def moved(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]) -> dict:
    """Counts change by exact amounts; latency sums only by 'more than zero'."""
    delta = {}
    for name, (_n, total) in after.items():
        change = total - before[name][1]
        delta[name] = change > 0 if "latency" in name else change
    return delta


def over_http(server: Server, model: str) -> int:
    with httpx.Client(base_url=server.url, headers=server.auth("inference"), timeout=30) as http:
        return http.post(f"/predictions/{model}", content=b"same").status_code


def over_grpc(server: Server, model: str) -> Status:
    async def call() -> Status:
        async with Client(
            inference_port=server.grpc_inference_port,
            inference_token=server.key("inference"),
            timeout=30,
        ) as client:
            try:
                await client.predictions(model, {"data": b"same"})
            except GRPCError as error:
                return error.status
            return Status.OK

    return asyncio.run(call())


def test_http_and_grpc_record_the_same_series(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(tokens=True)
    server.start()
    over_http(server, "control")  # the first request of a worker pays for its warm-up
    start = snapshot(server)
    assert over_http(server, "control") == 200
    after_http = snapshot(server)
    assert over_grpc(server, "control") is Status.OK
    after_grpc = snapshot(server)
    by_http, by_grpc = moved(start, after_http), moved(after_http, after_grpc)
    assert by_http == by_grpc
    assert by_http["ts_inference_requests_total"] == 1
    assert by_http["ts_inference_latency_microseconds_total"] is True
    # The prediction, and the /metrics answer of the snapshot before it (that port counts
    # its own answers too, after they are rendered).
    assert by_http["Requests2XX_total"] == 2

    # A model that does not exist: a client error both ways, and no per-model series
    # is created for the name the client made up.
    before = after_grpc
    assert over_http(server, "nope") == 404
    after_http = snapshot(server)
    assert over_grpc(server, "nope") is Status.NOT_FOUND
    after_grpc = snapshot(server)
    assert moved(before, after_http) == moved(after_http, after_grpc)
    assert moved(before, after_http)["Requests4XX_total"] == 1
    assert moved(before, after_http)["ts_inference_requests_total"] == 0
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    assert 'model_name="nope"' not in text


def over_oip_rest(server: Server, model: str, path: str = "infer", **output: object) -> int:
    body: dict[str, object] = {
        "inputs": [{"name": "data", "shape": [1], "datatype": "BYTES", "data": ["same"]}]
    }
    if output:
        body["outputs"] = [{"name": "data", "parameters": output}]
    with httpx.Client(base_url=server.url, headers=server.auth("inference"), timeout=30) as http:
        return http.post(f"/v2/models/{model}/{path}", json=body).status_code


def test_oip_rest_answers_are_classed_once(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(tokens=True)
    server.start()
    over_oip_rest(server, "control")  # warm-up
    before = snapshot(server)
    assert over_oip_rest(server, "control") == 200
    after_oip = snapshot(server)
    assert over_http(server, "control") == 200
    after_http = snapshot(server)
    # The same amounts as a TorchServe prediction: one request, one 2XX (plus the metrics
    # port's own answer to the snapshot before it), not one from the dataplane and one more
    # from the front.
    # (ts_inference_requests_total is left out: an OIP request names the version it ran
    # on, so its series is labelled with that version rather than "default".)
    classes = ("Requests2XX_total", "Requests4XX_total", "Requests5XX_total")
    by_oip, by_http = moved(before, after_oip), moved(after_oip, after_http)
    assert [by_oip[c] for c in classes] == [by_http[c] for c in classes] == [2, 0, 0]

    # Refused before queuing (unknown model; a binary output asked of a stream) and refused
    # by the dataplane: each is one 4XX.
    for model, path, output in (
        ("nope", "infer", {}),
        ("control", "infer_stream", {"binary_data": True}),
    ):
        start = snapshot(server)
        assert over_oip_rest(server, model, path, **output) in (400, 404)
        assert moved(start, snapshot(server))["Requests4XX_total"] == 1, (model, path)
