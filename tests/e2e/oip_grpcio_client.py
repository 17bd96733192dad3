"""A grpcio client of ``inference.GRPCInferenceService``, run as a subprocess by
tests/e2e/test_oip_grpc.py: ``python oip_grpcio_client.py STUBS_DIR TARGET SCENARIO``.

It imports the stubs grpcio-tools generated from proto/grpc_predict_v2.proto into STUBS_DIR
(in its own process: tritonclient.grpc registers the same ``inference.*`` message names in
protobuf's descriptor pool, so the two cannot share one), runs one scenario and prints what
it saw as one JSON document.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import grpc


def main() -> None:
    stubs, target, scenario = sys.argv[1:4]
    sys.path.insert(0, stubs)
    import grpc_predict_v2_pb2 as pb  # type: ignore[import-not-found]
    import grpc_predict_v2_pb2_grpc as pb_grpc  # type: ignore[import-not-found]

    def request(request_id: str, value: float, model: str = "oip") -> Any:
        return pb.ModelInferRequest(
            model_name=model,
            id=request_id,
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="x",
                    datatype="FP32",
                    shape=[2],
                    contents=pb.InferTensorContents(fp32_contents=[value, value + 1]),
                )
            ],
        )

    def answer(response: Any) -> dict[str, Any]:
        outputs = []
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            count = len(raw) // 8
            assert output.datatype in ("FP64", "INT64"), output.datatype
            code = "d" if output.datatype == "FP64" else "q"
            outputs.append(
                {
                    "name": output.name,
                    "datatype": output.datatype,
                    "shape": list(output.shape),
                    "values": list(struct.unpack(f"<{count}{code}", raw)),
                }
            )
        return {"id": response.id, "model": response.model_name, "outputs": outputs}

    result: dict[str, Any] = {}
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        if scenario == "infer":
            typed = stub.ModelInfer(
                pb.ModelInferRequest(
                    model_name="oip",
                    id="typed",
                    inputs=[
                        pb.ModelInferRequest.InferInputTensor(
                            name="n",
                            datatype="INT32",
                            shape=[2, 2],
                            contents=pb.InferTensorContents(int_contents=[1, 2, 3, 4]),
                        ),
                        pb.ModelInferRequest.InferInputTensor(
                            name="f",
                            datatype="FP64",
                            shape=[1],
                            contents=pb.InferTensorContents(fp64_contents=[0.25]),
                        ),
                    ],
                    outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="f")],
                ),
                timeout=30,
            )
            raw = stub.ModelInfer(
                pb.ModelInferRequest(
                    model_name="oip",
                    model_version="1.0",
                    id="raw",
                    inputs=[
                        pb.ModelInferRequest.InferInputTensor(name="r", datatype="INT64", shape=[3])
                    ],
                    raw_input_contents=[struct.pack("<3q", 5, -6, 7)],
                ),
                timeout=30,
            )
            result = {"typed": answer(typed), "raw": answer(raw)}
        elif scenario == "stream":
            responses = stub.ModelStreamInfer(
                iter([request("a", 1.0), request("b", 2.0), request("c", 3.0)]), timeout=30
            )
            result = {"answers": [answer(response) for response in responses]}
        elif scenario == "stream_error":
            responses = stub.ModelStreamInfer(
                iter([request("a", 1.0), request("b", 2.0, model="nope"), request("c", 3.0)]),
                timeout=30,
            )
            answers = []
            try:
                for response in responses:
                    answers.append(answer(response))
            except grpc.RpcError as error:
                result["code"] = error.code().name
                result["details"] = error.details()
            result["answers"] = answers
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
