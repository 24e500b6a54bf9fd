"""A call's end-of-call report as its streams build it: each stream adds what it saw (turns, barge-ins, digits,
tools, the agent's transcript, audio sent) and, where the call goes on in another stream (a reconnect, a move to
another process), hands the report so far on in the registry (``REPORT_NOTE``); the stream that ends the call
makes the ``CallReport``. Pure: the driver feeds it and stores it."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

import orjson

from callbridge.application import CallContext
from callbridge.application.events import CallReport, Latency, MediaQuality, SpokenLine
from callbridge.bridge.call_outputs import Observed
from callbridge.bridge.end_reason import EndCause, EndReason

__all__ = ["REPORT_NOTE", "CallReportBuilder", "ended_by"]

REPORT_NOTE: Final = "report"
"""The registry note (``CallRegistry.keep_note``) a call's report so far is handed on under."""
_MAX_ITEMS: Final = 500
"""Turns, barge-ins and transcript lines kept: a report stays small however long the call."""
_MAX_LINE_CHARS: Final = 4000


@dataclass(slots=True)
class CallReportBuilder:
    started_at: float
    """Unix time (s) the call's first stream bound its engine session."""
    streams: int = 0
    latencies_ms: list[int] = field(default_factory=list)
    barged_heard_ms: list[int] = field(default_factory=list)
    barged_generated_ms: list[int | None] = field(default_factory=list)
    agent_audio_ms: int = 0
    dtmf: int = 0
    barge_in_pauses: int = 0
    barge_in_resumes: int = 0
    barge_in_echo_ms: int = 0
    tools: int = 0
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """``{"response_id", "text", "heard_ms"}`` for the agent's replies, ``{"role": "caller", "item_id", "text"}``
    for what the caller said (where the engine transcribes it), in the order they came."""
    seq: int = 0
    """Events sent for the call so far (``CallEvent.seq``)."""
    recording: str | None = None
    """The call's recording file, once a stream has written to it."""
    engine_endpoint: str | None = None
    engine_sessions: int = 0
    engine_resumes: int = 0
    answered_by: str | None = None
    """A placed call with machine detection: ``person``, ``machine`` or ``uncertain``, and why (``machine:beep``)."""
    answered_by_after_ms: int | None = None
    first_agent_audio_ms: int | None = None
    media: dict[str, Any] | None = None
    """A SIP call's line (``MediaQuality``, as JSON): its last stream's."""

    def bound(self, resumed: bool, endpoint: str | None) -> None:
        """A stream bound the call's engine session: a new one, or resumed; on ``endpoint`` (None: embedded)."""
        if resumed:
            self.engine_resumes += 1
        else:
            self.engine_sessions += 1
        self.engine_endpoint = endpoint

    def observe(self, observed: Observed) -> None:
        match observed.kind:
            case "turn" if len(self.latencies_ms) < _MAX_ITEMS:
                self.latencies_ms.append(observed.ms)
            case "barge-in" if len(self.barged_heard_ms) < _MAX_ITEMS:
                self.barged_heard_ms.append(observed.ms)
                self.barged_generated_ms.append(observed.of_ms)
                for line in reversed(self.transcript):
                    if line["response_id"] == observed.response_id:
                        line["heard_ms"] = observed.ms
                        break
            case "dtmf":
                self.dtmf += 1
            case "barge-in-pause":
                self.barge_in_pauses += 1
            case "barge-in-resume":
                self.barge_in_resumes += 1
            case "answered-by":
                self.answered_by, self.answered_by_after_ms = observed.detail, observed.ms

    def transcribed(self, response_id: str, delta: str) -> None:
        """A piece of the agent's output transcript."""
        if self.transcript and self.transcript[-1]["response_id"] == response_id:
            line = self.transcript[-1]
            line["text"] = (line["text"] + delta)[:_MAX_LINE_CHARS]
        elif len(self.transcript) < _MAX_ITEMS:
            self.transcript.append({"response_id": response_id, "text": delta[:_MAX_LINE_CHARS], "heard_ms": None})

    def caller_said(self, item_id: str | None, text: str) -> None:
        """The engine's transcript of an input item of the caller's."""
        if len(self.transcript) < _MAX_ITEMS:
            self.transcript.append({"role": "caller", "item_id": item_id, "text": text[:_MAX_LINE_CHARS], "response_id": None, "heard_ms": None})

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> CallReportBuilder:
        return cls(**orjson.loads(text))

    def report(
        self,
        call: CallContext,
        *,
        ended_at: float,
        end_reason: EndCause,
        engine_session_id: str | None,
        metadata: dict[str, Any] | None = None,
    ) -> CallReport:
        latencies = self.latencies_ms
        return CallReport(
            call=call,
            started_at=self.started_at,
            ended_at=ended_at,
            duration_ms=max(0, round((ended_at - self.started_at) * 1000)),
            end_reason=end_reason,
            ended_by=ended_by(end_reason),
            streams=self.streams,
            turns=len(latencies),
            turn_latency=Latency(count=len(latencies), p50_ms=round(statistics.median(latencies)), max_ms=max(latencies))
            if latencies
            else None,
            barge_ins=len(self.barged_heard_ms),
            barged_heard_ms=list(self.barged_heard_ms),
            barged_generated_ms=list(self.barged_generated_ms),
            agent_audio_ms=self.agent_audio_ms,
            dtmf=self.dtmf,
            barge_in_pauses=self.barge_in_pauses,
            barge_in_resumes=self.barge_in_resumes,
            barge_in_echo_ms=self.barge_in_echo_ms,
            tools=self.tools,
            engine_session_id=engine_session_id,
            engine_endpoint=self.engine_endpoint,
            engine_sessions=self.engine_sessions,
            engine_resumes=self.engine_resumes,
            transcript=[
                SpokenLine(role=line.get("role", "agent"), text=line["text"], response_id=line["response_id"], item_id=line.get("item_id"), heard_ms=line["heard_ms"])
                for line in self.transcript
            ],
            recording=self.recording,
            metadata=metadata or {},
            answered_by=self.answered_by.partition(":")[0] if self.answered_by else None,  # type: ignore[arg-type]
            answered_by_after_ms=self.answered_by_after_ms,
            first_agent_audio_ms=self.first_agent_audio_ms,
            media=MediaQuality.model_validate(self.media) if self.media is not None else None,
        )


_ENDED_BY: Final[dict[EndReason, Literal["caller", "agent", "engine", "carrier"]]] = {
    EndReason.CALLER_HUNG_UP: "caller",
    EndReason.STREAM_STOPPED: "caller",
    EndReason.CALLER_SILENT: "agent",  # the agent said goodbye to a caller who said nothing
    EndReason.AGENT_HUNG_UP: "agent",
    EndReason.MACHINE_DETECTED: "agent",
    EndReason.VOICEMAIL_LEFT: "agent",
    EndReason.TRANSFERRED: "agent",
    EndReason.ENGINE_SESSION_CLOSED: "engine",
    EndReason.ENGINE_SESSION_EXPIRED: "engine",
    EndReason.ENGINE_STREAM_FAILED: "engine",
    EndReason.ENGINE_UNAVAILABLE: "engine",
    EndReason.ENGINE_FAILED: "engine",
    EndReason.PROTOCOL_ERROR: "carrier",
    EndReason.NO_RECONNECT: "carrier",  # its stream ended and did not come back
}


def ended_by(cause: EndCause) -> Literal["caller", "agent", "bridge", "engine", "carrier"]:
    """Who ended the call, from how its last stream ended (the bridge: its limits, a shutdown, a refusal…)."""
    return _ENDED_BY.get(cause.kind, "bridge")
