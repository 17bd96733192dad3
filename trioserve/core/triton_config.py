"""A model's configuration as Triton's model configuration extension shows it (sans-IO).

Triton's client tools (``perf_analyzer``, ``model_analyzer``, tritonclient's
``get_model_config``) read ``GET /v2/models/{m}/config`` (or the ``ModelConfig`` rpc) before
anything else. trioserve has no ``config.pbtxt``: the answer is derived from what the model
declares and how it is served (docs/triton.md):

- ``input`` / ``output``: the declared tensors (model-config ``tensorInputs``, or an MLServer
  model's ``inputs`` / ``outputs``), each ``data_type`` Triton's name of its OIP datatype
  (``FP32`` -> ``TYPE_FP32``, ``BYTES`` -> ``TYPE_STRING``) and ``dims`` its shape (-1: the
  dimension varies);
- ``max_batch_size``: > 0 only where the server merges requests along their first dimension
  (an MLServer model with adaptive batching); ``dims`` then leave that dimension out, as
  Triton's rule is. A TorchServe model's request tensors never hold the batch dimension (the
  server stacks requests into a new one), so its ``max_batch_size`` is 0 and ``dims`` are
  the whole request shape, even with ``batchSize`` > 1;
- ``dynamic_batching``: requests of several clients may be batched together (a TorchServe
  model's ``batchSize`` > 1, an MLServer model's adaptive batching), with the batch window
  as ``max_queue_delay_microseconds``; ``sequence_batching`` for a stateful model;
- ``model_transaction_policy.decoupled``: how many answers a request gets is the model's
  (decided from its settings by :func:`trioserve.runtime.triton.batching_of`).

:class:`TritonConfig` is protocol-neutral; :meth:`TritonConfig.json` is the REST answer, the
gRPC adapter builds its message from the same value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from trioserve.core.oip.raw import TensorMeta

# OIP datatype -> Triton's DataType name (model_config.proto); BYTES is TYPE_STRING.
TRITON_TYPES: Final = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
    "BF16": "TYPE_BF16",
}
INVALID_TYPE: Final = "TYPE_INVALID"


def triton_type(datatype: str) -> str:
    """Triton's ``DataType`` name of an OIP datatype (``TYPE_INVALID`` if it has none)."""
    return TRITON_TYPES.get(datatype.upper(), INVALID_TYPE)


@dataclass(frozen=True, slots=True)
class TritonTensor:
    """One ``input`` or ``output`` entry."""

    name: str
    data_type: str  # TYPE_FP32, ...
    dims: tuple[int, ...]  # -1: varies; the batch dimension left out when max_batch_size > 0


@dataclass(frozen=True, slots=True)
class Batching:
    """How a model is served, as far as its Triton configuration tells.

    ``merges_first_dim``: requests are merged along their first dimension (MLServer's
    adaptive batching), so that dimension is Triton's batch dimension; ``batch_size``: the
    most requests one batch holds; ``window_us``: how long a batch waits to fill, in
    microseconds; ``sequence_idle_us``: set for a stateful model (0: no idle limit)."""

    batch_size: int = 1
    window_us: int = 0
    merges_first_dim: bool = False
    sequence_idle_us: int | None = None
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class TritonConfig:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]
    dynamic_batching_delay_us: int | None  # None: no dynamic_batching
    sequence_idle_us: int | None  # None: no sequence_batching
    decoupled: bool

    def json(self) -> dict[str, Any]:
        """The REST answer: Triton's JSON form (proto field names, enum names, numbers)."""
        body: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "backend": self.backend,
            "max_batch_size": self.max_batch_size,
            "input": [_tensor_json(t) for t in self.inputs],
            "output": [_tensor_json(t) for t in self.outputs],
            "model_transaction_policy": {"decoupled": self.decoupled},
        }
        if self.dynamic_batching_delay_us is not None:
            body["dynamic_batching"] = {
                "max_queue_delay_microseconds": self.dynamic_batching_delay_us
            }
        if self.sequence_idle_us is not None:
            body["sequence_batching"] = {"max_sequence_idle_microseconds": self.sequence_idle_us}
        return body


def _tensor_json(tensor: TritonTensor) -> dict[str, Any]:
    return {"name": tensor.name, "data_type": tensor.data_type, "dims": list(tensor.dims)}


def _tensors(metas: Sequence[TensorMeta], batched: bool) -> tuple[TritonTensor, ...]:
    return tuple(
        TritonTensor(
            meta.name, triton_type(meta.datatype), tuple(meta.shape[1:] if batched else meta.shape)
        )
        for meta in metas
    )


def triton_config(
    *,
    name: str,
    platform: str,
    backend: str,
    inputs: Sequence[TensorMeta],
    outputs: Sequence[TensorMeta],
    batching: Batching,
) -> TritonConfig:
    """The configuration of a model declaring ``inputs`` / ``outputs`` (their OIP metadata,
    as ``GET /v2/models/{m}`` shows them) and served as ``batching`` says."""
    merged = batching.merges_first_dim and batching.batch_size > 1
    stateful = batching.sequence_idle_us is not None
    return TritonConfig(
        name=name,
        platform=platform,
        backend=backend,
        max_batch_size=batching.batch_size if merged else 0,
        inputs=_tensors(inputs, merged),
        outputs=_tensors(outputs, merged),
        # Triton's scheduling_choice is one of them: a stateful model shows its sequences.
        dynamic_batching_delay_us=(
            batching.window_us if batching.batch_size > 1 and not stateful else None
        ),
        sequence_idle_us=batching.sequence_idle_us,
        decoupled=batching.decoupled,
    )


__all__ = [
    "INVALID_TYPE",
    "TRITON_TYPES",
    "Batching",
    "TritonConfig",
    "TritonTensor",
    "triton_config",
    "triton_type",
]
