"""The Open Inference Protocol payloads, spelled as ``mlserver.types`` spells them.

Same class names, fields, defaults and dump behaviour as MLServer 1.7: every model stores
enum fields as their string values, and ``model_dump`` / ``model_dump_json`` leave unset
and ``None`` fields out unless told otherwise. ``Parameters`` keeps unknown keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Any

import pydantic
from pydantic import ConfigDict, Field, RootModel

__all__ = [
    "BaseModel",
    "Datatype",
    "InferenceErrorResponse",
    "InferenceRequest",
    "InferenceResponse",
    "MetadataModelErrorResponse",
    "MetadataModelResponse",
    "MetadataServerErrorResponse",
    "MetadataServerResponse",
    "MetadataTensor",
    "Parameters",
    "RepositoryIndexRequest",
    "RepositoryIndexResponse",
    "RepositoryIndexResponseItem",
    "RepositoryLoadErrorResponse",
    "RepositoryUnloadErrorResponse",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "State",
    "TensorData",
]


class BaseModel(pydantic.BaseModel):
    """A pydantic model whose dumps skip unset and ``None`` fields by default."""

    model_config = ConfigDict(protected_namespaces=(), use_enum_values=True)

    def model_dump(
        self, *, exclude_unset: bool = True, exclude_none: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        return super().model_dump(exclude_unset=exclude_unset, exclude_none=exclude_none, **kwargs)

    def model_dump_json(
        self, *, exclude_unset: bool = True, exclude_none: bool = True, **kwargs: Any
    ) -> str:
        return super().model_dump_json(
            exclude_unset=exclude_unset, exclude_none=exclude_none, **kwargs
        )


class Datatype(Enum):
    """The tensor element types of the protocol."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"


class Parameters(BaseModel):
    """Free-form parameters; ``content_type`` and ``headers`` are the named ones."""

    model_config = ConfigDict(extra="allow")

    content_type: str | None = None
    headers: dict[str, Any] | None = None


class TensorData(RootModel[list[Any] | Any]):
    """A tensor's elements: usually a flat (or nested) list, sometimes a single value."""

    root: list[Any] | Any = Field(..., title="TensorData")

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(self.root)

    def __getitem__(self, idx: Any) -> Any:
        return self.root[idx]

    def __len__(self) -> int:
        return len(self.root)


class MetadataServerResponse(BaseModel):
    name: str
    version: str
    extensions: list[str]


class MetadataServerErrorResponse(BaseModel):
    error: str


class MetadataModelErrorResponse(BaseModel):
    error: str


class InferenceErrorResponse(BaseModel):
    error: str | None = None


class MetadataTensor(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]
    parameters: Parameters | None = None


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: TensorData


class RequestOutput(BaseModel):
    name: str
    parameters: Parameters | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: TensorData


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class MetadataModelResponse(BaseModel):
    name: str
    versions: list[str] | None = None
    platform: str
    inputs: list[MetadataTensor] | None = None
    outputs: list[MetadataTensor] | None = None
    parameters: Parameters | None = None


# The model repository extension.


class State(Enum):
    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


class RepositoryIndexRequest(BaseModel):
    ready: bool | None = None


class RepositoryIndexResponseItem(BaseModel):
    name: str
    version: str | None = None
    state: State
    reason: str


class RepositoryIndexResponse(RootModel[list[RepositoryIndexResponseItem]]):
    root: list[RepositoryIndexResponseItem] = Field(..., title="RepositoryIndexResponse")

    def __iter__(self) -> Iterator[RepositoryIndexResponseItem]:  # type: ignore[override]
        return iter(self.root)

    def __getitem__(self, idx: int) -> RepositoryIndexResponseItem:
        return self.root[idx]

    def __len__(self) -> int:
        return len(self.root)


class RepositoryLoadErrorResponse(BaseModel):
    error: str | None = None


class RepositoryUnloadErrorResponse(BaseModel):
    error: str | None = None
