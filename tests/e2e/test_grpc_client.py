"""The same flows with trioserve's own client and the ``trioserve-client`` command."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import TypeVar

import pytest
import trio
import trio_asyncio  # type: ignore[import-untyped]
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from trioserve.client import Client, prediction_request
from trioserve.client.cli import main as cli_main

from .grpc_fixtures import build_store, markers, running_server, wait_until
from .grpc_server import GrpcServer

pytestmark = pytest.mark.e2e

T = TypeVar("T")
MODELS = "control=control.mar,gstream=gstream.mar,echo=echo.mar,multi-1.mar,multi-2.mar"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    store = build_store(tmp_path_factory.mktemp("grpc_client_store"))
    workdir = tmp_path_factory.mktemp("grpc_client") / "server"
    with running_server(
        workdir,
        store,
        MODELS,
        tokens=True,
        properties={"enable_model_api": "true", "max_request_size": "4096"},
    ) as started:
        assert "gRPC: grpclib runs on an asyncio loop Trio steps" in started.log
        yield started


def client_for(server: GrpcServer, *, tokens: bool = True, timeout: float = 30) -> Client:
    return Client(
        "127.0.0.1",
        inference_port=server.grpc_inference_port,
        management_port=server.grpc_management_port,
        inference_token=server.key("inference") if tokens else None,
        management_token=server.key("management") if tokens else None,
        timeout=timeout,
    )


def run(server: GrpcServer, scenario: Callable[[Client], Awaitable[T]], **options: object) -> T:
    async def main() -> T:
        async with client_for(server, **options) as client:  # type: ignore[arg-type]
            return await scenario(client)

    return asyncio.run(main())


def failure(server: GrpcServer, scenario: Callable[[Client], Awaitable[object]]) -> GRPCError:
    with pytest.raises(GRPCError) as info:
        run(server, scenario)
    return info.value


def pid_of(server: GrpcServer, model: str = "control") -> bytes:
    return run(server, lambda c: c.predictions(model, b"pid"))


def test_inference_calls(server: GrpcServer) -> None:
    async def scenario(client: Client) -> None:
        assert await client.ping() == "Healthy"
        assert await client.predictions("echo", b"hello") == b"hello"
        named = await client.predictions("control", {"data": b"params", "x": b"1"}, version="1.0")
        assert json.loads(named) == {"data": "params", "x": "1"}
        parts = [p async for p in client.stream_predictions("control", b"stream:2")]
        assert parts == [b"part0;", b"part1;", b"end"]
        answers = [
            (r.prediction, r.sequence_id, r.status)
            async for r in client.sequence("echo", "seq-7", [b"a", b"b", b"c"])
        ]
        assert answers == [(b"a", "seq-7", None), (b"b", "seq-7", None), (b"c", "seq-7", None)]
        mixed = [
            r
            async for r in client.stream_predictions2(
                [
                    prediction_request("echo", b"1", sequence_id="s"),
                    prediction_request("echo", b"2"),
                    prediction_request("echo", b"3", sequence_id="s"),
                ]
            )
        ]
        assert [r.prediction for r in mixed] == [b"1", b"", b"3"]
        assert mixed[1].status is not None
        assert mixed[1].status.code == Status.INVALID_ARGUMENT.value

    run(server, scenario)


def test_errors(server: GrpcServer) -> None:
    error = failure(server, lambda c: c.predictions("nope", b"x"))
    assert (error.status, error.message) == (Status.NOT_FOUND, "Model not found: nope")
    error = failure(server, lambda c: c.describe_model("control", "9.9"))
    assert error.status is Status.NOT_FOUND
    with pytest.raises(GRPCError) as info:
        run(server, lambda c: c.ping(), tokens=False)
    assert info.value.status is Status.UNAUTHENTICATED
    error = failure(server, lambda c: c.predictions("echo", b"x" * 5000))
    assert error.status is Status.RESOURCE_EXHAUSTED


def test_deadline_and_early_exit_cancel_the_work(server: GrpcServer) -> None:
    pid, stream_pid = pid_of(server), pid_of(server, "gstream")
    cancelled = markers(server, "cancelled")
    error = failure(server, lambda c: c.predictions("control", b"sleep:1.5", timeout=0.3))
    assert error.status is Status.DEADLINE_EXCEEDED
    assert wait_until(lambda: len(markers(server, "cancelled") - cancelled) == 1)

    stream_cancelled = markers(server, "stream-cancelled")

    async def leave_early(client: Client) -> list[bytes]:
        seen = []
        async with aclosing(client.stream_predictions("gstream", b"stream:50")) as parts:
            async for part in parts:
                seen.append(part)
                if len(seen) == 2:
                    break
        return seen

    assert run(server, leave_early) == [b"part0;", b"part1;"]
    assert wait_until(lambda: len(markers(server, "stream-cancelled") - stream_cancelled) == 1)
    assert (pid_of(server), pid_of(server, "gstream")) == (pid, stream_pid)


def test_management_calls(server: GrpcServer) -> None:
    async def scenario(client: Client) -> None:
        listed = await client.list_models()
        assert sorted(m["modelName"] for m in listed["models"]) == [
            "control",
            "echo",
            "gstream",
            "multi",
        ]
        assert (await client.describe_model("multi", "all"))[0]["modelName"] == "multi"
        assert await client.set_default("multi", "2.0") == (
            'Default version successfully updated for model "multi" to "2.0"'
        )
        assert await client.register_model(
            "echo.mar", model_name="echo3", initial_workers=1, synchronous=True
        ) == ('Model "echo3" Version: 1.0 registered with 1 initial workers')
        assert await client.scale_worker("echo3", min_worker=2, synchronous=True) == (
            "Workers scaled to 2 for model: echo3"
        )
        assert await client.unregister_model("echo3") == 'Model "echo3" unregistered'

    run(server, scenario)


async def test_the_client_from_trio(server: GrpcServer) -> None:
    """Trio code uses the client through trio-asyncio, as the server runs grpclib."""
    async with trio_asyncio.open_loop():
        client = client_for(server)
        try:
            answer = await trio_asyncio.aio_as_trio(client.predictions)("echo", b"from trio")
        finally:
            client.close()
    assert answer == b"from trio"
    await trio.lowlevel.checkpoint()


def cli(
    server: GrpcServer, capsysbinary: pytest.CaptureFixture[bytes], *args: str
) -> tuple[int, bytes, bytes]:
    code = cli_main(
        [
            "--port",
            str(server.grpc_inference_port),
            "--management-port",
            str(server.grpc_management_port),
            "--key-file",
            str(server.workdir / "key_file.json"),
            "--timeout",
            "30",
            *args,
        ]
    )
    out, err = capsysbinary.readouterr()
    return code, out, err


def test_cli(
    server: GrpcServer, capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path
) -> None:
    assert cli(server, capsysbinary, "ping") == (0, b"Healthy\n", b"")
    assert cli(server, capsysbinary, "infer", "echo", "hello") == (0, b"hello", b"")
    payload = tmp_path / "input.bin"
    payload.write_bytes(b"\x00from a file")
    assert cli(server, capsysbinary, "infer", "echo", f"@{payload}")[1] == b"\x00from a file"
    code, out, _ = cli(server, capsysbinary, "infer", "control", "-i", "data=params", "-i", "y=2")
    assert (code, json.loads(out)) == (0, {"data": "params", "y": "2"})
    assert cli(server, capsysbinary, "infer-stream", "control", "stream:1") == (
        0,
        b"part0;end",
        b"",
    )
    assert cli(
        server, capsysbinary, "infer-stream2", "echo", "--sequence-id", "s1", "a", "b", "c"
    ) == (0, b"a\nb\nc\n", b"")
    code, out, err = cli(server, capsysbinary, "infer", "nope", "x")
    assert (code, out, err) == (1, b"", b"error: NOT_FOUND: Model not found: nope\n")
    code, out, _ = cli(server, capsysbinary, "list", "--limit", "1")
    assert code == 0 and json.loads(out)["nextPageToken"] == "1"
    code, out, _ = cli(server, capsysbinary, "describe", "control")
    assert code == 0 and json.loads(out)[0]["modelName"] == "control"
    code, out, _ = cli(
        server, capsysbinary, "register", "echo.mar", "--model-name", "echo4", "--synchronous",
        "--initial-workers", "1",
    )  # fmt: skip
    assert (code, out) == (0, b'Model "echo4" Version: 1.0 registered with 1 initial workers\n')
    code, out, _ = cli(server, capsysbinary, "scale", "echo4", "--min-worker", "1", "--synchronous")
    assert (code, out) == (0, b"Workers scaled to 1 for model: echo4\n")
    code, out, _ = cli(server, capsysbinary, "set-default", "echo4", "1.0")
    assert code == 0 and b"Default version successfully updated" in out
    assert cli(server, capsysbinary, "unregister", "echo4") == (
        0,
        b'Model "echo4" unregistered\n',
        b"",
    )
    started = time.monotonic()
    code, _, err = cli(server, capsysbinary, "--timeout", "0.3", "infer", "control", "sleep:1")
    assert (code, err) == (1, b"error: DEADLINE_EXCEEDED: Deadline exceeded\n")
    assert time.monotonic() - started < 1.0
