"""``python -m trioserve.worker --fd N [--listen PATH]``: run a worker on an inherited socket.

``N`` is a connected ``AF_UNIX``/``SOCK_STREAM`` socket (one end of a socketpair made by the
server). The working directory is the model directory. With ``--listen``, other serving
processes may attach to this worker through a Unix socket bound at ``PATH`` (in a directory
private to the server) before the model loads: see :mod:`trioserve.worker.attached`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

import trio

from trioserve.worker.attached import listen_socket
from trioserve.worker.connection import exit_now
from trioserve.worker.loop import WorkerLoop

LOG_FORMAT = "%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s"


def _configure_logging(level: str) -> None:
    # Handlers log the TorchServe way (root logger, INFO, to stdout); the worker's own log
    # lines and tracebacks go to stderr.
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format=LOG_FORMAT)
    own = logging.getLogger("trioserve.worker")
    own.setLevel(level)
    own.propagate = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    own.addHandler(handler)


def main(argv: list[str] | None = None) -> None:
    parent_pid = os.getppid()  # as early as possible: the watchdog compares against it
    parser = argparse.ArgumentParser(prog="python -m trioserve.worker", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket file descriptor")
    parser.add_argument("--listen", help="where other serving processes attach (a socket path)")
    parser.add_argument("--log-level", default="INFO", help="level of the worker's own log")
    args = parser.parse_args(argv)

    # Ctrl-C in a terminal reaches the whole process group; the server decides when workers
    # stop (SHUTDOWN, SIGTERM), so an in-flight batch is not torn down by it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    _configure_logging(args.log_level.upper())

    try:
        sock = socket.socket(fileno=args.fd)
    except OSError as exc:
        exit_now(2, f"--fd {args.fd} is not a usable socket: {exc}")
    if sock.type != socket.SOCK_STREAM:
        exit_now(2, f"--fd {args.fd} is not a stream socket")
    sock.set_inheritable(False)
    listening = None
    if args.listen is not None:
        try:
            listening = listen_socket(args.listen)
        except OSError as exc:
            exit_now(2, f"--listen {args.listen}: {exc}")

    async def serve() -> int:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        listener = None if listening is None else trio.socket.from_stdlib_socket(listening)
        return await WorkerLoop(stream, parent_pid=parent_pid, listener=listener).run()

    status = trio.run(serve)
    exit_now(status, "done" if status == 0 else "the model failed to load")


if __name__ == "__main__":
    main()
