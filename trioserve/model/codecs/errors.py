"""The codec errors of ``mlserver.codecs.errors``."""

from __future__ import annotations

from typing import Any

from ..errors import MLServerError
from ..types import RequestInput

__all__ = ["CodecError", "CodecNotFound", "InputsNotFound", "OutputNotFound"]


class CodecNotFound(MLServerError):
    def __init__(
        self,
        name: str | None = None,
        payload_type: str | None = None,
        is_input: bool = False,
        is_request: bool = False,
    ) -> None:
        what = ""
        if name:
            what = f"with name '{name}'"
            if payload_type:
                what = f"{what} and type {payload_type}"
        elif payload_type:
            what = f"with type {payload_type}"
        direction = "input" if is_input else "output"
        if is_request:
            category = f"{direction} request" if is_input else "output response"
        else:
            category = f"{direction} field"
        super().__init__(f"Codec not found for {category} {what}")


class CodecError(MLServerError):
    def __init__(self, msg: str) -> None:
        super().__init__(f"There was an error encoding / decoding the payload: {msg}")


class OutputNotFound(MLServerError):
    def __init__(self, output_idx: int, output_type: type, output_hints: list[Any]) -> None:
        expected = ", ".join(f"'{hint}'" for hint in output_hints)
        super().__init__(
            f"Unexpected output value at position '{output_idx}' ({output_type}). "
            f"Expected outputs are {expected} outputs."
        )


class InputsNotFound(MLServerError):
    def __init__(self, inputs: list[RequestInput], input_hints: dict[str, Any]) -> None:
        names = ", ".join(f"'{inp.name}'" for inp in inputs)
        available = ", ".join(f"'{name}'" for name in input_hints)
        super().__init__(f"Input {names} was not found. Available inputs are {available}.")
