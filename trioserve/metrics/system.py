"""Host CPU, memory and disk use, read with psutil the way TorchServe's collector does."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import psutil
import trio

if TYPE_CHECKING:
    from trioserve.metrics.registry import ServerMetrics

log = logging.getLogger("trioserve.metrics")

MB = 1024 * 1024
GB = 1024 * 1024 * 1024
DISK_PATH = "/"


def _busy_and_total(times: Any) -> tuple[float, float]:
    """CPU seconds spent busy and in all, from a ``psutil.cpu_times()`` tuple."""
    total = float(sum(times))
    # On Linux guest time is already part of user/nice time.
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class SystemSampler:
    """Reads the system metrics; CPU use is measured between two samples (since boot for the
    first), so each server has its own measure and none disturbs ``psutil.cpu_percent``."""

    def __init__(self, disk_path: str = DISK_PATH) -> None:
        self.disk_path = disk_path
        self._last_cpu: tuple[float, float] | None = None

    def cpu_percent(self) -> float:
        busy, total = _busy_and_total(psutil.cpu_times())
        last_busy, last_total = self._last_cpu or (0.0, 0.0)
        self._last_cpu = (busy, total)
        elapsed = total - last_total
        if elapsed <= 0:
            return 0.0
        return round(min(100.0, max(0.0, 100.0 * (busy - last_busy) / elapsed)), 1)

    def sample(self) -> dict[str, float]:
        """Metric name -> value, for TorchServe's system metric names and units."""
        memory = psutil.virtual_memory()
        disk = psutil.disk_usage(self.disk_path)
        return {
            "CPUUtilization": self.cpu_percent(),
            "MemoryUsed": memory.used / MB,
            "MemoryAvailable": memory.available / MB,
            "MemoryUtilization": float(memory.percent),
            "DiskUsage": disk.used / GB,
            "DiskUtilization": float(disk.percent),
            "DiskAvailable": disk.free / GB,
        }


async def sample_system_forever(
    metrics: ServerMetrics,
    interval: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sample the system metrics now, report started, then again every ``interval`` seconds."""
    if interval <= 0:
        raise ValueError(f"metric sampling interval must be positive, got {interval}")
    metrics.sample_system()
    task_status.started()
    while True:
        await trio.sleep(interval)
        metrics.sample_system()
