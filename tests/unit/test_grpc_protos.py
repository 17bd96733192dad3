"""The gRPC protos and generated code: TorchServe's field numbers, no drift, one asyncio module."""

from __future__ import annotations

import ast
import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2

from trioserve.core import errors
from trioserve.core.errors import ErrorKind, ServeError
from trioserve.grpc.errors import GRPC_STATUS, grpc_code
from trioserve.grpc.inference import in_band_status
from trioserve.http.errors import HTTP_STATUS, http_status

REPO = Path(__file__).resolve().parents[2]
F = descriptor_pb2.FieldDescriptorProto

# spec §1.1-1.2: message -> [(field, number, type, label / proto3 optional)]
EXPECTED_MESSAGES = {
    "org.pytorch.serve.grpc.inference.PredictionsRequest": [
        ("model_name", 1, F.TYPE_STRING, ""),
        ("model_version", 2, F.TYPE_STRING, ""),
        ("input", 3, F.TYPE_MESSAGE, "map<string, bytes>"),
        ("sequence_id", 4, F.TYPE_STRING, "optional"),
    ],
    "org.pytorch.serve.grpc.inference.PredictionResponse": [
        ("prediction", 1, F.TYPE_BYTES, ""),
        ("sequence_id", 2, F.TYPE_STRING, "optional"),
        ("status", 3, F.TYPE_MESSAGE, "optional"),
    ],
    "org.pytorch.serve.grpc.inference.TorchServeHealthResponse": [
        ("health", 1, F.TYPE_STRING, ""),
    ],
    "org.pytorch.serve.grpc.management.ManagementResponse": [("msg", 1, F.TYPE_STRING, "")],
    "org.pytorch.serve.grpc.management.DescribeModelRequest": [
        ("model_name", 1, F.TYPE_STRING, ""),
        ("model_version", 2, F.TYPE_STRING, ""),
        ("customized", 3, F.TYPE_BOOL, ""),
    ],
    "org.pytorch.serve.grpc.management.ListModelsRequest": [
        ("limit", 1, F.TYPE_INT32, ""),
        ("next_page_token", 2, F.TYPE_INT32, ""),
    ],
    "org.pytorch.serve.grpc.management.RegisterModelRequest": [
        ("batch_size", 1, F.TYPE_INT32, ""),
        ("handler", 2, F.TYPE_STRING, ""),
        ("initial_workers", 3, F.TYPE_INT32, ""),
        ("max_batch_delay", 4, F.TYPE_INT32, ""),
        ("model_name", 5, F.TYPE_STRING, ""),
        ("response_timeout", 6, F.TYPE_INT32, ""),
        ("runtime", 7, F.TYPE_STRING, ""),
        ("synchronous", 8, F.TYPE_BOOL, ""),
        ("url", 9, F.TYPE_STRING, ""),
        ("s3_sse_kms", 10, F.TYPE_BOOL, ""),
        ("startup_timeout", 11, F.TYPE_INT32, ""),
    ],
    "org.pytorch.serve.grpc.management.ScaleWorkerRequest": [
        ("model_name", 1, F.TYPE_STRING, ""),
        ("model_version", 2, F.TYPE_STRING, ""),
        ("max_worker", 3, F.TYPE_INT32, ""),
        ("min_worker", 4, F.TYPE_INT32, ""),
        ("number_gpu", 5, F.TYPE_INT32, ""),
        ("synchronous", 6, F.TYPE_BOOL, ""),
        ("timeout", 7, F.TYPE_INT32, ""),
    ],
    "org.pytorch.serve.grpc.management.SetDefaultRequest": [
        ("model_name", 1, F.TYPE_STRING, ""),
        ("model_version", 2, F.TYPE_STRING, ""),
    ],
    "org.pytorch.serve.grpc.management.UnregisterModelRequest": [
        ("model_name", 1, F.TYPE_STRING, ""),
        ("model_version", 2, F.TYPE_STRING, ""),
    ],
}

# service -> [(rpc, request, response, client streaming, server streaming)]
EXPECTED_SERVICES = {
    "org.pytorch.serve.grpc.inference.InferenceAPIsService": [
        ("Ping", ".google.protobuf.Empty", "TorchServeHealthResponse", False, False),
        ("Predictions", "PredictionsRequest", "PredictionResponse", False, False),
        ("StreamPredictions", "PredictionsRequest", "PredictionResponse", False, True),
        ("StreamPredictions2", "PredictionsRequest", "PredictionResponse", True, True),
    ],
    "org.pytorch.serve.grpc.management.ManagementAPIsService": [
        (rpc, f"{rpc}Request", "ManagementResponse", False, False)
        for rpc in (
            "DescribeModel",
            "ListModels",
            "RegisterModel",
            "ScaleWorker",
            "SetDefault",
            "UnregisterModel",
        )
    ],
}


def googleapis_dir() -> str:
    import google.rpc

    for path in google.rpc.__path__:
        if os.path.exists(os.path.join(path, "status.proto")):
            return os.path.dirname(os.path.dirname(path))
    raise RuntimeError("googleapis-common-protos is not installed")


@pytest.fixture(scope="module")
def descriptors(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorSet:
    out = tmp_path_factory.mktemp("descriptors") / "protos.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'proto'}",
            f"-I{googleapis_dir()}",
            f"--descriptor_set_out={out}",
            "inference.proto",
            "management.proto",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _label(field: descriptor_pb2.FieldDescriptorProto, message: object) -> str:
    if field.proto3_optional:
        return "optional"
    if field.type == F.TYPE_MESSAGE and field.label == F.LABEL_REPEATED:
        nested = {n.name: n for n in message.nested_type}  # type: ignore[attr-defined]
        entry = nested.get(field.type_name.rsplit(".", 1)[-1])
        if entry is not None and entry.options.map_entry:
            key, value = entry.field
            names = {F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes"}
            return f"map<{names[key.type]}, {names[value.type]}>"
        return "repeated"
    return ""


def test_messages_and_services_match_torchserve(
    descriptors: descriptor_pb2.FileDescriptorSet,
) -> None:
    files = {f.name: f for f in descriptors.file}
    assert list(files["inference.proto"].dependency) == [
        "google/protobuf/empty.proto",
        "google/rpc/status.proto",
    ]
    messages = {}
    services = {}
    for f in files.values():
        assert f.syntax == "proto3"
        assert f.options.java_multiple_files
        for message in f.message_type:
            messages[f"{f.package}.{message.name}"] = [
                (x.name, x.number, x.type, _label(x, message)) for x in message.field
            ]
        for service in f.service:
            services[f"{f.package}.{service.name}"] = [
                (
                    m.name,
                    m.input_type.removeprefix(f".{f.package}."),
                    m.output_type.removeprefix(f".{f.package}."),
                    m.client_streaming,
                    m.server_streaming,
                )
                for m in service.method
            ]
    assert messages == EXPECTED_MESSAGES
    assert services == EXPECTED_SERVICES


def test_generated_code_has_not_drifted(tmp_path: Path) -> None:
    """Regenerating from proto/ must give exactly the committed trioserve/_proto/."""
    out = tmp_path / "_proto"
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_protos.sh"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    committed = REPO / "trioserve" / "_proto"

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    assert files(out) == files(committed), "run scripts/gen_protos.sh"
    changed = [
        name
        for name in sorted(files(out))
        if not filecmp.cmp(out / name, committed / name, shallow=False)
    ]
    assert changed == [], (
        f"generated code differs from proto/ in {changed}: run scripts/gen_protos.sh"
    )
    for name in files(committed):
        if name.endswith(".py"):
            assert (committed / name).read_text().startswith("# Generated by scripts/gen_protos.sh")


ASYNCIO_WORLD = ("asyncio", "trio_asyncio", "grpclib")


def test_only_the_bridge_touches_asyncio() -> None:
    """Outside the generated code and the (asyncio) client, only the gRPC bridge and its
    portals import anything asyncio-flavoured (asyncio, trio-asyncio, grpclib). In the
    worker, the MLServer-model runner owns the event loop those models' coroutines need, and
    its outbox writes from it."""
    importers = set()
    for path in sorted((REPO / "trioserve").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(("trioserve/_proto/", "trioserve/client/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), relative)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(name.split(".")[0] in ASYNCIO_WORLD for name in names):
                importers.add(relative)
    assert importers == {
        "trioserve/grpc/bridge.py",
        "trioserve/grpc/driven.py",
        "trioserve/grpc/portal.py",
        "trioserve/grpc/loop_thread.py",
        "trioserve/grpc/servers.py",
        "trioserve/worker/mlserver/mlmodel.py",
        "trioserve/worker/mlserver/outbox.py",
    }


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, 3), (401, 16), (403, 7), (404, 5), (409, 10), (413, 8), (418, 9), (500, 13),
     (503, 14), (504, 4), (507, 8)],
)  # fmt: skip
def test_handler_status_codes(status: int, code: int) -> None:
    """A handler's own failure code maps as TorchServe's gRPC transport maps statuses."""
    assert grpc_code(errors.prediction_failed(status, "m")) == code


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [(ErrorKind.BAD_INPUT, 400, 3), (ErrorKind.UNAUTHENTICATED, 401, 16),
     (ErrorKind.FORBIDDEN, 403, 7), (ErrorKind.NOT_FOUND, 404, 5),
     (ErrorKind.NOT_ALLOWED, 405, 9), (ErrorKind.CONFLICT, 409, 10),
     (ErrorKind.TOO_LARGE, 413, 8), (ErrorKind.CANCELLED, 499, 1),
     (ErrorKind.INTERNAL, 500, 13), (ErrorKind.WORKER_FAILED, 500, 13),
     (ErrorKind.NOT_IMPLEMENTED, 501, 12), (ErrorKind.UNAVAILABLE, 503, 14),
     (ErrorKind.TIMEOUT, 504, 4), (ErrorKind.OUT_OF_MEMORY, 507, 8)],
)  # fmt: skip
def test_error_kinds_map_once_per_transport(kind: ErrorKind, status: int, code: int) -> None:
    error = ServeError(kind, "m")
    assert (http_status(error), grpc_code(error)) == (status, code)


def test_every_error_kind_has_a_status_in_both_tables() -> None:
    assert set(HTTP_STATUS) == set(GRPC_STATUS) == set(ErrorKind)


def test_in_band_status_carries_an_error_info() -> None:
    reason = "R" * 200  # a length that needs two varint bytes
    status = in_band_status(ServeError(ErrorKind.BAD_INPUT, "bad", reason=reason))
    assert (status.code, status.message) == (3, "bad")
    (detail,) = status.details
    assert detail.type_url == "type.googleapis.com/google.rpc.ErrorInfo"
    info = error_details_pb2.ErrorInfo.FromString(detail.value)
    assert (info.reason, info.domain) == (reason, "trioserve")
