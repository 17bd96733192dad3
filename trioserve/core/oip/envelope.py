"""The JSON envelope of a REST inference request, validated with pydantic.

The models check the envelope's structure and field types (strict: ``"3"`` is not an
integer, ``1`` is not a string); tensor ``data`` passes through unvalidated, to be checked
element by element by :class:`~trioserve.core.oip.tensor.Tensor`, which is much faster.
Unknown fields are ignored. :func:`parse_envelope` turns pydantic's errors into one
``ServeError(BAD_INPUT)`` whose message names the field path
(``inputs[0].shape[1] must be an integer``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError
from pydantic_core import ErrorDetails

from trioserve.core.errors import ErrorKind, ServeError

_SCALARS = (str, int, float, bool)


def _scalar(value: Any) -> Any:
    if type(value) not in _SCALARS:
        raise ValueError("must be a string, number or boolean")
    return value


ParamValueField = Annotated[str | int | float | bool, PlainValidator(_scalar)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class InputEnvelope(_Model):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, ParamValueField] | None = None
    data: Any = None


class OutputEnvelope(_Model):
    name: str
    parameters: dict[str, ParamValueField] | None = None


class RequestEnvelope(_Model):
    id: str | None = None
    parameters: dict[str, ParamValueField] | None = None
    inputs: list[InputEnvelope]
    outputs: list[OutputEnvelope] | None = None


_WORDS = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "bool_type": "must be a boolean",
    "float_type": "must be a number",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}


def parse_envelope(text: bytes) -> RequestEnvelope:
    """The validated envelope of a JSON request body; ``ServeError(BAD_INPUT)`` when the
    JSON is malformed or a field is missing or of the wrong type."""
    try:
        return RequestEnvelope.model_validate_json(text)
    except ValidationError as exc:
        raise ServeError(ErrorKind.BAD_INPUT, describe(exc.errors(include_url=False))) from None


def describe(errors: list[ErrorDetails]) -> str:
    """One sentence for the first of pydantic's errors (and how many more there are)."""
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first["msg"])
        return f"malformed JSON: {detail}"
    path = field_path(first["loc"])
    if kind == "value_error":
        what = str((first.get("ctx") or {}).get("error", first["msg"]))
    else:
        what = _WORDS.get(kind) or _lower_first(first["msg"])
    if not path:
        message = "the request body must be a JSON object" if "object" in what else what
    else:
        message = f"invalid inference request: {path} {what}"
    if len(errors) > 1:
        others = len(errors) - 1
        message += f" (and {others} more problem{'s' if others > 1 else ''})"
    return message


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("inputs", 0, "shape")`` as ``inputs[0].shape``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
