"""Request envelopes: optional wrappers around a handler's entry point.

* ``body``: the entry point sees the requests as they are (a no-op wrapper).
* ``json``: each request's ``data`` (or ``body``) is a JSON object ``{"instances": [...]}``;
  the entry point is called once with all instances of the batch, flattened, and its answers
  are regrouped into one ``{"predictions": [...]}`` per request.
* ``kserve`` (KServe v1): as ``json``; an explanation request (``/explanations``) is
  answered ``{"explanations": [...]}``.
* ``kservev2`` (KServe v2, the Open Inference Protocol's JSON): each request's body is an
  inference request; the entry point gets one row per input tensor of every request
  (``{"name", "shape", "datatype", "data"}``, data nested in its shape, as the OIP routes give
  it) and answers one element per row, which becomes the output named after that row's
  input: one ``{"id", "model_name", "outputs": [...]}`` per request.

TorchServe's ``kserve`` and ``kservev2`` envelopes read only the first request of a batch;
these read every request.

Each is a class with TorchServe's envelope API (``ts.torch_handler.request_envelope.*``
names them): :class:`BaseEnvelope` wraps an entry point, and its ``handle(data, context)``
runs ``parse_input``, the entry point, then ``format_output``, so an envelope a user wrote
against TorchServe's base class runs unchanged. :func:`wrap` is how the loader applies one.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from trioserve.core import jsontext
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.core.limits import DEFAULT_LIMITS, RequestLimits, check_instances
from trioserve.core.oip.request import InferRequest, parse_infer_request
from trioserve.worker.errors import LoadError
from trioserve.worker.torchserve.batch import Entry
from trioserve.worker.torchserve.errors import PredictionException
from trioserve.worker.torchserve.oip import answer_tensor, input_row


class BaseEnvelope(ABC):
    """TorchServe's envelope base class: parse the batch, call the entry point, format."""

    # What one request may expand to (``wrap`` sets the worker's): bodies are parsed here.
    limits: RequestLimits = DEFAULT_LIMITS

    def __init__(self, handle_fn: Entry) -> None:
        self._handle_fn = handle_fn
        self.context: Any = None

    def handle(self, data: Any, context: Any) -> Any:
        self.context = context
        if data:  # None: a function handler's initialisation call
            data = self.parse_input(data)
        results = self._handle_fn(data, context)
        if results:
            results = self.format_output(results)
        return results

    @abstractmethod
    def parse_input(self, data: Any) -> Any: ...

    @abstractmethod
    def format_output(self, data: Any) -> Any: ...


class BodyEnvelope(BaseEnvelope):
    """The requests as they are."""

    def parse_input(self, data: Any) -> Any:
        return data

    def format_output(self, data: Any) -> Any:
        return data


def _failure(idx: int, error: ServeError) -> PredictionException:
    """The batch's failure for request ``idx``'s bad body: 413 beyond a limit, else 400."""
    code = 413 if error.kind is ErrorKind.TOO_LARGE else 400
    return PredictionException(f"request {idx}: {error.message}", code)


def _instances(row: Any, idx: int, limits: RequestLimits) -> list[Any]:
    value = row.get("data") if isinstance(row, dict) else None
    if value is None and isinstance(row, dict):
        value = row.get("body")
    if isinstance(value, bytes | bytearray | str):
        try:
            value = jsontext.parse(value)
        except jsontext.JSONError:
            raise PredictionException(f"request {idx}: body is not JSON", 400) from None
    if not isinstance(value, dict) or not isinstance(value.get("instances"), list):
        raise PredictionException(
            f'request {idx}: the json envelope expects {{"instances": [...]}}', 400
        )
    instances: list[Any] = value["instances"]
    try:
        check_instances(len(instances), limits)
    except ServeError as error:
        raise _failure(idx, error) from None
    return instances


class JSONEnvelope(BaseEnvelope):
    """``{"instances": [...]}`` in, ``{"predictions": [...]}`` out, per request."""

    explain_key = False  # kserve: an explanation request's answers go under "explanations"

    def parse_input(self, data: Any) -> Any:
        groups = [_instances(row, idx, self.limits) for idx, row in enumerate(data)]
        self._sizes = [len(group) for group in groups]
        return [instance for group in groups for instance in group]

    def format_output(self, data: Any) -> Any:
        if not isinstance(data, list) or len(data) != sum(self._sizes):
            return data  # the worker reports the malformed answer
        out: list[dict[str, Any]] = []
        start = 0
        for idx, size in enumerate(self._sizes):
            key = "predictions"
            if self.explain_key and str(self.context.get_request_header(idx, "explain")) == "True":
                key = "explanations"
            out.append({key: data[start : start + size]})
            start += size
        return out


class KServeEnvelope(JSONEnvelope):
    explain_key = True


def _v2_request(row: Any, idx: int, limits: RequestLimits) -> InferRequest:
    value = row.get("data") if isinstance(row, dict) else None
    if value is None and isinstance(row, dict):
        value = row.get("body")
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, dict | list):
        value = json.dumps(value).encode()
    if not isinstance(value, bytes | bytearray):
        raise PredictionException(f"request {idx}: the kservev2 envelope expects a JSON body", 400)
    try:
        return parse_infer_request(bytes(value), header_length=None, limits=limits)
    except ServeError as error:
        raise _failure(idx, error) from None


def _output(name: str, answer: Any, datatype: str) -> dict[str, Any]:
    try:
        tensor = answer_tensor(name, answer, datatype)
        data = tensor.to_json()
    except ServeError as error:
        raise PredictionException(
            f"the handler's answer is not a valid output: {error.message}", 500
        ) from None
    return {
        "name": tensor.name,
        "shape": list(tensor.shape),
        "datatype": tensor.datatype,
        "data": data,
    }


class KServev2Envelope(BaseEnvelope):
    """OIP JSON requests in, one row per input tensor; one output per row out."""

    def parse_input(self, data: Any) -> Any:
        self._rows: list[dict[str, Any]] = []
        self._groups: list[tuple[str | None, int]] = []  # each request: its id, its rows
        for idx, row in enumerate(data):
            request = _v2_request(row, idx, self.limits)
            self._rows.extend(input_row(tensor) for tensor in request.inputs)
            self._groups.append((request.id, len(request.inputs)))
        return self._rows

    def format_output(self, data: Any) -> Any:
        rows = self._rows
        if not isinstance(data, list) or len(data) != len(rows):
            return data  # the worker reports the malformed answer
        out: list[dict[str, Any]] = []
        start = 0
        for idx, (request_id, count) in enumerate(self._groups):
            outputs = [
                _output(rows[i]["name"], data[i], rows[i]["datatype"])
                for i in range(start, start + count)
            ]
            start += count
            out.append(
                {
                    "id": request_id or self.context.get_request_id(idx),
                    "model_name": self.context.model_name,
                    "outputs": outputs,
                }
            )
        return out


ENVELOPES: dict[str, type[BaseEnvelope]] = {
    "body": BodyEnvelope,
    "json": JSONEnvelope,
    "kserve": KServeEnvelope,
    "kservev2": KServev2Envelope,
}
SUPPORTED = tuple(ENVELOPES)


def validate(envelope: str | None) -> None:
    """Raise :class:`LoadError` unless the envelope is supported (or there is none)."""
    if envelope and envelope not in SUPPORTED:
        raise LoadError(
            f"request envelope {envelope!r} is not supported by trioserve's worker "
            f"(supported: {', '.join(SUPPORTED)}); remove it from the model config or use one "
            "of those"
        )


def wrap(envelope: str | None, entry: Entry, limits: RequestLimits = DEFAULT_LIMITS) -> Entry:
    """``entry`` wrapped in the named envelope (none, or ``body``: unchanged); the envelope
    holds the bodies it parses to ``limits``."""
    validate(envelope)
    if not envelope or envelope == "body":
        return entry
    wrapper = ENVELOPES[envelope](entry)
    wrapper.limits = limits
    return wrapper.handle


__all__ = [
    "ENVELOPES",
    "SUPPORTED",
    "BaseEnvelope",
    "BodyEnvelope",
    "JSONEnvelope",
    "KServeEnvelope",
    "KServev2Envelope",
    "validate",
    "wrap",
]
