"""How a call stream behaves, fixed for the stream (``CallSession``'s options, made from the settings by
``bridge/call_config.py``): pacing and markers, the resampler, DTMF, the failure tone, the agent's call actions, the
stream's limits, the session's turn silence."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from callbridge.bridge.interruption_judge import BargeInChoice
from callbridge.codecs import ResamplerQuality

__all__ = ["CallOptions", "DtmfMode"]


class DtmfMode(enum.Enum):
    TEXT_ITEM = "text_item"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class CallOptions:
    engine_rate_hz: int = 16000
    lead_ms: int = 200
    mark_every_frames: int = 5
    """A marker every this many 20 ms of audio (fewer, longer frames count as their 20 ms), after a response's first
    (``FIRST_MARK_FRAMES`` in, or sooner at this interval)."""
    media_message_ms: int = 100
    """The most agent audio one media message carries, where the carrier joins frames (its profile says)."""
    uses_marks: bool = True
    resampler_quality: ResamplerQuality = ResamplerQuality.LD
    dtmf_mode: DtmfMode = DtmfMode.TEXT_ITEM
    failure_tone_ms: int = 600
    """When the engine fails mid-call, the caller hears this long a tone before the hang-up (0: none)."""
    call_actions: bool = False
    """The agent may act on the call (``end_call``, ``send_dtmf``, ``transfer_call``); off: every call refused."""
    transfer_targets: tuple[str, ...] = ()
    first_message_timeout_ms: int = 10_000
    """A connection that has not started its stream this long after ``connected`` is ended."""
    idle_timeout_ms: int = 10_000
    """A started stream that sends nothing this long is taken for dropped (the session waits for the next one)."""
    max_call_ms: int | None = 14_400_000
    """A stream is ended this long after ``connected`` (None: no limit)."""
    barge_in: BargeInChoice = "engine"
    """Who decides barge-in (``barge_in.mode``): the engine, or the bridge with these settings
    (``bridge/bridge_barge_in.py``). A call's assistant may choose otherwise (``AgentSetup.barge_in``)."""
    turn_silence_ms: int = 500
    """The session's ``server_vad`` silence: a ``SpeechStopped``'s ``audio_end_ms`` includes it (as OpenAI's Realtime
    and the embedded engine give it), so the caller stopped this much earlier (the turn's latency counts it)."""
