"""How a model version's settings are decided (sans-IO).

Sources, from strongest to weakest, follow TorchServe (spec §3.1, §6.3):

- ``responseTimeout`` / ``startupTimeout`` in the archive's model-config.yaml win over the
  register API's values, which win over the server defaults;
- ``batchSize`` / ``maxBatchDelay``: register API, then model-config.yaml, then the
  ``models`` server setting, then 1 / 100 ms;
- workers: model-config.yaml ``minWorkers``/``maxWorkers`` when valid (min > 0, max >= min),
  else the API's ``initial_workers``, else the server's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RegisterOptions:
    """What a register call (or a startup model entry) asked for; None = not given."""

    url: str
    model_name: str | None = None
    handler: str | None = None
    runtime: str | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    initial_workers: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    synchronous: bool = True
    loaded_at_startup: bool = False


@dataclass(frozen=True, slots=True)
class YamlSettings:
    """The subset of model-config.yaml that decides settings (None = not set)."""

    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int | None = None
    max_batch_delay: int | None = None
    response_timeout: int | None = None
    startup_timeout: int | None = None
    job_queue_size: int | None = None
    sequence_batching: bool | None = None
    sequence_max_idle_msec: int | None = None
    sequence_timeout_msec: int | None = None
    max_sequence_job_queue_size: int | None = None
    max_num_sequence: int | None = None
    continuous_batching: bool | None = None


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    """A stateful model's sequence limits (TorchServe's sequence batching keys)."""

    max_idle_msec: int  # sequenceMaxIdleMSec; 0 = no idle limit
    timeout_msec: int  # sequenceTimeoutMSec; 0 = no lifetime limit
    max_queue: int  # maxSequenceJobQueueSize (requests waiting in one sequence)
    max_sequences: int  # maxNumSequence (open sequences of the model version)


@dataclass(frozen=True, slots=True)
class ServerDefaults:
    default_workers: int
    job_queue_size: int
    response_timeout: int
    startup_timeout: int
    models_setting: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelSettings:
    name: str
    version: str
    url: str
    handler: str
    runtime: str
    batch_size: int
    max_batch_delay: int
    min_workers: int
    max_workers: int
    response_timeout: int
    startup_timeout: int
    job_queue_size: int
    loaded_at_startup: bool
    sequence: SequenceSettings | None = None  # set for a stateful model
    continuous_batching: bool = False  # model-config continuousBatching

    @property
    def batch_capacity(self) -> int:
        """The most requests one batch sent to a worker holds (with continuous batching,
        each step of a running batch, the requests that go on counted).

        ``batch_size``, except for a stateful model with continuous batching: twice it, as
        TorchServe's frontend fills each step of sequence continuous batching up to
        ``batchSize * 2`` requests. That is what lets a sequence's next request (the ``-1``
        cancel of TorchServe's example) join the running batch while the sequence's stream
        still runs, even with ``batchSize: 1``. Plain continuous batching stays at
        ``batch_size``, as TorchServe's does."""
        if self.sequence is not None and self.continuous_batching:
            return 2 * self.batch_size
        return self.batch_size


def sequence_settings(
    yaml: YamlSettings, batch_size: int, max_workers: int
) -> SequenceSettings | None:
    """The sequence limits of a model whose model-config.yaml sets ``sequenceBatching``.

    ``maxNumSequence`` defaults to ``batchSize * maxWorkers`` (every slot of every worker),
    ``maxSequenceJobQueueSize`` to 1, as TorchServe's minimum."""
    if not yaml.sequence_batching:
        return None
    return SequenceSettings(
        max_idle_msec=max(0, yaml.sequence_max_idle_msec or 0),
        timeout_msec=max(0, yaml.sequence_timeout_msec or 0),
        max_queue=max(1, yaml.max_sequence_job_queue_size or 1),
        max_sequences=max(1, yaml.max_num_sequence or batch_size * max(1, max_workers)),
    )


def _models_setting(defaults: ServerDefaults, name: str, version: str) -> dict[str, Any]:
    entry = defaults.models_setting.get(name)
    if not isinstance(entry, dict):
        return {}
    per_version = entry.get(version)
    return per_version if isinstance(per_version, dict) else {}


def is_default_version(defaults: ServerDefaults, name: str, version: str) -> bool:
    """Whether the server's ``models`` setting marks this version ``defaultVersion``."""
    return _models_setting(defaults, name, version).get("defaultVersion") is True


def _first(*values: int | None, default: int) -> int:
    for value in values:
        if value is not None:
            return value
    return default


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decide(
    *,
    name: str,
    version: str,
    handler: str,
    runtime: str,
    options: RegisterOptions,
    yaml: YamlSettings,
    defaults: ServerDefaults,
) -> ModelSettings:
    server_model = _models_setting(defaults, name, version)
    batch_size = _first(
        options.batch_size if options.batch_size else None,
        yaml.batch_size,
        _int_or_none(server_model.get("batchSize")),
        default=1,
    )
    max_batch_delay = _first(
        options.max_batch_delay if options.max_batch_delay else None,
        yaml.max_batch_delay,
        _int_or_none(server_model.get("maxBatchDelay")),
        default=100,
    )
    response_timeout = _first(
        yaml.response_timeout,
        options.response_timeout if options.response_timeout else None,
        _int_or_none(server_model.get("responseTimeout")),
        default=defaults.response_timeout,
    )
    startup_timeout = _first(
        yaml.startup_timeout,
        options.startup_timeout if options.startup_timeout else None,
        _int_or_none(server_model.get("startupTimeout")),
        default=defaults.startup_timeout,
    )
    if (
        yaml.min_workers is not None
        and yaml.max_workers is not None
        and yaml.min_workers > 0
        and yaml.max_workers >= yaml.min_workers
    ):
        min_workers, max_workers = yaml.min_workers, yaml.max_workers
    else:
        workers = _first(
            options.initial_workers,
            _int_or_none(server_model.get("minWorkers")),
            default=defaults.default_workers,
        )
        min_workers = max_workers = max(0, workers)
    job_queue_size = yaml.job_queue_size if yaml.job_queue_size else defaults.job_queue_size
    return ModelSettings(
        name=name,
        version=version,
        url=options.url,
        handler=handler,
        runtime=runtime,
        batch_size=max(1, batch_size),
        max_batch_delay=max(0, max_batch_delay),
        min_workers=min_workers,
        max_workers=max_workers,
        response_timeout=max(1, response_timeout),
        startup_timeout=max(1, startup_timeout),
        job_queue_size=max(1, job_queue_size),
        loaded_at_startup=options.loaded_at_startup,
        sequence=sequence_settings(yaml, max(1, batch_size), max_workers),
        continuous_batching=bool(yaml.continuous_batching),
    )
