"""A streaming MLServer runtime (tests/e2e/test_mlserver_streaming.py), written against
MLServer's API only.

``predict_stream`` answers each request of the stream (the BYTES input ``text``) with one
response per word, output ``token``; the request parameter ``delay`` (seconds) paces the words.
The text ``forever`` streams ticks (each padded with ``pad`` x's) until the stream is
cancelled; ``boom`` raises after one
word. When the generator ends, however it ends, its ``finally`` writes a marker file named
after the request id into ``$TRIOSERVE_TEST_MARKERS`` (when set): the ids of the requests it
saw and how many responses it yielded. Requests with the parameter ``collect`` are not answered
one by one: when the input ends, one response joins all their texts. ``predict`` answers the
word count.
"""

import asyncio
import json
import os
from pathlib import Path

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


class Streamer(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        words = StringCodec.decode_input(payload.inputs[0])[0].split()
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("count", np.array([len(words)]))],
        )

    async def predict_stream(self, payloads):
        seen = []
        produced = 0
        collected: list[str] = []
        try:
            async for payload in payloads:
                if payload.parameters is not None and getattr(payload.parameters, "collect", None):
                    collected.append(StringCodec.decode_input(payload.inputs[0])[0])
                    seen.append(payload.id or "")
                    continue
                seen.append(payload.id or "")
                text = StringCodec.decode_input(payload.inputs[0])[0]
                options = payload.parameters
                delay = float(getattr(options, "delay", 0) or 0) if options else 0.0
                pad = "x" * int(getattr(options, "pad", 0) or 0) if options else ""
                if text == "forever":
                    tick = 0
                    while True:
                        yield self._token(payload, f"tick{tick}{pad}")
                        produced += 1
                        tick += 1
                        await asyncio.sleep(delay or 0.01)
                for word in text.split():
                    if word == "boom":
                        raise InferenceError("boom: the model failed mid-stream")
                    yield self._token(payload, word)
                    produced += 1
                    if delay:
                        await asyncio.sleep(delay)
            if collected:  # stream in, one answer out: every input's text, joined
                yield self._token(payload, " ".join(collected))
                produced += 1
        finally:
            markers = os.environ.get("TRIOSERVE_TEST_MARKERS")
            if markers and seen:
                marker = Path(markers, f"closed-{seen[0]}")
                report = json.dumps({"ids": seen, "produced": produced})
                marker.write_text(report)  # noqa: ASYNC240 (a tiny file, at the end)

    def _token(self, payload: InferenceRequest, word: str) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[StringCodec.encode_output("token", [word])],
        )
