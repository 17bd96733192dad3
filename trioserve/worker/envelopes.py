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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from trioserve.core.errors import ServeError
from trioserve.core.oip.request import InferRequest, parse_infer_request
from trioserve.worker.errors import LoadError, PredictionException
from trioserve.worker.oip import answer_tensor, input_row

Entry = Callable[[Any, Any], Any]

SUPPORTED = ("body", "json", "kserve", "kservev2")


def _instances(row: Any, idx: int) -> list[Any]:
    value = row.get("data") if isinstance(row, dict) else None
    if value is None and isinstance(row, dict):
        value = row.get("body")
    if isinstance(value, bytes | bytearray | str):
        try:
            value = json.loads(value)
        except ValueError:
            raise PredictionException(f"request {idx}: body is not JSON", 400) from None
    if not isinstance(value, dict) or not isinstance(value.get("instances"), list):
        raise PredictionException(
            f'request {idx}: the json envelope expects {{"instances": [...]}}', 400
        )
    instances: list[Any] = value["instances"]
    return instances


def json_envelope(entry: Entry, *, explain_key: bool = False) -> Entry:
    """``explain_key``: an explanation request's answers go under ``explanations``."""

    def wrapped(data: Any, context: Any) -> Any:
        if data is None:  # a function handler's initialisation call
            return entry(data, context)
        groups = [_instances(row, idx) for idx, row in enumerate(data)]
        flat = [instance for group in groups for instance in group]
        answers = entry(flat, context)
        if not isinstance(answers, list) or len(answers) != len(flat):
            return answers  # the worker reports the malformed answer
        out: list[dict[str, Any]] = []
        start = 0
        for idx, group in enumerate(groups):
            key = "predictions"
            if explain_key and str(context.get_request_header(idx, "explain")) == "True":
                key = "explanations"
            out.append({key: answers[start : start + len(group)]})
            start += len(group)
        return out

    return wrapped


def _v2_request(row: Any, idx: int) -> InferRequest:
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
        return parse_infer_request(bytes(value), header_length=None)
    except ServeError as error:
        raise PredictionException(f"request {idx}: {error.message}", 400) from None


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


def kservev2_envelope(entry: Entry) -> Entry:
    def wrapped(data: Any, context: Any) -> Any:
        if data is None:
            return entry(data, context)
        rows: list[dict[str, Any]] = []
        groups: list[tuple[str | None, int]] = []  # each request: its id, its row count
        for idx, row in enumerate(data):
            request = _v2_request(row, idx)
            rows.extend(input_row(tensor) for tensor in request.inputs)
            groups.append((request.id, len(request.inputs)))
        answers = entry(rows, context)
        if not isinstance(answers, list) or len(answers) != len(rows):
            return answers  # the worker reports the malformed answer
        out: list[dict[str, Any]] = []
        start = 0
        for idx, (request_id, count) in enumerate(groups):
            outputs = [
                _output(rows[i]["name"], answers[i], rows[i]["datatype"])
                for i in range(start, start + count)
            ]
            start += count
            out.append(
                {
                    "id": request_id or context.get_request_id(idx),
                    "model_name": context.model_name,
                    "outputs": outputs,
                }
            )
        return out

    return wrapped


def validate(envelope: str | None) -> None:
    """Raise :class:`LoadError` unless the envelope is supported (or there is none)."""
    if envelope and envelope not in SUPPORTED:
        raise LoadError(
            f"request envelope {envelope!r} is not supported by trioserve's worker "
            f"(supported: {', '.join(SUPPORTED)}); remove it from the model config or use one "
            "of those"
        )


def wrap(envelope: str | None, entry: Entry) -> Entry:
    """``entry`` wrapped in the named envelope (no name: unchanged)."""
    validate(envelope)
    if envelope == "json":
        return json_envelope(entry)
    if envelope == "kserve":
        return json_envelope(entry, explain_key=True)
    if envelope == "kservev2":
        return kservev2_envelope(entry)
    return entry
