"""An MLServer runtime with adaptive batching (tests/e2e/test_mlserver_streaming.py): it
doubles ``x`` and answers, for every row, how many rows the ``predict`` call it ran in held.
The request parameter ``sleep`` (seconds) holds the call up first.
"""

import asyncio

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Batcher(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if payload.parameters is not None and getattr(payload.parameters, "sleep", None):
            await asyncio.sleep(float(payload.parameters.sleep))
        x = NumpyCodec.decode_input(payload.inputs[0])
        rows = np.full((x.shape[0], 1), x.shape[0], dtype=np.int64)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("y", x * 2), NumpyCodec.encode_output("rows", rows)],
        )
