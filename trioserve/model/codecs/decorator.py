"""``decode_args``: a ``predict`` written with typed arguments, decoded by codecs."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

from ..types import InferenceRequest, InferenceResponse, ResponseOutput
from .base import InputCodec, RequestCodec, find_input_codec, find_request_codec
from .errors import CodecNotFound, InputsNotFound, OutputNotFound
from .utils import Codec

if TYPE_CHECKING:
    from ..model import MLModel

__all__ = ["SignatureCodec", "decode_args"]

PredictFunc = Callable[["MLModel", InferenceRequest], Coroutine[Any, Any, InferenceResponse]]


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, tuple):
        return list(value)
    if get_origin(value) is tuple:
        return list(get_args(value))
    return [value]


def _is_codec(codec: Any, kind: type) -> bool:
    return (isinstance(codec, type) and issubclass(codec, kind)) or isinstance(codec, kind)


def _unwrap_optional(hint: Any) -> Any:
    """``Optional[X]`` (``X | None``) is X here."""
    if get_origin(hint) in (Union, types.UnionType):
        args = get_args(hint)
        if len(args) == 2 and type(None) in args:
            return next(a for a in args if a is not type(None))
    return hint


class SignatureCodec(RequestCodec):
    """Maps the argument and return type hints of a ``predict`` to codecs."""

    def __init__(self, predict: Callable[..., Any]) -> None:
        hints = {name: _unwrap_optional(h) for name, h in get_type_hints(predict).items()}
        self._output_hints = _as_list(hints.pop("return", None))
        self._input_hints = hints
        self._input_codecs: dict[str, Codec] = {
            name: self._find_codec(name, hint, is_input=True) for name, hint in hints.items()
        }
        self._output_codecs: list[Codec] = [
            self._find_codec(None, hint, is_input=False) for hint in self._output_hints
        ]

    @staticmethod
    def _find_codec(name: str | None, type_hint: Any, is_input: bool) -> Codec:
        codec: Codec | None = find_input_codec(type_hint=type_hint)
        if codec is None:
            codec = find_request_codec(type_hint=type_hint)
        if codec is None:
            raise CodecNotFound(name=name, payload_type=str(type_hint), is_input=is_input)
        return codec

    def decode_request(self, request: InferenceRequest) -> dict[str, Any]:  # type: ignore[override]
        inputs: dict[str, Any] = {}
        extra = []
        for request_input in request.inputs:
            codec = self._input_codecs.get(request_input.name)
            if codec is None:
                # Possibly part of a request-level argument (e.g. a dataframe's columns).
                extra.append(request_input)
                continue
            if not _is_codec(codec, InputCodec):
                raise CodecNotFound(name=request_input.name, is_input=True)
            inputs[request_input.name] = codec.decode_input(request_input)  # type: ignore[union-attr]
        if extra:
            found = next(
                ((n, c) for n, c in self._input_codecs.items() if _is_codec(c, RequestCodec)),
                None,
            )
            if found is None:
                raise InputsNotFound(extra, self._input_codecs)
            name, request_codec = found
            inputs[name] = request_codec.decode_request(InferenceRequest(inputs=extra))  # type: ignore[union-attr]
        return inputs

    def encode_response(  # type: ignore[override]
        self, model_name: str, payload: Any, model_version: str | None = None
    ) -> InferenceResponse:
        outputs: list[ResponseOutput] = []
        for idx, value in enumerate(_as_list(payload)):
            outputs += self._encode_outputs(idx, value)
        return InferenceResponse(
            model_name=model_name, model_version=model_version, outputs=outputs
        )

    def _encode_outputs(self, idx: int, payload: Any) -> list[ResponseOutput]:
        if idx >= len(self._output_codecs):
            raise OutputNotFound(idx, type(payload), self._output_hints)
        codec = self._output_codecs[idx]
        if not codec.can_encode(payload):
            raise OutputNotFound(idx, type(payload), self._output_hints)
        if _is_codec(codec, InputCodec):
            return [codec.encode_output(name=f"output-{idx}", payload=payload)]  # type: ignore[union-attr]
        if _is_codec(codec, RequestCodec):
            response = codec.encode_response(model_name="", payload=payload)  # type: ignore[union-attr]
            return list(response.outputs)
        return []


def decode_args(predict: Callable[..., Any]) -> PredictFunc:
    """Wrap a ``predict(self, a: np.ndarray, ...) -> X`` into one taking a request."""
    codec = SignatureCodec(predict)

    @functools.wraps(predict)
    async def wrapper(self: MLModel, request: InferenceRequest) -> InferenceResponse:
        outputs = await predict(self, **codec.decode_request(request))
        return codec.encode_response(self.name, outputs, self.version)

    return wrapper
