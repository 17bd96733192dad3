"""The metrics API app (port 8082), driven with quart-trio's test client."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from quart import Response
from quart_trio import QuartTrio

from trioserve.http.bodies import NO_CACHE_HEADERS
from trioserve.http.metrics import create_metrics_app
from trioserve.metrics import CONTENT_TYPE, ServerMetrics

HOST = "app-host"
NOT_FOUND = {
    "code": 404,
    "type": "ResourceNotFoundException",
    "message": "Requested resource is not found, please refer to API document.",
}
NOT_ALLOWED = {
    "code": 405,
    "type": "MethodNotAllowedException",
    "message": "Requested method is not allowed, please refer to API document.",
}


@pytest.fixture
def metrics() -> ServerMetrics:
    metrics = ServerMetrics(hostname=HOST)
    metrics.request_received("resnet", None)
    metrics.request_finished("resnet", None, latency_us=1200.0, queue_us=100.0)
    metrics.handler_metrics(
        "resnet",
        "1.0",
        [
            {
                "name": "HandlerTime",
                "unit": "Milliseconds",
                "value": 3.5,
                "type": "GAUGE",
                "dimensions": {"ModelName": "resnet", "Level": "Model"},
                "request_id": "r1",
            }
        ],
    )
    return metrics


@pytest.fixture
def app(metrics: ServerMetrics) -> QuartTrio:
    return create_metrics_app(metrics, max_request_size=1024)


async def send(app: QuartTrio, method: str, path: str) -> Response:
    """``method`` on ``path`` through the test client."""
    call: Callable[[str], Awaitable[Response]] = getattr(app.test_client(), method.lower())
    return await call(path)


async def page(app: QuartTrio, path: str) -> bytes:
    response = await app.test_client().get(path)
    assert response.status_code == 200
    return await response.get_data(as_text=False)


def parse(body: bytes) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(body.decode())
    }


async def test_metrics_page(app: QuartTrio) -> None:
    response = await app.test_client().get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE
    for key, value in NO_CACHE_HEADERS.items():
        assert response.headers[key] == value
    parsed = parse(await response.get_data(as_text=False))
    labels = {"model_name": "resnet", "model_version": "default", "hostname": HOST}
    assert parsed["ts_inference_requests"] == [("ts_inference_requests_total", labels, 1.0)]
    assert parsed["ts_inference_latency_microseconds"] == [
        ("ts_inference_latency_microseconds_total", labels, 1200.0)
    ]
    assert parsed["HandlerTime"] == [
        ("HandlerTime", {"ModelName": "resnet", "Level": "Model", "Hostname": HOST}, 3.5)
    ]
    assert {"Requests2XX", "QueueTime", "WorkerLoadTime", "CPUUtilization"} <= set(parsed)


@pytest.mark.parametrize("path", ["/metrics/", "/metrics/anything", "/metrics/a/b?x=1"])
async def test_any_path_under_metrics_serves_the_page(app: QuartTrio, path: str) -> None:
    response = await app.test_client().get(path)
    assert response.status_code == 200
    assert "ts_inference_requests" in parse(await response.get_data(as_text=False))


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
async def test_the_page_answers_any_method(app: QuartTrio, method: str) -> None:
    response = await send(app, method, "/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE


async def test_head_answers_like_get(app: QuartTrio) -> None:
    # The server (hypercorn) drops the body of a HEAD response on the wire.
    response = await app.test_client().head("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE


async def test_name_filter(app: QuartTrio) -> None:
    client = app.test_client()
    response = await client.get("/metrics?name[]=HandlerTime&name[]=ts_inference_requests_total")
    assert response.status_code == 200
    assert set(parse(await response.get_data(as_text=False))) == {
        "HandlerTime",
        "ts_inference_requests",
    }
    response = await client.get("/metrics", query_string={"name[]": "QueueTime"})
    assert set(parse(await response.get_data(as_text=False))) == {"QueueTime"}
    response = await client.get("/metrics?name[]=nothing")
    assert response.status_code == 200
    assert await response.get_data(as_text=False) == b""


async def test_log_mode_serves_an_empty_page() -> None:
    metrics = ServerMetrics(mode="log", hostname=HOST)
    metrics.request_received("m", None)
    response = (
        await create_metrics_app(metrics, max_request_size=1024).test_client().get("/metrics")
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE
    assert await response.get_data(as_text=False) == b""


async def test_legacy_mode_serves_only_the_ts_counters() -> None:
    metrics = ServerMetrics(mode="legacy", hostname=HOST)
    metrics.request_received("m", None)
    response = (
        await create_metrics_app(metrics, max_request_size=1024).test_client().get("/metrics")
    )
    assert set(parse(await response.get_data(as_text=False))) == {
        "ts_inference_requests",
        "ts_inference_latency_microseconds",
        "ts_queue_latency_microseconds",
    }


@pytest.mark.parametrize(("method", "path"), [("OPTIONS", "/"), ("GET", "/api-description")])
async def test_api_description(app: QuartTrio, method: str, path: str) -> None:
    response = await send(app, method, path)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    text = (await response.get_data(as_text=False)).decode()
    assert text.endswith("}\n")
    doc = json.loads(text)
    assert doc["openapi"] == "3.0.1"
    assert doc["info"]["title"] == "TorchServe APIs"
    (parameter,) = doc["paths"]["/metrics"]["get"]["parameters"]
    assert parameter["name"] == "name[]"
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_other_methods_on_root_are_not_allowed(app: QuartTrio, method: str) -> None:
    response = await send(app, method, "/")
    assert response.status_code == 405
    assert await response.get_json() == NOT_ALLOWED


@pytest.mark.parametrize(
    "path", ["/nope", "/predictions/resnet", "/metricsx", "/ping", "/api-description/x"]
)
async def test_unknown_paths_are_404(app: QuartTrio, path: str) -> None:
    response = await app.test_client().get(path)
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/json"
    assert await response.get_json() == NOT_FOUND


async def test_responses_are_counted(app: QuartTrio) -> None:
    client = app.test_client()
    await client.get("/metrics")
    await client.get("/nope")
    await client.get("/")
    response = await client.get("/metrics?name[]=Requests2XX&name[]=Requests4XX")
    parsed = parse(await response.get_data(as_text=False))
    labels = {"Level": "Host", "Hostname": HOST}
    # The page being served is counted after it is written.
    assert parsed["Requests2XX"] == [("Requests2XX_total", labels, 1.0)]
    assert parsed["Requests4XX"] == [("Requests4XX_total", labels, 2.0)]


async def test_counting_can_be_left_to_the_caller(metrics: ServerMetrics) -> None:
    client = create_metrics_app(metrics, max_request_size=1024, count_requests=False).test_client()
    await client.get("/metrics")
    await client.get("/nope")
    response = await client.get("/metrics?name[]=Requests2XX&name[]=Requests4XX")
    parsed = parse(await response.get_data(as_text=False))
    assert parsed == {"Requests2XX": [], "Requests4XX": []}


NAME_FILTER = "/metrics?name[]=ts_inference_requests_total"


async def test_two_servers_in_one_process_serve_their_own_metrics() -> None:
    one, two = ServerMetrics(hostname="one"), ServerMetrics(hostname="two")
    one.request_received("a", None)
    two.request_received("b", "2")
    page_one = await page(create_metrics_app(one, max_request_size=1024), NAME_FILTER)
    page_two = await page(create_metrics_app(two, max_request_size=1024), NAME_FILTER)
    assert parse(page_one)["ts_inference_requests"] == [
        (
            "ts_inference_requests_total",
            {"model_name": "a", "model_version": "default", "hostname": "one"},
            1.0,
        )
    ]
    assert parse(page_two)["ts_inference_requests"] == [
        (
            "ts_inference_requests_total",
            {"model_name": "b", "model_version": "2", "hostname": "two"},
            1.0,
        )
    ]


# -- several serving processes: the page shows the server's totals -----------------------


def serving_process() -> ServerMetrics:
    """Another serving process's metrics: two more requests, its own handler gauge."""
    other = ServerMetrics(hostname=HOST)
    for _ in range(2):
        other.request_received("resnet", None)
    other.request_received("bert", "2")
    other.http_status(200)
    other.handler_metrics(
        "resnet",
        "1.0",
        [
            {
                "name": "HandlerTime",
                "unit": "Milliseconds",
                "value": 1.5,
                "type": "GAUGE",
                "dimensions": {"ModelName": "resnet", "Level": "Model"},
            }
        ],
    )
    return other


def others_giving(
    *processes: ServerMetrics,
) -> tuple[Callable[[], Awaitable[list[bytes]]], list[int]]:
    """An ``others`` that gives the expositions of ``processes``, and its call count."""
    calls: list[int] = []

    async def others() -> list[bytes]:
        calls.append(1)
        return [process.exposition() for process in processes]

    return others, calls


async def test_with_other_processes_the_page_shows_the_totals(metrics: ServerMetrics) -> None:
    others, calls = others_giving(serving_process(), ServerMetrics(mode="log", hostname=HOST))
    app = create_metrics_app(metrics, max_request_size=1024, others=others)
    response = await app.test_client().get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE
    parsed = parse(await response.get_data(as_text=False))
    assert calls == [1]
    labels = {"model_name": "resnet", "model_version": "default", "hostname": HOST}
    bert = {"model_name": "bert", "model_version": "2", "hostname": HOST}
    assert parsed["ts_inference_requests"] == [
        ("ts_inference_requests_total", labels, 3.0),
        ("ts_inference_requests_total", bert, 1.0),
    ]
    # Only the control process had a request finish.
    assert parsed["ts_inference_latency_microseconds"] == [
        ("ts_inference_latency_microseconds_total", labels, 1200.0)
    ]
    model = {"ModelName": "resnet", "Level": "Model", "Hostname": HOST}
    assert parsed["HandlerTime"] == [("HandlerTime", model, 5.0)]  # 3.5 + 1.5
    assert parsed["Requests2XX"] == [
        ("Requests2XX_total", {"Level": "Host", "Hostname": HOST}, 1.0)
    ]
    assert list(parsed) == list(parse(metrics.exposition()))


async def test_the_name_filter_applies_to_the_totals(metrics: ServerMetrics) -> None:
    others, _ = others_giving(serving_process())
    client = create_metrics_app(metrics, max_request_size=1024, others=others).test_client()
    response = await client.get("/metrics?name[]=HandlerTime&name[]=ts_inference_requests_total")
    assert response.status_code == 200
    parsed = parse(await response.get_data(as_text=False))
    assert set(parsed) == {"HandlerTime", "ts_inference_requests"}
    assert [value for _, _, value in parsed["ts_inference_requests"]] == [3.0, 1.0]
    # The control process's own responses are counted, and added to the other's.
    response = await client.get("/metrics", query_string={"name[]": "Requests2XX"})
    parsed = parse(await response.get_data(as_text=False))
    assert parsed == {
        "Requests2XX": [("Requests2XX_total", {"Level": "Host", "Hostname": HOST}, 2.0)]
    }
    response = await client.get("/metrics?name[]=nothing")
    assert response.status_code == 200
    assert await response.get_data(as_text=False) == b""


async def test_without_answers_from_the_others_the_page_is_the_own(
    metrics: ServerMetrics,
) -> None:
    others, calls = others_giving()
    app = create_metrics_app(metrics, max_request_size=1024, others=others, count_requests=False)
    assert await page(app, "/metrics") == metrics.exposition()
    assert await page(app, NAME_FILTER) == metrics.exposition(["ts_inference_requests_total"])
    assert calls == [1, 1]


async def test_in_log_mode_the_others_are_not_asked() -> None:
    metrics = ServerMetrics(mode="log", hostname=HOST)
    others, calls = others_giving(serving_process())
    app = create_metrics_app(metrics, max_request_size=1024, others=others)
    assert await page(app, "/metrics") == b""
    assert calls == []
