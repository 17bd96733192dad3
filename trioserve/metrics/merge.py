"""The server's totals from the metrics of several serving processes (sans-IO).

With several serving processes each keeps its own :class:`~.registry.ServerMetrics`; the
metrics API (port 8082, served by the control process) shows their merge. Each process gives
its unfiltered exposition (``ServerMetrics.exposition()``, Prometheus text format 0.0.4);
:func:`merge_expositions` reads them with prometheus_client's parser and writes one exposition
back with prometheus_client's ``generate_latest``, the same way a single process writes its
page:

* the families in order of first appearance (the first input's order, then what later
  inputs add), each with the HELP and TYPE of its first appearance;
* within a family, the samples in order of first appearance, one per sample name and label
  set, whose value is the **sum** of that sample's values over the inputs that have it.

What is summed is exactly what trioserve exposes -- counters, gauges and histograms:

* counters (``*_total``) and histograms (``_bucket``, ``_count``, ``_sum``; every process
  uses prometheus_client's default buckets for a handler histogram) become the server's
  totals, what one registry that saw every update would show;
* a gauge becomes the sum of each process's current value. For a gauge of an amount (the
  open sequences of a model) that is the server's amount. For a gauge that holds a last
  value (``QueueTime``, ``WorkerThreadTime``, a handler's ``HandlerTime``) set by more than
  one process, it is the sum of their last values, not the server's last value. A gauge
  that one process alone sets -- the system metrics (CPU, memory, disk), which only the
  control process samples -- is that process's value, unchanged.

A family only one input has passes through unchanged. Sums are computed with
:func:`math.fsum`, so they are correctly rounded and do not depend on the order of the
inputs. Samples keep no timestamps (trioserve's have none).

Families of other types (summary, info...; trioserve has none) are not summed: the first
input's family is kept. A family whose name comes back with another type, or whose names
clash with a family already merged, is left out rather than make the page invalid; so is an
input that cannot be read as a whole (logged). An empty input (``metrics_mode=log``) adds
nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from trioserve.metrics.families import answers_to, family_names

__all__ = ["SUMMED_TYPES", "merge_expositions", "merge_families", "read_exposition"]

log = logging.getLogger("trioserve.metrics")

# The metric types whose samples are summed: those trioserve exposes.
SUMMED_TYPES: Final = frozenset({"counter", "gauge", "histogram"})

_SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def read_exposition(text: bytes) -> list[Metric]:
    """The metric families of one exposition; ValueError if it cannot be read."""
    try:
        return list(text_string_to_metric_families(text.decode()))
    except Exception as error:  # the parser raises what it meets (ValueError, IndexError...)
        raise ValueError(f"unreadable exposition: {error!r}") from error


def merge_expositions(expositions: Iterable[bytes], names: Collection[str] | None = None) -> bytes:
    """One exposition of the samples of ``expositions``, summed (see the module's doc); only
    the families that answer to one of ``names`` when given (TorchServe's ``?name[]=``)."""
    inputs: list[list[Metric]] = []
    for number, text in enumerate(expositions):
        try:
            inputs.append(read_exposition(text))
        except ValueError as error:
            log.warning("exposition %d left out of the merged metrics: %s", number, error)
    merged = merge_families(inputs)
    if names:
        wanted = frozenset(names)
        merged = [metric for metric in merged if answers_to(metric, wanted)]
    return generate_latest(_Collected(merged))


def merge_families(inputs: Iterable[Iterable[Metric]]) -> list[Metric]:
    """The metric families of ``inputs`` (each as prometheus_client's parser gives them),
    merged as the module's doc says."""
    merged: dict[str, _Merging] = {}
    owners: dict[str, str] = {}  # exposed name -> the family that uses it
    for families in inputs:
        for metric in families:
            merging = merged.get(metric.name)
            if merging is None:
                names = family_names(metric)
                if any(name in owners for name in names):
                    continue  # its names are another family's
                merging = merged[metric.name] = _Merging(metric)
                owners.update(dict.fromkeys(names, metric.name))
            elif merging.first.type != metric.type:
                continue  # the same name with another type: the first one stands
            elif merging.first.type not in SUMMED_TYPES:
                continue  # not summed: the first input's family stands
            merging.add(metric)
    return [merging.result() for merging in merged.values()]


@dataclass
class _Merging:
    """One family being merged: its first appearance and each sample's values so far."""

    first: Metric
    values: dict[_SampleKey, list[float]] = field(default_factory=dict)
    labels: dict[_SampleKey, dict[str, str]] = field(default_factory=dict)

    def add(self, metric: Metric) -> None:
        for sample in metric.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            values = self.values.get(key)
            if values is None:
                values = self.values[key] = []
                self.labels[key] = sample.labels
            values.append(float(sample.value))

    def result(self) -> Metric:
        metric = Metric(self.first.name, self.first.documentation, self.first.type)
        for key, values in self.values.items():
            metric.add_sample(key[0], self.labels[key], _sum(values))
        return metric


def _sum(values: Sequence[float]) -> float:
    """The correctly rounded sum (the same in any order); a plain sum where an infinity or an
    overflow makes :func:`math.fsum` give up."""
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return sum(values)


class _Collected:
    """Metric families already collected, as ``generate_latest`` takes them."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics
