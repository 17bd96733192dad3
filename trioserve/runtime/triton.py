"""Triton's model configuration and statistics extensions, for every adapter (REST, gRPC).

:func:`model_config` derives a model version's :class:`~trioserve.core.triton_config.TritonConfig`
from its declared tensors (:func:`trioserve.runtime.oip.model_metadata`) and its settings;
:func:`model_statistics` lists the counters of the model versions asked for
(:class:`~trioserve.core.model_stats.ModelStats`, kept by this process's dataplane and
workers). The adapters only encode them.

A model's ``decoupled`` flag: a TorchServe model with ``continuousBatching`` answers in a
stream (its settings say so); an MLServer model is decoupled when its runtime overrides
``predict_stream`` (its worker says so when it loads: ``ModelVersion.streams``), and until a
worker has loaded it, it is taken as decoupled (it may be); any other model answers each
request once (a TorchServe handler that sends intermediate replies is not known to:
docs/triton.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from trioserve.core.model_stats import ModelStats
from trioserve.core.triton_config import Batching, TritonConfig, triton_config
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.model import ModelVersion
from trioserve.runtime.oip import model_metadata

TORCHSERVE_BACKEND = "torchserve"
MLSERVER_BACKEND = "mlserver"


def batching_of(model: ModelVersion) -> Batching:
    """How ``model`` is served, in the terms of Triton's configuration."""
    declared = model.mlserver
    if declared is not None:
        adaptive = declared.adaptive_batching
        return Batching(
            batch_size=declared.max_batch_size if adaptive else 1,
            window_us=round(declared.max_batch_time * 1e6) if adaptive else 0,
            merges_first_dim=adaptive,
            decoupled=model.streams is not False,
        )
    settings = model.settings
    sequence = settings.sequence
    return Batching(
        batch_size=settings.batch_size,
        window_us=settings.max_batch_delay * 1000,
        sequence_idle_us=None if sequence is None else sequence.max_idle_msec * 1000,
        decoupled=settings.continuous_batching,
    )


def model_config(dataplane: Dataplane, model: ModelVersion) -> TritonConfig:
    """The Triton configuration of ``model`` (inputs and outputs as its metadata's)."""
    meta = model_metadata(dataplane, model)
    return triton_config(
        name=model.name,
        platform=meta.platform,
        backend=MLSERVER_BACKEND if model.mlserver is not None else TORCHSERVE_BACKEND,
        inputs=meta.inputs,
        outputs=meta.outputs,
        batching=batching_of(model),
    )


@dataclass(frozen=True, slots=True)
class VersionStats:
    name: str
    version: str
    stats: ModelStats


def model_statistics(
    dataplane: Dataplane, name: str | None = None, version: str | None = None
) -> list[VersionStats]:
    """The statistics of every model version (no ``name``), of every version of ``name``
    (no ``version``), or of the one version asked for (NOT_FOUND if there is none)."""
    if name is None:
        return [VersionStats(n, v, model.stats) for n, v, model in dataplane.registered()]
    if version is None:
        return [
            VersionStats(name, v, dataplane.model(name, v).stats) for v in dataplane.versions(name)
        ]
    model = dataplane.model(name, version)
    return [VersionStats(model.name, model.version, model.stats)]


__all__ = [
    "MLSERVER_BACKEND",
    "TORCHSERVE_BACKEND",
    "VersionStats",
    "batching_of",
    "model_config",
    "model_statistics",
]
