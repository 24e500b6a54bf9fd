"""A load test's raw samples and their statistics (``callbridge.sim.loadtest``): every latency, per-call counts,
the generator's timer lags (``LoadSamples``), merged across generator processes (``merge_samples``), and the report
computed from them (``LoadSamples.report``: ``LoadReport``), never from other statistics."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

import orjson

__all__ = ["FRAME_MS", "CallSamples", "LoadReport", "LoadSamples", "merge_samples", "most_in_a_second", "progress_line", "quantiles", "report_json"]

FRAME_MS: Final = 20


@dataclass
class LoadReport:
    provider: str
    calls: int
    failed_calls: int
    """Calls that did not last: refused at the answer, or broken off (``refused_calls`` of them refused)."""
    duration_s: float
    round_trip_ms: dict[str, float]
    """A click sent → back at the carrier."""
    heard_round_trip_ms: dict[str, float]
    """A click sent → the caller would hear it (after the agent audio queued before it)."""
    first_audio_ms: dict[str, float]
    clicks_sent: int
    clicks_returned: int
    frames_sent: int
    frames_received: int
    """20 ms of agent audio each."""
    reconnects: int
    barge_ins: int
    barge_in_flush_ms: dict[str, float]
    heard_position_error_ms: dict[str, float]
    """The bridge's truncation of the interrupted reply minus what the caller had heard of it at the flush
    (in-process bridges only: it needs the engine)."""
    protocol_warnings: int
    generator_tick_lag_ms: dict[str, float]
    generator_cpu_ms_per_call_second: float
    server_cpu_ms_per_call_second: float | None
    server_rss_mb: float | None
    failures: list[str]
    warnings: list[str]
    generator_processes: int = 1
    bridge_messages_per_call_second: float = 0.0
    """Messages the bridge sent the carrier (media, marks, clears…), per second of call."""
    first_audio_to_engine_ms: dict[str, float] = field(default_factory=dict)
    """From the bridge's metrics: streams, and the bucket bounds (ms) under which half and 99 % of them handed
    their first caller audio to the engine, and the share within 5 ms (%)."""
    refused_calls: int = 0
    """Calls the bridge said no to at the answer (busy, rejected): its admission past capacity."""
    answer_ms: dict[str, float] = field(default_factory=dict)
    """Answered calls: the carrier's first request (the answer webhook) → the stream started."""
    refused_answer_ms: dict[str, float] = field(default_factory=dict)
    """Refused calls: the carrier's first request → the bridge's no."""
    dials: int = 0
    """Placed calls (``--outbound``): the dials the carrier took."""
    dials_in_a_second_max: int = 0
    """The most of them in any one second (a window [t, t + 1 s)): ``outbound.calls_per_second``, or one more where
    dials exactly 1/rate apart land a ms closer by the carrier's clock (the HTTP request's own jitter)."""
    dials_min_gap_ms: float | None = None
    """The two closest dials, as the carrier took them (``1000 / outbound.calls_per_second`` asked)."""
    dials_span_s: float | None = None
    """From the first dial to the last, as the carrier took them."""

    def render(self) -> str:
        def q(stats: dict[str, float]) -> str:
            return " ".join(f"{k} {v:.1f}" for k, v in stats.items()) if stats else "n/a"

        refused = f", {self.refused_calls} of them refused at the answer" if self.refused_calls else ""
        lines = [f"{self.provider}: {self.calls} calls ({self.failed_calls} failed{refused}), {self.duration_s:.1f} s"]
        if self.dials:
            gap = f", the closest two {self.dials_min_gap_ms:.0f} ms apart" if self.dials_min_gap_ms is not None else ""
            lines.append(f"placed: {self.dials} dials, at most {self.dials_in_a_second_max} in any second{gap}")
        lines.append(f"answer, the carrier's first request → the stream (ms): {q(self.answer_ms)}")
        if self.refused_calls:
            lines.append(f"refused, the carrier's first request → the bridge's no (ms): {q(self.refused_answer_ms)}")
        if self.clicks_sent:
            lines += [
                f"round trip, click sent → back at the carrier (ms): {q(self.round_trip_ms)}",
                f"round trip, click sent → heard (ms): {q(self.heard_round_trip_ms)}",
                f"first agent audio after the first caller frame (ms): {q(self.first_audio_ms)}",
                f"clicks: {self.clicks_returned}/{self.clicks_sent} came back; frames: {self.frames_received}/{self.frames_sent}",
            ]
        else:
            lines.append(f"barge-ins: {self.barge_ins}; barge-in → flush (ms): {q(self.barge_in_flush_ms)}")
            lines.append(f"heard-position error, the bridge's truncation − heard at the flush (ms): {q(self.heard_position_error_ms)}")
        lines.append(
            f"reconnects: {self.reconnects}; protocol warnings: {self.protocol_warnings}; "
            f"bridge → carrier: {self.bridge_messages_per_call_second:.1f} messages per call-second"
        )
        lines.append(
            f"generator: tick lag (ms) {q(self.generator_tick_lag_ms)}; CPU {self.generator_cpu_ms_per_call_second:.2f} ms per call-second"
            + (f" ({self.generator_processes} processes)" if self.generator_processes > 1 else "")
        )
        if self.first_audio_to_engine_ms:
            first = self.first_audio_to_engine_ms
            lines.append(
                f"first caller audio read → handed to the engine (bridge's /metrics, {first['streams']:.0f} streams): "
                f"p50 ≤ {first['p50_le']:g} ms, p99 ≤ {first['p99_le']:g} ms, {first['within_5ms_pct']:.1f} % within 5 ms"
            )
        if self.server_cpu_ms_per_call_second is not None:
            lines.append(f"server: CPU {self.server_cpu_ms_per_call_second:.2f} ms per call-second, RSS {self.server_rss_mb:.1f} MB")
        lines += [f"  failed: {failure}" for failure in self.failures[:10]]
        lines += [f"  warning: {warning}" for warning in self.warnings[:10]]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class CallSamples:
    """What one call did, raw (``LoadSamples``)."""

    index: int
    up_from_s: float | None
    """Its first caller frame, in s from the run's start (None: it never came up)."""
    up_until_s: float | None
    """When it ended or failed (None: it never came up)."""
    frames_sent: int
    frames_received: int
    clicks_sent: int
    clicks_returned: int
    reconnects: int
    barge_ins: int
    first_audio_ms: float | None
    failed: str | None
    warnings: tuple[str, ...]
    messages_received: int = 0
    """Messages from the bridge on its streams."""
    answer_ms: float | None = None
    """The call's answer, from the carrier's first request to its stream (or to the refusal)."""
    refused: bool = False
    """Refused at the answer (busy, rejected): counted in ``failed`` too."""


@dataclass
class LoadSamples:
    """The raw samples of a run, or of several generator processes' runs merged (``merge_samples``): the report's
    statistics are computed from these, never from other statistics."""

    provider: str
    calls_planned: int
    started: float
    """``time.monotonic()`` at the run's start: the epoch of every ``*_at_s``."""
    duration_s: float
    calls: list[CallSamples]
    round_trip_ms: list[float]
    heard_round_trip_ms: list[float]
    click_at_s: list[float]
    """When each timed click was sent (s from ``started``), one per ``round_trip_ms`` and ``heard_round_trip_ms``."""
    barge_in_flush_ms: list[float]
    barge_in_at_s: list[float]
    heard_position_error_ms: list[float]
    tick_lag_ms: list[float]
    generator_cpu_ms: float
    processes: int = 1
    server_cpu_ms: float | None = None
    """The server's CPU over the run (``--server-pid``; measured once, by the process that started the run)."""
    server_rss_mb: float | None = None
    first_audio_buckets: dict[float, float] | None = None
    """The bridge's ``callbridge_first_audio_to_engine_seconds`` over the run: bucket bound (s) → streams at or
    under it (``metrics_url``; scraped once, by the process that started the run)."""
    dialled_at_s: list[float] = field(default_factory=list)
    """Placed calls (``--outbound``): when the carrier took each dial (s from ``started``)."""

    @property
    def call_seconds(self) -> float:
        return sum(c.frames_sent for c in self.calls) * FRAME_MS / 1000

    def report(self) -> LoadReport:
        """The statistics, every one over all the samples."""
        call_seconds = self.call_seconds or math.inf  # no call up: 0 per call-second
        warnings = [f"call {c.index}: {w}" for c in self.calls for w in c.warnings]
        errors = self.heard_position_error_ms
        return LoadReport(
            provider=self.provider,
            calls=self.calls_planned,
            failed_calls=sum(c.failed is not None for c in self.calls),
            duration_s=self.duration_s,
            round_trip_ms=quantiles(self.round_trip_ms),
            heard_round_trip_ms=quantiles(self.heard_round_trip_ms),
            first_audio_ms=quantiles([c.first_audio_ms for c in self.calls if c.first_audio_ms is not None]),
            clicks_sent=sum(c.clicks_sent for c in self.calls),
            clicks_returned=sum(c.clicks_returned for c in self.calls),
            frames_sent=sum(c.frames_sent for c in self.calls),
            frames_received=sum(c.frames_received for c in self.calls),
            reconnects=sum(c.reconnects for c in self.calls),
            barge_ins=sum(c.barge_ins for c in self.calls),
            barge_in_flush_ms=quantiles(self.barge_in_flush_ms),
            heard_position_error_ms={"min": min(errors), "p50": statistics.median(errors), "max": max(errors)} if errors else {},
            protocol_warnings=len(warnings),
            generator_tick_lag_ms=quantiles(self.tick_lag_ms),
            generator_cpu_ms_per_call_second=self.generator_cpu_ms / call_seconds,
            server_cpu_ms_per_call_second=None if self.server_cpu_ms is None else self.server_cpu_ms / call_seconds,
            server_rss_mb=self.server_rss_mb,
            bridge_messages_per_call_second=sum(c.messages_received for c in self.calls) / call_seconds,
            failures=[f"call {c.index}: {c.failed}" for c in self.calls if c.failed],
            warnings=warnings,
            generator_processes=self.processes,
            first_audio_to_engine_ms=_bucket_summary(self.first_audio_buckets) if self.first_audio_buckets else {},
            refused_calls=sum(c.refused for c in self.calls),
            answer_ms=quantiles([c.answer_ms for c in self.calls if c.answer_ms is not None and not c.refused]),
            refused_answer_ms=quantiles([c.answer_ms for c in self.calls if c.answer_ms is not None and c.refused]),
            dials=len(self.dialled_at_s),
            dials_in_a_second_max=most_in_a_second(self.dialled_at_s),
            dials_min_gap_ms=min((b - a) * 1000 for a, b in itertools.pairwise(sorted(self.dialled_at_s))) if len(self.dialled_at_s) > 1 else None,
            dials_span_s=max(self.dialled_at_s) - min(self.dialled_at_s) if self.dialled_at_s else None,
        )


def most_in_a_second(at_s: list[float]) -> int:
    """The most of ``at_s`` in any one second (a window [t, t + 1) at any t)."""
    times, most, first = sorted(at_s), 0, 0
    for last, t in enumerate(times):
        while t - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def merge_samples(parts: list[LoadSamples]) -> LoadSamples:
    """Several generator processes' samples as one run's: lists joined (times re-based on the earliest start),
    counts and CPU summed, the calls in index order (the server's CPU and RSS are left to the caller)."""
    if not parts:
        raise ValueError("no samples to merge")
    started = min(part.started for part in parts)
    ended = max(part.started + part.duration_s for part in parts)

    def rebased(part: LoadSamples, times: list[float]) -> list[float]:
        shift = part.started - started
        return [t + shift for t in times] if shift else list(times)

    def call_rebased(part: LoadSamples, call: CallSamples) -> CallSamples:
        shift = part.started - started
        if not shift or call.up_from_s is None:
            return call
        return replace(call, up_from_s=call.up_from_s + shift, up_until_s=None if call.up_until_s is None else call.up_until_s + shift)

    return LoadSamples(
        provider=parts[0].provider,
        calls_planned=sum(part.calls_planned for part in parts),
        started=started,
        duration_s=ended - started,
        calls=sorted((call_rebased(part, c) for part in parts for c in part.calls), key=lambda c: c.index),
        round_trip_ms=[v for part in parts for v in part.round_trip_ms],
        heard_round_trip_ms=[v for part in parts for v in part.heard_round_trip_ms],
        click_at_s=[t for part in parts for t in rebased(part, part.click_at_s)],
        barge_in_flush_ms=[v for part in parts for v in part.barge_in_flush_ms],
        barge_in_at_s=[t for part in parts for t in rebased(part, part.barge_in_at_s)],
        dialled_at_s=[t for part in parts for t in rebased(part, part.dialled_at_s)],
        heard_position_error_ms=[v for part in parts for v in part.heard_position_error_ms],
        tick_lag_ms=[v for part in parts for v in part.tick_lag_ms],
        generator_cpu_ms=sum(part.generator_cpu_ms for part in parts),
        processes=sum(part.processes for part in parts),
    )


def progress_line(elapsed_s: float, up: int, frames_sent: int, round_trip_ms: list[float], barge_in_flush_ms: list[float]) -> str:
    """The live progress line: calls up, frames, the latencies so far."""
    line = f"  {elapsed_s:6.1f} s: {up} calls up, {frames_sent} frames sent"
    rt, barge = quantiles(round_trip_ms), quantiles(barge_in_flush_ms)
    if rt:
        line += f", round trip p50 {rt['p50']:.1f} ms p99 {rt['p99']:.1f} ms"
    if barge:
        line += f", barge-in → flush p50 {barge['p50']:.0f} ms"
    return line


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]

    return {"p50": statistics.median(ordered), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def _bucket_summary(buckets: dict[float, float]) -> dict[str, float]:
    total = buckets.get(math.inf, 0.0)
    if not total:
        return {}
    bounds = sorted(buckets)

    def le(fraction: float) -> float:
        return next(b for b in bounds if buckets[b] >= fraction * total) * 1000

    within = max((count for bound, count in buckets.items() if bound <= 0.005), default=0.0)
    return {"streams": total, "p50_le": le(0.5), "p99_le": le(0.99), "within_5ms_pct": 100 * within / total}


def report_json(report: LoadReport) -> bytes:
    data: dict[str, Any] = asdict(report)
    return orjson.dumps(data, option=orjson.OPT_INDENT_2)
