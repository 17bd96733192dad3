"""OpenAI's answers: whole responses, stream chunks and usage (sans-IO).

A stream's chunks share everything but their text, so :class:`ChunkWriter` encodes the
common part of a chunk once and each piece of text with one ``json.dumps`` of the string:
the per-token cost of a chunk is one string escape and a join.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Final

from trioserve.core.openai.requests import Generation
from trioserve.core.openai.stops import FinishReason

DONE: Final = b"data: [DONE]\n\n"
_OBJECTS: Final = {"completion": "text_completion", "chat": "chat.completion"}
_PREFIXES: Final = {"completion": "cmpl-", "chat": "chatcmpl-"}


def new_id(generation: Generation) -> str:
    return _PREFIXES[generation.kind] + secrets.token_hex(12)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def prompt_tokens(prompt: str) -> int:
    """The prompt's length in tokens, estimated as its whitespace-separated words: the
    server has no tokenizer of the model's (docs/openai.md)."""
    return len(prompt.split())


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def response(
    generation: Generation,
    answer_id: str,
    created: int,
    text: str,
    finish: FinishReason,
    used: dict[str, int],
) -> bytes:
    """A whole (non-streamed) answer."""
    choice: dict[str, Any]
    if generation.kind == "chat":
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return _dumps(
        {
            "id": answer_id,
            "object": _OBJECTS[generation.kind],
            "created": created,
            "model": generation.model,
            "system_fingerprint": None,
            "choices": [choice],
            "usage": used,
        }
    )


class ChunkWriter:
    """The SSE events of one streamed answer."""

    def __init__(self, generation: Generation, answer_id: str, created: int) -> None:
        self._chat = generation.kind == "chat"
        self._usage = generation.include_usage
        head = {
            "id": answer_id,
            "object": "chat.completion.chunk" if self._chat else "text_completion",
            "created": created,
            "model": generation.model,
            "system_fingerprint": None,
        }
        self._head = _dumps(head)[:-1]  # without its closing brace
        self._tail = b',"usage":null}' if self._usage else b"}"
        if self._chat:
            self._text_open = b',"choices":[{"index":0,"delta":{"content":'
            self._text_close = b'},"logprobs":null,"finish_reason":null}]'
        else:
            self._text_open = b',"choices":[{"index":0,"text":'
            self._text_close = b',"logprobs":null,"finish_reason":null}]'

    def _event(self, middle: bytes, tail: bytes | None = None) -> bytes:
        return b"data: " + self._head + middle + (self._tail if tail is None else tail) + b"\n\n"

    def first(self) -> bytes:
        """A chat stream's first chunk: the assistant's role (completions have none)."""
        if not self._chat:
            return b""
        delta = b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        return self._event(delta + b'"logprobs":null,"finish_reason":null}]')

    def text(self, piece: str) -> bytes:
        return self._event(self._text_open + _dumps(piece) + self._text_close)

    def finish(self, reason: FinishReason) -> bytes:
        empty = b'"delta":{}' if self._chat else b'"text":""'
        middle = b',"choices":[{"index":0,' + empty + b',"logprobs":null,"finish_reason":'
        return self._event(middle + _dumps(reason) + b"}]")

    def usage(self, used: dict[str, int]) -> bytes:
        """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
        if not self._usage:
            return b""
        return self._event(b',"choices":[]', b',"usage":' + _dumps(used) + b"}")


def error_event(body: bytes) -> bytes:
    """A failure after the stream began: OpenAI's error object as one event."""
    return b"data: " + body + b"\n\n"


__all__ = ["DONE", "ChunkWriter", "error_event", "new_id", "prompt_tokens", "response", "usage"]
