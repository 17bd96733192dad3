"""The JSON envelope of a REST inference request, validated with pydantic.

The models check the envelope's structure and field types (strict: ``"3"`` is not an
integer, ``1`` is not a string); tensor ``data`` passes through unvalidated, to be checked
element by element by :class:`~trioserve.core.oip.tensor.Tensor`, which is much faster.
Unknown fields are ignored. ``null`` for an optional field (``id``, ``parameters``,
``outputs``, an output's ``parameters``) or for a parameter's value means absent, as MLServer
reads it: its pydantic types serialize every unset optional field as ``null``
(``{"content_type": "str", "headers": null}``) and its documented client posts exactly that;
a null parameter is dropped. A value of the wrong type is still refused. The body is parsed
by :func:`trioserve.core.jsontext.parse` (its depth limit), then validated;
:func:`parse_envelope` turns pydantic's errors into one ``ServeError(BAD_INPUT)`` whose
message names the field path (``inputs[0].shape[1] must be an integer``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from pydantic_core import ErrorDetails

from trioserve.core import jsontext
from trioserve.core.errors import QUOTE_LIMIT, ErrorKind, ServeError, quote
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, check_inputs, check_outputs

_SCALARS = (str, int, float, bool, type(None))


def _scalar(value: Any) -> Any:
    # null passes here, to be dropped by _drop_nulls: the field's type stays null-free.
    if type(value) not in _SCALARS:
        raise ValueError("must be a string, number or boolean")
    return value


def _drop_nulls(parameters: dict[str, Any]) -> dict[str, Any]:
    if None in parameters.values():
        return {key: value for key, value in parameters.items() if value is not None}
    return parameters


# Every array and object of the envelope stops at its first bad element (fail_fast): by
# default pydantic validates all of them and keeps an error for each, though the message
# names only the first. A shape of 100,000 strings (a 400 KB body) made 65 MB of errors, a
# body of 100,000 ``{}`` inputs 190 MB and three seconds of CPU;
# tests/unit/test_hostile_parsers.py bounds the memory of every parse.
_FIRST_ERROR = Field(fail_fast=True)

ParamValueField = Annotated[str | int | float | bool, PlainValidator(_scalar)]
# A parameters object; a parameter whose value is null is absent.
ParametersField = Annotated[dict[str, ParamValueField], _FIRST_ERROR, AfterValidator(_drop_nulls)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class InputEnvelope(_Model):
    name: str
    shape: Annotated[list[int], _FIRST_ERROR]
    datatype: str
    parameters: ParametersField | None = None
    data: Any = None


class OutputEnvelope(_Model):
    name: str
    parameters: ParametersField | None = None


class RequestEnvelope(_Model):
    id: str | None = None
    parameters: ParametersField | None = None
    inputs: Annotated[list[InputEnvelope], _FIRST_ERROR]
    outputs: Annotated[list[OutputEnvelope], _FIRST_ERROR] | None = None


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


def parse_envelope(text: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> RequestEnvelope:
    """The validated envelope of a JSON request body; ``ServeError(BAD_INPUT)`` when the
    JSON is malformed (or nested too deep) or a field is missing or of the wrong type,
    ``ServeError(TOO_LARGE)`` when it has more inputs or outputs than ``limits`` allow
    (counted before pydantic builds an object for each)."""
    try:
        value = jsontext.parse(text)
    except jsontext.JSONError as exc:
        raise ServeError(ErrorKind.BAD_INPUT, f"malformed JSON: {exc}") from None
    if isinstance(value, dict):
        if isinstance(inputs := value.get("inputs"), list):
            check_inputs(len(inputs), limits)
        if isinstance(outputs := value.get("outputs"), list):
            check_outputs(len(outputs), limits)
    try:
        return RequestEnvelope.model_validate(value)
    except ValidationError as exc:
        raise ServeError(ErrorKind.BAD_INPUT, describe(exc.errors(include_url=False))) from None


def describe(errors: list[ErrorDetails]) -> str:
    """One sentence for the first of pydantic's errors (and how many more there are)."""
    first = errors[0]
    kind = first["type"]
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
    """``("inputs", 0, "shape")`` as ``inputs[0].shape``; a long key (a parameter's name is
    the client's) is cut, see :func:`~trioserve.core.errors.quote`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part if len(part) <= QUOTE_LIMIT else quote(part)
            text += f".{name}" if text else name
    return text


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
