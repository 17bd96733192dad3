"""System metrics: the psutil sampler and the periodic sampling task."""

from __future__ import annotations

from collections import namedtuple

import psutil
import pytest
import trio

from trioserve.metrics import ServerMetrics, SystemSampler, sample_system_forever

SYSTEM_NAMES = {
    "CPUUtilization",
    "MemoryUsed",
    "MemoryAvailable",
    "MemoryUtilization",
    "DiskUsage",
    "DiskUtilization",
    "DiskAvailable",
}

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait guest guest_nice")


def test_sample_has_torchserve_names_and_sane_values() -> None:
    values = SystemSampler().sample()
    assert set(values) == SYSTEM_NAMES
    for name in ("CPUUtilization", "MemoryUtilization", "DiskUtilization"):
        assert 0.0 <= values[name] <= 100.0
    assert values["MemoryUsed"] > 0 and values["MemoryAvailable"] > 0
    assert values["DiskUsage"] > 0 and values["DiskAvailable"] >= 0


def test_cpu_percent_is_measured_between_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter(
        [
            CpuTimes(user=30, nice=0, system=10, idle=60, iowait=0, guest=0, guest_nice=0),
            # 100 s later: 25 s busy (user+system), 75 s idle or waiting on I/O.
            CpuTimes(user=50, nice=0, system=15, idle=125, iowait=10, guest=0, guest_nice=0),
            CpuTimes(user=50, nice=0, system=15, idle=125, iowait=10, guest=0, guest_nice=0),
        ]
    )
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(readings))
    sampler = SystemSampler()
    assert sampler.cpu_percent() == 40.0  # since boot
    assert sampler.cpu_percent() == 25.0
    assert sampler.cpu_percent() == 0.0  # no time passed


def test_guest_time_is_not_counted_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    times = CpuTimes(user=50, nice=0, system=0, idle=50, iowait=0, guest=40, guest_nice=0)
    monkeypatch.setattr(psutil, "cpu_times", lambda: times)
    assert SystemSampler().cpu_percent() == 50.0


class CountingMetrics(ServerMetrics):
    def __init__(self) -> None:
        super().__init__(hostname="h")
        self.samples = 0

    def sample_system(self) -> None:
        self.samples += 1


async def test_sample_system_forever_samples_before_started_then_every_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = CountingMetrics()
    async with trio.open_nursery() as nursery:
        await nursery.start(sample_system_forever, metrics, 60.0)
        assert metrics.samples == 1
        await trio.sleep(59)
        assert metrics.samples == 1
        await trio.sleep(2)
        assert metrics.samples == 2
        await trio.sleep(600)
        assert metrics.samples == 12
        nursery.cancel_scope.cancel()


async def test_sample_system_forever_fills_the_real_gauges(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = ServerMetrics(hostname="h")
    async with trio.open_nursery() as nursery:
        await nursery.start(sample_system_forever, metrics, 1.0)
        nursery.cancel_scope.cancel()
    text = metrics.exposition(sorted(SYSTEM_NAMES)).decode()
    for name in SYSTEM_NAMES:
        assert f'{name}{{Hostname="h",Level="Host"}} ' in text


async def test_sample_system_forever_refuses_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        await sample_system_forever(CountingMetrics(), 0)
