"""REST inference requests: the JSON envelope plus the binary tensor data extension.

A request body is a JSON object, optionally followed by binary blobs. The
``Inference-Header-Content-Length`` header gives the JSON's length; without it the whole
body is JSON. Every input whose ``parameters.binary_data_size`` is set takes that many bytes
from the blobs, in the order of the inputs, and the sizes must add up to exactly the bytes
after the JSON. A header length of 0 is a raw binary request, which only the model can
interpret: see :func:`trioserve.core.oip.raw.raw_request`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trioserve.core.errors import ErrorKind, ServeError, quote
from trioserve.core.limits import (
    DEFAULT_LIMITS,
    RequestLimits,
    check_elements,
    declared_elements,
)
from trioserve.core.oip.envelope import InputEnvelope, parse_envelope
from trioserve.core.oip.packing import Buffer, byte_view
from trioserve.core.oip.tensor import Parameters, Tensor

HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An entry of the request's ``outputs``: a name and its parameters. ``binary_data``
    (a bool, checked when parsed) asks for the output in binary form."""

    name: str
    parameters: Parameters = field(default_factory=dict)

    @property
    def binary_data(self) -> bool | None:
        """The output's own ``binary_data`` choice; ``None`` when it makes none."""
        value = self.parameters.get("binary_data")
        return value if isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A parsed inference request.

    ``inputs`` carry their data; their ``binary_data_size`` parameter is consumed, the
    other parameters are kept. ``outputs`` empty means every output, with the default
    form. ``parameters`` are the request's own, as sent. ``raw`` marks a raw binary request,
    whose outputs are all answered binary.
    """

    inputs: list[Tensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)
    raw: bool = False

    @property
    def binary_default(self) -> bool:
        """Whether an output that makes no choice of its own is answered binary: the
        request's ``binary_data_output`` (default false), always true for a raw request."""
        return self.raw or self.parameters.get("binary_data_output") is True


def parse_header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header's value as an int (``None`` when the
    header is absent); ``ServeError(BAD_INPUT)`` unless it is a non-negative integer."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{HEADER_LENGTH_HEADER} must be a non-negative integer, not {quote(value)}",
        )
    return int(text)


def parse_infer_request(
    body: Buffer, *, header_length: int | None, limits: RequestLimits = DEFAULT_LIMITS
) -> InferRequest:
    """Parse a REST inference request body.

    ``header_length`` is the ``Inference-Header-Content-Length`` value (see
    :func:`parse_header_length`); ``None``: the whole body is JSON. A raw binary request
    (``header_length == 0``) must go to ``raw_request`` instead, with the model's inputs:
    passing it here raises ``ValueError``. Everything a client can get wrong raises
    ``ServeError(BAD_INPUT)`` with a message that names the field or input; a request that
    declares more inputs, outputs or elements than ``limits`` raises ``ServeError(TOO_LARGE)``
    before any tensor is built.
    """
    if header_length == 0:
        raise ValueError("a raw binary request (header length 0) needs raw_request(body, inputs)")
    view = byte_view(body)
    if header_length is None:
        text = body if isinstance(body, bytes) else bytes(view)
        blobs = view[len(view) :]
    else:
        if header_length < 0 or header_length > len(view):
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{HEADER_LENGTH_HEADER} is {header_length} but the body has {len(view)} bytes",
            )
        text = bytes(view[:header_length])
        blobs = view[header_length:]
    try:
        envelope = parse_envelope(text, limits)
    except ServeError as exc:
        if header_length is None and "trailing characters" in exc.message:
            exc.message += f" (binary data after the JSON needs the {HEADER_LENGTH_HEADER} header)"
        raise
    check_elements(declared_elements(item.shape for item in envelope.inputs), limits)
    sizes = [_binary_size(item) for item in envelope.inputs]
    _check_blob_sizes(sizes, len(blobs), header_length)
    inputs: list[Tensor] = []
    offset = 0
    for item, size in zip(envelope.inputs, sizes, strict=True):
        parameters = {k: v for k, v in (item.parameters or {}).items() if k != "binary_data_size"}
        if size is None:
            tensor = Tensor.from_values(
                item.name, item.datatype, item.shape, item.data, parameters, role="input"
            )
        else:
            blob = blobs[offset : offset + size]
            offset += size
            tensor = Tensor.from_raw(
                item.name, item.datatype, item.shape, blob, parameters, role="input"
            )
        inputs.append(tensor)
    _check_unique([t.name for t in inputs], "input")
    outputs = [
        RequestedOutput(item.name, dict(item.parameters or {})) for item in envelope.outputs or ()
    ]
    for output in outputs:
        _check_bool(output.parameters, "binary_data", f"output {quote(output.name)}: ")
    _check_unique([o.name for o in outputs], "requested output")
    parameters = dict(envelope.parameters or {})
    _check_bool(parameters, "binary_data_output", "")
    return InferRequest(inputs, outputs, envelope.id, parameters)


def _binary_size(item: InputEnvelope) -> int | None:
    """The input's ``binary_data_size`` (None: its data is in JSON), after checking that
    it gives its data one way exactly."""
    size = (item.parameters or {}).get("binary_data_size")
    where = f"input {quote(item.name)}"
    if size is None:
        if item.data is None:
            raise ServeError(
                ErrorKind.BAD_INPUT,
                f"{where} has no data: give data, or parameters.binary_data_size and the "
                "bytes after the JSON",
            )
        return None
    if type(size) is not int or size < 0:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{where}: parameters.binary_data_size must be a non-negative integer, "
            f"not {quote(size)}",
        )
    if item.data is not None:
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{where} has both data and parameters.binary_data_size; give one of them",
        )
    return size


def _check_blob_sizes(sizes: Sequence[int | None], available: int, header: int | None) -> None:
    total = sum(size for size in sizes if size is not None)
    if total == available:
        return
    if header is None:
        after = f"no {HEADER_LENGTH_HEADER} header was sent, so no binary data follows the JSON"
    else:
        after = f"{available} bytes follow the JSON header ({HEADER_LENGTH_HEADER}: {header})"
    raise ServeError(
        ErrorKind.BAD_INPUT,
        f"the inputs' parameters.binary_data_size add up to {total} bytes but {after}",
    )


def _check_bool(parameters: Parameters, key: str, where: str) -> None:
    if key in parameters and not isinstance(parameters[key], bool):
        raise ServeError(
            ErrorKind.BAD_INPUT,
            f"{where}parameters.{key} must be a boolean, not {quote(parameters[key])}",
        )


def _check_unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ServeError(ErrorKind.BAD_INPUT, f"{what} {quote(name)} is given more than once")
        seen.add(name)
