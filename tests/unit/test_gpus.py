"""GPU placement of workers (sans-IO)."""

from __future__ import annotations

import pytest

from trioserve.core.gpus import GpuError, GpuPlan, parse_visible_devices, visible_gpu_count


@pytest.mark.parametrize(
    ("value", "count"),
    [("0,1", 2), ("3", 1), ("", 0), ("-1", 0), ("0,1,-1,2", 2), (" 2 , 5 ", 2), ("GPU-uuid", 1)],
)
def test_cuda_visible_devices_counts_entries_up_to_an_invalid_one(value: str, count: int) -> None:
    assert parse_visible_devices(value) == count


def test_visible_count_prefers_cuda_visible_devices_over_nvidia_smi() -> None:
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0"}, lambda: 8) == 1
    assert visible_gpu_count({}, lambda: 4) == 4
    assert visible_gpu_count({}, lambda: None) == 0


def test_workers_share_one_round_robin_over_the_servers_gpus() -> None:
    plan = GpuPlan(3)
    a = plan.chooser("a", None, None)
    b = plan.chooser("b", "gpu", None)
    assert [a(), a(), b(), a(), b()] == [0, 1, 2, 0, 1]


def test_device_ids_are_a_models_own_round_robin() -> None:
    plan = GpuPlan(4)
    pick = plan.chooser("m", "gpu", [3, 1])
    assert [pick(), pick(), pick()] == [3, 1, 3]
    assert plan.chooser("other", None, None)() == 0  # the shared counter was not moved


def test_cpu_models_and_gpu_less_servers_get_cpu_workers() -> None:
    assert GpuPlan(2).chooser("m", "cpu", [0])() is None
    assert GpuPlan(0).chooser("m", None, None)() is None


@pytest.mark.parametrize(
    ("gpus", "device_type", "device_ids", "says"),
    [
        (0, "gpu", None, "deviceType is gpu, but this server uses no GPU"),
        (2, "gpu", [0, 2], r"deviceIds \[0, 2\] name GPUs this server does not have"),
        (0, None, [0], "deviceIds"),
    ],
)
def test_settings_that_cannot_be_met_are_refused(
    gpus: int, device_type: str | None, device_ids: list[int] | None, says: str
) -> None:
    with pytest.raises(GpuError, match=says):
        GpuPlan(gpus).chooser("m", device_type, device_ids)
