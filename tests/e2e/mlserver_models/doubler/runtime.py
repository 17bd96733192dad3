"""An MLServer runtime written against MLServer's API only (tests/e2e/test_mlserver_models.py).

Numeric inputs are multiplied by the factor read from the file ``parameters.uri`` names;
BYTES inputs are upper-cased; an input named ``fail`` makes predict raise MLServer's
InferenceError (400), one named ``crash`` a plain exception (500). The output ``request``
tells what the model saw: the request's id and parameters and each input's content type.
"""

import json
from pathlib import Path

from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class Doubler(MLModel):
    async def load(self) -> bool:
        path = Path(await get_model_uri(self.settings))
        self.factor = float(path.read_text())  # noqa: ASYNC240 (a tiny file, read once)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        seen = {
            "id": payload.id,
            "parameters": payload.parameters.model_dump(exclude_none=True)
            if payload.parameters
            else None,
            "content_types": {},
        }
        for tensor in payload.inputs:
            if tensor.name == "fail":
                raise InferenceError("the input 'fail' asks this model to fail")
            if tensor.name == "crash":
                raise RuntimeError("crashed on purpose")
            if tensor.parameters is not None and tensor.parameters.content_type:
                seen["content_types"][tensor.name] = tensor.parameters.content_type
            if tensor.datatype == "BYTES":
                texts = StringCodec.decode_input(tensor)
                outputs.append(StringCodec.encode_output(tensor.name, [t.upper() for t in texts]))
            else:
                array = NumpyCodec.decode_input(tensor)
                outputs.append(NumpyCodec.encode_output(tensor.name, array * self.factor))
        outputs.append(StringCodec.encode_output("request", [json.dumps(seen, sort_keys=True)]))
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id, outputs=outputs
        )
