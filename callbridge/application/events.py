"""What callbridge tells the application about its calls as they happen (``CallEvent``), and the end-of-call report
(``CallReport``) the last event carries. Delivered off the media path, with retries, from a bounded queue: a slow or
absent application never slows a call (``callbridge.bridge.app_events``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from callbridge.application.context import CallContext

__all__ = ["CallEvent", "CallReport", "EventType", "Latency", "MediaQuality", "SpokenLine"]

EventType = Literal[
    "call.dialing", "call.ringing", "call.failed", "call.started", "call.answered", "call.resumed", "call.machine_detected",
    "call.voicemail_left", "turn", "barge-in", "dtmf", "silence", "tool", "transfer", "call.ended",
]  # fmt: skip


class CallEvent(BaseModel):
    """One thing that happened on a call. A call the agent places first has ``call.dialing`` (the carrier took the
    request: ``{"dial_id"}``), ``call.ringing`` and, where nobody answers, ``call.failed`` ``{"dial_id", "reason":
    "busy" | "no_answer" | "declined" | "failed" | "canceled", "detail"}`` (its last event); its ``call_id`` is the
    carrier's, or the dial id where the carrier never named the call; with ``machine_detection``,
    ``call.machine_detected`` ``{"answered_by": "person" | "machine" | "uncertain", "why", "after_ms",
    "greeting_ms"}`` says who answered, and ``call.voicemail_left`` that the message played. ``call.started``: the application chose the
    call's assistant (the carrier is answered with it); ``call.answered``: its media flows, the agent's session bound (``{"engine"}``: its server, None for the embedded
    engine); ``call.resumed`` ``{"stream", "session": "resumed" | "new", "engine"}``: a later stream of the call (a
    reconnect, a move to another bridge process) took its session on, or a new one where its engine was lost. ``data`` by type: ``turn``
    ``{"latency_ms"}`` (the caller stopped speaking → the agent's reply on its way to them); ``barge-in``
    ``{"heard_ms", "generated_ms", "decided_by": "engine" | "bridge"}`` (``barge_in.mode``); ``dtmf`` ``{"digit"}``; ``silence`` ``{"silent_ms", "action": "reprompt" |
    "hang_up"}``; ``tool`` ``{"name", "ok", "elapsed_ms"}``; ``transfer`` ``{"target", "ok"}``; ``call.ended``
    ``{"report": CallReport}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: EventType
    call_id: str
    at: float
    """Unix time (s) it happened, as the bridge saw it."""
    seq: int = 0
    """Its order among the events one stream of the call sent (a reconnected call's next stream counts on)."""
    data: dict[str, Any] = Field(default_factory=dict)


class Latency(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int
    p50_ms: int
    max_ms: int


class MediaQuality(BaseModel):
    """A SIP call's media and what the network did to it (``callbridge/sip/call_quality.py`` says how each figure is
    made): the caller's stream as it reached us, ours as the peer's RTCP says it reached them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    codec: str
    """As SDP names it: ``PCMU``, ``PCMA``, ``G722``, ``opus``."""
    encryption: Literal["srtp", "none"]
    packets_expected: int
    """The caller's media packets, by their sequence numbers."""
    packets_lost: int
    """Of those, concealed (never came, or came too late: ``packets_late``)."""
    packets_late: int
    loss_percent: float
    jitter_ms: float
    """RFC 3550's interarrival jitter at the call's end."""
    jitter_max_ms: float
    round_trip_ms: float | None
    """The last round trip the peer's RTCP showed (None: it sent no report of our stream after seeing an SR of ours)."""
    round_trip_max_ms: float | None
    peer_loss_percent: float | None
    """Our stream as the peer's last report says it arrived (None: no report)."""
    peer_jitter_ms: float | None
    mos: float
    """E-model estimate (ITU-T G.107) of the network's part, 1–4.5: loss, and delay where the round trip is known."""


class SpokenLine(BaseModel):
    """A line of the call: a reply of the agent's, as the engine transcribed it (its output transcript), and how
    much was heard; or what the caller said, where the model transcribes its input (``role`` caller)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["agent", "caller"] = "agent"
    text: str
    response_id: str | None = None
    """The agent's reply (None on a caller's line)."""
    item_id: str | None = None
    """The caller's input item (a caller's line, where the engine names it)."""
    heard_ms: int | None = None
    """Where the caller cut the reply off (a barge-in); None: heard to its end, as far as the bridge knows."""


class CallReport(BaseModel):
    """The end-of-call report: how the call went, over all its streams (a call that reconnected, or moved to
    another bridge process, is one call)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call: CallContext
    started_at: float
    ended_at: float
    duration_ms: int
    end_reason: str
    ended_by: Literal["caller", "agent", "bridge", "engine", "carrier"]
    streams: int
    """Media streams the call had: more than one after a reconnect or a move between bridge processes."""
    turns: int
    turn_latency: Latency | None
    """The caller stopped speaking → the agent's reply on its way to them, over the call's turns."""
    barge_ins: int
    barged_heard_ms: list[int] = Field(default_factory=list)
    """For each barge-in, how much of the reply the caller heard before cutting in."""
    barged_generated_ms: list[int | None] = Field(default_factory=list)
    """For each barge-in, how much of that reply the engine had generated (None: not known), beside
    ``barged_heard_ms``: the share of it heard."""
    barge_in_pauses: int = 0
    """``barge_in.mode = "bridge"``: times the agent was paused for the caller's speech over it. Each either resumed
    (``barge_in_resumes``: no interruption — the reply played on where the caller stopped hearing it) or was
    confirmed (a barge-in, counted in ``barge_ins``)."""
    barge_in_resumes: int = 0
    barge_in_echo_ms: int = 0
    """``barge_in.mode = "bridge"``: how much of the caller's line was only the agent's own voice coming back (a
    speakerphone, a PBX without echo cancelling), sound the engine's VAD would have taken for the caller — sent to
    it as silence. 0 on a line with no echo."""
    agent_audio_ms: int
    """Agent audio the bridge sent to the caller's carrier (what played, but for what a flush dropped)."""
    dtmf: int
    tools: int
    engine_session_id: str | None
    engine_endpoint: str | None = None
    """The engine server the call's session was last on (its URL, without a query); None: the embedded engine."""
    engine_sessions: int = 0
    """Engine sessions the call opened: more than one where its engine was lost and a new session took the call."""
    engine_resumes: int = 0
    """Streams that resumed the call's session (a reconnect, a move to another bridge process, a takeover)."""
    transcript: list[SpokenLine] = Field(default_factory=list)
    """The call's lines in order: the agent's replies where the engine transcribes its output, the caller's where
    the model transcribes its input (``role`` caller); the bridge transcribes nothing itself."""
    recording: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The assistant's ``metadata``, as the application gave it."""
    answered_by: Literal["person", "machine", "uncertain"] | None = None
    """A call the agent placed with ``machine_detection``: who answered, as the bridge decided."""
    answered_by_after_ms: int | None = None
    """When it was decided, from the answer (the callee's first audio)."""
    first_agent_audio_ms: int | None = None
    """The answer (the call's engine session bound) → the first audio sent to the caller: the greeting's first frame,
    for a placed call with machine detection once a person is known; None: the agent never spoke."""
    media: MediaQuality | None = None
    """A SIP call's codec, encryption and network figures (jitter, loss, round trip, MOS); None for the other
    carriers (their media comes over TCP: the carrier's own network is not ours to see)."""
