"""The public helpers of ``mlserver.utils`` that models use, ``get_model_uri`` first."""

from __future__ import annotations

import logging
import os
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

from .errors import InvalidModelURI
from .settings import ModelSettings
from .types import InferenceRequest, InferenceResponse, Parameters

__all__ = [
    "extract_headers",
    "generate_uuid",
    "get_model_uri",
    "get_wrapped_method",
    "insert_headers",
    "to_absolute_path",
]

logger = logging.getLogger("trioserve.model.utils")


async def get_model_uri(
    settings: ModelSettings, wellknown_filenames: list[str] | None = None
) -> str:
    """Where the model's artefact is: ``parameters.uri`` made absolute.

    A relative path resolves against the model's folder (the folder of
    ``settings._source``); a folder resolves to the first of ``wellknown_filenames`` in it,
    else to the folder itself. A non-``file`` URI is returned as is.
    """
    if not settings.parameters or not settings.parameters.uri:
        raise InvalidModelURI(settings.name)
    uri = settings.parameters.uri
    parsed = urllib.parse.urlparse(uri, scheme="file")
    if parsed.scheme != "file":
        return uri
    return _resolve(settings, to_absolute_path(settings, parsed.path), wellknown_filenames)


def _resolve(settings: ModelSettings, path: str, wellknown_filenames: list[str] | None) -> str:
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for filename in wellknown_filenames or []:
            candidate = os.path.join(path, filename)
            if os.path.isfile(candidate):
                return candidate
        return path
    raise InvalidModelURI(settings.name, path)


def to_absolute_path(model_settings: ModelSettings, uri: str) -> str:
    """``uri`` relative to the model's folder; as given when the folder is unknown."""
    folder = model_settings.model_folder
    if folder is None:
        return uri
    return os.path.normpath(os.path.join(folder, uri))


def get_wrapped_method(f: Callable[..., Any]) -> Callable[..., Any]:
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    return f


def generate_uuid() -> str:
    return str(uuid.uuid4())


def insert_headers(
    inference_request: InferenceRequest, headers: dict[str, str]
) -> InferenceRequest:
    """Put the transport's headers into ``parameters.headers`` (replacing what was there)."""
    if inference_request.parameters is None:
        inference_request.parameters = Parameters()
    if inference_request.parameters.headers is not None:
        logger.warning(
            "the request's parameters.headers (%d entries) are replaced by the transport's "
            "headers: the field should not be set by clients",
            len(inference_request.parameters.headers),
        )
    inference_request.parameters.headers = headers
    return inference_request


def extract_headers(inference_response: InferenceResponse) -> dict[str, str] | None:
    """Take ``parameters.headers`` out of a response (to send as transport headers)."""
    parameters = inference_response.parameters
    if parameters is None or parameters.headers is None:
        return None
    headers = parameters.headers
    parameters.headers = None
    return headers
