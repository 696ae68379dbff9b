""":meth:`stoker.Loader.stats` and the figures it derives from the native counters: the shares
of time the GPU and the training loop waited, and the share the GPU decode lane cost the step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker._batches import BatchFeed
    from stoker._native import NativeLoader

__all__ = ["Stats"]


class Stats:
    """The ``stats()`` of :class:`stoker.Loader` (a part of it, as a base class)."""

    _thread_rule: str
    _feed: BatchFeed

    def _handle(self) -> NativeLoader:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """Counters since the loader was made.

        Returns:
            The native counters (``samples``, ``batches``, ``elapsed_s``, ``samples_per_s``,
            ``wait_s`` (time the caller waited inside ``next()``), ``first_batch_s``, ``read_s``,
            ``decode_s``, ``augment_s``, ``assemble_s`` (thread-seconds per stage),
            ``bad_samples``, ``tokens_dropped`` (packed text: document tokens past a batch's
            last row, dropped), ``in_flight``, ``prefetch_depth`` (the current depth, which
            ``prefetch="auto"`` adjusts), ``slots_in_use``, ``slot_capacity``, ``pinned`` (every
            slot page-locked), ``pinned_bytes``, ``pin_error`` (why the driver refused to lock a
            slot, or None), ``pinned_device`` (the CUDA device whose context locks the slots,
            chosen when the first batch goes out; None before, and for pageable slots),
            ``gpu_idle_s`` and ``gpu_span_s`` (seconds the consumer's CUDA
            stream sat idle waiting for a batch, over how much of its time: measured with events
            once torch has started CUDA), ``gpu_lane_cost_s`` (with a GPU decode lane: seconds
            that stream was busier on steps beside the lane's work than on steps with the lane
            quiet, counted once ``gpu_lane_quiet_steps`` such steps give a baseline; they come
            where the lane has nothing to build, and under ``decode="auto"`` from points it
            builds all on the CPU)), ``thread_rule`` (how ``num_threads`` was chosen),
            ``device`` (``"cpu"`` or ``"cuda:N"``), ``gpu_idle_fraction`` (``gpu_idle_s /
            gpu_span_s``, the GPU's share of time waiting for data), ``gpu_lane_cost_fraction``
            (``gpu_lane_cost_s / gpu_span_s``, the GPU's share of time the lane beside the step
            cost it, which no wait shows) and ``stall_fraction``: ``wait_s / elapsed_s``, the
            share of time the training loop spent waiting for data.
        """
        stats: dict[str, Any] = dict(self._handle().stats())
        stats["thread_rule"] = self._thread_rule
        stage = self._feed.stage
        stats["device"] = f"cuda:{stage.index}" if stage is not None else "cpu"
        _add_fractions(stats)
        return stats


def _add_fractions(stats: dict[str, Any]) -> None:
    """Adds ``gpu_idle_fraction``, ``gpu_lane_cost_fraction`` and ``stall_fraction`` to
    ``stats`` (0 where the time they divide by is 0)."""

    def share(part: str, whole: str) -> float:
        total = float(stats.get(whole) or 0.0)
        return float(stats.get(part, 0.0)) / total if total > 0 else 0.0

    stats["gpu_idle_fraction"] = share("gpu_idle_s", "gpu_span_s")
    stats["gpu_lane_cost_fraction"] = share("gpu_lane_cost_s", "gpu_span_s")
    stats["stall_fraction"] = share("wait_s", "elapsed_s")
