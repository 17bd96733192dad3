"""trioserve's spelling of MLServer's model API (``mlserver`` 1.7).

A runtime written for MLServer runs here unchanged: ``from trioserve.model import MLModel``,
or ``from mlserver import MLModel`` with the worker's ``mlserver`` import hook
(:mod:`trioserve.worker.mlserver.mlserver_shim`), which maps ``mlserver.*`` onto these modules.
Nothing here imports torch, trio or an event loop.
"""

from __future__ import annotations

from typing import Any

from . import codecs, errors, settings, types, utils
from .codecs import (
    Base64Codec,
    CodecError,
    DatetimeCodec,
    InputCodec,
    NumpyCodec,
    NumpyRequestCodec,
    RequestCodec,
    StringCodec,
    StringRequestCodec,
)
from .errors import InferenceError, MLServerError
from .metrics import log, register
from .model import MLModel
from .settings import ModelParameters, ModelSettings, Settings
from .types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
    TensorData,
)

# The MLServer release whose API this mirrors (runtimes sometimes check it).
__version__ = "1.7.1"

__all__ = [
    "Base64Codec",
    "CodecError",
    "Datatype",
    "DatetimeCodec",
    "InferenceError",
    "InferenceRequest",
    "InferenceResponse",
    "InputCodec",
    "MLModel",
    "MLServerError",
    "MetadataModelResponse",
    "MetadataTensor",
    "ModelParameters",
    "ModelSettings",
    "NumpyCodec",
    "NumpyRequestCodec",
    "Parameters",
    "RequestCodec",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "Settings",
    "StringCodec",
    "StringRequestCodec",
    "TensorData",
    "__version__",
    "codecs",
    "errors",
    "log",
    "register",
    "settings",
    "types",
    "utils",
]

SERVER_MISSING = (
    "trioserve.model provides MLServer's model API, not its server: run the model under "
    "trioserve (or install mlserver for mlserver.MLServer)"
)


def __getattr__(name: str) -> Any:
    if name == "MLServer":
        raise ImportError(SERVER_MISSING, name=f"{__name__}.MLServer")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
