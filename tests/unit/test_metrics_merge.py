"""Merging the expositions of several serving processes into the server's totals.

The expositions come from real registries (:class:`ServerMetrics`, prometheus_client inside)
and the merge is read back with prometheus_client's parser, so every merged page checked here
is also a valid exposition.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from trioserve.metrics import BUILTIN_METRICS, ServerMetrics
from trioserve.metrics.merge import merge_expositions, merge_families, read_exposition

HOST = "merge-host"
SYSTEM = (
    "CPUUtilization",
    "MemoryUsed",
    "MemoryAvailable",
    "MemoryUtilization",
    "DiskUsage",
    "DiskUtilization",
    "DiskAvailable",
)

Key = tuple[str, str, frozenset[tuple[str, str]]]


def parse(body: bytes) -> list[Metric]:
    return list(text_string_to_metric_families(body.decode()))


def samples(
    body: bytes, types: Sequence[str] = ("counter", "gauge", "histogram")
) -> dict[Key, float]:
    """(family, sample name, labels) -> value, for the families of ``types``."""
    found: dict[Key, float] = {}
    for family in parse(body):
        if family.type in types:
            for s in family.samples:
                key = (family.name, s.name, frozenset(s.labels.items()))
                assert key not in found, f"sample {key} twice"
                found[key] = s.value
    return found


# -- what a serving process records -----------------------------------------------------

# Label values are any text: the merge must read back whatever a process escaped.
label_values = st.text(max_size=6)
whole = st.integers(min_value=0, max_value=10**6)  # exact in a float, summed in any order


@dataclass(frozen=True)
class Op:
    """One update a serving process records."""

    kind: str
    model: str
    version: str | None
    value: float


ops = st.one_of(
    st.builds(Op, st.just("received"), label_values, st.none() | label_values, st.just(0.0)),
    st.builds(Op, st.just("finished"), label_values, st.none() | label_values, whole),
    st.builds(Op, st.just("count"), label_values, label_values, whole),
    st.builds(Op, st.just("observe"), label_values, label_values, st.integers(0, 20)),
    st.builds(Op, st.just("status"), st.just(""), st.none(), st.sampled_from([200, 404, 503])),
)


def record(op: Op) -> list[dict[str, Any]]:
    """A handler's METRICS records for ``op`` (``version`` is a dimension here)."""
    kind, name = ("COUNTER", "Hits") if op.kind == "count" else ("HISTOGRAM", "Sizes")
    dimensions = {"ModelName": op.model, "Level": op.version}
    return [{"name": name, "type": kind, "value": op.value, "dimensions": dimensions}]


def apply(metrics: ServerMetrics, op: Op) -> None:
    if op.kind == "received":
        metrics.request_received(op.model, op.version)
    elif op.kind == "finished":
        metrics.request_finished(op.model, op.version, latency_us=op.value, queue_us=op.value)
    elif op.kind == "status":
        metrics.http_status(int(op.value))
    else:
        metrics.handler_metrics(op.model, "1.0", record(op))


def split_ops(max_processes: int = 4) -> st.SearchStrategy[tuple[int, list[tuple[Op, int]]]]:
    """A number of processes (1 to ``max_processes``) and ops, each given to one of them."""
    return st.integers(1, max_processes).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.tuples(ops, st.integers(0, n - 1)), max_size=30)
        )
    )


def processes(n: int, split: list[tuple[Op, int]]) -> list[ServerMetrics]:
    serving = [ServerMetrics(hostname=HOST) for _ in range(n)]
    for op, process in split:
        apply(serving[process], op)
    return serving


# -- the properties ---------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(split_ops())
def test_the_merge_is_the_sum_of_every_process(split: tuple[int, list[tuple[Op, int]]]) -> None:
    """Counters and histograms however their updates were split among 1 to 4 processes
    read as in one registry that got every update."""
    n, given_ops = split
    one = ServerMetrics(hostname=HOST)
    for op, _ in given_ops:
        apply(one, op)
    merged = merge_expositions([p.exposition() for p in processes(n, given_ops)])
    summed = ("counter", "histogram")
    assert samples(merged, summed) == samples(one.exposition(), summed)
    assert {f.name for f in parse(merged)} == {f.name for f in parse(one.exposition())}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(ops, max_size=20),
    st.lists(st.tuples(label_values, st.floats(-1e9, 1e9)), max_size=4),
    st.lists(st.sampled_from([*BUILTIN_METRICS, "Hits", "Sizes_count", "Gauge", "x"])),
)
def test_merging_one_exposition_gives_it_back(
    given_ops: list[Op], gauges: list[tuple[str, float]], names: list[str]
) -> None:
    metrics = ServerMetrics(hostname=HOST)
    for op in given_ops:
        apply(metrics, op)
    for model, value in gauges:
        metrics.handler_metrics(
            model, "1", [{"name": "Gauge", "type": "GAUGE", "value": value, "dimensions": {}}]
        )
    metrics.add_gauge_source("ts_open_sequences", "Open", ("model_name",), lambda: [(["m"], 2)])
    metrics.sample_system()
    assert merge_expositions([metrics.exposition()]) == metrics.exposition()
    # TorchServe's name[] filter reads the same on the merge as on the process's own page.
    assert merge_expositions([metrics.exposition()], names) == metrics.exposition(names)


# Any finite value; large and small ones together, where a left-to-right sum would round
# differently depending on the order.
values = st.sampled_from([1e16, -1e16, 1.0, 0.1, -0.3]) | st.floats(-1e15, 1e15)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.dictionaries(st.sampled_from("abc"), values, max_size=3), min_size=1, max_size=4),
    st.data(),
)
def test_the_sums_do_not_depend_on_the_order(
    inputs: list[dict[str, float]], data: st.DataObject
) -> None:
    """Each sample is the correctly rounded sum of the processes' values, the same whatever
    the order of the processes."""
    expositions = []
    for values_of in inputs:
        registry = CollectorRegistry()
        gauge = Gauge("level", "a gauge", ["shard"], registry=registry)
        for shard, value in values_of.items():
            gauge.labels(shard).set(value)
        expositions.append(generate_latest(registry))
    merged = samples(merge_expositions(expositions))
    order = data.draw(st.permutations(range(len(inputs))))
    assert samples(merge_expositions([expositions[i] for i in order])) == merged
    shards = {shard for values_of in inputs for shard in values_of}
    assert merged == {
        ("level", "level", frozenset({("shard", shard)})): math.fsum(
            values_of[shard] for values_of in inputs if shard in values_of
        )
        for shard in shards
    }


@settings(max_examples=100, deadline=None)
@given(
    split_ops(),
    st.data(),
    st.lists(st.tuples(label_values, st.floats(-1e9, 1e9)), min_size=1, max_size=4),
)
def test_a_family_of_one_process_passes_through(
    split: tuple[int, list[tuple[Op, int]]], data: st.DataObject, only: list[tuple[str, float]]
) -> None:
    """The system metrics, sampled by one process only, and a handler gauge only one
    process has, come out as that process wrote them."""
    n, given_ops = split
    serving = processes(n, given_ops)
    alone = serving[data.draw(st.integers(0, n - 1))]
    alone.sample_system()
    for model, value in only:
        alone.handler_metrics(
            model,
            "1",
            [{"name": "Alone", "type": "GAUGE", "value": value, "dimensions": {"M": model}}],
        )
    merged = {f.name: f for f in parse(merge_expositions([p.exposition() for p in serving]))}
    own = {f.name: f for f in parse(alone.exposition())}
    for name in (*SYSTEM, "Alone"):
        assert merged[name] == own[name]
        assert merged[name].samples == own[name].samples


# -- examples ---------------------------------------------------------------------------


def exposition(*families: tuple[str, str, list[tuple[dict[str, str], float]]]) -> bytes:
    """A real registry's exposition of the given (name, kind, samples) families."""
    registry = CollectorRegistry()
    for name, kind, children in families:
        labels = sorted({k for child, _ in children for k in child})
        metric: Counter | Gauge
        if kind == "counter":
            metric = Counter(name, f"{name} help", labels, registry=registry)
        else:
            metric = Gauge(name, f"{name} help", labels, registry=registry)
        for child, value in children:
            target = metric.labels(**child) if labels else metric
            if isinstance(target, Counter):
                target.inc(value)
            else:
                target.set(value)
    return b"".join(
        line + b"\n" for line in generate_latest(registry).splitlines() if b"_created" not in line
    )


def test_families_come_in_order_of_first_appearance() -> None:
    first = exposition(("b", "counter", [({}, 1)]), ("a", "gauge", [({}, 1)]))
    second = exposition(("c", "gauge", [({}, 1)]), ("a", "gauge", [({}, 2)]))
    merged = merge_expositions([first, second])
    assert [f.name for f in parse(merged)] == ["b", "a", "c"]
    assert merged.decode() == (
        "# HELP b_total b help\n# TYPE b_total counter\nb_total 1.0\n"
        "# HELP a a help\n# TYPE a gauge\na 3.0\n"
        "# HELP c c help\n# TYPE c gauge\nc 1.0\n"
    )


def test_samples_come_in_order_of_first_appearance() -> None:
    first = exposition(("g", "gauge", [({"x": "2"}, 1)]))
    second = exposition(("g", "gauge", [({"x": "1"}, 1), ({"x": "2"}, 1)]))
    (family,) = parse(merge_expositions([first, second]))
    assert [(s.labels, s.value) for s in family.samples] == [({"x": "2"}, 2.0), ({"x": "1"}, 1.0)]


def test_a_gauge_is_the_sum_of_each_process_value() -> None:
    """A last-value gauge that several processes set reads as the sum of their values."""
    one, two = ServerMetrics(hostname=HOST), ServerMetrics(hostname=HOST)
    one.request_finished("m", None, latency_us=10.0, queue_us=3000.0)
    two.request_finished("m", None, latency_us=10.0, queue_us=500.0)
    two.request_finished("m", None, latency_us=10.0, queue_us=1000.0)
    merged = samples(merge_expositions([one.exposition(), two.exposition()]), ["gauge"])
    labels = frozenset({"Level": "Host", "Hostname": HOST}.items())
    assert merged[("QueueTime", "QueueTime", labels)] == 4.0  # 3 ms + two's last, 1 ms


def test_the_same_name_with_another_type_keeps_the_first() -> None:
    counter = exposition(("m", "counter", [({}, 2)]))
    gauge = b"# HELP m other\n# TYPE m gauge\nm 5.0\n"
    assert merge_expositions([counter, gauge]) == counter
    assert merge_expositions([gauge, counter]) == gauge


def test_a_family_whose_names_clash_is_left_out() -> None:
    """A counter ``m`` writes ``m_total``: a gauge named ``m_total`` cannot join it."""
    counter = exposition(("m", "counter", [({}, 2)]))
    gauge = exposition(("m_total", "gauge", [({}, 5)]))
    assert merge_expositions([counter, gauge]) == counter
    assert merge_expositions([gauge, counter]) == gauge


def test_other_types_are_not_summed() -> None:
    summary = (
        b'# HELP s a summary\n# TYPE s summary\ns{quantile="0.5"} 1.0\ns_count 2.0\ns_sum 3.0\n'
    )
    other = summary.replace(b"1.0", b"7.0")
    assert merge_expositions([summary, other]) == summary


BROKEN = b"# TYPE a counter\na_total one\n"


def test_an_unreadable_input_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    good = exposition(("a", "counter", [({}, 1)]))
    with caplog.at_level(logging.WARNING, "trioserve.metrics"):
        merged = merge_expositions([good, BROKEN, b"\xff\xfe", good])
    assert samples(merged) == {("a", "a_total", frozenset()): 2.0}
    assert len([r for r in caplog.records if "left out of the merged metrics" in r.message]) == 2
    with pytest.raises(ValueError, match="unreadable exposition"):
        read_exposition(BROKEN)


def test_nothing_to_merge() -> None:
    assert merge_expositions([]) == b""
    assert merge_expositions([b"", b""]) == b""
    assert merge_families([]) == []
    log_mode = ServerMetrics(mode="log", hostname=HOST)
    log_mode.request_received("m", None)
    metrics = ServerMetrics(hostname=HOST)
    assert merge_expositions([metrics.exposition(), log_mode.exposition()]) == (
        metrics.exposition()
    )


def test_the_name_filter_applies_to_the_merge() -> None:
    one, two = ServerMetrics(hostname=HOST), ServerMetrics(hostname=HOST)
    one.request_received("m", None)
    two.request_received("m", None)
    two.handler_metrics(
        "m", "1", [{"name": "Sizes", "type": "HISTOGRAM", "value": 1, "dimensions": {}}]
    )
    pages = [one.exposition(), two.exposition()]
    merged = merge_expositions(pages, ["ts_inference_requests_total", "Sizes_sum"])
    assert [f.name for f in parse(merged)] == ["ts_inference_requests", "Sizes"]
    labels = frozenset({"model_name": "m", "model_version": "default", "hostname": HOST}.items())
    assert samples(merged)[("ts_inference_requests", "ts_inference_requests_total", labels)] == 2
    assert merge_expositions(pages, ["nothing"]) == b""
