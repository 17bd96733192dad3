"""The handler's metrics cache (``context.metrics``), with TorchServe's method signatures.

TorchServe prints each metric as a ``[METRICS]`` log line the moment it is recorded. Here the
cache keeps the records and the worker sends them to the server in one METRICS frame after
each batch (:meth:`MetricsCache.drain`). A record is::

    {"name": "HandlerTime", "unit": "Milliseconds", "value": 1.5, "type": "GAUGE",
     "dimensions": {"ModelName": "m", "Level": "Model"}, "request_id": "<id>[,<id>...]"}

Units are spelled the way TorchServe reports them (``ms`` -> ``Milliseconds``); unknown
units pass through unchanged.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any

log = logging.getLogger("trioserve.worker")

UNIT_NAMES: dict[str, str] = {
    "ms": "Milliseconds",
    "s": "Seconds",
    "percent": "Percent",
    "count": "Count",
    "MB": "Megabytes",
    "GB": "Gigabytes",
    "kB": "Kilobytes",
    "B": "Bytes",
    "": "unit",
}


class MetricTypes(enum.Enum):
    """The kinds of metric (``ts.metrics.metric_type_enum.MetricTypes``)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class MetricsCacheKeyError(KeyError):
    """``get_metric`` was asked for a metric that was never added."""


class MetricsCacheTypeError(TypeError):
    """A metric argument has the wrong type."""


class MetricsCacheValueError(ValueError):
    """A metric argument has a value the metric does not accept."""


class Dimension:
    """One ``name: value`` label of a metric (``ts.metrics.dimension.Dimension``)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"

    def __repr__(self) -> str:
        return f"Dimension({self.name!r}, {self.value!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"Name": self.name, "Value": self.value}


def _type_of(metric_type: MetricTypes | str) -> MetricTypes:
    if isinstance(metric_type, MetricTypes):
        return metric_type
    try:
        return MetricTypes(str(metric_type).lower())
    except ValueError:
        raise MetricsCacheValueError(
            f"metric type must be one of counter, gauge, histogram; got {metric_type!r}"
        ) from None


def _record(
    cache: MetricsCache,
    name: str,
    unit: str,
    metric_type: MetricTypes,
    dimension_names: list[str],
    values: list[Any],
    value: float,
    request_id: str | None,
) -> None:
    """Check one update of metric ``name`` and hand its record to ``cache`` (bad input is
    logged, not raised). ``unit`` is already spelled the TorchServe way."""
    if len(values) != len(dimension_names):
        log.error(
            "metric %s not recorded: dimension values %r do not match dimension names %r",
            name,
            values,
            dimension_names,
        )
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        log.error("metric %s not recorded: value %r is not a number", name, value)
        return
    if metric_type is MetricTypes.COUNTER and value < 0:
        log.error("metric %s not recorded: a counter cannot decrease", name)
        return
    cache.record(
        {
            "name": name,
            "unit": unit,
            "value": value,
            "type": metric_type.name,
            "dimensions": {n: str(v) for n, v in zip(dimension_names, values, strict=True)},
            "request_id": request_id or "",
        }
    )


class CachedMetric:
    """A named metric with fixed dimension names; each update becomes one record."""

    def __init__(
        self,
        cache: MetricsCache,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        self._cache = cache
        self.metric_name = metric_name
        self.unit = UNIT_NAMES.get(unit, unit)
        self.dimension_names = list(dimension_names or [])
        self.metric_type = metric_type

    def add_or_update(
        self,
        value: float,
        dimension_values: list[Any] | None = None,
        request_id: str | None = "",
    ) -> None:
        """Record ``value`` with one value per dimension name. Bad input is logged, not raised."""
        _record(
            self._cache,
            self.metric_name,
            self.unit,
            self.metric_type,
            self.dimension_names,
            list(dimension_values or []),
            value,
            request_id,
        )

    def update(
        self,
        value: float,
        request_id: str | None = "",
        dimensions: list[Dimension] | None = None,
    ) -> None:
        """Older API: record with these Dimension objects (they replace the dimension names)."""
        dims = list(dimensions or [])
        self.dimension_names = [d.name for d in dims]
        self.add_or_update(value, [d.value for d in dims], request_id)


class MetricsCache:
    """``context.metrics``: create metrics, record values, hand the records to the worker."""

    def __init__(self, model_name: str | None = None) -> None:
        self.model_name = model_name
        self.request_ids: dict[int, str] | None = None
        self.cache: dict[tuple[MetricTypes, str], CachedMetric] = {}
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    # -- worker side -------------------------------------------------------------------------

    def set_request_ids(self, request_ids: dict[int, str] | None) -> None:
        self.request_ids = request_ids

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._records.append(entry)

    def drain(self) -> list[dict[str, Any]]:
        """Every record since the last drain; the cache of records is emptied."""
        with self._lock:
            records, self._records = self._records, []
        return records

    # -- handler API: defining and looking up metrics ---------------------------------------

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> CachedMetric:
        """Define (or redefine) a metric and return it."""
        if not isinstance(metric_name, str) or not isinstance(unit, str):
            raise MetricsCacheTypeError("metric_name and unit must be strings")
        kind = _type_of(metric_type)
        metric = CachedMetric(self, metric_name, unit, dimension_names, kind)
        self.cache[(kind, metric_name)] = metric
        return metric

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes | str = MetricTypes.COUNTER
    ) -> CachedMetric:
        kind = _type_of(metric_type)
        try:
            return self.cache[(kind, metric_name)]
        except KeyError:
            raise MetricsCacheKeyError(
                f"metric {metric_name!r} of type {kind.value} is not in the cache; "
                "define it with add_metric_to_cache first"
            ) from None

    # -- handler API: one-call recording ------------------------------------------------------

    def _request_id(self, idx: Any) -> str | None:
        """The request id for batch index ``idx``; all of the batch's ids when idx is None,
        each once (the rows of one request, its v1 instances or OIP inputs, share its id: a
        request of 100,000 rows must not make a metric record of 100,000 ids)."""
        ids = self.request_ids
        if ids is not None and idx is not None and idx in ids:
            return ids[idx]
        if isinstance(idx, str):
            return idx
        if ids is None:
            return None
        return ",".join(dict.fromkeys(ids.values()))

    def _dimensions(self, request_id: str | None, dimensions: list[Dimension] | None) -> list[Any]:
        dims = list(dimensions or [])
        names = {d.name for d in dims}
        if request_id is None:
            if "Level" not in names:
                dims.append(Dimension("Level", "Error"))
            return dims
        if "ModelName" not in names:
            dims.append(Dimension("ModelName", self.model_name))
        if "Level" not in names:
            dims.append(Dimension("Level", "Model"))
        return dims

    def _emit(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any,
        dimensions: list[Dimension] | None,
        metric_type: MetricTypes | str,
    ) -> None:
        request_id = self._request_id(idx)
        kind = _type_of(metric_type)
        names: list[str]
        values: list[Any]
        if dimensions is None:  # the usual call: the default dimensions, without objects
            if request_id is None:
                names, values = ["Level"], ["Error"]
            else:
                names, values = ["ModelName", "Level"], [self.model_name, "Model"]
        else:
            dims = self._dimensions(request_id, dimensions)
            names, values = [d.name for d in dims], [d.value for d in dims]
        if (kind, name) not in self.cache:
            self.cache[(kind, name)] = CachedMetric(self, name, unit, names, kind)
        _record(self, name, UNIT_NAMES.get(unit, unit), kind, names, values, value, request_id)

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> None:
        self._emit(name, value, unit, idx, dimensions, metric_type)

    def add_counter(
        self,
        name: str,
        value: float,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
    ) -> None:
        self._emit(name, value, "count", idx, dimensions, MetricTypes.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "ms",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("ms", "s"):
            raise MetricsCacheValueError("the unit of a time metric must be 'ms' or 's'")
        self._emit(name, value, unit, idx, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "MB",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("MB", "kB", "GB", "B"):
            raise MetricsCacheValueError(
                "the unit of a size metric must be 'MB', 'kB', 'GB' or 'B'"
            )
        self._emit(name, value, unit, idx, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        self._emit(name, value, "percent", idx, dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: list[Dimension] | None = None) -> None:
        request_id = None
        dims = self._dimensions(request_id, dimensions)
        metric = CachedMetric(self, name, "", [d.name for d in dims], MetricTypes.COUNTER)
        metric.add_or_update(value, [d.value for d in dims], request_id)


# The names TorchServe's own modules use for these classes (``ts.metrics.*``).
CachingMetric = CachedMetric
MetricCacheAbstract = MetricsCache
