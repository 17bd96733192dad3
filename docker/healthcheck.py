"""The image's ``HEALTHCHECK``: exit 0 when trioserve answers ``GET /ping`` with 200.

It reads the configuration the way the server does (``$TS_CONFIG_FILE``, ``TS_*``
variables when the file enables them) to find the inference address and the key file, so
an address or key file moved by ``docker run -e TS_...`` is followed. A listener on
0.0.0.0 or :: is reached on the loopback address; an ``https`` one without checking the
certificate (it is the server's own, on loopback).

Token authorization: ``/ping`` needs the inference key, which the check takes from the key
file. The inference key expires (``token_expiration_min``, 60 minutes by default) and only
``/token`` renews it, so a container whose key nobody renewed would turn unhealthy while it
serves. When ``/ping`` answers 401 the check therefore asks the keyless gRPC health service
(``grpc.health.v1.Health`` on the gRPC inference port), which reports the same readiness,
instead of failing. Without a key file (token authorization disabled) no key is sent.

Run as ``python healthcheck.py`` inside the container; ``-v`` prints what it did.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import sys
from pathlib import Path

from trioserve.config import CliOptions, ServerConfig, load_config
from trioserve.config.addresses import Address

TIMEOUT = 5.0
_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT)
        sock.connect(self._path)
        self.sock = sock


def _insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _connection(address: Address) -> http.client.HTTPConnection:
    if address.is_unix:
        assert address.path is not None
        return _UnixConnection(address.path)
    host = _ANY.get(address.host, address.host)
    if address.is_tls:
        return http.client.HTTPSConnection(
            host, address.port, timeout=TIMEOUT, context=_insecure_context()
        )
    return http.client.HTTPConnection(host, address.port, timeout=TIMEOUT)


def _inference_key(config: ServerConfig) -> str | None:
    if config.disable_token_authorization:
        return None
    path = config.key_file or Path.cwd() / "key_file.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return str(document["inference"]["key"])
    except FileNotFoundError:
        return None


def _compact(body: bytes) -> str:
    """A JSON body on one line (trioserve indents its answers)."""
    try:
        return json.dumps(json.loads(body), separators=(", ", ": "))
    except ValueError:
        return body.decode("utf-8", "replace").strip()


def ping(config: ServerConfig) -> tuple[int, str]:
    """The status and body of ``GET /ping`` on the inference address."""
    headers = {}
    key = _inference_key(config)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    connection = _connection(config.inference_address)
    try:
        connection.request("GET", "/ping", headers=headers)
        response = connection.getresponse()
        return response.status, _compact(response.read())
    finally:
        connection.close()


def grpc_health(config: ServerConfig) -> str:
    """The status name ``grpc.health.v1.Health/Check`` gives the whole server."""
    import asyncio

    from grpclib.client import Channel

    from trioserve._proto.grpc.health.v1 import HealthCheckRequest, HealthStub

    host = _ANY.get(config.grpc_inference_address, config.grpc_inference_address)
    tls = _insecure_context() if config.enable_grpc_ssl else None

    async def check() -> str:
        channel = Channel(host, config.grpc_inference_port, ssl=tls)
        try:
            reply = await HealthStub(channel).check(HealthCheckRequest(service=""), timeout=TIMEOUT)
            return reply.status.name
        finally:
            channel.close()

    return asyncio.run(check())


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    try:
        config = load_config(CliOptions(), os.environ, Path.cwd())
        status, body = ping(config)
        if verbose:
            print(f"/ping: {status} {body}")
        if status == 200:
            return 0
        if status != 401:
            print(f"unhealthy: /ping answered {status} {body}", file=sys.stderr)
            return 1
        serving = grpc_health(config)
        if verbose:
            print(f"/ping needs a current inference key; gRPC health: {serving}")
        if serving == "SERVING":
            return 0
        print(f"unhealthy: gRPC health check says {serving}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
