"""The process's CPU use, for admission: past its budget a bridge refuses new calls rather than let every call
it carries fall behind real time (a late frame is heard by every caller on the process, not just the newest).

Sans-I/O: ``sample(wall_s, cpu_s)`` takes readings (``time.monotonic()``, ``time.process_time()``) — the app
feeds it every half second — and ``utilization`` is the share of one core used, smoothed over ``window_s``.
One event loop runs on one core, so 1.0 is the ceiling that matters (threads of onnxruntime count too).
"""

from __future__ import annotations

import math

__all__ = ["CpuMeter"]


class CpuMeter:
    """CPU seconds per wall second, exponentially smoothed."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.utilization = 0.0
        self._last: tuple[float, float] | None = None

    def sample(self, wall_s: float, cpu_s: float) -> None:
        last, self._last = self._last, (wall_s, cpu_s)
        if last is None:
            return
        elapsed_s = wall_s - last[0]
        if elapsed_s <= 0:
            self._last = last
            return
        current = max(0.0, cpu_s - last[1]) / elapsed_s
        weight = 1 - math.exp(-elapsed_s / self.window_s)
        self.utilization += weight * (current - self.utilization)
