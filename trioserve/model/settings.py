"""``ModelSettings``, ``ModelParameters`` and a small ``Settings``, as in ``mlserver.settings``.

Differences from MLServer: these are plain pydantic models, so nothing is read from
``MLSERVER_*`` environment variables or ``.env`` files; trioserve's worker fills them in.
``implementation`` may be given as a dotted path or as the class itself, and ``_source``
(the path of the model's settings file, whose folder relative ``uri`` values resolve
against) is a private attribute the worker sets, as MLServer's loader does.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import sys
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Self

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    field_validator,
    model_validator,
)

from .types import MetadataTensor

if TYPE_CHECKING:
    from .model import MLModel

__all__ = ["ModelParameters", "ModelSettings", "Settings"]


def _import_path(klass: type) -> str:
    return f"{klass.__module__}.{klass.__qualname__}"


def _import_string(dotted: str) -> Any:
    module_name, _, attribute = dotted.rpartition(".")
    if not module_name:
        raise ImportError(f"{dotted!r} is not a dotted path (module.Class)")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attribute!r}") from None


@contextlib.contextmanager
def _on_sys_path(folder: str) -> Iterator[None]:
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


class Settings(BaseModel):
    """Server-wide settings: the fields runtimes read, with MLServer's defaults."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    debug: bool = True
    parallel_workers: int = 1
    parallel_workers_timeout: int = 5
    model_repository_root: str = "."
    load_models_at_startup: bool = True
    server_name: str = "mlserver"
    server_version: str = "1.7.1"
    extensions: list[str] = []
    host: str = "0.0.0.0"
    http_port: int = 8080
    root_path: str = ""
    grpc_port: int = 8081
    grpc_max_message_length: int | None = None
    metrics_endpoint: str | None = "/metrics"
    metrics_port: int = 8082
    use_structured_logging: bool = False
    logging_settings: str | dict[str, Any] | None = None
    tracing_server: str | None = None
    cache_enabled: bool = False
    cache_size: int = 100
    gzip_enabled: bool = True


class ModelParameters(BaseModel):
    """Per-instance parameters of a model: where its artefacts are, its version, ..."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    uri: str | None = None
    version: str | None = None
    environment_path: str | None = None
    environment_tarball: str | None = None
    inference_pool_gid: str | None = None
    autogenerate_inference_pool_gid: bool = False
    format: str | None = None
    content_type: str | None = None
    extra: dict[str, Any] | None = {}

    @model_validator(mode="after")
    def _pool_gid(self) -> Self:
        if self.autogenerate_inference_pool_gid and self.inference_pool_gid is None:
            self.inference_pool_gid = str(uuid.uuid4())
        return self


class ModelSettings(BaseModel):
    """A model's settings (``model-settings.json``), as MLServer reads them."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=(), populate_by_name=True)

    # The settings file these were read from; relative URIs resolve against its folder.
    _source: str | None = PrivateAttr(default=None)

    # The runtime class as a dotted path; ``implementation`` (the property) imports it.
    implementation_: str = Field(
        default="",
        validation_alias=AliasChoices("implementation", "implementation_"),
        serialization_alias="implementation",
    )
    name: str = ""
    platform: str = ""
    versions: list[str] = []
    inputs: list[MetadataTensor] = []
    outputs: list[MetadataTensor] = []
    parallel_workers: int | None = None
    warm_workers: bool = False
    max_batch_size: int = 0
    max_batch_time: float = 0.0
    parameters: ModelParameters | None = None
    cache_enabled: bool = False

    def __init__(self, **data: Any) -> None:
        # Spelled out so that type checkers accept ``ModelSettings(implementation=Model)``
        # (the field is ``implementation_``; ``implementation`` is its alias).
        super().__init__(**data)

    @field_validator("implementation_", mode="before")
    @classmethod
    def _class_to_path(cls, value: Any) -> Any:
        if inspect.isclass(value):
            return _import_path(value)
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _take_source(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        source = None
        if isinstance(data, dict) and "_source" in data:
            data = dict(data)
            source = data.pop("_source")
        settings = handler(data)
        if source:
            settings._source = str(source)
        return settings

    @classmethod
    def parse_file(cls, path: str) -> ModelSettings:  # type: ignore[override]
        """Read a ``model-settings.json``; its folder becomes the model's folder."""
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        obj["_source"] = path
        return cls.model_validate(obj)

    @property
    def implementation(self) -> type[MLModel]:
        """The runtime class, imported (from the model's folder when there is one)."""
        if not self._source:
            return _import_string(self.implementation_)  # type: ignore[no-any-return]
        module_name = self.implementation_.rpartition(".")[0]
        with _on_sys_path(os.path.dirname(self._source)):
            if module_name in sys.modules:
                importlib.reload(sys.modules[module_name])
            return _import_string(self.implementation_)  # type: ignore[no-any-return]

    @implementation.setter
    def implementation(self, value: type[MLModel] | str) -> None:
        self.implementation_ = value if isinstance(value, str) else _import_path(value)

    @property
    def model_folder(self) -> str | None:
        """The folder of the settings file (``_source``), or None when there is none."""
        return os.path.dirname(self._source) if self._source else None

    @property
    def version(self) -> str | None:
        return self.parameters.version if self.parameters is not None else None
