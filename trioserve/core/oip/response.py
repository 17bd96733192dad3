"""REST inference responses and OIP error bodies.

:func:`encode_infer_response` writes the JSON response, then the binary blobs of the
outputs answered binary, in the order of the outputs in the JSON. JSON is written with
pydantic-core's serializer (several times faster than :mod:`json` on large float lists);
NaN and infinities are written as ``NaN`` / ``Infinity`` / ``-Infinity``, as Python's
:mod:`json` (and so tritonclient) reads them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

from trioserve.core.errors import ErrorKind, ServeError, quote
from trioserve.core.oip.request import RequestedOutput
from trioserve.core.oip.tensor import ParamValue, Tensor


def encode_infer_response(
    *,
    model_name: str,
    model_version: str | None,
    id: str | None,
    parameters: Mapping[str, ParamValue] | None,
    outputs: Sequence[Tensor],
    requested: Sequence[RequestedOutput],
    binary_default: bool,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON's length when any output is binary (the value of
    the ``Inference-Header-Content-Length`` response header; ``None``: all JSON).

    ``requested`` (the request's ``outputs``) selects and orders the outputs; empty means
    all of ``outputs`` in their order. An output is binary when its requested
    ``binary_data`` says so, else when ``binary_default`` (the request's
    ``binary_data_output``; true for raw requests) does. A binary output carries
    ``parameters.binary_data_size`` and no ``data``. ``model_version`` and ``id`` are left
    out when ``None``, ``parameters`` when empty.

    Raises ``ServeError(BAD_INPUT)`` for a requested output the model does not have, and
    for a BYTES output with non-UTF-8 elements asked for as JSON.
    """
    document: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        document["model_version"] = model_version
    if id is not None:
        document["id"] = id
    if parameters:
        document["parameters"] = dict(parameters)
    entries: list[dict[str, Any]] = []
    blobs: list[memoryview] = []
    for tensor, binary in select_outputs(outputs, requested, binary_default):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        output_parameters: dict[str, ParamValue] = dict(tensor.parameters)
        if binary:
            output_parameters["binary_data_size"] = tensor.nbytes
            blobs.append(tensor.raw)
        if output_parameters:
            entry["parameters"] = output_parameters
        if not binary:
            entry["data"] = tensor.to_json()
        entries.append(entry)
    document["outputs"] = entries
    header = dumps(document)
    if len(blobs) == 0:
        return header, None
    return b"".join([header, *blobs]), len(header)


def select_outputs(
    outputs: Sequence[Tensor], requested: Sequence[RequestedOutput], binary_default: bool
) -> list[tuple[Tensor, bool]]:
    """The outputs to answer, each with whether it goes binary (see
    :func:`encode_infer_response`)."""
    if not requested:
        return [(tensor, binary_default) for tensor in outputs]
    by_name = {tensor.name: tensor for tensor in outputs}
    chosen = []
    for want in requested:
        tensor = by_name.get(want.name)
        if tensor is None:
            names = ", ".join(repr(name) for name in by_name) or "none"
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"requested output {quote(want.name)} is not an output of the model "
                f"(its outputs: {names})",
            )
        binary = want.binary_data
        chosen.append((tensor, binary_default if binary is None else binary))
    return chosen


def error_body(message: str) -> bytes:
    """The OIP error body: ``{"error": message}``."""
    return dumps({"error": message})


def dumps(document: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and infinities as JavaScript constants."""
    try:
        return to_json(document, inf_nan_mode="constants")
    except PydanticSerializationError:
        # A string with a lone surrogate (from a handler): json escapes it as \\udxxx.
        return json.dumps(document, separators=(",", ":")).encode()
