"""Streaming demo handler: sends a text back one word at a time.

A module-level TorchServe handler (``handle(data, context)``) that streams with
``send_intermediate_predict_response``, so an HTTP client sees a chunked response (one chunk
per word) and a gRPC ``StreamPredictions`` client one message per word.

Request body, one per request:
    a text prompt (``str``, or UTF-8 ``bytes``), or JSON ``{"prompt": "...", "tokens": n}``.

For a prompt of words ``w1 .. wk`` the handler sends ``"w1 "``, ``"w2 "``, ... as intermediate
chunks, ``delay_ms`` apart, and returns ``"[done]"`` as the final chunk, so the chunks
concatenate to ``"w1 w2 ... wk [done]"``. With ``"tokens": n`` exactly ``n`` words are sent,
cycling through the prompt when ``n > k`` (``n = 0``: just ``"[done]"``). The output depends
on the input only.

The pause between words is ``handler.delay_ms`` in ``model-config.yaml`` (default 50 ms).
Requests of one batch are streamed side by side: every round sends the next word of each
request that still has one.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response

DEFAULT_DELAY_MS = 50.0
FINAL_CHUNK = "[done]"
CONTENT_TYPE = "text/plain; charset=utf-8"
INTERMEDIATE_MESSAGE = "Intermediate Prediction success"
MAX_TOKENS = 10_000


def delay_seconds(context: Any) -> float:
    """``handler.delay_ms`` from the model's YAML config, in seconds (default 50 ms)."""
    config = getattr(context, "model_yaml_config", None) or {}
    handler_config = config.get("handler") if isinstance(config, dict) else None
    value: Any = DEFAULT_DELAY_MS
    if isinstance(handler_config, dict) and handler_config.get("delay_ms") is not None:
        value = handler_config["delay_ms"]
    try:
        delay_ms = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"handler.delay_ms must be a number of milliseconds, got {value!r}"
        ) from None
    if not delay_ms >= 0:  # also rejects NaN
        raise ValueError(f"handler.delay_ms must be >= 0, got {value!r}")
    return delay_ms / 1000.0


def _payload(row: Any) -> Any:
    if isinstance(row, dict):
        for key in ("body", "data"):
            if key in row:
                return row[key]
        if len(row) == 1:
            return next(iter(row.values()))
    return row


def parse_request(value: Any, idx: int = 0) -> tuple[str, int | None]:
    """``(prompt, tokens)`` for one request; ``tokens`` is None when not given."""
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"request {idx}: prompt is not UTF-8 text: {exc}") from None
    if isinstance(value, str) and value.lstrip().startswith("{"):
        # A JSON object sent without a JSON content type (e.g. curl -T / --data-binary).
        # Plain text that merely starts with "{" stays a prompt.
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if isinstance(value, str):
        return value, None
    if isinstance(value, dict):
        prompt = value.get("prompt", "")
        if not isinstance(prompt, str):
            raise ValueError(f'request {idx}: "prompt" must be a string')
        tokens = value.get("tokens")
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0
        ):
            raise ValueError(f'request {idx}: "tokens" must be a non-negative integer')
        if tokens is not None and tokens > MAX_TOKENS:
            raise ValueError(f'request {idx}: "tokens" must be at most {MAX_TOKENS}')
        return prompt, tokens
    raise ValueError(
        f'request {idx}: expected a text prompt or {{"prompt": ..., "tokens": n}}, '
        f"got {type(value).__name__}"
    )


def plan_chunks(prompt: str, tokens: int | None = None) -> list[str]:
    """The intermediate chunks for one request (the final ``[done]`` chunk not included)."""
    words = prompt.split()
    if tokens is None:
        chosen = words
    elif not words:
        chosen = []
    else:
        chosen = [words[i % len(words)] for i in range(tokens)]
    return [word + " " for word in chosen]


def expected_text(prompt: str, tokens: int | None = None) -> str:
    """Everything a client receives for one request, all chunks concatenated."""
    return "".join(plan_chunks(prompt, tokens)) + FINAL_CHUNK


def _request_id(context: Any, idx: int) -> str:
    request_ids = getattr(context, "request_ids", None) or {}
    if idx in request_ids:
        return str(request_ids[idx])
    return str(context.get_request_id(idx))


def handle(data: list[Any] | None, context: Any) -> list[str] | None:
    """TorchServe entry point. Called once with ``data=None`` when the model loads."""
    if data is None:
        delay_seconds(context)  # fail at load time on a bad config, not on the first request
        return None
    delay = delay_seconds(context)
    plans = [plan_chunks(*parse_request(_payload(row), idx)) for idx, row in enumerate(data)]
    for idx in range(len(data)):
        context.set_response_content_type(idx, CONTENT_TYPE)

    rounds = max((len(chunks) for chunks in plans), default=0)
    for step in range(rounds):
        if step:
            time.sleep(delay)
        active = [idx for idx, chunks in enumerate(plans) if step < len(chunks)]
        ret = [chunks[step] if step < len(chunks) else "" for chunks in plans]
        req_id_map = {idx: _request_id(context, idx) for idx in active}
        send_intermediate_predict_response(ret, req_id_map, INTERMEDIATE_MESSAGE, 200, context)
    if rounds:
        time.sleep(delay)
    return [FINAL_CHUNK for _ in data]
