"""Reading a server's readiness report (``trioserve.launch.Launched``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trioserve.launch import Launched


def launched(*lines: str) -> Launched:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(10)
    return Launched(process, list(lines))


def test_ready_report_names_every_bound_address() -> None:
    report = launched(
        "READY inference=http://127.0.0.1:41001"
        " management=http://[::1]:41002,http://127.0.0.1:41003"
        " grpc_inference=127.0.0.1:41004",
        "PROBLEM model x not loaded",
    )
    assert report.ready
    assert report.bound == {
        "inference": ["http://127.0.0.1:41001"],
        "management": ["http://[::1]:41002", "http://127.0.0.1:41003"],
        "grpc_inference": ["127.0.0.1:41004"],
    }
    assert report.port("inference") == 41001
    assert report.port("management") == 41002
    assert report.port("grpc_inference") == 41004
    with pytest.raises(KeyError):
        report.port("metrics")


@pytest.mark.parametrize("lines", [(), ("FAILED OSError: address already in use",)])
def test_a_server_that_is_not_ready_has_no_addresses(lines: tuple[str, ...]) -> None:
    report = launched(*lines)
    assert not report.ready
    assert report.bound == {}


def test_stop_terminates_then_kills() -> None:
    import signal
    import subprocess
    import sys

    from trioserve.launch import stop

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop(polite, grace=10) == -signal.SIGTERM
    stubborn = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('ready', flush=True)\n"
         "time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    assert stop(stubborn, grace=0.5) is None
    assert stubborn.returncode == -signal.SIGKILL
    stubborn.stdout.close()
    assert stop(stubborn) == -signal.SIGKILL  # already gone: its status, nothing sent
