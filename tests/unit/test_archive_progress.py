"""Progress of long copies (trioserve/archive/_progress.py): the choice of a bar or lines,
the line schedule, and what the archiver shows on a terminal and on a pipe."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from trioserve.archive import write_archive
from trioserve.archive._progress import (
    ENV,
    SMALL,
    LineSchedule,
    Mode,
    Progress,
    choose_mode,
    format_duration,
    format_size,
    progress_enabled,
    summary,
)

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]
BAR_UPDATE = re.compile(r"\r(?!\n)")  # tqdm redraws with a bare '\r' (a tty adds '\r\n')


@pytest.mark.parametrize(
    ("enabled", "tty", "total", "small", "expected"),
    [
        (False, True, 100 * MiB, Mode.SUMMARY, Mode.OFF),
        (False, False, None, Mode.SUMMARY, Mode.OFF),
        (True, True, 100 * MiB, Mode.SUMMARY, Mode.BAR),
        (True, False, 100 * MiB, Mode.SUMMARY, Mode.LINES),
        (True, True, SMALL, Mode.SUMMARY, Mode.BAR),
        (True, True, SMALL - 1, Mode.SUMMARY, Mode.SUMMARY),
        (True, False, SMALL - 1, Mode.OFF, Mode.OFF),
        (True, False, 0, Mode.SUMMARY, Mode.SUMMARY),
        (True, True, None, Mode.OFF, Mode.BAR),  # an unknown size may be large
        (True, False, None, Mode.OFF, Mode.LINES),
    ],
)
def test_choose_mode(
    enabled: bool, tty: bool, total: int | None, small: Mode, expected: Mode
) -> None:
    assert choose_mode(enabled=enabled, tty=tty, total=total, small=small) is expected


def test_choose_mode_threshold() -> None:
    assert choose_mode(enabled=True, tty=False, total=1000, threshold=1000) is Mode.LINES
    assert choose_mode(enabled=True, tty=False, total=999, threshold=1000) is Mode.SUMMARY


@pytest.mark.parametrize(
    ("value", "enabled"),
    [
        *[("0", False), ("off", False), (" OFF ", False), ("false", False), ("no", False)],
        *[("", True), ("1", True), ("auto", True), ("yes", True)],
    ],
)
def test_progress_enabled(value: str, enabled: bool) -> None:
    assert progress_enabled({ENV: value}) is enabled
    assert progress_enabled({}) is True


def test_formats() -> None:
    assert format_size(0) == "0 B"
    assert format_size(1023) == "1023 B"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(64 * MiB) == "64.0 MiB"
    assert format_size(3 * 1024 * MiB) == "3.0 GiB"
    assert format_size(2048 * 1024 * 1024 * MiB) == "2048.0 TiB"
    assert format_duration(0.04) == "0.0 s"
    assert format_duration(12) == "12.0 s"
    assert format_duration(185.4) == "3 min 05 s"
    assert (
        summary("archived x.mar", 256 * MiB, 2.0)
        == "archived x.mar: 256.0 MiB in 2.0 s (128.0 MiB/s)"
    )
    assert summary("downloaded x.mar", 300, 0.0) == "downloaded x.mar: 300 B in 0.0 s"


def _feed(schedule: LineSchedule, total: int, chunk: int, clock: list[float]) -> list[str]:
    lines = []
    done = 0
    while done < total:
        done = min(total, done + chunk)
        line = schedule.update(done, clock[0])
        if line is not None:
            lines.append(line)
    return lines


def test_schedule_one_line_per_step_not_per_chunk() -> None:
    total = 256 * MiB
    lines = _feed(LineSchedule("archiving m.mar", total, 0.0), total, 64 * 1024, [0.0])
    assert lines[0] == "archiving m.mar: 25.6 MiB of 256.0 MiB (10%)"
    assert lines[2] == "archiving m.mar: 76.8 MiB of 256.0 MiB (30%)"
    assert [line.rsplit("(", 1)[1] for line in lines] == [f"{p}%)" for p in range(10, 100, 10)]


def test_schedule_big_jumps_skip_steps() -> None:
    schedule = LineSchedule("x", 1000, 0.0)
    assert schedule.update(350, 0.0) == "x: 350 B of 1000 B (35%)"
    assert schedule.update(390, 0.0) is None
    assert schedule.update(400, 0.0) == "x: 400 B of 1000 B (40%)"
    assert schedule.update(1000, 0.0) is None  # done: the final line says it


def test_schedule_by_time() -> None:
    schedule = LineSchedule("downloading m.mar", None, 100.0, interval=10.0)
    assert schedule.update(5 * MiB, 105.0) is None
    assert schedule.update(6 * MiB, 110.0) == "downloading m.mar: 6.0 MiB so far"
    assert schedule.update(6 * MiB, 125.0) is None  # nothing moved: no line
    assert schedule.update(7 * MiB, 125.0) == "downloading m.mar: 7.0 MiB so far"
    assert schedule.update(8 * MiB, 134.9) is None
    # with a total, a slow copy still says something every interval
    slow = LineSchedule("x", 100 * MiB, 0.0, interval=10.0)
    assert slow.update(1 * MiB, 10.0) == "x: 1.0 MiB of 100.0 MiB (1%)"
    assert slow.update(2 * MiB, 15.0) is None
    assert slow.update(10 * MiB, 16.0) == "x: 10.0 MiB of 100.0 MiB (10%)"
    assert slow.update(11 * MiB, 25.0) is None  # the step line restarted the interval


def _progress(
    mode: Mode, total: int | None, stream: io.StringIO | None = None
) -> tuple[Progress, list[str], list[float]]:
    lines: list[str] = []
    clock = [50.0]
    progress = Progress(
        "archiving m.mar",
        "archived m.mar",
        total,
        mode=mode,
        stream=stream,
        emit=lines.append,
        clock=lambda: clock[0],
    )
    return progress, lines, clock


def test_progress_lines_then_summary() -> None:
    progress, lines, clock = _progress(Mode.LINES, 20 * MiB)
    with progress:
        for _ in range(20):
            progress.advance(MiB)
            clock[0] += 0.1
    assert len(lines) == 10
    assert lines[0] == "archiving m.mar: 2.0 MiB of 20.0 MiB (10%)"
    assert lines[-1] == "archived m.mar: 20.0 MiB in 2.0 s (10.0 MiB/s)"
    progress.finish()  # once only
    assert len(lines) == 10


def test_progress_failure_has_no_final_line() -> None:
    progress, lines, _ = _progress(Mode.LINES, 20 * MiB)

    def fail() -> None:
        with progress:
            progress.advance(5 * MiB)
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fail()
    assert lines == ["archiving m.mar: 5.0 MiB of 20.0 MiB (25%)"]


def test_progress_summary_and_off() -> None:
    progress, lines, _ = _progress(Mode.SUMMARY, 1000)
    with progress:
        progress.advance(1000)
    assert lines == ["archived m.mar: 1000 B in 0.0 s"]
    progress, lines, _ = _progress(Mode.OFF, 100 * MiB)
    with progress:
        progress.advance(100 * MiB)
    assert lines == []


def test_progress_bar_is_drawn_on_its_stream() -> None:
    stream = io.StringIO()
    progress, lines, _ = _progress(Mode.BAR, 20 * MiB, stream)
    with progress:
        for _ in range(20):
            progress.advance(MiB)
    text = stream.getvalue()
    assert "archiving m.mar: 100%|" in text
    assert BAR_UPDATE.search(text)
    assert lines == ["archived m.mar: 20.0 MiB in 0.0 s"]  # no plain progress lines


def test_progress_on_picks_lines_for_a_plain_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    stream = io.StringIO()
    with Progress.on(stream, "archiving m.mar", "archived m.mar", 10 * MiB) as progress:
        assert progress.mode is Mode.LINES
        progress.advance(10 * MiB)
    assert stream.getvalue().startswith("archived m.mar: 10.0 MiB in ")
    assert Progress.on(None, "a", "b", 10 * MiB).mode is Mode.OFF
    assert Progress.on(stream, "a", "b", 10 * MiB, environ={ENV: "0"}).mode is Mode.OFF


@pytest.mark.parametrize("archive_format", ["default", "tgz", "no-archive"])
def test_write_archive_shows_lines(tmp_path: Path, archive_format: str) -> None:
    weights = tmp_path / "model.pt"
    with weights.open("wb") as file:
        file.truncate(9 * MiB)
    small = tmp_path / "index.json"
    small.write_text("{}")
    stream = io.StringIO()
    write_archive(
        model_name="big",
        version="1",
        handler="base_handler",
        export_path=tmp_path / "out",
        serialized_file=weights,
        extra_files=[small],
        archive_format=archive_format,
        progress=stream,
    )
    lines = stream.getvalue().splitlines()
    name = {"default": "big.mar", "tgz": "big.tar.gz", "no-archive": "big"}[archive_format]
    _check_lines(lines, name, "9.0 MiB")


def _check_lines(lines: list[str], name: str, size: str) -> None:
    """One line per 10 % (however large the chunks), then the final line."""
    percents = []
    for line in lines[:-1]:
        match = re.fullmatch(rf"archiving {re.escape(name)}: \S+ \S+ of {size} \((\d+)%\)", line)
        assert match is not None, line
        percents.append(int(match[1]))
    assert [p // 10 for p in percents] == list(range(1, 10)), lines
    assert re.fullmatch(rf"archived {re.escape(name)}: {size} in \d+\.\d s \(.*/s\)", lines[-1])


def test_write_archive_small_shows_nothing(tmp_path: Path) -> None:
    small = tmp_path / "model.pt"
    small.write_bytes(b"w" * 1000)
    stream = io.StringIO()
    write_archive(
        model_name="small",
        version="1",
        handler="base_handler",
        export_path=tmp_path,
        serialized_file=small,
        progress=stream,
    )
    assert stream.getvalue() == ""


# The command line, on a pseudo-terminal and on a pipe --------------------------------------


@pytest.fixture(scope="module")
def big_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "model.pt"
    with path.open("wb") as file:
        file.truncate(24 * MiB)  # sparse zeros: quick to make, to read and to deflate
    return path


def _archiver(weights: Path, export: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trioserve",
        "archive",
        "--model-name",
        "big",
        "--version",
        "1",
        "--handler",
        "base_handler",
        "--serialized-file",
        str(weights),
        "--export-path",
        str(export),
        *extra,
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV and not k.startswith("TQDM_")}
    env.update(extra)
    return env


def _run_on_pty(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; return what it showed."""
    master, slave = os.openpty()
    termios.tcsetwinsize(slave, (24, 100))
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every slave end is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        process = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, timeout=60
        )
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    return process.returncode, b"".join(chunks).decode()


def test_cli_draws_a_bar_on_a_terminal(big_weights: Path, tmp_path: Path) -> None:
    code, shown = _run_on_pty(_archiver(big_weights, tmp_path), _env())
    assert code == 0, shown
    assert (tmp_path / "big.mar").is_file()
    assert "archiving big.mar: 100%|" in shown
    assert "24.0M/24.0M" in shown
    assert BAR_UPDATE.search(shown), repr(shown)
    assert re.search(r"archived big\.mar: 24\.0 MiB in \d+\.\d s", shown)
    assert "of 24.0 MiB (" not in shown  # no plain lines beside the bar


def test_cli_prints_lines_to_a_pipe(big_weights: Path, tmp_path: Path) -> None:
    process = subprocess.run(
        _archiver(big_weights, tmp_path), capture_output=True, env=_env(), timeout=60
    )
    assert process.returncode == 0, process.stderr
    assert process.stdout == b""
    err = process.stderr.decode()
    assert "\r" not in err
    _check_lines(err.splitlines(), "big.mar", "24.0 MiB")


@pytest.mark.parametrize(("flags", "env"), [(("--quiet",), {}), ((), {ENV: "0"})])
def test_cli_progress_can_be_silenced(
    big_weights: Path, tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    code, shown = _run_on_pty(_archiver(big_weights, tmp_path, *flags), _env(**env))
    assert code == 0, shown
    assert (tmp_path / "big.mar").is_file()
    assert shown == ""
