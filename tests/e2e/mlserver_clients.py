"""MLServer's own client side against trioserve, run by tests/e2e/test_mlserver_models.py
in the ``.venv-mlserver`` environment (the real ``mlserver`` 1.7.1 package, its generated
gRPC stubs and converters, ``requests``): ``python mlserver_clients.py SCENARIO HTTP GRPC``.

Prints what it saw as one JSON document.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import grpc
import numpy as np
import requests
from mlserver.codecs import NumpyCodec, NumpyRequestCodec, StringCodec
from mlserver.grpc import dataplane_pb2 as pb
from mlserver.grpc import dataplane_pb2_grpc as pb_grpc
from mlserver.grpc.converters import ModelInferRequestConverter, ModelInferResponseConverter
from mlserver.types import InferenceRequest, InferenceResponse


def request(value: float, request_id: str) -> InferenceRequest:
    payload = NumpyRequestCodec.encode_request(
        np.array([[value, value + 1, value + 2]], np.float32)
    )
    payload.inputs[0].name = "x"
    payload.id = request_id
    return payload


def decoded(response: InferenceResponse) -> dict[str, Any]:
    found: dict[str, Any] = {"id": response.id, "model": response.model_name}
    for output in response.outputs:
        if output.datatype == "BYTES":
            found[output.name] = StringCodec.decode_output(output)
        else:
            found[output.name] = NumpyCodec.decode_output(output).tolist()
    return found


def main() -> None:
    scenario, http, target = sys.argv[1:4]
    result: Any
    if scenario == "rest":
        # what MLServer's docs show: a pydantic request posted with requests
        payload = request(1.0, "rest-1")
        reply = requests.post(
            f"{http}/v2/models/doubler/infer", json=payload.model_dump(), timeout=30
        )
        reply.raise_for_status()
        result = decoded(InferenceResponse.model_validate(reply.json()))
    elif scenario == "grpc":
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            message = ModelInferRequestConverter.from_types(
                request(2.0, "grpc-1"), model_name="doubler", model_version=""
            )
            response = stub.ModelInfer(message, timeout=30)
            result = decoded(ModelInferResponseConverter.to_types(response))
            ready = stub.ModelReady(pb.ModelReadyRequest(name="doubler"), timeout=30)
            meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="doubler"), timeout=30)
            result["ready"] = ready.ready
            result["inputs"] = [(t.name, t.datatype, list(t.shape)) for t in meta.inputs]
    elif scenario == "stream":
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            messages = [
                ModelInferRequestConverter.from_types(
                    request(float(i), f"s-{i}"), model_name=model, model_version=""
                )
                for i, model in enumerate(["doubler", "oip", "doubler"])
            ]
            responses = stub.ModelStreamInfer(iter(messages), timeout=30)
            result = [decoded(ModelInferResponseConverter.to_types(r)) for r in responses]
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
