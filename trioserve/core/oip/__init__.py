"""The Open Inference Protocol (KServe v2) tensor codec, sans-IO.

No trio, sockets, torch or numpy: bytes and Python values in, bytes and Python values
out. Every failure a client causes is a ``ServeError(ErrorKind.BAD_INPUT, message)`` whose
message names the input, output, field or element; the REST and gRPC adapters map it
(400 with :func:`error_body`, INVALID_ARGUMENT).

Datatypes (``datatypes.py``)
    ``DATATYPES: Mapping[str, Datatype]`` (BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32,
    FP64, BF16, BYTES) and ``lookup_datatype(name) -> Datatype``. A ``Datatype`` has
    ``name``, ``itemsize`` (None for BYTES), ``struct_format`` (``"<f"``; None for BF16
    and BYTES), ``json_type`` (bool/int/float/str), ``contents_field`` (the gRPC
    ``InferTensorContents`` field; None for FP16 and BF16) and ``int_range``.

Tensors (``tensor.py``)
    ``Tensor.from_values(name, datatype, shape, data, parameters=None, *, role="tensor")``
    takes JSON ``data`` (nested or flat) or a flat list from typed gRPC contents;
    ``Tensor.from_raw(name, datatype, shape, raw, parameters=None, *, role="tensor")``
    takes the binary form (REST binary extension, gRPC ``raw_*_contents``), kept as a
    view. A tensor has ``name``, ``datatype`` (str), ``datatype_info`` (Datatype),
    ``shape`` (tuple), ``parameters``, ``element_count``, ``raw`` (memoryview of the
    little-endian binary form, always available), ``nbytes``, ``to_list()`` (Python values;
    BYTES as bytes) and ``to_json()`` (JSON values; BYTES as str). FP16 and BF16 given as
    numbers are converted (BF16: float32, then round to nearest even; NaN -> 0x7FC0).

Choice for BYTES that are not UTF-8 asked for as JSON: ``to_json()`` (and so
``encode_infer_response``) raises BAD_INPUT telling the client to request the output as
binary data, rather than sending base64 that no client would know to decode.

REST requests (``request.py``, ``raw.py``)
    ``parse_header_length(header_value | None) -> int | None`` and
    ``parse_infer_request(body, *, header_length) -> InferRequest`` (``id``, ``parameters``,
    ``inputs: list[Tensor]``, ``outputs: list[RequestedOutput]`` (empty = all),
    ``binary_default``). ``header_length == 0`` is a raw binary request: call
    ``raw_request(body, model_inputs: Sequence[TensorMeta]) -> InferRequest`` instead
    (``parse_infer_request`` raises ``ValueError`` for it).

REST responses (``response.py``)
    ``encode_infer_response(*, model_name, model_version, id, parameters, outputs,
    requested, binary_default) -> (body, header_length | None)``: when the second value
    is not None, send it as ``Inference-Header-Content-Length`` (``HEADER_LENGTH_HEADER``).
    ``error_body(message) -> bytes`` is ``{"error": message}``.

Typical REST route::

    length = parse_header_length(headers.get("inference-header-content-length"))
    if length == 0:
        request = raw_request(body, model_inputs)
    else:
        request = parse_infer_request(body, header_length=length)
    outputs = ...  # run the model: list[Tensor], e.g. Tensor.from_raw(...) per output
    body, length = encode_infer_response(
        model_name=name, model_version=version, id=request.id, parameters=None,
        outputs=outputs, requested=request.outputs, binary_default=request.binary_default,
    )
"""

from typing import TYPE_CHECKING, Any

# The names below are imported from their modules on first use (PEP 562), so that a process
# that only moves tensors (a worker) does not import the request and response codecs and
# pydantic with them: ~0.2 s less at every worker start.
_EXPORTS = {
    "DATATYPES": "datatypes",
    "Datatype": "datatypes",
    "lookup_datatype": "datatypes",
    "TensorMeta": "raw",
    "raw_request": "raw",
    "HEADER_LENGTH_HEADER": "request",
    "InferRequest": "request",
    "RequestedOutput": "request",
    "parse_header_length": "request",
    "parse_infer_request": "request",
    "encode_infer_response": "response",
    "error_body": "response",
    "Parameters": "tensor",
    "ParamValue": "tensor",
    "Tensor": "tensor",
}

if TYPE_CHECKING:
    from trioserve.core.oip.datatypes import DATATYPES, Datatype, lookup_datatype
    from trioserve.core.oip.raw import TensorMeta, raw_request
    from trioserve.core.oip.request import (
        HEADER_LENGTH_HEADER,
        InferRequest,
        RequestedOutput,
        parse_header_length,
        parse_infer_request,
    )
    from trioserve.core.oip.response import encode_infer_response, error_body
    from trioserve.core.oip.tensor import Parameters, ParamValue, Tensor


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DATATYPES",
    "HEADER_LENGTH_HEADER",
    "Datatype",
    "InferRequest",
    "ParamValue",
    "Parameters",
    "RequestedOutput",
    "Tensor",
    "TensorMeta",
    "encode_infer_response",
    "error_body",
    "lookup_datatype",
    "parse_header_length",
    "parse_infer_request",
    "raw_request",
]
