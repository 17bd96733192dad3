"""Start a trioserve server process and wait until it reports ready (or why it failed).

The server writes its report to the file descriptor named by ``TRIOSERVE_READY_FD`` once its
listeners accept (``READY api=url ...`` and any ``PROBLEM ...`` lines), or ``FAILED <reason>``,
then closes it. The ``trioserve start`` launcher, the end-to-end tests and the benchmarks all
start servers through :func:`launch`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

READY_FD_ENV = "TRIOSERVE_READY_FD"


@dataclass(slots=True)
class Launched:
    process: subprocess.Popen[bytes]
    report: list[str]  # the report's lines; empty when the server said nothing in time

    @property
    def ready(self) -> bool:
        return bool(self.report) and self.report[0].startswith("READY")

    @property
    def bound(self) -> dict[str, list[str]]:
        """The addresses each API listens on, from the ``READY`` line (empty if not ready).

        These are the real bound addresses, so a server configured with port 0 tells its
        caller which ports the kernel picked."""
        if not self.ready:
            return {}
        found: dict[str, list[str]] = {}
        for item in self.report[0].split()[1:]:
            api, sep, urls = item.partition("=")
            if sep:
                found[api] = urls.split(",")
        return found

    def port(self, api: str) -> int:
        """The TCP port of ``api``'s first listener (``KeyError`` if it has none)."""
        url = self.bound[api][0]
        return int(url.rsplit(":", 1)[1].rstrip("/"))


def launch(
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
    timeout: float | None = None,
) -> Launched:
    """Run ``argv`` (a ``trioserve start --foreground`` command line) with its output
    appended to ``log_path``, and read its readiness report until the server closes the
    pipe, exits, or ``timeout`` seconds pass (``None``: no limit)."""
    read_fd, write_fd = os.pipe()
    child_env = dict(os.environ if env is None else env)
    child_env[READY_FD_ENV] = str(write_fd)
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(write_fd,),
                start_new_session=new_session,
            )
    finally:
        os.close(write_fd)
    report = b""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while deadline is None or time.monotonic() < deadline:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([read_fd], [], [], wait)[0]:
                continue
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            report += chunk
    finally:
        os.close(read_fd)
    return Launched(process, report.decode(errors="replace").splitlines())


def stop(process: subprocess.Popen[bytes], grace: float = 30.0) -> int | None:
    """SIGTERM a launched server and wait ``grace`` seconds for its drain; then SIGKILL.

    Returns its exit status, or None when it had to be killed."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        return None
