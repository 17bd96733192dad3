"""A streaming text model for the demo store, written against MLServer's model API.

It continues a prompt with words from a small vocabulary: each next word is picked by a hash
of the two words before it, so the same prompt always gives the same text (no weights, no
randomness). ``predict_stream`` yields one response per word (output ``text``, one BYTES
element); ``predict`` answers the whole continuation at once. Request parameters:
``max_tokens`` (default from ``model-settings.json``) and ``delay`` (seconds per word, to see
the stream arrive; default 0).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse

VOCABULARY = (
    "the",
    "a",
    "small",
    "quick",
    "model",
    "server",
    "streams",
    "tokens",
    "over",
    "wire",
    "one",
    "at",
    "time",
    "while",
    "client",
    "reads",
    "every",
    "word",
    "arrives",
    "soon",
    "after",
    "it",
    "is",
    "made",
    "and",
    "nothing",
    "waits",
    "for",
    "whole",
    "answer",
    "so",
    "first",
    "token",
    "comes",
    "fast",
    "then",
    "rest",
    "follow",
    "in",
    "order",
    "until",
    "stream",
    "ends",
)
MAX_ALLOWED = 512


class TextGenerator(MLModel):
    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        self.default_tokens = int(extra.get("max_tokens", 16))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        words = [word async for word in self._words(payload)]
        return self._answer(payload, " ".join(words))

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            async for word in self._words(payload):
                yield self._answer(payload, word)

    async def _words(self, payload: InferenceRequest) -> AsyncIterator[str]:
        prompt, count, delay = self._read(payload)
        context = (prompt.split() or ["the"])[-2:]
        for _ in range(count):
            key = " ".join(context[-2:]).encode()
            word = VOCABULARY[
                int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % len(VOCABULARY)
            ]
            context.append(word)
            yield word
            if delay:
                await asyncio.sleep(delay)

    def _read(self, payload: InferenceRequest) -> tuple[str, int, float]:
        prompts = [i for i in payload.inputs if i.name == "prompt"]
        if len(prompts) != 1:
            raise InferenceError("send one BYTES input named 'prompt'")
        (prompt,) = StringCodec.decode_input(prompts[0]) or [""]
        options = payload.parameters
        count = int(getattr(options, "max_tokens", None) or self.default_tokens)
        delay = float(getattr(options, "delay", None) or 0.0)
        if not 0 < count <= MAX_ALLOWED:
            raise InferenceError(f"max_tokens must be between 1 and {MAX_ALLOWED}, not {count}")
        return prompt, count, delay

    def _answer(self, payload: InferenceRequest, text: str) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=[StringCodec.encode_output("text", [text])],
        )
