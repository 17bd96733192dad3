"""Test harness for the demo handlers: run a handler the way a trioserve worker does.

:class:`ModelUnderTest` loads a handler with the worker's own loader (TorchServe's rules:
module-level ``handle`` or the module's one class), builds batches of
:class:`~trioserve.core.messages.WorkItem` requests, decodes them with the worker's codec
(JSON -> value, ``text/*`` -> str, else bytearray) and runs them with the worker's
``run_batch``. Intermediate responses (``send_intermediate_predict_response``) are captured
from the context's intermediate channel as the frames the worker would send, decoded back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trioserve.core import frames
from trioserve.core.messages import BatchReply, Param, WorkItem, decode_reply
from trioserve.worker.torchserve import ts_shim
from trioserve.worker.torchserve.batch import prepare, run_batch
from trioserve.worker.torchserve.context import Context
from trioserve.worker.torchserve.loader import load_handler
from trioserve.worker.torchserve.streaming import IntermediateChannel

HANDLERS = Path(__file__).resolve().parent


@dataclass
class Request:
    """One client request: the raw body parameter plus request headers."""

    body: bytes
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    parameter: str = "body"

    def to_item(self, request_id: str) -> WorkItem:
        headers = dict(self.headers)
        if self.content_type is not None:
            headers.setdefault("Content-Type", self.content_type)
        return WorkItem(
            request_id=request_id,
            headers=list(headers.items()),
            params=[Param(self.parameter, self.body, self.content_type)],
        )


@dataclass
class Result:
    """Everything the worker sent for one batch."""

    intermediate: list[BatchReply]
    final: BatchReply

    def chunks(self, request_id: str) -> list[bytes]:
        """The bodies sent to ``request_id``, in order, the final one last."""
        out = [
            bytes(reply.body)
            for frame in self.intermediate
            for reply in frame.replies
            if reply.request_id == request_id
        ]
        out += [bytes(r.body) for r in self.final.replies if r.request_id == request_id]
        return out


class ModelUnderTest:
    def __init__(self, entry: Any, context: Context) -> None:
        self.entry = entry
        self.context = context
        self._batches = 0

    def infer(self, requests: list[Request | tuple[bytes, str | None]]) -> Result:
        """Run one batch; a request is a :class:`Request` or ``(body, content type)``."""
        requests = [r if isinstance(r, Request) else Request(*r) for r in requests]
        self._batches += 1
        batch_id = self._batches
        sent: list[BatchReply] = []
        channel = IntermediateChannel(
            batch_id, lambda frame: sent.append(decode_reply(frames.decode(frame)))
        )
        items = [r.to_item(f"req-{batch_id}-{i}") for i, r in enumerate(requests)]
        data = prepare(self.context, items, channel=channel)
        final = run_batch(self.entry, self.context, batch_id, items, data)
        self.context.end_batch()
        return Result(sent, final)


@pytest.fixture
def ts_importable() -> None:
    """Make ``import ts.*`` work in this test (trioserve's shim when ``ts`` is absent)."""
    ts_shim.install()


@pytest.fixture
def load_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``load_model(handler_path, model_dir, *, manifest=None, model_yaml_config=None,
    batch_size=1)`` -> :class:`ModelUnderTest`.

    ``sys.path`` and ``sys.modules`` changes are undone afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    ts_shim.install()

    def load(
        handler: Path,
        model_dir: Path,
        *,
        manifest: dict[str, Any] | None = None,
        model_yaml_config: dict[str, Any] | None = None,
        batch_size: int = 1,
    ) -> ModelUnderTest:
        if manifest is None:
            manifest = {
                "runtime": "python",
                "model": {"modelName": "demo", "handler": handler.name, "modelVersion": "1.0"},
            }
        context = Context(
            manifest["model"]["modelName"],
            str(model_dir),
            manifest,
            batch_size,
            None,
            "0.12.0",
            model_yaml_config=model_yaml_config,
        )
        # Import the handler afresh from ``handler``, as a new worker process would.
        monkeypatch.delitem(sys.modules, handler.stem, raising=False)
        entry = load_handler(str(handler), str(model_dir), context)
        return ModelUnderTest(entry, context)

    return load
