"""What the operator sees of one carrier stream: its metrics and log lines, as an observer of what the call produced
that only reports (carrier notices, digits, marker lags, barge-in timing, the first audio's way to the engine) and
of its account as it ends. The media driver (``bridge/media.py``) hands it those and keeps none of it.

Totals are counted once, as the stream ends; nothing is counted per frame. Label values come from bounded sets:
end reasons by their kind (``EndReason``, the part before a detail), engine failures by ``engine_failure_kind``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from structlog.stdlib import BoundLogger

from callbridge.bridge.call import engine_failure_kind
from callbridge.bridge.call_outputs import Notice, Observed, StreamReport
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.log_budget import LogBudget
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.pacing import monotonic_ms
from callbridge.carriers.base import CarrierNotice, DtmfReceived, ProviderCodec, UnknownCarrierEvent
from callbridge.engine.events import EngineErrorEvent, EngineEvent

__all__ = ["StreamTelemetry", "UnknownEventHook"]

UnknownEventHook = Callable[[str, str, BoundLogger], None]
"""``BridgeServices.unknown_carrier_event``: a carrier's event type no codec knows (counted, logged once a type)."""


class StreamTelemetry:
    """One stream's metrics and log lines (see the module docstring). ``log``: the stream's, rebound as the stream
    learns its call and session (``bind``)."""

    def __init__(
        self, metrics: BridgeMetrics, codec: ProviderCodec, log: BoundLogger, unknown_event: UnknownEventHook, refusals: LogBudget
    ) -> None:
        self.metrics, self._codec, self.log, self._unknown_event, self._refusals = metrics, codec, log, unknown_event, refusals
        self._quiet = False
        """A refused stream past the refusals' log budget: counted, its lines left out."""
        self._event_taken: tuple[float, str] | None = None
        """When the last engine event was handed to the call, and its kind (a barge-in it caused is timed from it)."""
        self._first_audio_read_at: float | None = None
        """When the stream's first caller audio was read (``perf_counter``)."""
        self.first_audio_ms: float | None = None
        """From then until it was handed to the engine session (None: not yet)."""

    @property
    def provider(self) -> str:
        """The carrier's name (a codec that recognises the carrier knows it once the stream has started)."""
        return self._codec.provider

    def bind(self, **fields: object) -> None:
        self.log = self.log.bind(**fields)

    # ------------------------------------------------------------ as it runs

    def caller_audio_began(self) -> None:
        self._first_audio_read_at = time.perf_counter()

    def audio_to_engine(self) -> None:
        """Caller audio goes to the engine: the first of it is timed from its read (``first_audio_seconds``)."""
        if self.first_audio_ms is None and self._first_audio_read_at is not None:
            elapsed_s = time.perf_counter() - self._first_audio_read_at
            self.metrics.first_audio_seconds.observe(elapsed_s)
            self.first_audio_ms = round(elapsed_s * 1000, 3)

    def engine_error(self, event: EngineErrorEvent, *, expected: bool = False) -> None:
        """Counted by code; logged as a warning unless the call's own doing (``expected``: bridge-mode barge-in's
        listened-over speech, which the engine's VAD commits with nothing kept), then at debug."""
        self.metrics.engine_errors.labels(event.code).inc()
        log = self.log.debug if expected else self.log.warning
        log("engine_error", code=event.code, detail=event.message, retryable=event.retryable)

    def engine_event_taken(self, event: EngineEvent) -> None:
        """The call took ``event``: a barge-in it causes is timed from now."""
        self._event_taken = (time.perf_counter(), type(event).__name__)

    def notice(self, notice: Notice) -> None:
        match notice:
            case Notice(UnknownCarrierEvent(event)):
                self._unknown_event(self.provider, event, self.log)
            case Notice(DtmfReceived()):
                self.metrics.dtmf_received.labels(self.provider).inc()
                self.log.info("dtmf_received")  # not the digit: callers key in PINs and card numbers
            case Notice(CarrierNotice() as carrier_notice):
                self.log.info("carrier_notice", notice=carrier_notice.name, detail=carrier_notice.detail)

    def observed(self, seen: Observed) -> None:
        """What the call core saw of the conversation: a turn's latency (the caller's end of speech → the agent's
        reply on its way) is measured."""
        if seen.kind == "turn":
            self.metrics.turn_latency_seconds.labels(self.provider).observe(seen.ms / 1000)

    def mark_lag(self, ms: int) -> None:
        self.metrics.mark_lag_seconds.observe(ms / 1000)

    def barge_in_flushed(self) -> None:
        """The barge-in's clear has been sent: timed from the engine event that caused it."""
        if self._event_taken is not None:
            received, signal = self._event_taken
            elapsed_s = time.perf_counter() - received
            self.metrics.barge_in_clear_seconds.observe(elapsed_s)
            self.log.info("barge_in", signal=signal, clear_sent_after_ms=round(elapsed_s * 1000, 3))

    def refused(self, reason: EndCause, call_id: str, peer: str | None) -> None:
        """The stream was refused: counted; logged within the refusals' budget (a sender that reconnects at once
        after each refusal writes a line every ``EVERY_MS`` for its call and address, with how many were left out)."""
        self.metrics.stream_refused.labels(self.provider, reason.kind).inc()
        not_logged = self._refusals.allow(f"{self.provider}:{peer}:{call_id}", monotonic_ms())
        self._quiet = not_logged is None
        if not_logged is not None:
            self.log.warning("stream_refused", reason=reason, **({"not_logged": not_logged} if not_logged else {}))

    def action(self, action: str, outcome: str, detail: str | None) -> None:
        """The carrier work the agent asked for (a transfer, digits) is over: ``outcome`` ok, or why not."""
        self.metrics.call_actions.labels(self.provider, action, outcome).inc()
        self.log.info("call_action", action=action, result=outcome, detail=detail)

    def tool_ran(self, tool: str, failure: str | None, elapsed_ms: float, detail: str) -> None:
        self.metrics.call_actions.labels(self.provider, "ApplicationTool", failure or "ok").inc()
        self.log.info("application_tool", tool=tool, elapsed_ms=elapsed_ms, failure=failure, detail=detail[:300] or None)

    def hung_up(self, reason: str, error: Exception | None) -> None:
        self.metrics.hangups.labels(self.provider, "ok" if error is None else "failed").inc()
        if error is None:
            self.log.info("call_hung_up", reason=reason)
        else:
            self.log.warning("hang_up_failed", reason=reason, error=repr(error))

    # --------------------------------------------------------------- its end

    def ended(self, report: StreamReport) -> None:
        """The stream is over: its totals into the process's metrics, and the line that says how it ended."""
        self._count(report)
        metrics, provider, end_reason = self.metrics, self.provider, report.facts.end_reason
        if report.limit_reached is not None:
            self.log.warning("call_limit_reached", reason=report.limit_reached)
        if report.engine_failure is not None:
            metrics.engine_failures.labels(provider, engine_failure_kind(report.engine_failure)).inc()
            self.log.warning("engine_failed_mid_call", reason=report.engine_failure)
        if report.failure is not None:
            metrics.protocol_errors.labels(provider, report.failure.reason.value).inc()
            self.log.warning("call_ended", reason=end_reason, error=report.failure.detail)
        elif not self._quiet:
            self.log.info(
                "call_ended" if report.facts.call_over else "stream_detached",
                reason=end_reason,
                frames_sent=report.frames_sent,
                frames_flushed=report.frames_flushed,
                first_audio_to_engine_ms=self.first_audio_ms,
            )
        metrics.calls_total.labels(provider, end_reason.kind if end_reason is not None else EndReason.UNKNOWN).inc()

    def _count(self, report: StreamReport) -> None:
        metrics, provider = self.metrics, self.provider
        metrics.audio_seconds.labels(provider, "in").inc(report.stream_input_ms / 1000)
        metrics.audio_seconds.labels(provider, "out").inc(report.output_ms / 1000)
        metrics.frames_flushed.labels(provider).inc(report.frames_flushed)
        metrics.barge_ins.labels(provider).inc(report.barge_ins)
        if report.barge_in_pauses:
            metrics.barge_in_pauses.labels(provider, "resumed").inc(report.barge_in_resumes)
            metrics.barge_in_pauses.labels(provider, "not_resumed").inc(report.barge_in_pauses - report.barge_in_resumes)
        metrics.barge_in_echo_seconds.labels(provider).inc(report.barge_in_echo_ms / 1000)
        metrics.late_audio_dropped.labels(provider).inc(report.late_deltas_dropped)
        metrics.heard_corrections.labels(provider).inc(report.heard_corrections)
        metrics.playout_underruns.labels(provider).inc(report.playout_underruns)
