"""ServerMetrics: TorchServe's metric names, labels and modes, read back from the exposition."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from trioserve.metrics import BUILTIN_METRICS, LEGACY_METRICS, ServerMetrics, help_text
from trioserve.metrics.system import SystemSampler

HOST = "test-host"
HOST_LABELS = {"Level": "Host", "Hostname": HOST}


def families(metrics: ServerMetrics, names: list[str] | None = None) -> dict[str, Any]:
    """Family name (as the parser names it) -> parsed family."""
    text = metrics.exposition(names).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(metrics: ServerMetrics, name: str) -> list[Sample]:
    family = families(metrics).get(name)
    return list(family.samples) if family is not None else []


def value(metrics: ServerMetrics, sample_name: str, **labels: str) -> float | None:
    for family in families(metrics).values():
        for sample in family.samples:
            if sample.name == sample_name and sample.labels == labels:
                return float(sample.value)
    return None


def ts_labels(model: str, version: str = "default") -> dict[str, str]:
    return {"model_name": model, "model_version": version, "hostname": HOST}


def record(
    name: str, value: Any, kind: str = "GAUGE", unit: str = "Milliseconds", **dims: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "unit": unit,
        "value": value,
        "type": kind,
        "dimensions": dims,
        "request_id": "req-1",
    }


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics(hostname=HOST)


# -- the frontend's metrics ---------------------------------------------------------------


def test_every_builtin_metric_is_listed_with_torchserve_help(metrics: ServerMetrics) -> None:
    parsed = families(metrics)
    for name, spec in BUILTIN_METRICS.items():
        family = parsed[name.removesuffix("_total")]
        assert family.type == spec.kind
        assert family.documentation == help_text(spec.kind, spec.unit)
        assert family.documentation == (
            f"Torchserve prometheus {spec.kind} metric with unit: {spec.unit}"
        )
    text = metrics.exposition().decode()
    assert "# HELP Requests2XX_total Torchserve prometheus counter metric with unit: Count" in text
    assert "# TYPE QueueTime gauge" in text


def test_default_mode_is_prometheus_and_hostname_defaults_to_the_host() -> None:
    metrics = ServerMetrics()
    assert metrics.mode == "prometheus"
    assert metrics.hostname
    metrics.http_status(200)
    assert value(metrics, "Requests2XX_total", Level="Host", Hostname=metrics.hostname) == 1.0


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="metrics mode"):
        ServerMetrics(mode="statsd")


def test_requests_total_counts_per_model_and_version(metrics: ServerMetrics) -> None:
    metrics.request_received("resnet", None)
    metrics.request_received("resnet", None)
    metrics.request_received("resnet", "2.0")
    metrics.request_received("bert", "")
    assert value(metrics, "ts_inference_requests_total", **ts_labels("resnet")) == 2.0
    assert value(metrics, "ts_inference_requests_total", **ts_labels("resnet", "2.0")) == 1.0
    assert value(metrics, "ts_inference_requests_total", **ts_labels("bert")) == 1.0
    family = families(metrics)["ts_inference_requests"]
    assert family.type == "counter"
    assert {s.name for s in family.samples} == {"ts_inference_requests_total"}


def test_request_received_counts_without_a_finish(metrics: ServerMetrics) -> None:
    # A request refused with 503 is received but never finished: it still counts.
    metrics.request_received("m", None)
    assert value(metrics, "ts_inference_requests_total", **ts_labels("m")) == 1.0
    assert value(metrics, "ts_inference_latency_microseconds_total", **ts_labels("m")) is None


def test_request_finished_sums_latencies_and_sets_queue_time(metrics: ServerMetrics) -> None:
    metrics.request_finished("m", None, latency_us=1500.0, queue_us=200.0)
    metrics.request_finished("m", None, latency_us=500.0, queue_us=3000.0)
    labels = ts_labels("m")
    assert value(metrics, "ts_inference_latency_microseconds_total", **labels) == 2000.0
    assert value(metrics, "ts_queue_latency_microseconds_total", **labels) == 3200.0
    assert value(metrics, "QueueTime", **HOST_LABELS) == 3.0  # the last one, in ms


def test_updates_between_scrapes_add_up_exactly(metrics: ServerMetrics) -> None:
    # The per-request metrics keep their value in a tally between scrapes: each scrape
    # shows every update made before it, once.
    labels = ts_labels("m")
    for _ in range(3):
        metrics.request_received("m", None)
    metrics.request_finished("m", None, latency_us=10.0, queue_us=4000.0)
    assert value(metrics, "ts_inference_requests_total", **labels) == 3.0
    assert value(metrics, "ts_inference_requests_total", **labels) == 3.0  # no double count
    assert value(metrics, "QueueTime", **HOST_LABELS) == 4.0
    for _ in range(2):
        metrics.request_received("m", None)
    metrics.request_finished("m", None, latency_us=5.0, queue_us=1000.0)
    assert value(metrics, "ts_inference_requests_total", **labels) == 5.0
    assert value(metrics, "ts_inference_latency_microseconds_total", **labels) == 15.0
    assert value(metrics, "QueueTime", **HOST_LABELS) == 1.0  # a gauge: the last value
    assert value(metrics, "QueueTime", **HOST_LABELS) == 1.0  # kept after the scrape


def test_a_counter_updated_by_zero_is_exported_at_zero(metrics: ServerMetrics) -> None:
    metrics.request_finished("m", None, latency_us=0.0, queue_us=0.0)
    assert value(metrics, "ts_queue_latency_microseconds_total", **ts_labels("m")) == 0.0
    assert value(metrics, "ts_inference_latency_microseconds_total", **ts_labels("m")) == 0.0


def test_negative_or_nan_latencies_never_move_counters_back(metrics: ServerMetrics) -> None:
    metrics.request_finished("m", None, latency_us=100.0, queue_us=10.0)
    metrics.request_finished("m", None, latency_us=-5.0, queue_us=float("nan"))
    assert value(metrics, "ts_inference_latency_microseconds_total", **ts_labels("m")) == 100.0
    assert value(metrics, "ts_queue_latency_microseconds_total", **ts_labels("m")) == 10.0


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (200, "Requests2XX"),
        (204, "Requests2XX"),
        (404, "Requests4XX"),
        (400, "Requests4XX"),
        (500, "Requests5XX"),
        (503, "Requests5XX"),
        (507, "Requests5XX"),
    ],
)
def test_http_status_classes(metrics: ServerMetrics, status: int, name: str) -> None:
    metrics.http_status(status)
    metrics.http_status(status)
    for other in ("Requests2XX", "Requests4XX", "Requests5XX"):
        expected = 2.0 if other == name else None
        assert value(metrics, f"{other}_total", **HOST_LABELS) == expected


@pytest.mark.parametrize("status", [101, 301, 304])
def test_informational_and_redirect_statuses_are_not_counted(
    metrics: ServerMetrics, status: int
) -> None:
    metrics.http_status(status)
    for name in ("Requests2XX", "Requests4XX", "Requests5XX"):
        assert samples(metrics, name) == []


def test_worker_load_and_thread_time(metrics: ServerMetrics) -> None:
    metrics.worker_loaded("W-9000-resnet_1.0", 812.5)
    metrics.worker_loaded("W-9001-resnet_1.0", 90.0)
    metrics.worker_thread_time(1.25)
    metrics.worker_thread_time(0.75)
    assert value(metrics, "WorkerLoadTime", WorkerName="W-9000-resnet_1.0", **HOST_LABELS) == 812.5
    assert value(metrics, "WorkerLoadTime", WorkerName="W-9001-resnet_1.0", **HOST_LABELS) == 90.0
    assert value(metrics, "WorkerThreadTime", **HOST_LABELS) == 0.75


def test_sample_system_sets_the_host_gauges(metrics: ServerMetrics) -> None:
    metrics.sample_system()
    got = {
        name: value(metrics, name, **HOST_LABELS)
        for name in (
            "CPUUtilization",
            "MemoryUtilization",
            "MemoryUsed",
            "MemoryAvailable",
            "DiskUtilization",
            "DiskUsage",
            "DiskAvailable",
        )
    }
    assert all(v is not None for v in got.values()), got
    for name in ("CPUUtilization", "MemoryUtilization", "DiskUtilization"):
        assert 0.0 <= got[name] <= 100.0  # type: ignore[operator]
    assert got["MemoryUsed"] > 0  # type: ignore[operator]
    assert got["DiskUsage"] > 0  # type: ignore[operator]


def test_sample_system_survives_a_failing_psutil(
    metrics: ServerMetrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: SystemSampler) -> dict[str, float]:
        raise OSError("no /proc")

    monkeypatch.setattr(SystemSampler, "sample", broken)
    with caplog.at_level(logging.WARNING, logger="trioserve.metrics"):
        metrics.sample_system()
        metrics.sample_system()
    assert len([r for r in caplog.records if "system metrics" in r.getMessage()]) == 1
    assert samples(metrics, "CPUUtilization") == []


def test_no_created_samples(metrics: ServerMetrics) -> None:
    metrics.request_received("m", None)
    metrics.handler_metrics("m", "1", [record("H", 0.2, "HISTOGRAM")])
    assert b"_created" not in metrics.exposition()


def test_servers_in_one_process_do_not_share_metrics() -> None:
    one, two = ServerMetrics(hostname="a"), ServerMetrics(hostname="b")
    one.request_received("m", None)
    one.handler_metrics("m", "1", [record("Mine", 1.0)])
    two.handler_metrics("m", "1", [record("Mine", 5.0, "COUNTER")])  # no clash across servers
    assert value(one, "ts_inference_requests_total", **{**ts_labels("m"), "hostname": "a"}) == 1
    assert samples(two, "ts_inference_requests") == []
    assert value(two, "Mine_total", Hostname="b") == 5.0
    assert one.registry is not two.registry
    assert REGISTRY.get_sample_value("ts_inference_requests_total", ts_labels("m")) is None


# -- handler metrics ----------------------------------------------------------------------


def test_handler_gauge_sets_with_dimensions_as_labels(metrics: ServerMetrics) -> None:
    dims = {"ModelName": "mnist", "Level": "Model"}
    metrics.handler_metrics("mnist", "1.0", [record("HandlerTime", 5.0, **dims)])
    metrics.handler_metrics("mnist", "1.0", [record("HandlerTime", 2.5, **dims)])
    family = families(metrics)["HandlerTime"]
    assert family.type == "gauge"
    assert family.documentation == "Torchserve prometheus gauge metric with unit: Milliseconds"
    assert value(metrics, "HandlerTime", Hostname=HOST, **dims) == 2.5


def test_handler_counter_adds(metrics: ServerMetrics) -> None:
    rec = record("InferenceRequestCount", 1, "COUNTER", "Count")
    metrics.handler_metrics("m", "1.0", [rec, rec])
    metrics.handler_metrics("m", "1.0", [record("InferenceRequestCount", 3, "COUNTER", "Count")])
    family = families(metrics)["InferenceRequestCount"]
    assert family.type == "counter"
    assert family.documentation == "Torchserve prometheus counter metric with unit: Count"
    # No dimensions: only Hostname, as TorchServe's InferenceRequestCount{Hostname=...}.
    assert value(metrics, "InferenceRequestCount_total", Hostname=HOST) == 5.0


def test_handler_histogram_observes(metrics: ServerMetrics) -> None:
    dims = {"ModelName": "m", "Level": "Model"}
    batch = [record("ExamplePercentMetric", v, "HISTOGRAM", "Percent", **dims) for v in (0.3, 7)]
    metrics.handler_metrics("m", "1.0", batch)
    family = families(metrics)["ExamplePercentMetric"]
    assert family.type == "histogram"
    assert family.documentation == "Torchserve prometheus histogram metric with unit: Percent"
    labels = {"Hostname": HOST, **dims}
    assert value(metrics, "ExamplePercentMetric_count", **labels) == 2.0
    assert value(metrics, "ExamplePercentMetric_sum", **labels) == pytest.approx(7.3)
    assert value(metrics, "ExamplePercentMetric_bucket", le="0.5", **labels) == 1.0
    assert value(metrics, "ExamplePercentMetric_bucket", le="+Inf", **labels) == 2.0


def test_handler_metric_types_are_case_insensitive(metrics: ServerMetrics) -> None:
    metrics.handler_metrics("m", "1", [record("Lower", 1.0, "gauge")])
    assert value(metrics, "Lower", Hostname=HOST) == 1.0


def test_handler_metric_label_values_are_strings_and_hostname_may_be_given(
    metrics: ServerMetrics,
) -> None:
    metrics.handler_metrics("m", "1", [record("Size", 3, Batch=4, Hostname="worker-host")])
    assert value(metrics, "Size", Batch="4", Hostname="worker-host") == 3.0


def test_dimension_order_does_not_make_a_new_metric(metrics: ServerMetrics) -> None:
    metrics.handler_metrics("m", "1", [record("T", 1.0, ModelName="m", Level="Model")])
    metrics.handler_metrics(
        "m", "1", [{**record("T", 2.0), "dimensions": {"Level": "Model", "ModelName": "m"}}]
    )
    assert value(metrics, "T", ModelName="m", Level="Model", Hostname=HOST) == 2.0


def test_distinct_label_values_are_distinct_series(metrics: ServerMetrics) -> None:
    metrics.handler_metrics(
        "m",
        "1",
        [
            record("Calls", 1, "COUNTER", MethodName="pre"),
            record("Calls", 2, "COUNTER", MethodName="post"),
        ],
    )
    assert value(metrics, "Calls_total", MethodName="pre", Hostname=HOST) == 1.0
    assert value(metrics, "Calls_total", MethodName="post", Hostname=HOST) == 2.0


BAD_RECORDS: list[tuple[str, Any]] = [
    ("not an object", "HandlerTime"),
    ("no name", {"value": 1, "type": "GAUGE"}),
    ("empty name", record("", 1.0)),
    ("unknown type", record("X", 1.0, "SUMMARY")),
    ("missing type", {"name": "X", "value": 1.0}),
    ("string value", record("X", "1.0")),
    ("bool value", record("X", True)),
    ("nan value", record("X", float("nan"))),
    ("infinite value", record("X", float("inf"))),
    ("negative counter", record("X", -1, "COUNTER")),
    ("dimensions not an object", {**record("X", 1.0), "dimensions": ["a", "b"]}),
    ("invalid metric name", record("bad-name", 1.0)),
    ("invalid dimension name", record("X", 1.0, **{"Model Name": "m"})),
    ("reserved dimension name", record("X", 1.0, __name="m")),
    ("histogram with le", record("X", 1.0, "HISTOGRAM", le="1")),
    ("frontend metric name", record("QueueTime", 1.0, Level="Host")),
    ("frontend counter name", record("Requests2XX", 1.0, "COUNTER", Level="Host")),
]


@pytest.mark.parametrize(("why", "bad"), BAD_RECORDS, ids=[w for w, _ in BAD_RECORDS])
def test_bad_handler_metrics_are_dropped_and_logged_once(
    metrics: ServerMetrics, caplog: pytest.LogCaptureFixture, why: str, bad: Any
) -> None:
    before = metrics.exposition()
    good = record("Good", 1.0)
    with caplog.at_level(logging.WARNING, logger="trioserve.metrics"):
        metrics.handler_metrics("m", "1.0", [bad, good])
        metrics.handler_metrics("m", "1.0", [bad, good])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "model m" in warnings[0].getMessage()
    # The good record beside it still counts; nothing else changed.
    assert value(metrics, "Good", Hostname=HOST) == 1.0
    after = metrics.exposition().decode()
    assert (
        after.replace(
            "# HELP Good Torchserve prometheus gauge metric with unit: Milliseconds\n"
            "# TYPE Good gauge\n"
            f'Good{{Hostname="{HOST}"}} 1.0\n',
            "",
        )
        == before.decode()
    )


def test_a_frame_that_is_not_a_list_is_dropped(
    metrics: ServerMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="trioserve.metrics"):
        metrics.handler_metrics("m", "1", {"name": "X"})  # type: ignore[arg-type]
    assert "METRICS frame" in caplog.text


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (record("Reused", 1.0, "GAUGE"), record("Reused", 1.0, "COUNTER")),
        (record("Reused", 1.0, "COUNTER"), record("Reused", 1.0, "HISTOGRAM")),
        (record("Reused", 1.0, ModelName="m"), record("Reused", 1.0, ModelName="m", Level="x")),
        (record("Reused", 1.0, ModelName="m"), record("Reused", 1.0)),
        # Different metrics whose exposed names would collide.
        (record("Foo", 1.0, "COUNTER"), record("Foo_total", 1.0, "GAUGE")),
        (record("Foo_total", 1.0, "COUNTER"), record("Foo", 1.0, "COUNTER")),
        (record("Lat", 1.0, "HISTOGRAM"), record("Lat_count", 1.0, "GAUGE")),
        # A handler metric whose exposed name is a frontend metric's sample name.
        (record("Ok", 1.0), record("Requests2XX_total", 1.0)),
    ],
)
def test_reusing_a_name_with_other_labels_or_type_is_dropped_once(
    metrics: ServerMetrics,
    caplog: pytest.LogCaptureFixture,
    first: dict[str, Any],
    second: dict[str, Any],
) -> None:
    metrics.handler_metrics("m", "1", [first])
    before = metrics.exposition()
    with caplog.at_level(logging.WARNING, logger="trioserve.metrics"):
        for _ in range(3):
            metrics.handler_metrics("m", "1", [second])
    assert metrics.exposition() == before
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "dropped" in warnings[0]


def test_many_distinct_bad_names_do_not_flood_the_log(
    metrics: ServerMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="trioserve.metrics"):
        metrics.handler_metrics("m", "1", [record(f"bad-{i}", 1.0) for i in range(3000)])
    assert 0 < len(caplog.records) <= 1000


# -- the name filter ----------------------------------------------------------------------


def test_name_filter_keeps_only_the_named_metrics(metrics: ServerMetrics) -> None:
    metrics.request_received("m", None)
    metrics.http_status(200)
    metrics.http_status(500)
    metrics.handler_metrics("m", "1", [record("H", 0.2, "HISTOGRAM")])
    parsed = families(metrics, ["Requests2XX", "ts_inference_requests_total", "H_sum"])
    assert set(parsed) == {"Requests2XX", "ts_inference_requests", "H"}
    # A counter answers to its TorchServe name and to its sample name.
    assert set(families(metrics, ["Requests5XX_total"])) == {"Requests5XX"}
    assert set(families(metrics, ["ts_queue_latency_microseconds"])) == {
        "ts_queue_latency_microseconds"
    }
    assert families(metrics, ["NoSuchMetric"]) == {}
    assert set(families(metrics, [])) == set(families(metrics))


def test_name_filter_lists_a_metric_that_has_no_samples_yet(metrics: ServerMetrics) -> None:
    text = metrics.exposition(["Requests4XX"]).decode()
    assert text == (
        "# HELP Requests4XX_total Torchserve prometheus counter metric with unit: Count\n"
        "# TYPE Requests4XX_total counter\n"
    )


# -- legacy and log modes -----------------------------------------------------------------


def metric_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "trioserve.metrics" and r.levelno == logging.INFO
    ]


def exercise(metrics: ServerMetrics) -> None:
    metrics.request_received("m", None)
    metrics.request_finished("m", "1.0", latency_us=1500.0, queue_us=250.0)
    metrics.http_status(200)
    metrics.worker_loaded("W-9000-m_1.0", 12.0)
    metrics.worker_thread_time(0.5)
    metrics.sample_system()
    metrics.handler_metrics("m", "1.0", [record("HandlerTime", 4.0, ModelName="m", Level="Model")])


def test_prometheus_mode_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="trioserve.metrics"):
        exercise(ServerMetrics(hostname=HOST))
    assert metric_lines(caplog) == []


def test_legacy_mode_exports_only_the_ts_counters_and_logs_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = ServerMetrics(mode="legacy", hostname=HOST)
    with caplog.at_level(logging.INFO, logger="trioserve.metrics"):
        exercise(metrics)
    parsed = families(metrics)
    assert set(parsed) == {n.removesuffix("_total") for n in LEGACY_METRICS}
    assert value(metrics, "ts_inference_requests_total", **ts_labels("m")) == 1.0
    assert value(metrics, "ts_inference_latency_microseconds_total", **ts_labels("m", "1.0")) == (
        1500.0
    )
    lines = metric_lines(caplog)
    logged = {line.split(".", 1)[0] for line in lines}
    assert not logged & LEGACY_METRICS
    assert {
        "Requests2XX",
        "QueueTime",
        "WorkerLoadTime",
        "WorkerThreadTime",
        "CPUUtilization",
        "DiskAvailable",
        "HandlerTime",
    } <= logged
    (requests,) = [line for line in lines if line.startswith("Requests2XX.")]
    assert requests.startswith(f"Requests2XX.Count:1.0|#Level:Host|#hostname:{HOST},")
    (load,) = [line for line in lines if line.startswith("WorkerLoadTime.")]
    assert load.startswith(
        f"WorkerLoadTime.Milliseconds:12.0|#WorkerName:W-9000-m_1.0,Level:Host|#hostname:{HOST},"
    )


def test_log_mode_exports_nothing_and_logs_everything(caplog: pytest.LogCaptureFixture) -> None:
    metrics = ServerMetrics(mode="log", hostname=HOST)
    with caplog.at_level(logging.INFO, logger="trioserve.metrics"):
        exercise(metrics)
    assert metrics.exposition() == b""
    assert metrics.exposition(["Requests2XX"]) == b""
    lines = metric_lines(caplog)
    logged = {line.split(".", 1)[0] for line in lines}
    assert set(LEGACY_METRICS) | {"Requests2XX", "QueueTime", "HandlerTime", "MemoryUsed"} <= logged
    (requests,) = [line for line in lines if line.startswith("ts_inference_requests_total.")]
    assert requests.startswith(
        f"ts_inference_requests_total.Count:1.0|#model_name:m,model_version:default"
        f"|#hostname:{HOST},"
    )
    (handler,) = [line for line in lines if line.startswith("HandlerTime.")]
    assert handler.startswith(
        f"HandlerTime.Milliseconds:4.0|#ModelName:m,Level:Model|#type:GAUGE|#hostname:{HOST},"
    )
    assert handler.endswith(",req-1")


def test_log_mode_still_drops_malformed_handler_metrics(caplog: pytest.LogCaptureFixture) -> None:
    metrics = ServerMetrics(mode="log", hostname=HOST)
    with caplog.at_level(logging.INFO, logger="trioserve.metrics"):
        metrics.handler_metrics("m", "1", [record("X", "nope"), record("Y", 1, "COUNTER")])
    assert [line.split(".", 1)[0] for line in metric_lines(caplog)] == ["Y"]
