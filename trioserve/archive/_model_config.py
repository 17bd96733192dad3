"""``model-config.yaml``: per-model frontend settings (spec §6.3).

The file is read with ``yaml.safe_load`` only. A key whose value has the wrong YAML type
(an integer key given ``"4"``, ``4.0`` or ``true``; a boolean key given ``1`` or ``"yes"``)
is ignored with a warning naming the key and the value, as TorchServe does. Negative
numbers are ignored the same way: every numeric key here is a count, size or duration.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from ._errors import ArchiveError

_log = logging.getLogger(__name__)

# YAML key -> ModelConfig field
_INT_KEYS: Final = {
    "minWorkers": "min_workers",
    "maxWorkers": "max_workers",
    "batchSize": "batch_size",
    "maxBatchDelay": "max_batch_delay",
    "responseTimeout": "response_timeout",
    "startupTimeout": "startup_timeout",
    "jobQueueSize": "job_queue_size",
    "maxRetryTimeoutInSec": "max_retry_timeout_in_sec",
    "clientTimeoutInMills": "client_timeout_in_mills",
    "parallelLevel": "parallel_level",
    "sequenceMaxIdleMSec": "sequence_max_idle_msec",
    "sequenceTimeoutMSec": "sequence_timeout_msec",
    "maxSequenceJobQueueSize": "max_sequence_job_queue_size",
    "maxNumSequence": "max_num_sequence",
}
_BOOL_KEYS: Final = {
    "useJobTicket": "use_job_ticket",
    "sequenceBatching": "sequence_batching",
    "continuousBatching": "continuous_batching",
    "asyncCommunication": "async_communication",
    "useVenv": "use_venv",
}
_CHOICE_KEYS: Final = {
    "deviceType": ("device_type", ("cpu", "gpu")),
    "parallelType": ("parallel_type", ("pp", "tp", "pptp", "custom")),
}


@dataclass(frozen=True)
class ModelConfig:
    """The frontend keys of model-config.yaml; ``None`` means the key is not set.

    Durations keep the file's units: ``max_batch_delay`` and the ``*_msec`` / ``*_mills``
    fields in milliseconds, ``response_timeout``, ``startup_timeout`` and
    ``max_retry_timeout_in_sec`` in seconds. ``raw`` is the whole YAML mapping, unknown keys
    included; handlers see it as ``context.model_yaml_config``.
    """

    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    job_queue_size: int | None = None
    max_retry_timeout_in_sec: int | None = None
    client_timeout_in_mills: int | None = None
    device_type: str | None = None
    device_ids: tuple[int, ...] | None = None
    parallel_type: str | None = None
    parallel_level: int | None = None
    use_job_ticket: bool | None = None
    sequence_batching: bool | None = None
    sequence_max_idle_msec: int | None = None
    sequence_timeout_msec: int | None = None
    max_sequence_job_queue_size: int | None = None
    max_num_sequence: int | None = None
    continuous_batching: bool | None = None
    async_communication: bool | None = None
    use_venv: bool | None = None
    raw: dict[str, Any] = field(default_factory=dict, hash=False)


def _is_count(value: object) -> bool:
    # bool is a subclass of int in Python, but `true` is not a YAML integer.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ignore(key: str, value: object, expected: str) -> None:
    _log.warning("model-config.yaml: ignoring %s=%r: expected %s", key, value, expected)


def parse_model_config(text: str | bytes) -> ModelConfig:
    """Parse model-config.yaml. Raises :class:`ArchiveError` (400) unless it is a mapping.

    An empty document is an empty mapping.
    """
    try:
        raw = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise ArchiveError(400, f"model-config.yaml is not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ArchiveError(
            400, f"model-config.yaml must be a mapping of keys to values, got {type(raw).__name__}"
        )

    values: dict[str, Any] = {}
    for key, name in _INT_KEYS.items():
        if key in raw:
            if _is_count(raw[key]):
                values[name] = raw[key]
            else:
                _ignore(key, raw[key], "a non-negative YAML integer")
    for key, name in _BOOL_KEYS.items():
        if key in raw:
            if isinstance(raw[key], bool):
                values[name] = raw[key]
            else:
                _ignore(key, raw[key], "a YAML boolean (true or false)")
    for key, (name, choices) in _CHOICE_KEYS.items():
        if key in raw:
            value = raw[key]
            if isinstance(value, str) and value.lower() in choices:
                values[name] = value.lower()
            else:
                _ignore(key, value, "one of " + ", ".join(choices))
    if "deviceIds" in raw:
        ids = raw["deviceIds"]
        if isinstance(ids, list) and all(_is_count(i) for i in ids):
            values["device_ids"] = tuple(ids)
        else:
            _ignore("deviceIds", ids, "a list of non-negative YAML integers")
    if "parallel_level" not in values and isinstance(raw.get("torchrun"), dict):
        # torchrun's process count per node doubles as the parallel level.
        nproc = raw["torchrun"].get("nproc-per-node")
        if _is_count(nproc):
            values["parallel_level"] = nproc
        elif nproc is not None:
            _ignore("torchrun.nproc-per-node", nproc, "a non-negative YAML integer")

    return ModelConfig(**values, raw=raw)
