"""The process's CPU use, for admission: past its budget a bridge refuses new calls rather than let every call
it carries fall behind real time (a late frame is heard by every caller on the process, not just the newest).

Sans-I/O: ``sample(wall_s, cpu_s, calls)`` takes readings (``time.monotonic()``, ``time.process_time()``, the calls
whose streams are carried here) — the app feeds it every half second — and ``utilization`` is the share of one
core used, smoothed over ``window_s``. One event loop runs on one core, so 1.0 is the ceiling that matters
(threads of onnxruntime count too).

Why ``projected``: the smoothed use lags what was just answered by seconds, and a call answered costs nothing until
its stream starts, so a burst of answers (40 a second, on a core that carries about 110 calls) all passed a check of
``utilization`` alone, and every call on the process then fell seconds behind (``bench/past_capacity.py``). What
a carried call costs is measured the same way as the use (the use over the calls carried, both smoothed alike, so
a ramp biases neither), and a new call is admitted only if the process can carry every call it holds, that one
included, within the budget.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["CpuMeter"]

_PRIOR_WEIGHT_CALLS: Final = 2.0
"""How many calls' worth of measurement the configured guess of a call's cost weighs: few calls carried (whose
cost per call is inflated by the process's own fixed work) lean on the guess, many on what was measured."""


class CpuMeter:
    """CPU seconds per wall second, exponentially smoothed; and what one carried call costs."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.utilization = 0.0
        self.calls = 0.0
        """The calls carried, smoothed as ``utilization`` is."""
        self._last: tuple[float, float] | None = None
        self._carried = 0
        """The calls carried at the last sample."""
        self.idle = 0.0
        """What the process uses carrying no call (its own work: metrics, probes, timers), as last seen."""

    def sample(self, wall_s: float, cpu_s: float, calls: int = 0) -> None:
        last, self._last = self._last, (wall_s, cpu_s)
        if last is None:
            self._carried = calls
            return
        elapsed_s = wall_s - last[0]
        if elapsed_s <= 0:
            self._last = last
            return
        current = max(0.0, cpu_s - last[1]) / elapsed_s
        weight = 1 - math.exp(-elapsed_s / self.window_s)
        self.utilization += weight * (current - self.utilization)
        # the use is the interval's mean: so is the count (a ramp's count at the end would make a call look cheaper)
        self.calls += weight * ((calls + self._carried) / 2 - self.calls)
        if not calls and not self._carried:
            self.idle = self.utilization
        self._carried = calls

    def per_call(self, guess: float) -> float:
        """The share of a core one carried call costs: what was measured (the use beyond the process's own, over the
        calls carried), leaning on ``guess`` (the configuration's) while few calls have been."""
        carrying = max(0.0, self.utilization - self.idle)
        return (carrying + guess * _PRIOR_WEIGHT_CALLS) / (self.calls + _PRIOR_WEIGHT_CALLS)

    def guess(self, budget: float, max_calls: int) -> float:
        """What a call is taken to cost while few have been measured (``per_call``'s ``guess``): ``max_calls`` of
        them fill what ``budget`` (a share of a core) leaves beside the process's own use. Sized on the whole budget,
        the process's use made ``max_calls`` calls exceed it: the last slot of a small ``max_calls`` was refused."""
        return max(0.0, budget - self.idle) / max_calls

    def projected(self, calls: int, guess: float) -> float:
        """The share of a core the process uses once it carries ``calls`` (those it holds, answered or streaming,
        and the one asked about): never less than it uses now."""
        return max(self.utilization, self.idle + self.per_call(guess) * calls)
