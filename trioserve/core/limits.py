"""How much one inference request may expand to once it is parsed: the limits and their checks.

``max_request_size`` bounds the bytes of a request, not the work its bytes declare: a 1 MiB
body can name 16,000 inputs or 262,000 KServe v1 instances, each of which becomes Python
objects in the server, a row in the worker and an entry in the answer. These limits bound
that expansion. Each is a ``config.properties`` key of the same name (``TS_`` plus the name in
upper case from the environment, as every key); a request beyond one is refused with
``ServeError(TOO_LARGE)`` (HTTP 413, gRPC RESOURCE_EXHAUSTED) whose message names the limit,
the count and the setting that raises it. The checks run on counts the adapters have before
they build per-item objects (the inputs of a parsed envelope or message, the instances of a
v1 body, the shapes the inputs declare). docs/security.md lists them with their defaults.

This module is sans-IO: numbers and checks only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

from trioserve.core.errors import ErrorKind, ServeError

__all__ = [
    "DEFAULT_LIMITS",
    "ELEMENTS_CAP",
    "LIMIT_SETTINGS",
    "RequestLimits",
    "check_elements",
    "check_inputs",
    "check_instances",
    "check_outputs",
    "declared_elements",
    "response_frame_limit",
    "response_too_large",
    "shape_elements",
]


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The most one inference request may declare; each field is the setting of its name."""

    #: inputs of one request: OIP input tensors (REST and gRPC), TorchServe form fields and
    #: gRPC ``input`` entries; also the outputs one OIP request may ask for by name
    max_request_inputs: int = 2048
    #: instances of one KServe v1 ``{"instances": [...]}`` body (and of a body that a model's
    #: ``json``/``kserve`` envelope reads)
    max_request_instances: int = 10_000
    #: tensor elements, summed over the inputs of one OIP request (the product of each shape)
    max_request_elements: int = 1 << 25

    def to_meta(self) -> dict[str, int]:
        """As a JSON object (the worker's LOAD frame carries it)."""
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> RequestLimits:
        """From :meth:`to_meta`'s object; a missing or malformed entry keeps its default."""
        if not isinstance(meta, Mapping):
            return DEFAULT_LIMITS
        chosen = {
            name: value
            for name in LIMIT_SETTINGS
            if type(value := meta.get(name)) is int and value > 0
        }
        return cls(**chosen)


DEFAULT_LIMITS: Final = RequestLimits()
#: the settings, each with its default
LIMIT_SETTINGS: Final[Mapping[str, int]] = {
    f.name: getattr(DEFAULT_LIMITS, f.name) for f in fields(RequestLimits)
}


def _refuse(described: str, limit: int, setting: str) -> ServeError:
    return ServeError(
        ErrorKind.TOO_LARGE,
        f"{described}; at most {limit} are allowed ({setting}): raise {setting} in "
        "config.properties to accept more",
    )


def check_inputs(count: int, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """``ServeError(TOO_LARGE)`` when a request has more inputs than ``max_request_inputs``."""
    if count > limits.max_request_inputs:
        raise _refuse(
            f"the request has {count} inputs", limits.max_request_inputs, "max_request_inputs"
        )


def check_outputs(count: int, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """``ServeError(TOO_LARGE)`` when a request asks for more outputs by name than
    ``max_request_inputs`` (the one limit on the tensors a request names)."""
    if count > limits.max_request_inputs:
        raise _refuse(
            f"the request asks for {count} outputs by name",
            limits.max_request_inputs,
            "max_request_inputs",
        )


def check_instances(count: int, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """``ServeError(TOO_LARGE)`` when a v1 body has more instances than
    ``max_request_instances``."""
    if count > limits.max_request_instances:
        raise _refuse(
            f"the request has {count} instances",
            limits.max_request_instances,
            "max_request_instances",
        )


def check_elements(count: int, limits: RequestLimits = DEFAULT_LIMITS) -> None:
    """``ServeError(TOO_LARGE)`` when a request's inputs declare more tensor elements than
    ``max_request_elements``."""
    if count > limits.max_request_elements:
        shown = count if count < ELEMENTS_CAP else f"{ELEMENTS_CAP} or more"
        raise _refuse(
            f"the request's inputs declare {shown} tensor elements",
            limits.max_request_elements,
            "max_request_elements",
        )


#: The element count a shape is said to declare when it declares more (no limit reaches it).
ELEMENTS_CAP: Final = 1 << 64


def shape_elements(shape: Sequence[int]) -> int:
    """The product of ``shape``'s dimensions (non-negative integers), or :data:`ELEMENTS_CAP`
    when it is larger. The exact product of many dimensions costs time quadratic in their
    number (300,000 dimensions of 3: two seconds; a 6 MB body of them: minutes), for a count
    nothing could accept, and its digits can be too many for ``str``."""
    if 0 in shape:
        return 0
    product = 1
    for dim in shape:
        product *= dim
        if product >= ELEMENTS_CAP:
            return ELEMENTS_CAP
    return product


def declared_elements(shapes: Iterable[Sequence[Any]]) -> int:
    """The elements the shapes declare, summed (each shape's :func:`shape_elements`).

    A shape that is not a sequence of non-negative integers counts nothing here: the
    tensor's own checks refuse it with a message about its shape."""
    total = 0
    for shape in shapes:
        if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
            continue
        if all(type(dim) is int and dim >= 0 for dim in shape):
            total += shape_elements(shape)
    return total


def response_frame_limit(max_response_size: int, batch_size: int) -> int:
    """The largest RESPONSE frame the server reads from a worker: ``max_response_size`` per
    request of a full batch, plus 1 MiB for the frame's metadata."""
    return max_response_size * max(batch_size, 1) + (1 << 20)


def response_too_large(size: int, limit: int, setting: str = "max_response_size") -> str:
    """The message of an answer too large to send: its size, the limit and the setting."""
    return (
        f"the answer is {size} bytes, more than {setting} allows ({limit} bytes): raise "
        f"{setting} in config.properties to send it"
    )
