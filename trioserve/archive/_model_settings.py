"""MLServer model folders: ``model-settings.json`` as a model of the store.

A folder (or archive) without ``MAR-INF/MANIFEST.json`` but with ``model-settings.json`` is
an MLServer-style model. Its settings are read here, validated by pydantic, and turned
into what the rest of the server knows: the manifest's name, version and handler (the
``implementation``), and model-config batching (``max_batch_size`` / ``max_batch_time``
become ``batchSize`` / ``maxBatchDelay``). The whole document goes to the worker, which
builds the model's own ``ModelSettings`` from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._errors import ArchiveError
from ._manifest import Manifest
from ._model_config import ModelConfig

MODEL_SETTINGS_PATH: Final = "model-settings.json"
# Without adaptive batching, the requests a worker of an MLServer model takes at once: its
# coroutines run concurrently there (as in MLServer's event loop), never waiting to fill up.
CONCURRENT_REQUESTS: Final = 16


class _Tensor(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    datatype: str
    shape: list[int]


class _Parameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    uri: str | None = None
    version: str | None = None
    # trioserve's own (MLServer ignores it): merge the streamed answers waiting for a slow
    # client into one (trioserve.core.oip.merging).
    merge_stream_replies: bool = False


class _Settings(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str | None = None
    implementation: str
    parameters: _Parameters | None = None
    max_batch_size: int = Field(default=0, ge=0)
    max_batch_time: float = Field(default=0.0, ge=0)
    inputs: list[_Tensor] = Field(default_factory=list)
    outputs: list[_Tensor] = Field(default_factory=list)
    platform: str = ""


@dataclass(frozen=True)
class TensorDeclaration:
    """One input or output a model declares: name, datatype, shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class MlserverSettings:
    """What the server takes from ``model-settings.json``; ``raw`` is the whole document."""

    name: str | None
    implementation: str
    version: str | None
    max_batch_size: int
    max_batch_time: float
    inputs: tuple[TensorDeclaration, ...]
    outputs: tuple[TensorDeclaration, ...]
    platform: str
    raw: dict[str, Any] = field(default_factory=dict, hash=False)
    merge_stream_replies: bool = False  # parameters.merge_stream_replies

    def manifest(self) -> Manifest:
        """The manifest this folder would have as a TorchServe archive."""
        return Manifest(
            model_name=self.name,
            model_version=self.version,
            handler=self.implementation,
            description=f"MLServer model ({MODEL_SETTINGS_PATH})",
        )

    @property
    def adaptive_batching(self) -> bool:
        """MLServer batches when ``max_batch_size`` > 1 and ``max_batch_time`` > 0."""
        return self.max_batch_size > 1 and self.max_batch_time > 0

    def model_config(self) -> ModelConfig:
        """The model-config keys: MLServer's adaptive batching as batchSize and
        maxBatchDelay (the time in ms); without it, up to :data:`CONCURRENT_REQUESTS`
        requests go to a worker together, at once, to run concurrently."""
        if self.adaptive_batching:
            delay_ms = max(1, round(self.max_batch_time * 1000))
            return ModelConfig(batch_size=self.max_batch_size, max_batch_delay=delay_ms)
        return ModelConfig(batch_size=CONCURRENT_REQUESTS, max_batch_delay=0)


def parse_model_settings(data: bytes) -> MlserverSettings:
    """Read ``model-settings.json``; :class:`ArchiveError` (400) says what is wrong."""
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArchiveError(400, f"{MODEL_SETTINGS_PATH} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ArchiveError(400, f"{MODEL_SETTINGS_PATH} must hold a JSON object")
    try:
        settings = _Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'document'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ArchiveError(400, f"{MODEL_SETTINGS_PATH}: {problems}") from None
    parameters = settings.parameters or _Parameters()
    return MlserverSettings(
        name=settings.name,
        implementation=settings.implementation,
        version=parameters.version,
        max_batch_size=settings.max_batch_size,
        max_batch_time=settings.max_batch_time,
        inputs=tuple(
            TensorDeclaration(t.name, t.datatype, tuple(t.shape)) for t in settings.inputs
        ),
        outputs=tuple(
            TensorDeclaration(t.name, t.datatype, tuple(t.shape)) for t in settings.outputs
        ),
        platform=settings.platform,
        raw=raw,
        merge_stream_replies=parameters.merge_stream_replies,
    )


__all__ = ["MODEL_SETTINGS_PATH", "MlserverSettings", "TensorDeclaration", "parse_model_settings"]
