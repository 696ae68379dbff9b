"""The figures :meth:`stoker.Loader.stats` derives from the native counters: the shares of time
the GPU and the training loop waited, and the share the GPU decode lane cost the step."""

from __future__ import annotations

from typing import Any


def add_fractions(stats: dict[str, Any]) -> None:
    """Adds ``gpu_idle_fraction``, ``gpu_lane_cost_fraction`` and ``stall_fraction`` to
    ``stats`` (0 where the time they divide by is 0)."""

    def share(part: str, whole: str) -> float:
        total = float(stats.get(whole) or 0.0)
        return float(stats.get(part, 0.0)) / total if total > 0 else 0.0

    stats["gpu_idle_fraction"] = share("gpu_idle_s", "gpu_span_s")
    stats["gpu_lane_cost_fraction"] = share("gpu_lane_cost_s", "gpu_span_s")
    stats["stall_fraction"] = share("wait_s", "elapsed_s")
