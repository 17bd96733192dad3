"""The codec interfaces (``InputCodec``, ``RequestCodec``) and the codec registry."""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

from ..types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput

__all__ = [
    "InputCodec",
    "InputCodecLike",
    "RequestCodec",
    "RequestCodecLike",
    "find_input_codec",
    "find_input_codec_by_payload",
    "find_input_codec_by_type_hint",
    "find_request_codec",
    "find_request_codec_by_payload",
    "find_request_codec_by_type_hint",
    "register_input_codec",
    "register_request_codec",
]

logger = logging.getLogger("trioserve.model.codecs")

InputCodecLike = Union[type["InputCodec"], "InputCodec"]
RequestCodecLike = Union[type["RequestCodec"], "RequestCodec"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _deprecated(reason: str) -> Callable[[_F], _F]:
    def wrap(func: _F) -> _F:
        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            logger.warning("DEPRECATED! %s", reason)
            return func(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


class InputCodec:
    """Converts one input (output) tensor to and from a Python value."""

    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    @_deprecated("encode() is deprecated: use encode_output()")
    def encode(cls, name: str, payload: Any) -> ResponseOutput:
        return cls.encode_output(name, payload)

    @classmethod
    def encode_output(cls, name: str, payload: Any, **kwargs: Any) -> ResponseOutput:
        raise NotImplementedError()

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_input(cls, name: str, payload: Any, **kwargs: Any) -> RequestInput:
        raise NotImplementedError()

    @classmethod
    @_deprecated("decode() is deprecated: use decode_input()")
    def decode(cls, request_input: RequestInput) -> Any:
        return cls.decode_input(request_input)

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> Any:
        raise NotImplementedError()


class RequestCodec:
    """Converts a whole request (response) to and from a Python value."""

    ContentType: ClassVar[str] = ""
    TypeHint: ClassVar[Any] = type(None)

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return False

    @classmethod
    @_deprecated("encode() is deprecated: use encode_response()")
    def encode(
        cls, model_name: str, payload: Any, model_version: str | None = None
    ) -> InferenceResponse:
        return cls.encode_response(model_name, payload, model_version)

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        raise NotImplementedError()

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        raise NotImplementedError()

    @classmethod
    @_deprecated("decode() is deprecated: use decode_request()")
    def decode(cls, request: InferenceRequest) -> Any:
        return cls.decode_request(request)

    @classmethod
    def decode_request(cls, request: InferenceRequest) -> Any:
        raise NotImplementedError()


_C = TypeVar("_C", InputCodecLike, RequestCodecLike)


def _first(matching: list[_C], what: str) -> _C | None:
    if not matching:
        logger.warning("No codec was found for %s.", what)
        return None
    if len(matching) > 1:
        logger.warning(
            "Multiple codecs (%d) were found for %s; the first one found will be used (%s).",
            len(matching),
            what,
            matching[0].ContentType,
        )
    return matching[0]


def _by_payload(payload: Any, codecs: Iterable[_C]) -> _C | None:
    found = [c for c in codecs if c.can_encode(payload)]
    return _first(found, f"payload with type {type(payload)}")


def _hint_key(hint: Any) -> Any:
    """A type hint in one spelling: ``List[str]`` and ``list[str]`` (and ``a | b`` and
    ``Union[a, b]``) compare equal."""
    origin = get_origin(hint)
    if origin is None:
        return hint
    if origin is types.UnionType:
        origin = Union
    return (origin, tuple(_hint_key(arg) for arg in get_args(hint)))


def _by_type_hint(type_hint: Any, codecs: Iterable[_C]) -> _C | None:
    key = _hint_key(type_hint)
    found = [c for c in codecs if _hint_key(c.TypeHint) == key]
    return _first(found, f"type hint {type_hint}")


_input_codecs: dict[str, InputCodecLike] = {}
_request_codecs: dict[str, RequestCodecLike] = {}


def find_input_codec(
    content_type: str | None = None, payload: Any | None = None, type_hint: Any | None = None
) -> InputCodecLike | None:
    """The input codec for a content type, else for a payload, else for a type hint."""
    if content_type:
        return _input_codecs.get(content_type)
    if payload:
        return find_input_codec_by_payload(payload)
    if type_hint:
        return find_input_codec_by_type_hint(type_hint)
    return None


def find_input_codec_by_payload(payload: Any) -> InputCodecLike | None:
    return _by_payload(payload, _input_codecs.values())


def find_input_codec_by_type_hint(type_hint: Any) -> InputCodecLike | None:
    return _by_type_hint(type_hint, _input_codecs.values())


def find_request_codec(
    content_type: str | None = None, payload: Any | None = None, type_hint: Any | None = None
) -> RequestCodecLike | None:
    """The request codec for a content type, else for a payload, else for a type hint."""
    if content_type:
        return _request_codecs.get(content_type)
    if payload:
        return find_request_codec_by_payload(payload)
    if type_hint:
        return find_request_codec_by_type_hint(type_hint)
    return None


def find_request_codec_by_payload(payload: Any) -> RequestCodecLike | None:
    return _by_payload(payload, _request_codecs.values())


def find_request_codec_by_type_hint(type_hint: Any) -> RequestCodecLike | None:
    return _by_type_hint(type_hint, _request_codecs.values())


_I = TypeVar("_I", bound=InputCodecLike)
_R = TypeVar("_R", bound=RequestCodecLike)


def register_input_codec(codec: _I) -> _I:
    """Register an input codec under its ``ContentType`` (usable as a class decorator)."""
    if codec.ContentType is not None:
        _input_codecs[codec.ContentType] = codec
    return codec


def register_request_codec(codec: _R) -> _R:
    """Register a request codec under its ``ContentType`` (usable as a class decorator)."""
    if codec.ContentType is not None:
        _request_codecs[codec.ContentType] = codec
    return codec
