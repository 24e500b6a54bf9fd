"""The simulated caller (``SimulatedCarrier.place_call``): what they do (``CallerScript``), what happened to them
(``CallResult``: what they heard, the timeline) and, tick by tick, what they hear and say (``CallerSide``: their
words, a backchannel, their talking over the agent, and what their line adds: ``sim/caller_line.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from callbridge.sim.caller_line import CallerLine, backchannel_piece

__all__ = ["FRAME_MS", "CallResult", "CallerScript", "CallerSide", "TimelineEvent", "caller_timeline"]

FRAME_MS = 20
_SILENCE_8K = bytes(320)


@dataclass(frozen=True, slots=True)
class CallerScript:
    """What the caller does. Times are ms from the moment the call is placed."""

    utterances: tuple[tuple[int, bytes], ...] = ()
    """(start_ms, PCM16 8 kHz) the caller says."""
    dtmf: tuple[tuple[int, str], ...] = ()
    drop_stream_at_ms: tuple[int, ...] = ()
    """Drop the media connection at these times (no goodbye); the carrier reconnects if it can."""
    hangup_at_ms: int | None = None
    """The caller hangs up then; None: 1.5 s after the agent last finished speaking, at most ``max_call_ms``."""
    max_call_ms: int = 30_000
    interrupt_after_agent_ms: int | None = None
    """Say ``interruption`` (the first utterance again) this long after the agent starts speaking (a barge-in)."""
    redirect_delay_ms: int = 0
    """How long the carrier takes, after a connection drops, to open the next one."""
    hangs_up_while_dropped: bool = False
    """The caller hangs up while the media connection is down (at its first drop): the carrier never opens another,
    and tells the bridge nothing more than its own webhooks do."""
    unknown_events_at_ms: tuple[int, ...] = ()
    """The carrier sends an event type it added since (``SimulatedCarrier.unknown_event``) at these times."""
    echo_db: float | None = None
    """The agent's voice comes back on the caller's line this many dB down (a speakerphone, a PBX without echo
    cancelling), ``echo_delay_ms`` after the caller heard it; None: no echo."""
    echo_delay_ms: int = 0
    backchannels_ms: tuple[int, ...] = ()
    """The caller says a short "go on" (the first ``backchannel_ms`` of the first utterance) this long after the
    agent first starts speaking, each: meant as no interruption."""
    backchannel_ms: int = 400
    backchannel: bytes | None = None
    """What the caller says as each backchannel (PCM16 8 kHz, whole: an "mm-hm" of the corpus); None: the first
    ``backchannel_ms`` of the first utterance."""
    interruption: bytes | None = None
    """What the caller says over the agent at ``interrupt_after_agent_ms``; None: the first utterance."""
    noise_db: float | None = None
    """Line noise under everything the caller's line sends (``sim/caller_line.py``'s ``LineNoise``); None: none."""
    room: tuple[bytes, float] | None = None
    """Voices in the caller's room (PCM16 8 kHz, again and again from the call's start) this many dB under it."""
    band: bool = False
    """All the caller's line sends passes the telephone network's band (300–3400 Hz: ``TelephoneBand``)."""
    wideband: bytes | None = None
    """A wideband caller: PCM16 at 16 kHz from the call's start, sent in place of the 8 kHz frames (one 20 ms frame for
    one) where the carrier's stream is at 16 kHz (the L16 websocket carriers at 16 kHz): what G.711 cannot carry reaches the
    bridge. The utterances still time the caller's turns in the timeline; elsewhere (8 kHz streams) it is unused."""


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    at_ms: int
    who: str
    what: str


@dataclass
class CallResult:
    call_sid: str
    heard: bytearray = field(default_factory=bytearray)
    """PCM16 8 kHz: what the caller heard, frame by frame from the call's start."""
    timeline: list[TimelineEvent] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What the real carrier would have rejected or warned about."""
    marks_echoed: list[str] = field(default_factory=list)
    clears: list[int] = field(default_factory=list)
    """At each flush: how many ms of agent audio it dropped."""
    played_ms_at_clear: list[int] = field(default_factory=list)
    """At each flush: agent audio played (ms) on the stream so far."""
    cleared_at_s: list[float] = field(default_factory=list)
    """At each flush: when it arrived (``time.monotonic()``), to set against when the bridge decided it."""
    hung_up_by: str | None = None
    transferred_to: str | None = None
    """Where the bridge sent the call on at its answer (the carrier's own transfer: ``<Dial>``, ``connect``, 302…)."""
    agent_speech_ms: int = 0
    agent_ticks: bytearray = field(default_factory=bytearray)
    """Per 20 ms tick from the call's start: 1 where the caller heard the agent's audio (quiet moments of its
    speech included), else 0."""
    agent_runs_ms: list[int] = field(default_factory=list)
    """The agent's speech as the caller heard it, in runs (a gap of more than 200 ms starts a new one): a
    barge-in ends a run where the caller stopped hearing it."""

    def log(self, at_ms: int, who: str, what: str) -> None:
        self.timeline.append(TimelineEvent(at_ms, who, what))

    @property
    def heard_ms(self) -> int:
        return len(self.heard) // 16

    @property
    def first_agent_heard_ms(self) -> int | None:
        """When the caller first heard the agent (the start of its tick), from the call's start; None: never."""
        first = self.agent_ticks.find(1)
        return first * FRAME_MS if first >= 0 else None

    def render(self) -> str:
        return "\n".join(f"{e.at_ms / 1000:8.3f} s  {e.who:<7} {e.what}" for e in self.timeline)

    def failure_tone_at_ms(self) -> int | None:
        """When the caller first heard the reorder tone (480 + 620 Hz, the bridge's failure audio), in ms from the
        call's start: the first frame whose energy is nearly all at those two frequencies. None: never."""
        heard = bytes(self.heard)
        samples = np.frombuffer(heard[: len(heard) // 320 * 320], dtype="<i2").astype(np.float64).reshape(-1, 160)
        t = np.arange(160) / 8000
        basis = np.stack([f(2 * np.pi * hz * t) for hz in (480, 620) for f in (np.sin, np.cos)])
        energy = np.einsum("ij,ij->i", samples, samples)
        projected = np.sum((samples @ basis.T) ** 2, axis=1) / 80
        tone = np.flatnonzero((energy >= 160 * 1000**2) & (projected > 0.8 * energy))
        return int(tone[0]) * FRAME_MS if tone.size else None


class CallerSide:
    """The caller of one ``place_call``: what it hears of the agent (its runs of speech, logged), what it says each
    20 ms tick (its script, and its talking over the agent), and when it is done."""

    def __init__(self, script: CallerScript, caller: bytes, interrupt: bytes, result: CallResult, now_ms: Callable[[], int]) -> None:
        self.script, self.caller, self.interrupt, self.result, self.now_ms = script, caller, interrupt, result, now_ms
        self.interrupt_at: int | None = None
        self.agent_started_at: int | None = None
        self.first_agent_at: int | None = None
        """When the caller first heard the agent (backchannels are timed from it)."""
        self.line = CallerLine(echo_db=script.echo_db, echo_delay_ms=script.echo_delay_ms, noise_db=script.noise_db, room=script.room, band=script.band)
        self.agent_last_heard_at: int | None = None

    def hears(self, t: int, heard: bytes, agent: bool) -> None:
        result, script = self.result, self.script
        if agent:
            if self.agent_started_at is None or (self.agent_last_heard_at is not None and t - self.agent_last_heard_at > 200):
                self.agent_started_at = t
                self.first_agent_at = t if self.first_agent_at is None else self.first_agent_at
                result.agent_runs_ms.append(0)
                result.log(self.now_ms(), "agent", "starts speaking (caller hears audio)")
                if script.interrupt_after_agent_ms is not None and self.interrupt_at is None:
                    self.interrupt_at = t + script.interrupt_after_agent_ms
            self.agent_last_heard_at = t
            result.agent_speech_ms += FRAME_MS
            result.agent_runs_ms[-1] += FRAME_MS
        elif self.agent_last_heard_at is not None and t - self.agent_last_heard_at == 200:
            result.log(self.now_ms(), "agent", "stops speaking")
        result.heard += heard
        result.agent_ticks.append(agent)
        for start_ms, pcm in script.utterances:
            if start_ms == t:
                result.log(self.now_ms(), "caller", f"speaks ({len(pcm) // 16} ms)")

    def says(self, t: int) -> bytes:
        """The tick's 20 ms of 8 kHz PCM: what the caller says, and what the line adds (``CallerLine``)."""
        caller, interrupt, interrupt_at = self.caller, self.interrupt, self.interrupt_at
        speech = caller[t * 16 : t * 16 + 320] if t * 16 < len(caller) else b""
        if interrupt_at is not None and interrupt_at <= t < interrupt_at + len(interrupt) // 16:
            if t == interrupt_at:
                self.result.log(self.now_ms(), "caller", f"talks over the agent ({len(interrupt) // 16} ms)")
            speech = interrupt[(t - interrupt_at) * 16 : (t - interrupt_at) * 16 + 320]
        speech = self._backchannel(t) or speech
        return self.line.frame(speech.ljust(320, b"\x00") if speech else _SILENCE_8K, self.result.heard, t)

    def _backchannel(self, t: int) -> bytes:
        """The piece of a backchannel the caller says at ``t``, if any (``CallerScript.backchannels_ms``)."""
        script = self.script
        if self.first_agent_at is None or not script.utterances:
            return b""
        said = script.backchannel if script.backchannel is not None else script.utterances[0][1][: script.backchannel_ms * 16]
        piece, begins = backchannel_piece(t, self.first_agent_at, script.backchannels_ms, len(said) // 16, said)
        if begins:
            self.result.log(self.now_ms(), "caller", f"backchannels ({len(said) // 16} ms)")
        return piece

    def done(self, t: int) -> bool:
        interrupt_at = self.interrupt_at
        caller_end = max(len(self.caller), (interrupt_at + len(self.interrupt) // 16) * 16 if interrupt_at is not None else 0)
        return caller_done(self.script, t, caller_end, self.agent_last_heard_at)


def caller_done(script: CallerScript, t: int, caller_len: int, agent_last_heard_at: int | None) -> bool:
    if script.hangup_at_ms is not None:
        return t >= script.hangup_at_ms
    if t >= script.max_call_ms:
        return True
    return agent_last_heard_at is not None and t * 16 >= caller_len and t - agent_last_heard_at >= 1500


def caller_timeline(script: CallerScript) -> bytes:
    end = max((start * 16 + len(pcm) for start, pcm in script.utterances), default=0)
    timeline = bytearray(end)
    for start, pcm in script.utterances:
        timeline[start * 16 : start * 16 + len(pcm)] = pcm
    return bytes(timeline)
