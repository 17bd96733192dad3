"""The one place where gRPC request bytes become messages.

:func:`request_decoder` gives, for a generated betterproto2 message class, a
:class:`RequestDecoder`: the bytes are first checked against the class's wire schema
(:func:`trioserve.core.protowire.check`, built once from betterproto2's field metadata),
then parsed by betterproto2. Malformed bytes fail with INVALID_ARGUMENT naming the problem,
never with the parser's own exception; a request with more inputs (or shape dimensions) than
the request limits allow fails with RESOURCE_EXHAUSTED before the parser builds them. The
bridge builds one decoder per rpc when a service is registered and reads every request
message of every call, stream messages included, through it; nothing else in
:mod:`trioserve.grpc` parses request bytes (``tests/unit/test_grpc_decode.py`` checks both).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Final

import betterproto2

from trioserve.core import protowire
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits
from trioserve.core.oip.tensor import MAX_DIMS
from trioserve.core.protowire import Cap, FieldSpec, MessageSchema

log = logging.getLogger("trioserve.grpc")

_KINDS: Final = {
    betterproto2.TYPE_BOOL: protowire.VARINT,
    betterproto2.TYPE_ENUM: protowire.VARINT,
    betterproto2.TYPE_INT32: protowire.VARINT,
    betterproto2.TYPE_INT64: protowire.VARINT,
    betterproto2.TYPE_UINT32: protowire.VARINT,
    betterproto2.TYPE_UINT64: protowire.VARINT,
    betterproto2.TYPE_SINT32: protowire.VARINT,
    betterproto2.TYPE_SINT64: protowire.VARINT,
    betterproto2.TYPE_FLOAT: protowire.FIXED32,
    betterproto2.TYPE_FIXED32: protowire.FIXED32,
    betterproto2.TYPE_SFIXED32: protowire.FIXED32,
    betterproto2.TYPE_DOUBLE: protowire.FIXED64,
    betterproto2.TYPE_FIXED64: protowire.FIXED64,
    betterproto2.TYPE_SFIXED64: protowire.FIXED64,
    betterproto2.TYPE_STRING: protowire.STRING,
    betterproto2.TYPE_BYTES: protowire.BYTES,
    betterproto2.TYPE_MESSAGE: protowire.MESSAGE,
    betterproto2.TYPE_MAP: protowire.MESSAGE,  # repeated entries {1: key, 2: value}
}


def caps(limits: RequestLimits) -> dict[tuple[str, str], Cap]:
    """The repeated fields counted before parsing, by (message class, field): what one
    request may declare (the request limits), so that the parser never builds an object per
    entry of a request that its count would refuse afterwards."""
    inputs = Cap(limits.max_request_inputs, "max_request_inputs")
    return {
        ("ModelInferRequest", "inputs"): inputs,
        ("ModelInferRequest", "outputs"): inputs,
        ("ModelInferRequest", "raw_input_contents"): inputs,
        ("ModelInferRequestInferInputTensor", "shape"): Cap(MAX_DIMS),
        ("PredictionsRequest", "input"): inputs,
    }


def wire_schema(
    message_type: type[betterproto2.Message], limits: RequestLimits = DEFAULT_LIMITS
) -> MessageSchema:
    """The wire schema of a generated message class (nested and map entry types included),
    with the counted fields' caps from ``limits``."""
    return _schema(message_type, {}, caps(limits))


def _schema(
    message_type: type[Any],
    seen: dict[type[Any], MessageSchema],
    capped: dict[tuple[str, str], Cap],
) -> MessageSchema:
    known = seen.get(message_type)
    if known is not None:
        return known
    schema = MessageSchema(message_type.__name__)
    seen[message_type] = schema  # before the fields: a message may contain itself
    meta = message_type._betterproto
    for name, field in meta.meta_by_field_name.items():
        kind = _KINDS[field.proto_type]
        nested = None
        if field.proto_type == betterproto2.TYPE_MAP:
            nested = _schema(meta.cls_by_field[name], seen, capped)
        elif field.proto_type == betterproto2.TYPE_MESSAGE:
            inner = field.unwrap() if field.unwrap is not None else meta.cls_by_field[name]
            nested = _schema(inner, seen, capped)
        repeated = field.repeated or field.proto_type == betterproto2.TYPE_MAP
        cap = capped.get((schema.name, name)) if repeated else None
        schema.fields[field.number] = FieldSpec(name, kind, repeated, nested, cap)
        schema.capped = schema.capped or cap is not None
    return schema


class RequestDecoder:
    """Bytes to one message type, strictly: see the module's docstring."""

    __slots__ = ("message_type", "schema")

    def __init__(
        self, message_type: type[betterproto2.Message], limits: RequestLimits = DEFAULT_LIMITS
    ) -> None:
        self.message_type = message_type
        self.schema = wire_schema(message_type, limits)

    def __call__(self, data: bytes) -> Any:
        protowire.check(data, self.schema)
        try:
            return self.message_type.FromString(data)
        except Exception as exc:  # well-formed, yet betterproto2 refused it
            # At debug level: each such message is a client's, and clients must not be able
            # to fill the log; the client gets the reason in its error.
            log.debug("betterproto2 refused a checked %s", self.schema.name, exc_info=exc)
            raise ServeError(
                ErrorKind.BAD_INPUT, f"malformed protobuf in {self.schema.name}: {exc}"
            ) from None


@functools.cache
def request_decoder(
    message_type: type[betterproto2.Message], limits: RequestLimits = DEFAULT_LIMITS
) -> RequestDecoder:
    """The decoder of ``message_type`` under ``limits`` (one per pair, built on first use)."""
    return RequestDecoder(message_type, limits)


__all__ = ["RequestDecoder", "caps", "request_decoder", "wire_schema"]
