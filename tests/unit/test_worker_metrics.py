"""``context.metrics``: TorchServe's metric-cache API, collected for the METRICS frame."""

from __future__ import annotations

import logging

import pytest

from trioserve.worker.torchserve.metrics import (
    Dimension,
    MetricsCache,
    MetricsCacheKeyError,
    MetricsCacheValueError,
    MetricTypes,
)


@pytest.fixture
def cache() -> MetricsCache:
    metrics = MetricsCache("resnet")
    metrics.set_request_ids({0: "a", 1: "b"})
    return metrics


def test_add_time_for_one_request(cache: MetricsCache) -> None:
    cache.add_time("HandlerTime", 12.5, 1, "ms")
    assert cache.drain() == [
        {
            "name": "HandlerTime",
            "unit": "Milliseconds",
            "value": 12.5,
            "type": "GAUGE",
            "dimensions": {"ModelName": "resnet", "Level": "Model"},
            "request_id": "b",
        }
    ]
    assert cache.drain() == []


def test_batch_wide_metric_names_all_requests(cache: MetricsCache) -> None:
    cache.add_counter("Calls", 2)
    (record,) = cache.drain()
    assert record["request_id"] == "a,b"
    assert (record["unit"], record["type"]) == ("Count", "COUNTER")


def test_other_helpers(cache: MetricsCache) -> None:
    cache.add_size("Mem", 3, 0, "GB")
    cache.add_percent("Util", 50.0, 0)
    cache.add_time("Secs", 1, 0, "s", metric_type=MetricTypes.HISTOGRAM)
    cache.add_metric("Custom", 7, "tokens", 0, [Dimension("Shard", 3)], MetricTypes.GAUGE)
    cache.add_error("Errs", 1)
    records = cache.drain()
    assert [(r["name"], r["unit"], r["type"]) for r in records] == [
        ("Mem", "Gigabytes", "GAUGE"),
        ("Util", "Percent", "GAUGE"),
        ("Secs", "Seconds", "HISTOGRAM"),
        ("Custom", "tokens", "GAUGE"),
        ("Errs", "unit", "COUNTER"),
    ]
    assert records[3]["dimensions"] == {"Shard": "3", "ModelName": "resnet", "Level": "Model"}
    assert records[4]["dimensions"] == {"Level": "Error"}
    assert records[4]["request_id"] == ""


def test_own_dimensions_override_defaults(cache: MetricsCache) -> None:
    cache.add_counter("C", 1, 0, [Dimension("Level", "Host"), Dimension("ModelName", "x")])
    assert cache.drain()[0]["dimensions"] == {"Level": "Host", "ModelName": "x"}


def test_request_id_given_directly(cache: MetricsCache) -> None:
    cache.add_counter("C", 1, "explicit-id")
    assert cache.drain()[0]["request_id"] == "explicit-id"


def test_bad_units_raise(cache: MetricsCache) -> None:
    with pytest.raises(MetricsCacheValueError):
        cache.add_time("T", 1, None, "minutes")
    with pytest.raises(MetricsCacheValueError):
        cache.add_size("S", 1, None, "TB")


def test_defined_metric_round_trip(cache: MetricsCache) -> None:
    metric = cache.add_metric_to_cache("Tokens", "count", ["Model"], MetricTypes.COUNTER)
    assert cache.get_metric("Tokens", MetricTypes.COUNTER) is metric
    assert cache.get_metric("Tokens", "counter") is metric
    metric.add_or_update(5, ["gpt"], "a")
    assert cache.drain() == [
        {
            "name": "Tokens",
            "unit": "Count",
            "value": 5,
            "type": "COUNTER",
            "dimensions": {"Model": "gpt"},
            "request_id": "a",
        }
    ]


def test_get_missing_metric(cache: MetricsCache) -> None:
    cache.add_metric_to_cache("G", "ms", [], MetricTypes.GAUGE)
    with pytest.raises(MetricsCacheKeyError, match="add_metric_to_cache"):
        cache.get_metric("G", MetricTypes.COUNTER)
    with pytest.raises(MetricsCacheKeyError):
        cache.get_metric("Nope")


def test_invalid_updates_are_logged_not_recorded(
    cache: MetricsCache, caplog: pytest.LogCaptureFixture
) -> None:
    metric = cache.add_metric_to_cache("C", "count", ["A"])
    with caplog.at_level(logging.ERROR, logger="trioserve.worker"):
        metric.add_or_update(1, [])  # wrong number of dimension values
        metric.add_or_update(-1, ["x"])  # a counter cannot go down
        metric.add_or_update("many", ["x"])  # type: ignore[arg-type]
    assert cache.drain() == []
    assert len(caplog.records) == 3


def test_update_with_dimension_objects(cache: MetricsCache) -> None:
    metric = cache.add_metric_to_cache("G", "MB", ["Old"], MetricTypes.GAUGE)
    metric.update(2.5, "b", [Dimension("New", "v")])
    (record,) = cache.drain()
    assert record["dimensions"] == {"New": "v"}
    assert record["unit"] == "Megabytes"


def test_dimension() -> None:
    dim = Dimension("Level", "Model")
    assert str(dim) == "Level:Model"
    assert dim.to_dict() == {"Name": "Level", "Value": "Model"}


def test_unknown_metric_type() -> None:
    with pytest.raises(MetricsCacheValueError):
        MetricsCache("m").add_metric_to_cache("X", "ms", [], "summary")
