"""Reference batched handler: a TorchServe ``BaseHandler`` subclass for a 256-feature MLP.

Runs unchanged on TorchServe and on trioserve. ``BaseHandler`` loads the TorchScript
``model.pt`` named by the manifest's ``serializedFile``; this class turns a batch of request
bodies into one ``[N, 256]`` float32 tensor and the logits into one answer per request.

Request body, one per request:
    256 little-endian float32 values (exactly 1024 bytes, application/octet-stream)
    or a JSON list of 256 numbers
Response, one per request: ``{"class": argmax, "probability": its softmax probability}``.

On trioserve the model's ``model-config.yaml`` declares ``tensorInputs: body: {dtype:
float32, shape: [256]}``, so the server collates the batch's raw bodies into one tensor and
the context hands it over without a copy (``context.get_batch_tensor("body")``); the handler
then skips per-request decoding. Without that (TorchServe, or a batch the server could not
collate) it decodes each body itself and stacks the rows.

Control inputs, for tests: a JSON body ``{"wrong_length": true}`` makes the handler return one
answer too many for its whole batch (the worker fails that batch: 503 "number of batch
response mismatched"); ``{"crash": true}`` kills the worker process with SIGKILL. The request
header ``X-Batched-Control: wrong_length`` (or ``crash``) does the same for a request with an
ordinary body: trioserve refuses bodies that do not fit a declared tensor input (400) before
they reach the handler, so with the shipped model-config.yaml only the header reaches it.

Every batch's size is recorded as the metric ``BatchSize`` and, when the environment variable
``TRIOSERVE_BATCH_LOG`` names a file, appended to that file as one line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from array import array
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

log = logging.getLogger(__name__)

NUM_FEATURES = 256
BODY_BYTES = NUM_FEATURES * 4  # little-endian float32
TENSOR_INPUT = "body"
BATCH_LOG_ENV = "TRIOSERVE_BATCH_LOG"
CONTROLS = ("crash", "wrong_length")
CONTROL_HEADER = "X-Batched-Control"


class BatchedHandler(BaseHandler):
    """Argmax classifier over a batch, using the server-collated tensor when there is one."""

    _batch_log: tuple[str, int] | None = None  # $TRIOSERVE_BATCH_LOG and its open descriptor

    # -- request -> tensor -------------------------------------------------------------------

    @staticmethod
    def _request_value(row: Any) -> Any:
        """The request's payload: the raw body, or a form field / gRPC input named ``data``."""
        if isinstance(row, dict):
            for key in ("body", "data"):
                if key in row:
                    return row[key]
            if len(row) == 1:
                return next(iter(row.values()))
        return row

    @staticmethod
    def control(value: Any) -> str | None:
        """``"crash"`` or ``"wrong_length"`` for a control input, else None.

        Cheap for ordinary inputs: a 1024-byte body or a decoded JSON list is never parsed.
        """
        if isinstance(value, bytes | bytearray | memoryview):
            if len(value) == BODY_BYTES or not bytes(value).lstrip().startswith(b"{"):
                return None
            try:
                value = json.loads(bytes(value))
            except (UnicodeDecodeError, ValueError):
                return None
        elif isinstance(value, str):
            if not value.lstrip().startswith("{"):
                return None
            try:
                value = json.loads(value)
            except ValueError:
                return None
        if isinstance(value, dict):
            for name in CONTROLS:
                if value.get(name) is True:
                    return name
        return None

    @staticmethod
    def header_controls(context: Any, count: int) -> set[str]:
        """The controls asked for with the ``X-Batched-Control`` request header."""
        found = set()
        for idx in range(count):
            try:
                value = context.get_request_header(idx, CONTROL_HEADER)
            except (AttributeError, IndexError, KeyError, RuntimeError, TypeError):
                return found
            if isinstance(value, bytes | bytearray):
                value = bytes(value).decode("latin-1")
            if isinstance(value, str) and value.strip().lower() in CONTROLS:
                found.add(value.strip().lower())
        return found

    @staticmethod
    def parse_features(value: Any, idx: int = 0) -> torch.Tensor:
        """One request's body as a float32 tensor of shape [256]; ValueError if malformed."""
        where = f"request {idx}"
        expected = (
            f"expected {BODY_BYTES} bytes ({NUM_FEATURES} little-endian float32 values) "
            f"or a JSON list of {NUM_FEATURES} numbers"
        )
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            if len(raw) == BODY_BYTES:
                # A copy: the tensor must not alias (or need to write to) the request buffer.
                return torch.frombuffer(bytearray(raw), dtype=torch.float32)
            try:
                value = json.loads(raw)
            except (UnicodeDecodeError, ValueError):
                raise ValueError(f"{where}: body is {len(raw)} bytes: {expected}") from None
        elif isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"{where}: body is not valid JSON ({exc}): {expected}") from None
        if not isinstance(value, list):
            raise ValueError(f"{where}: {expected}, got a JSON {type(value).__name__}")
        if len(value) != NUM_FEATURES:
            raise ValueError(
                f"{where}: expected a JSON list of {NUM_FEATURES} numbers, got {len(value)}"
            )
        for pos, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise ValueError(f"{where}: element {pos} is {item!r}, expected a number")
        return torch.tensor(value, dtype=torch.float32)

    def collated(self, data: list[Any]) -> torch.Tensor | None:
        """The server-collated ``[N, 256]`` body tensor, or None when there is none to use.

        Used only when the context offers it (a trioserve addition), it has the batch's shape
        and dtype, and every request's body is raw bytes: a body the worker decoded (JSON,
        text) was not collated as float32 values.
        """
        context = self.context
        names = getattr(context, "batch_tensor_names", None)
        get = getattr(context, "get_batch_tensor", None)
        if not callable(names) or not callable(get):
            return None
        try:
            if TENSOR_INPUT not in names():
                return None
            tensor = get(TENSOR_INPUT)
        except LookupError:
            return None
        if (
            not isinstance(tensor, torch.Tensor)
            or tensor.dtype != torch.float32
            or tuple(tensor.shape) != (len(data), NUM_FEATURES)
        ):
            return None
        for row in data:
            if not isinstance(self._request_value(row), bytes | bytearray | memoryview):
                return None
        return tensor

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        batch = self.collated(data)
        if batch is None:
            rows = []
            for idx, row in enumerate(data):
                value = self._request_value(row)
                if self.control(value) is not None:
                    rows.append(torch.zeros(NUM_FEATURES))  # answered, then discarded
                else:
                    rows.append(self.parse_features(value, idx))
            batch = torch.stack(rows)
        # A finite sum means every value is finite (a NaN or an infinity makes the sum NaN or
        # infinite); two tensor calls instead of three on the common path. Only a non-finite
        # sum, which huge finite values can also give, looks at the values one by one.
        if not math.isfinite(float(batch.sum())) and not bool(torch.isfinite(batch).all()):
            idx = int((~torch.isfinite(batch).all(dim=1)).nonzero()[0, 0])
            raise ValueError(f"request {idx}: the input holds a NaN or infinite value")
        return batch  # inference() moves it to the model's device

    # -- logits -> response ------------------------------------------------------------------

    def postprocess(self, data: torch.Tensor) -> list[dict[str, Any]]:
        """The argmax class and its softmax probability, per row of logits.

        One tensor call (``tolist``) and the rest in Python: right after the forward pass
        the caches hold the model's weights, and each small tensor call (softmax, max, two
        ``tolist``) then costs tens of microseconds, more than this loop over 16 x 10 values.
        The probability of the top class is ``1 / sum(exp(logit - top))``, rounded to float32
        like the logits (rows whose logits differ in the last bit give the same answer).
        """
        if data.dtype != torch.float32:
            data = data.float()
        classes = []
        totals = []
        exp = math.exp
        for row in data.tolist():
            top = max(row)
            total = 0.0
            for value in row:
                total += exp(value - top)
            classes.append(row.index(top))
            totals.append(1.0 / total)
        probabilities = array("f", totals).tolist()
        return [{"class": c, "probability": p} for c, p in zip(classes, probabilities, strict=True)]

    # -- the batch ---------------------------------------------------------------------------

    def record_batch(self, context: Any, size: int) -> None:
        """Metric ``BatchSize`` and a line in ``$TRIOSERVE_BATCH_LOG``; never fails the batch.

        The log is opened once (``O_APPEND``: every line is one ``write``, whole even when
        several workers share the file)."""
        metrics = getattr(context, "metrics", None)
        if metrics is not None and hasattr(metrics, "add_metric"):
            try:
                metrics.add_metric("BatchSize", size, "count")
            except Exception:
                log.exception("recording the BatchSize metric failed")
        path = os.environ.get(BATCH_LOG_ENV)
        if not path:
            return
        try:
            if self._batch_log is None or self._batch_log[0] != path:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._batch_log = (path, fd)
            os.write(self._batch_log[1], f"{size}\n".encode())
        except OSError:
            log.exception("cannot append to %s=%s", BATCH_LOG_ENV, path)

    def handle(self, data: list[Any], context: Any) -> Any:
        self.record_batch(context, len(data))
        controls = {self.control(self._request_value(row)) for row in data}
        controls |= self.header_controls(context, len(data))
        if "crash" in controls:
            log.warning("crash requested: killing worker process %d", os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
        answers = super().handle(data, context)
        if "wrong_length" in controls and isinstance(answers, list):
            answers = [*answers, {"class": -1, "probability": 0.0}]
        return answers
