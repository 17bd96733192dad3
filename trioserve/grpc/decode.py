"""The one place where gRPC request bytes become messages.

:func:`request_decoder` gives, for a generated betterproto2 message class, a
:class:`RequestDecoder`: the bytes are first checked against the class's wire schema
(:func:`trioserve.core.protowire.check`, built once from betterproto2's field metadata),
then parsed by betterproto2. Malformed bytes fail with INVALID_ARGUMENT naming the problem,
never with the parser's own exception. A message with more ``inputs`` or ``outputs``
entries than the request limits allow (``max_request_inputs``) fails with
RESOURCE_EXHAUSTED before it is parsed: the wire check counts them, and betterproto2 would
build an object of ~250 to ~850 bytes for each, from as little as two bytes of an empty
entry (a 1.3 MiB message of empty inputs took ~280 MiB before the inputs could be
counted). The bridge builds one decoder per rpc, under the server's request limits, when a
service is registered and reads every request message of every call, stream messages
included, through it; nothing else in :mod:`trioserve.grpc` parses request bytes
(``tests/unit/test_grpc_decode.py`` checks both).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final

import betterproto2

from trioserve.core import protowire
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, check_inputs, check_outputs
from trioserve.core.protowire import FieldSpec, MessageSchema

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


def wire_schema(message_type: type[betterproto2.Message]) -> MessageSchema:
    """The wire schema of a generated message class (nested and map entry types included)."""
    return _schema(message_type, {})


def _schema(message_type: type[Any], seen: dict[type[Any], MessageSchema]) -> MessageSchema:
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
            nested = _schema(meta.cls_by_field[name], seen)
        elif field.proto_type == betterproto2.TYPE_MESSAGE:
            inner = field.unwrap() if field.unwrap is not None else meta.cls_by_field[name]
            nested = _schema(inner, seen)
        repeated = field.repeated or field.proto_type == betterproto2.TYPE_MAP
        schema.fields[field.number] = FieldSpec(name, kind, repeated, nested)
    return schema


# The top-level repeated message fields the request limits count, by name, and their check.
_COUNTED: Final[dict[str, Callable[[int, RequestLimits], None]]] = {
    "inputs": check_inputs,
    "outputs": check_outputs,
}


def _counted_fields(
    message_type: type[Any],
) -> list[tuple[int, Callable[[int, RequestLimits], None]]]:
    """The field numbers of ``message_type`` whose entries the limits count, with the check."""
    return [
        (field.number, _COUNTED[name])
        for name, field in message_type._betterproto.meta_by_field_name.items()
        if name in _COUNTED and field.repeated and field.proto_type == betterproto2.TYPE_MESSAGE
    ]


class RequestDecoder:
    """Bytes to one message type, strictly: see the module's docstring."""

    __slots__ = ("counted", "limits", "message_type", "schema")

    def __init__(
        self, message_type: type[betterproto2.Message], limits: RequestLimits = DEFAULT_LIMITS
    ) -> None:
        self.message_type = message_type
        self.schema = wire_schema(message_type)
        self.limits = limits
        self.counted = _counted_fields(message_type)

    def __call__(self, data: bytes) -> Any:
        counts = protowire.check(data, self.schema)
        for number, check_count in self.counted:
            check_count(counts.get(number, 0), self.limits)
        try:
            return self.message_type.FromString(data)
        except Exception as exc:  # well-formed, yet betterproto2 refused it
            log.warning("betterproto2 refused a checked %s", self.schema.name, exc_info=exc)
            raise ServeError(
                ErrorKind.BAD_INPUT, f"malformed protobuf in {self.schema.name}: {exc}"
            ) from None


@functools.cache
def request_decoder(
    message_type: type[betterproto2.Message], limits: RequestLimits = DEFAULT_LIMITS
) -> RequestDecoder:
    """The decoder of ``message_type`` under ``limits`` (one per pair, built on first use)."""
    return RequestDecoder(message_type, limits)


__all__ = ["RequestDecoder", "request_decoder", "wire_schema"]
