"""Which GPU each worker gets (sans-IO).

TorchServe's rules, with its gaps closed:

* The server uses ``number_of_gpu`` GPUs, by default every GPU the machine shows it
  (:func:`visible_gpu_count`: ``CUDA_VISIBLE_DEVICES`` when set, else the count
  ``nvidia-smi`` reports, else none). A ``number_of_gpu`` above what is visible is cut to it.
* A model whose ``deviceType`` is ``cpu``, or any model when the server uses no GPU, gets
  CPU workers (``gpu_id`` None).
* Otherwise each new worker takes the next GPU round-robin: over the model's ``deviceIds``
  when it has them, else over the server's GPUs with one counter shared by every model, so
  models spread across the GPUs together.
* ``deviceType: gpu`` on a server with no GPU, or a ``deviceIds`` entry past the server's
  GPUs, is refused when the model is registered (:class:`GpuError`), not left to fail in
  the worker. TorchServe starts such workers and lets them fail.

A ``gpu_id`` is an index among the visible devices: with ``CUDA_VISIBLE_DEVICES=3,5``,
``gpu_id`` 0 is physical GPU 3 and ``cuda:0`` in the worker. Handlers use it as TorchServe's
do (``torch.device(f"cuda:{gpu_id}")``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = ["GpuError", "GpuPlan", "parse_visible_devices", "visible_gpu_count"]


class GpuError(ValueError):
    """A model's device settings cannot be met on this server."""


def parse_visible_devices(value: str) -> int:
    """How many devices ``CUDA_VISIBLE_DEVICES=value`` shows: entries up to the first
    invalid one (CUDA's own rule; ``-1`` or an empty value shows none)."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def visible_gpu_count(env: Mapping[str, str], nvidia_smi: Callable[[], int | None]) -> int:
    """The GPUs this server can see: ``CUDA_VISIBLE_DEVICES`` when set, else
    ``nvidia_smi()`` (None or 0 when there is no such tool or GPU)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return parse_visible_devices(visible)
    return nvidia_smi() or 0


class GpuPlan:
    """Hands out ``gpu_id`` values to new workers (one plan per server)."""

    def __init__(self, gpus: int) -> None:
        self.gpus = max(0, gpus)
        self._next = 0  # the shared round-robin counter

    def chooser(
        self, model: str, device_type: str | None, device_ids: Sequence[int] | None
    ) -> Callable[[], int | None]:
        """The ``gpu_id`` picker of one model's new workers; :class:`GpuError` when its
        settings cannot be met."""
        if device_type == "cpu":
            return lambda: None
        if device_ids:
            bad = [i for i in device_ids if not 0 <= i < self.gpus]
            if bad:
                raise GpuError(
                    f"Model {model}: deviceIds {list(device_ids)} name GPUs this server does "
                    f"not have ({self._have()})"
                )
            ids = list(device_ids)
            turn = 0

            def from_ids() -> int | None:
                nonlocal turn
                gpu = ids[turn % len(ids)]
                turn += 1
                return gpu

            return from_ids
        if self.gpus == 0:
            if device_type == "gpu":
                raise GpuError(f"Model {model}: deviceType is gpu, but {self._have()}")
            return lambda: None
        return self._shared

    def _shared(self) -> int | None:
        gpu = self._next % self.gpus
        self._next += 1
        return gpu

    def _have(self) -> str:
        if self.gpus == 0:
            return "this server uses no GPU (number_of_gpu, CUDA_VISIBLE_DEVICES)"
        return f"it uses {self.gpus}: ids 0 to {self.gpus - 1}"
