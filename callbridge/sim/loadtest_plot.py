"""``callbridge loadtest --png``: the latency distribution over time, drawn from a run's raw samples.

Top: per second of the run, p50 / p95 / p99 of the click round trip (the barge-in → flush latency in barge-in mode)
of the clicks sent in that second, and the calls up. Bottom: the histogram of every sample. The per-second
statistics come from the samples (``per_second``), so a run merged from several generator processes is drawn the
same way. matplotlib is an optional extra (``pip install 'callbridge[plot]'``); ``require_matplotlib`` says so
before a run starts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from callbridge.sim.loadtest import LoadSamples

__all__ = ["INSTALL_HINT", "PlotUnavailable", "SecondStats", "per_second", "require_matplotlib", "write_png"]

INSTALL_HINT: Final = "--png needs matplotlib: pip install 'callbridge[plot]'"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raises ``PlotUnavailable`` (with ``INSTALL_HINT``) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailable(f"{INSTALL_HINT} ({exc})") from None


@dataclass(frozen=True, slots=True)
class SecondStats:
    """One second of a run: the latencies of what was sent in it (NaN: none), and the calls up at its middle."""

    second: int
    count: int
    p50: float
    p95: float
    p99: float
    calls_up: int


def _at(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _series(samples: LoadSamples) -> tuple[str, list[float], list[float]]:
    if samples.round_trip_ms or not samples.barge_in_flush_ms:
        return "click round trip, sent → back at the carrier", samples.round_trip_ms, samples.click_at_s
    return "barge-in → flush", samples.barge_in_flush_ms, samples.barge_in_at_s


def per_second(samples: LoadSamples) -> list[SecondStats]:
    """Per second from the run's start: the click round trips (barge-in mode: barge-in → flush) sent in it, their
    p50 / p95 / p99 (the same quantiles as the report), and how many calls were up."""
    _, values, times = _series(samples)
    seconds = max(1, math.ceil(samples.duration_s), *(int(t) + 1 for t in times))
    buckets: list[list[float]] = [[] for _ in range(seconds)]
    for value, at in zip(values, times, strict=True):
        buckets[max(0, int(at))].append(value)
    rows = []
    for second, bucket in enumerate(buckets):
        middle = second + 0.5
        up = sum(
            c.up_from_s is not None and c.up_until_s is not None and c.up_from_s <= middle < c.up_until_s for c in samples.calls
        )
        if bucket:
            bucket.sort()
            rows.append(SecondStats(second, len(bucket), statistics.median(bucket), _at(bucket, 0.95), _at(bucket, 0.99), up))
        else:
            rows.append(SecondStats(second, 0, math.nan, math.nan, math.nan, up))
    return rows


def write_png(samples: LoadSamples, path: Path) -> None:
    """Draw the run (``per_second`` over time, and the histogram) into ``path``."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    label, values, _ = _series(samples)
    rows = per_second(samples)
    figure = Figure(figsize=(10, 7), layout="constrained")
    FigureCanvasAgg(figure)
    over_time, histogram = figure.subplots(2, 1, height_ratios=(3, 2))
    seconds = [row.second + 0.5 for row in rows]
    for name, color in (("p50", "tab:blue"), ("p95", "tab:orange"), ("p99", "tab:red")):
        over_time.plot(seconds, [getattr(row, name) for row in rows], label=name, color=color, marker=".", markersize=3)
    over_time.set_xlabel("s since the run started")
    over_time.set_ylabel(f"{label} (ms)")
    over_time.set_ylim(bottom=0)
    over_time.grid(alpha=0.3)
    calls_up = over_time.twinx()
    calls_up.fill_between(seconds, [row.calls_up for row in rows], step="mid", color="tab:gray", alpha=0.15, label="calls up")
    calls_up.set_ylabel("calls up")
    calls_up.set_ylim(bottom=0)
    lines, names = over_time.get_legend_handles_labels()
    more_lines, more_names = calls_up.get_legend_handles_labels()
    over_time.legend(lines + more_lines, names + more_names, loc="upper left")
    processes = f", {samples.processes} generator processes" if samples.processes > 1 else ""
    over_time.set_title(f"{samples.provider}: {len(samples.calls)} calls, {samples.duration_s:.0f} s{processes}")
    if values:
        histogram.hist(values, bins=min(100, max(10, len(values) // 20)), color="tab:blue", alpha=0.8)
        ordered = sorted(values)
        for name, value, color in (("p50", statistics.median(ordered), "tab:blue"), ("p99", _at(ordered, 0.99), "tab:red")):
            histogram.axvline(value, color=color, linestyle="--", label=f"{name} {value:.1f} ms")
        histogram.legend(loc="upper right")
    histogram.set_xlabel(f"{label} (ms), all {len(values)} samples")
    histogram.set_ylabel("count")
    figure.savefig(path, dpi=100)
