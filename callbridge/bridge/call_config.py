"""What the settings give each call: its ``CallOptions`` (audio, pacing, timeouts, actions) and the duplex session
it opens (``SessionConfig``)."""

from __future__ import annotations

from callbridge.bridge.actions import telephony_tools
from callbridge.bridge.call import CallOptions, DtmfMode
from callbridge.config import Settings
from callbridge.engine.port import SessionConfig, TurnDetection

__all__ = ["call_options", "session_config"]


def call_options(settings: Settings) -> CallOptions:
    audio, server = settings.audio, settings.server
    return CallOptions(
        engine_rate_hz=audio.engine_input_rate_hz,
        lead_ms=audio.playout_lead_ms,
        mark_every_frames=audio.mark_interval_frames,
        resampler_quality=audio.resampler_quality,
        dtmf_mode=DtmfMode(settings.engine.dtmf),
        failure_tone_ms=settings.engine.failure_tone_ms,
        call_actions=settings.call_actions.enabled,
        transfer_targets=tuple(settings.call_actions.transfer_targets),
        first_message_timeout_ms=int(server.first_message_timeout_s * 1000),
        idle_timeout_ms=int(server.idle_timeout_s * 1000),
        max_call_ms=int(server.max_call_duration_s * 1000) if server.max_call_duration_s else None,
    )


def session_config(settings: Settings) -> SessionConfig:
    """The duplex session every call opens: the engine detects turns and barge-in (server VAD)."""
    engine = settings.engine
    return SessionConfig(
        model=engine.model,
        instructions=engine.instructions or None,
        voice=engine.voice,
        turn_detection=TurnDetection(),
        input_rate_hz=settings.audio.engine_input_rate_hz,
        tools=telephony_tools(settings.call_actions.transfer_targets) if settings.call_actions.enabled else (),
    )
