"""The metrics API under a short bounded load, read with a Prometheus text parser."""

from __future__ import annotations

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .server import Server

pytestmark = pytest.mark.e2e


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(
        v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


def test_counters_move_under_load_and_the_port_needs_no_token(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(tokens=True)
    server.start()
    auth = server.auth("inference")
    before = samples(httpx.get(f"{server.metrics_url}/metrics", timeout=30).text)
    assert value(before, "ts_inference_requests_total", model_name="control") == 0
    with httpx.Client(base_url=server.url, headers=auth, timeout=30) as client:
        for i in range(20):
            assert client.post("/predictions/control", content=f"r{i}".encode()).status_code == 200
        for _ in range(3):
            assert client.post("/predictions/nope", content=b"x").status_code == 404
        assert client.post("/predictions/control", content=b"raise").status_code == 503
    r = httpx.get(f"{server.metrics_url}/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    after = samples(r.text)
    assert (
        value(after, "ts_inference_requests_total", model_name="control", model_version="default")
        == 21
    )
    assert value(after, "ts_inference_latency_microseconds_total", model_name="control") > 0
    assert value(after, "ts_queue_latency_microseconds_total", model_name="control") >= 0
    assert value(after, "Requests2XX_total") >= 20
    assert value(after, "Requests4XX_total") >= 3
    assert value(after, "Requests5XX_total") >= 1
    assert value(after, "WorkerLoadTime") > 0
    # the worker's own handler metric, with its dimensions
    # (a gauge of the last batch's time: present, possibly 0.0 ms for this fast handler)
    assert any(lab.get("ModelName") == "control" for lab, _ in after.get("PredictionTime", []))
    assert value(after, "MemoryUsed") > 0
    # the name filter
    only = samples(
        httpx.get(
            f"{server.metrics_url}/metrics",
            params={"name[]": "ts_inference_requests_total"},
            timeout=30,
        ).text
    )
    assert set(only) == {"ts_inference_requests_total"}


def test_metrics_api_can_be_disabled(make_server) -> None:  # type: ignore[no-untyped-def]
    server: Server = make_server(properties={"enable_metrics_api": "false"})
    report = server.start()
    assert "metrics=" not in report and "inference=" in report
    assert server.process is not None
    listening = {
        c.laddr.port
        for c in psutil.Process(server.process.pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    expected = {server.port, server.management_port}
    expected |= {server.grpc_inference_port, server.grpc_management_port}
    assert listening == expected  # no fifth listener: nothing serves metrics
    assert httpx.get(f"{server.url}/ping", timeout=30).status_code == 200
