"""The server's metrics, with TorchServe's names, kept in a per-server prometheus registry.

One :class:`ServerMetrics` per server: it owns a :class:`prometheus_client.CollectorRegistry`
of its own (never the process-global one), so several servers can live in one process.

``metrics_mode`` decides where each metric goes (spec §4):

* ``prometheus`` -- every metric is exported on ``/metrics``; nothing is logged;
* ``legacy`` -- only ``ts_inference_requests_total``, ``ts_inference_latency_microseconds``
  and ``ts_queue_latency_microseconds`` are exported; every other metric is logged;
* ``log`` -- every metric is logged; ``/metrics`` is empty.

Logged metrics go to the ``trioserve.metrics`` logger at INFO, one line per update, in
TorchServe's metric log format (``Name.Unit:value|#Dim:v,...|#hostname:h,epoch``; handler
metrics add ``|#type:T`` before the hostname and the request id after the epoch).

The Prometheus side (families, children, collectors) is in :mod:`.families`; the metric
names and labels in :mod:`.catalog`; record checking in :mod:`.records`.

Handler metrics (the worker's METRICS frame) become metrics by name, type and dimension
names; labels are the record's dimensions plus ``Hostname``. The worker's metrics cache
already adds TorchServe's ``ModelName``/``Level`` defaults, and, as in TorchServe, nothing is
added here for a metric that has none. Bad records are logged once and dropped: metrics never
raise into the serving path.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from trioserve.core.request import Outcome
from trioserve.metrics.catalog import (
    BUILTIN_METRICS,
    CONTENT_TYPE,
    DEFAULT_VERSION,
    HOST_LEVEL,
    INFERENCE_LATENCY,
    LEGACY_METRICS,
    METRICS_MODES,
    OUTCOME_COUNTERS,
    QUEUE_LATENCY,
    REQUESTS_TOTAL,
    MetricSpec,
    exposed_names,
    help_text,
)
from trioserve.metrics.families import (
    FamiliesCollector,
    Family,
    Filtered,
    GaugeSource,
    ignore_update,
)
from trioserve.metrics.records import record_name, record_problem
from trioserve.metrics.system import SystemSampler

__all__ = [
    "BUILTIN_METRICS",
    "CONTENT_TYPE",
    "LEGACY_METRICS",
    "METRICS_MODES",
    "MetricSpec",
    "ServerMetrics",
    "help_text",
]

log = logging.getLogger("trioserve.metrics")

# Caps that keep a misbehaving handler from growing the server without bound.
MAX_HANDLER_FAMILIES: Final = 2000
MAX_WARNINGS: Final = 1000
MAX_UPDATERS: Final = 10_000  # per-model builtin metric updaters kept

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class ServerMetrics:
    """The metrics of one server, exported or logged as ``mode`` says."""

    def __init__(self, *, mode: str = "prometheus", hostname: str | None = None) -> None:
        if mode not in METRICS_MODES:
            raise ValueError(f"metrics mode {mode!r}: expected one of {', '.join(METRICS_MODES)}")
        self.mode = mode
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}
        self._owners: dict[str, str] = {}  # exposed name -> the metric that uses it
        self._handler_families = 0
        self._warned: set[tuple[str, ...]] = set()
        self._ts_updaters: dict[tuple[str, str, str | None], Callable[[float], None]] = {}
        self._host_updaters: dict[str, Callable[[float], None]] = {}
        self._system = SystemSampler()
        for name, spec in BUILTIN_METRICS.items():
            if self._exported(name):
                self._family(name, spec)
        self.registry.register(FamiliesCollector(self._families_now))

    # -- frontend metrics ----------------------------------------------------------------

    def request_received(self, model: str, version: str | None) -> None:
        """An inference request arrived (counted before queueing, so also when refused)."""
        self._apply(self._ts_updater(REQUESTS_TOTAL, model, version), REQUESTS_TOTAL, 1.0)

    def request_finished(
        self, model: str, version: str | None, *, latency_us: float, queue_us: float
    ) -> None:
        """An inference request got its final response after ``latency_us`` in total."""
        queue_us = _non_negative(queue_us)
        latency = self._ts_updater(INFERENCE_LATENCY, model, version)
        self._apply(latency, INFERENCE_LATENCY, _non_negative(latency_us))
        self._apply(self._ts_updater(QUEUE_LATENCY, model, version), QUEUE_LATENCY, queue_us)
        self._apply(self._host_updater("QueueTime"), "QueueTime", queue_us / 1000.0)

    def http_status(self, status: int) -> None:
        """An HTTP response was sent (TorchServe's Requests2XX / 4XX / 5XX)."""
        if 200 <= status < 300:
            name = "Requests2XX"
        elif 400 <= status < 500:
            name = "Requests4XX"
        elif 500 <= status < 600:
            name = "Requests5XX"
        else:
            return  # TorchServe counts 1xx/3xx as 5XX; they are not server errors
        self._apply(self._host_updater(name), name, 1.0)

    def request_outcome(self, outcome: Outcome) -> None:
        """An inference request's response class was decided (by the dataplane, for every
        protocol): counted as Requests2XX / 4XX / 5XX."""
        name = OUTCOME_COUNTERS[outcome]
        self._apply(self._host_updater(name), name, 1.0)

    def add_gauge_source(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        read: Callable[[], Iterable[tuple[Sequence[str], float]]],
    ) -> None:
        """Export gauge ``name``, whose samples ``read()`` gives at each scrape (state the
        server keeps anyway, such as the open sequences of each stateful model)."""
        self.registry.register(GaugeSource(name, documentation, labelnames, read))

    def worker_loaded(self, worker_name: str, load_ms: float) -> None:
        """A worker (e.g. ``W-9000-resnet18_1.0``) loaded its model in ``load_ms``."""
        labels = {"WorkerName": worker_name, **self._host_labels()}
        self._builtin("WorkerLoadTime", labels, _non_negative(load_ms))

    def worker_thread_time(self, ms: float) -> None:
        """Time the frontend spent on a batch besides the model's own time."""
        self._builtin("WorkerThreadTime", self._host_labels(), _non_negative(ms))

    def sample_system(self) -> None:
        """Record host CPU, memory and disk use (TorchServe's system metrics)."""
        try:
            values = self._system.sample()
        except Exception:
            self._warn_once(("system",), "reading system metrics failed", exc_info=True)
            return
        labels = self._host_labels()
        for name, value in values.items():
            self._builtin(name, labels, value)

    # -- handler metrics -----------------------------------------------------------------

    def handler_metrics(self, model: str, version: str, metrics: list[dict[str, Any]]) -> None:
        """Apply the records of one METRICS frame from a worker of ``model``."""
        if not isinstance(metrics, list):
            self._warn_once(("frame", model), "model %s: METRICS frame without a list", model)
            return
        for record in metrics:
            try:
                self._handler_metric(model, version, record)
            except Exception:
                self._warn_once(
                    ("record", model, record_name(record)),
                    "model %s: metric %s dropped",
                    model,
                    record_name(record),
                    exc_info=True,
                )

    def _handler_metric(self, model: str, version: str, record: Any) -> None:
        if not isinstance(record, dict):
            self._warn_once(("record", model), "model %s: metric record is not an object", model)
            return
        name = record.get("name")
        kind = str(record.get("type", "")).lower()
        value = record.get("value")
        unit = record.get("unit")
        dimensions = record.get("dimensions") or {}
        request_id = record.get("request_id") or ""
        problem = record_problem(record)
        if problem is not None:
            self._warn_once(
                ("bad", model, str(name), problem),
                "model %s: metric %r dropped: %s",
                model,
                name,
                problem,
            )
            return
        assert isinstance(name, str) and isinstance(value, int | float)
        labels = {k: str(v) for k, v in dimensions.items()}
        labels.setdefault("Hostname", self.hostname)
        spec = MetricSpec(kind, str(unit) if unit else "unit", tuple(labels))  # type: ignore[arg-type]
        if not self._exported(name):
            self._log_metric(name, spec, labels, float(value), kind.upper(), str(request_id))
            return
        family = self._family(name, spec, model=model)
        if family is not None:
            family.update(labels, float(value))

    # -- exposition ----------------------------------------------------------------------

    def exposition(self, names: list[str] | None = None) -> bytes:
        """The ``/metrics`` body: Prometheus text format 0.0.4, only ``names`` when given."""
        if self.mode == "log":
            return b""
        if names:
            return generate_latest(Filtered(self.registry, frozenset(names)))
        return generate_latest(self.registry)

    # -- internals -----------------------------------------------------------------------

    def _exported(self, name: str) -> bool:
        if self.mode == "prometheus":
            return True
        return self.mode == "legacy" and name in LEGACY_METRICS

    def _ts_labels(self, model: str, version: str | None) -> dict[str, str]:
        return {
            "model_name": model,
            "model_version": version or DEFAULT_VERSION,
            "hostname": self.hostname,
        }

    def _host_labels(self) -> dict[str, str]:
        return {"Level": HOST_LEVEL, "Hostname": self.hostname}

    # Every inference request updates five builtin metrics: their updaters are resolved once
    # per label set and keep the value in a tally until the next scrape (families.Tally; a
    # metric never updated is not exported).

    def _ts_updater(self, name: str, model: str, version: str | None) -> Callable[[float], None]:
        key = (name, model, version)
        update = self._ts_updaters.get(key)
        if update is None:
            update = self._updater(name, self._ts_labels(model, version))
            if len(self._ts_updaters) < MAX_UPDATERS:
                self._ts_updaters[key] = update
        return update

    def _host_updater(self, name: str) -> Callable[[float], None]:
        update = self._host_updaters.get(name)
        if update is None:
            update = self._host_updaters[name] = self._updater(name, self._host_labels())
        return update

    def _apply(self, update: Callable[[float], None], name: str, value: float) -> None:
        try:
            update(value)
        except Exception:
            self._warn_once(("builtin", name), "updating metric %s failed", name, exc_info=True)

    def _updater(self, name: str, labels: dict[str, str]) -> Callable[[float], None]:
        """What ``_builtin(name, labels, value)`` does, as a function of ``value``."""
        spec = BUILTIN_METRICS[name]
        if not self._exported(name):
            return partial(self._log_metric, name, spec, labels)
        family = self._families.get(name)
        if family is None:
            return ignore_update
        return family.tally(labels)

    def _families_now(self) -> list[Family]:
        with self._lock:
            return list(self._families.values())

    def _builtin(self, name: str, labels: dict[str, str], value: float) -> None:
        spec = BUILTIN_METRICS[name]
        try:
            if not self._exported(name):
                self._log_metric(name, spec, labels, value)
                return
            family = self._families.get(name)
            if family is not None:
                family.update(labels, value)
        except Exception:
            self._warn_once(("builtin", name), "updating metric %s failed", name, exc_info=True)

    def _family(self, name: str, spec: MetricSpec, *, model: str | None = None) -> Family | None:
        """The metric ``name`` as ``spec`` describes it, created on first use; None if it
        cannot be (a clash with an existing metric, an invalid name): logged once."""
        problem: str | None
        with self._lock:
            family = self._families.get(name)
            if family is not None:
                if family.spec.kind == spec.kind and set(family.spec.labels) == set(spec.labels):
                    return family
                problem = (
                    f"it is already a {family.spec.kind} with labels {list(family.spec.labels)}"
                )
            else:
                problem = self._cannot_create(name, spec)
                if problem is None:
                    try:
                        family = self._create(name, spec)
                    except ValueError as error:
                        problem = str(error)
                    else:
                        return family
        self._warn_once(
            ("clash", name, spec.kind, *sorted(spec.labels)),
            "%smetric %r (%s with labels %s) dropped: %s",
            f"model {model}: " if model is not None else "",
            name,
            spec.kind,
            list(spec.labels),
            problem,
        )
        return None

    def _cannot_create(self, name: str, spec: MetricSpec) -> str | None:
        if not _METRIC_NAME.fullmatch(name):
            return "the name is not a valid Prometheus metric name"
        bad = [n for n in spec.labels if not _LABEL_NAME.fullmatch(n) or n.startswith("__")]
        if bad:
            return f"dimension names {bad} are not valid Prometheus label names"
        if spec.kind == "histogram" and "le" in spec.labels:
            return "a histogram cannot have a dimension named 'le'"
        clash = sorted(n for n in exposed_names(name, spec.kind) if n in self._owners)
        if clash:
            return f"its exposed names {clash} are used by metric {self._owners[clash[0]]!r}"
        if name not in BUILTIN_METRICS and self._handler_families >= MAX_HANDLER_FAMILIES:
            return f"the server already has {MAX_HANDLER_FAMILIES} handler metrics"
        return None

    def _create(self, name: str, spec: MetricSpec) -> Family:
        documentation = help_text(spec.kind, spec.unit)
        metric: Counter | Gauge | Histogram
        if spec.kind == "counter":
            metric = Counter(name, documentation, spec.labels, registry=None)
        elif spec.kind == "gauge":
            metric = Gauge(name, documentation, spec.labels, registry=None)
        else:
            metric = Histogram(name, documentation, spec.labels, registry=None)
        family = Family(name, spec, metric)
        self._families[name] = family
        for exposed in exposed_names(name, spec.kind):
            self._owners[exposed] = name
        if name not in BUILTIN_METRICS:
            self._handler_families += 1
        return family

    def _log_metric(
        self,
        name: str,
        spec: MetricSpec,
        labels: Mapping[str, str],
        value: float,
        handler_type: str | None = None,
        request_id: str = "",
    ) -> None:
        dims = ",".join(f"{k}:{v}" for k, v in labels.items() if k.lower() != "hostname")
        hostname = labels.get("Hostname", labels.get("hostname", self.hostname))
        kind = f"|#type:{handler_type}" if handler_type is not None else ""
        tail = f",{request_id}" if handler_type is not None else ""
        log.info(
            "%s.%s:%s|#%s%s|#hostname:%s,%d%s",
            name,
            spec.unit,
            value,
            dims,
            kind,
            hostname,
            int(time.time()),
            tail,
        )

    def _warn_once(
        self, key: tuple[str, ...], message: str, *args: Any, exc_info: bool = False
    ) -> None:
        with self._lock:
            if key in self._warned or len(self._warned) >= MAX_WARNINGS:
                return
            self._warned.add(key)
        log.warning(message, *args, exc_info=exc_info)


def _non_negative(value: float) -> float:
    """``value`` as a float, or 0.0 for anything negative, infinite or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number > 0 and math.isfinite(number) else 0.0
