"""TLS on every port: https:// addresses for the three HTTP APIs and ``enable_grpc_ssl`` for
gRPC, with a certificate made in the test (trustme); plaintext is not served there."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc
import httpx
import pytest
import trustme

from .grpc_fixtures import GrpcioStubs, grpcio_stubs
from .server import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> GrpcioStubs:
    return grpcio_stubs(tmp_path_factory.mktemp("grpcio_stubs"))


@pytest.fixture
def tls(make_server, tmp_path: Path) -> tuple[Server, Path]:  # type: ignore[no-untyped-def]
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    chain, key, ca = tmp_path / "chain.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in certificate.cert_chain_pems))
    authority.cert_pem.write_to_path(str(ca))
    server: Server = make_server(
        properties={
            "inference_address": "https://127.0.0.1:0",
            "management_address": "https://127.0.0.1:0",
            "metrics_address": "https://127.0.0.1:0",
            "certificate_file": str(chain),
            "private_key_file": str(key),
            "enable_grpc_ssl": "true",
        }
    )
    report = server.start()
    assert "inference=https://" in report and "management=https://" in report
    return server, ca


def test_http_apis_answer_over_tls_only(tls: tuple[Server, Path]) -> None:
    server, ca = tls
    base = f"https://127.0.0.1:{server.port}"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(ca)), timeout=30) as client:
        assert client.get(f"{base}/ping").json() == {"status": "Healthy"}
        r = client.post(f"{base}/predictions/control", content=b"over tls")  # the fast path
        assert (r.status_code, r.text) == (200, "over tls")
        stream = client.post(f"{base}/predictions/control", content=b"stream:2")
        assert stream.text == "part0;part1;end"
        models = client.get(f"https://127.0.0.1:{server.management_port}/models")
        assert models.json()["models"][0]["modelName"] == "control"
        assert client.get(f"https://127.0.0.1:{server.metrics_port}/metrics").status_code == 200
    for port in (server.port, server.management_port):
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5)  # plaintext: no answer


def test_grpc_answers_over_tls_only(tls: tuple[Server, Path], pb: GrpcioStubs) -> None:
    server, ca = tls
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    request = pb.inference.PredictionsRequest(model_name="control", input={"data": b"hi"})
    with grpc.secure_channel(server.grpc_target, credentials) as channel:
        stub = pb.inference_grpc.InferenceAPIsServiceStub(channel)
        assert stub.Predictions(request, timeout=30).prediction == b"hi"
    with grpc.secure_channel(server.grpc_management_target, credentials) as channel:
        stub = pb.management_grpc.ManagementAPIsServiceStub(channel)
        listed = stub.ListModels(pb.management.ListModelsRequest(), timeout=30)
        assert "control" in listed.msg
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb.inference_grpc.InferenceAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predictions(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
