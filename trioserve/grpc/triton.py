"""Triton's model configuration and statistics extensions on ``inference.GRPCInferenceService``:
the ``ModelConfig`` and ``ModelStatistics`` rpcs (:class:`TritonExtensionRpcs`, part of
:class:`trioserve.grpc.oip.OipRpcs`) and their messages (``ModelConfigResponse``,
``ModelStatisticsResponse``, with Triton's field numbers: proto/grpc_predict_v2.proto), built
from the protocol-neutral values of :mod:`trioserve.runtime.triton`."""

from __future__ import annotations

from collections.abc import Sequence

from trioserve._proto.inference import (
    DataType,
    InferBatchStatistics,
    InferStatistics,
    ModelConfig,
    ModelConfigRequest,
    ModelConfigResponse,
    ModelDynamicBatching,
    ModelInput,
    ModelOutput,
    ModelSequenceBatching,
    ModelStatistics,
    ModelStatisticsRequest,
    ModelStatisticsResponse,
    ModelTransactionPolicy,
    StatisticDuration,
)
from trioserve.core.model_stats import Duration, ModelStats
from trioserve.core.triton_config import TritonConfig
from trioserve.grpc.calls import RpcContext
from trioserve.runtime import triton
from trioserve.runtime.dataplane import Dataplane
from trioserve.runtime.triton import VersionStats


class TritonExtensionRpcs:
    """The two rpcs, answered from the dataplane's models."""

    def __init__(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

    async def model_config(
        self, request: ModelConfigRequest, _context: RpcContext
    ) -> ModelConfigResponse:
        """Triton's model configuration extension."""
        model = self._dataplane.model(request.name, request.version or None)
        return config_response(triton.model_config(self._dataplane, model))

    async def model_statistics(
        self, request: ModelStatisticsRequest, _context: RpcContext
    ) -> ModelStatisticsResponse:
        """Triton's statistics extension: every model version when no name is given."""
        entries = triton.model_statistics(
            self._dataplane, request.name or None, request.version or None
        )
        return statistics_response(entries)


def config_response(config: TritonConfig) -> ModelConfigResponse:
    return ModelConfigResponse(
        config=ModelConfig(
            name=config.name,
            platform=config.platform,
            backend=config.backend,
            max_batch_size=config.max_batch_size,
            input=[
                ModelInput(name=t.name, data_type=DataType[t.data_type], dims=list(t.dims))
                for t in config.inputs
            ],
            output=[
                ModelOutput(name=t.name, data_type=DataType[t.data_type], dims=list(t.dims))
                for t in config.outputs
            ],
            dynamic_batching=(
                None
                if config.dynamic_batching_delay_us is None
                else ModelDynamicBatching(
                    max_queue_delay_microseconds=config.dynamic_batching_delay_us
                )
            ),
            sequence_batching=(
                None
                if config.sequence_idle_us is None
                else ModelSequenceBatching(max_sequence_idle_microseconds=config.sequence_idle_us)
            ),
            model_transaction_policy=ModelTransactionPolicy(decoupled=config.decoupled),
        )
    )


def _duration(duration: Duration) -> StatisticDuration:
    return StatisticDuration(count=duration.count, ns=duration.ns)


def statistics_message(name: str, version: str, stats: ModelStats) -> ModelStatistics:
    zero = Duration()
    return ModelStatistics(
        name=name,
        version=version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=StatisticDuration(count=stats.compute_infer.count, ns=0),
            compute_infer=_duration(stats.compute_infer),
            compute_output=StatisticDuration(count=stats.compute_infer.count, ns=0),
            cache_hit=_duration(zero),
            cache_miss=_duration(zero),
        ),
        batch_stats=[
            InferBatchStatistics(
                batch_size=size,
                compute_input=StatisticDuration(count=stats.batches[size].count, ns=0),
                compute_infer=_duration(stats.batches[size]),
                compute_output=StatisticDuration(count=stats.batches[size].count, ns=0),
            )
            for size in sorted(stats.batches)
        ],
    )


def statistics_response(entries: Sequence[VersionStats]) -> ModelStatisticsResponse:
    return ModelStatisticsResponse(
        model_stats=[statistics_message(e.name, e.version, e.stats) for e in entries]
    )


__all__ = ["TritonExtensionRpcs", "config_response", "statistics_message", "statistics_response"]
