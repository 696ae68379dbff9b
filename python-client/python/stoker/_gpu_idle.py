"""The GPU idle meter of :class:`stoker.Loader` (public as :class:`stoker.gpu.GpuIdleMeter`):
how long the consumer's stream sat idle waiting for each batch, and, beside a GPU decode lane,
what the loader needs to tell steps beside the lane's work from steps with it quiet."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["GpuIdleMeter"]


class GpuIdleMeter:
    """Events on the consumer's current stream at the start and end of each ``next()``: the
    time between them on the GPU is the time the stream sat with nothing to do but wait for
    the batch (0 when the GPU was still busy with earlier steps). Finished pairs are read
    without waiting and reported to the native loader, one step each, as (idle, span) seconds,
    the span being the GPU time from one batch's hand-out to the next. With ``lane_busy`` (the
    GPU decode lane's busy seconds so far, None without a lane), read as each batch is handed
    out, a step's report also carries the lane's work within the step's host window and that
    window (by ``clock``), from which the loader tells steps beside the lane from steps with it
    quiet. ``index`` None: torch's current device."""

    def __init__(
        self,
        torch: Any,
        index: int | None,
        report: Callable[..., None],
        lane_busy: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._torch = torch
        self._clock = clock
        self._index = index
        self._report = report
        self._lane_busy = lane_busy
        self._free: list[Any] = []
        # (start event, end event, the lane's busy seconds and the host clock at the end).
        self._pending: deque[tuple[Any, Any, float | None, float]] = deque()
        self._start: Any = None
        self._last: tuple[Any, float | None, float] | None = None
        self._stream: Any = None

    def _event(self) -> Any:
        return self._free.pop() if self._free else self._torch.cuda.Event(enable_timing=True)

    def before(self) -> None:
        """At the start of ``next()``."""
        torch = self._torch
        if not torch.cuda.is_initialized():
            self._start = None
            return
        self._stream = torch.cuda.current_stream(self._index)
        self._start = self._event()
        self._start.record(self._stream)

    def after(self) -> None:
        """Once the batch is handed out (after the consumer's stream was told to wait)."""
        if self._start is None:
            return
        end = self._event()
        end.record(self._stream)
        lane = self._lane_busy() if self._lane_busy is not None else None
        if lane is None:
            # A loader without a lane says so at once and for good: not asked again.
            self._lane_busy = None
        self._pending.append((self._start, end, lane, self._clock()))
        self._start = None
        self._drain()

    def cancel(self) -> None:
        """``next()`` ended without a batch (end of epoch, an error)."""
        if self._start is not None:
            self._free.append(self._start)
            self._start = None

    def _drain(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end, lane, at = self._pending.popleft()
            last, self._last = self._last, (end, lane, at)
            self._free.append(start)
            if last is None:
                continue
            last_end, last_lane, last_at = last
            self._free.append(last_end)
            idle = max(0.0, start.elapsed_time(end)) / 1e3
            span = max(0.0, last_end.elapsed_time(end)) / 1e3
            if span <= 0.0:
                continue
            if lane is not None and last_lane is not None:
                self._report(idle, span, max(0.0, lane - last_lane), max(0.0, at - last_at))
            else:
                self._report(idle, span)
