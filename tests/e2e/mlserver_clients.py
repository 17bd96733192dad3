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
from mlserver.types import InferenceRequest, InferenceResponse, Parameters


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


def text(words: str, request_id: str, grpc: bool = False, **parameters: Any) -> InferenceRequest:
    """A BYTES input ``text`` (str elements for JSON, bytes for gRPC, as MLServer's docs)."""
    payload = InferenceRequest(
        id=request_id, inputs=[StringCodec.encode_input("text", [words], use_bytes=grpc)]
    )
    if parameters:
        payload.parameters = Parameters(**parameters)
    return payload


def streams(scenario: str, target: str) -> Any:
    """ModelStreamInfer with MLServer's stubs and converters (MLServer's response shape)."""
    model = "doubler" if scenario == "predict_each" else "streamer"
    if scenario == "tokens":  # unary in, stream out
        payloads = [text("alpha beta gamma", "t-1", True)]
    elif scenario == "tokens_in":  # stream in, stream out
        payloads = [
            text("alpha beta", "t-1", True),
            text("gamma", "t-2", True),
            text("delta", "t-3", True),
        ]
    elif scenario == "collect":  # stream in, one answer out
        payloads = [text(w, f"c-{w}", True, collect=True) for w in ("red", "green", "blue")]
    elif scenario == "boom":  # the model raises after two answers
        payloads = [text("one two boom three", "boom", True)]
    elif scenario == "predict_each":  # stream in, one answer each (no predict_stream)
        payloads = [
            NumpyRequestCodec.encode_request(np.array([float(i)], np.float32)) for i in range(3)
        ]
        for i, payload in enumerate(payloads):
            payload.inputs[0].name = "x"
            payload.id = f"p-{i}"
    else:  # cancel: a stream that never ends, cancelled after three answers
        payloads = [text("forever", "grpc-cancel", True, delay=0.01)]
    if scenario == "deadline":
        payloads = []
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        messages = [
            ModelInferRequestConverter.from_types(p, model_name=model, model_version="")
            for p in payloads
        ]
        if scenario == "deadline":
            forever = ModelInferRequestConverter.from_types(
                text("forever", "grpc-deadline", True, delay=0.01), model_name=model,
                model_version="",
            )  # fmt: skip
            call = stub.ModelStreamInfer(iter([forever]), timeout=1.0)
            got = []
            try:
                for response in call:
                    got.append(decoded(ModelInferResponseConverter.to_types(response)))
            except grpc.RpcError as error:
                return {
                    "answers": len(got),
                    "status": str(error.code()),
                    "details": error.details(),
                }
            return {"answers": len(got), "status": "OK"}
        if scenario == "boom":
            got = []
            try:
                for response in stub.ModelStreamInfer(iter(messages), timeout=30):
                    got.append(decoded(ModelInferResponseConverter.to_types(response)))
            except grpc.RpcError as error:
                return {"got": got, "status": str(error.code()), "details": error.details()}
            return {"got": got, "status": "OK"}
        if scenario == "cancel":
            gate = __import__("threading").Event()

            def requests_then_wait() -> Any:
                yield from messages
                gate.wait(30)  # keep the input open: the client cancels instead

            call = stub.ModelStreamInfer(requests_then_wait(), timeout=30)
            got = [decoded(ModelInferResponseConverter.to_types(next(call))) for _ in range(3)]
            call.cancel()
            gate.set()
            return got
        responses = stub.ModelStreamInfer(iter(messages), timeout=30)
        return [decoded(ModelInferResponseConverter.to_types(r)) for r in responses]


def serialized(payload: InferenceRequest) -> dict[str, Any]:
    """``payload`` as MLServer's types serialize it, four ways: ``.dict()`` (every unset
    optional field as null, what MLServer's docs post), ``.dict(exclude_none=True)``,
    ``.model_dump()`` (MLServer's default leaves nulls out) and ``.model_dump()`` told to keep
    them."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic: .dict() is deprecated (clients use it)
        return {
            "dict": payload.dict(),
            "dict_exclude_none": payload.dict(exclude_none=True),
            "model_dump": payload.model_dump(),
            "model_dump_nulls": payload.model_dump(exclude_none=False, exclude_unset=False),
        }


def nulls(http: str) -> Any:
    """Every REST inference route, with MLServer's own request types serialized each way:
    ``requests`` for ``infer`` / ``generate``, ``httpx_sse`` for the two SSE routes."""
    import httpx
    from httpx_sse import connect_sse
    from mlserver.types import RequestOutput

    numbers = request(1.0, "n-1")
    numbers.outputs = [RequestOutput(name="x")]
    words = text("one two", "w-1")
    words.inputs[0].parameters = Parameters(content_type="str")
    result: dict[str, Any] = {}
    for way, body in serialized(numbers).items():
        seen: dict[str, Any] = {"nulls": "null" in json.dumps(body)}
        reply = requests.post(f"{http}/v2/models/doubler/infer", json=body, timeout=30)
        seen["infer"] = [reply.status_code, reply.json()]
        if reply.ok:
            seen["infer"][1] = decoded(InferenceResponse.model_validate(reply.json()))
        result[way] = seen
    for way, body in serialized(words).items():
        seen = result[way]
        seen["text_nulls"] = "null" in json.dumps(body)
        reply = requests.post(f"{http}/v2/models/streamer/generate", json=body, timeout=30)
        seen["generate"] = [reply.status_code, reply.json()]
        if reply.ok:
            seen["generate"][1] = decoded(InferenceResponse.model_validate(reply.json()))
        for route in ("infer_stream", "generate_stream"):
            url = f"{http}/v2/models/streamer/{route}"
            with (
                httpx.Client(timeout=30) as client,
                connect_sse(client, "POST", url, json=body) as source,
            ):
                answer = source.response
                if answer.status_code != 200:
                    seen[route] = [answer.status_code, answer.read().decode()]
                    continue
                seen[route] = [200] + [
                    event.data
                    if event.event == "error"
                    else decoded(InferenceResponse.model_validate_json(event.data))
                    for event in source.iter_sse()
                ]
    return result


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
                for i, model in enumerate(["oip", "doubler", "oip"])
            ]
            responses = stub.ModelStreamInfer(iter(messages), timeout=30)
            result = [decoded(ModelInferResponseConverter.to_types(r)) for r in responses]
    elif scenario in (
        "tokens",
        "tokens_in",
        "predict_each",
        "cancel",
        "collect",
        "boom",
        "deadline",
    ):
        result = streams(scenario, target)
    elif scenario == "nulls":
        result = nulls(http)
    elif scenario == "sse":
        # MLServer's documented streaming client: httpx_sse over generate_stream
        import httpx
        from httpx_sse import connect_sse

        payload = text("one two three", "sse-client")
        with (
            httpx.Client(timeout=30) as client,
            connect_sse(
                client,
                "POST",
                f"{http}/v2/models/streamer/generate_stream",
                json=payload.model_dump(),
            ) as source,
        ):
            result = [
                StringCodec.decode_output(InferenceResponse.model_validate_json(e.data).outputs[0])
                for e in source.iter_sse()
            ]
        # and the non-streaming generate route, with requests
        reply = requests.post(
            f"{http}/v2/models/streamer/generate",
            json=text("a b c d", "g").model_dump(),
            timeout=30,
        )
        result = {
            "sse": result,
            "generate": NumpyCodec.decode_output(
                InferenceResponse.model_validate(reply.json()).outputs[0]
            ).tolist(),
        }
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
