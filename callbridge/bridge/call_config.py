"""What the settings give each call: its ``CallOptions`` (audio, pacing, timeouts, actions), the duplex session
it opens (``SessionConfig``) and what its agent does on a stream (``AgentSetup``)."""

from __future__ import annotations

from dataclasses import replace

import structlog
from pydantic import ValidationError

from callbridge.application import AssistantConfig, BargeInTaking
from callbridge.application.hooks import Application, AssistantSource, WebhookApplication, load_module
from callbridge.bridge.actions import telephony_tools
from callbridge.bridge.binding import AgentSetup
from callbridge.bridge.call import CallOptions, DtmfMode
from callbridge.bridge.interruption import InterruptionSettings
from callbridge.bridge.interruption_judge import BargeInChoice, BridgeBargeInSettings
from callbridge.bridge.turns import SilencePolicy
from callbridge.config import BargeInSettings, Settings, model_calls_tools
from callbridge.engine.port import SessionConfig, TurnDetection

_log = structlog.get_logger("callbridge.bridge")

__all__ = [
    "agent_setup",
    "barge_in_choice",
    "assistant_source",
    "call_options",
    "greeting",
    "greeting_interruptible",
    "session_config",
    "silence_policy",
    "tool_filler",
    "turn_detection",
]


def call_options(settings: Settings) -> CallOptions:
    audio, server = settings.audio, settings.server
    return CallOptions(
        engine_rate_hz=audio.engine_input_rate_hz,
        lead_ms=audio.playout_lead_ms,
        mark_every_frames=audio.mark_interval_frames,
        media_message_ms=audio.media_message_ms,
        resampler_quality=audio.resampler_quality,
        dtmf_mode=DtmfMode(settings.engine.dtmf),
        failure_tone_ms=settings.engine.failure_tone_ms,
        call_actions=settings.call_actions.enabled,
        transfer_targets=tuple(settings.call_actions.transfer_targets),
        first_message_timeout_ms=int(server.first_message_timeout_s * 1000),
        idle_timeout_ms=int(server.idle_timeout_s * 1000),
        max_call_ms=int(server.max_call_duration_s * 1000) if server.max_call_duration_s else None,
        turn_silence_ms=TurnDetection().silence_duration_ms,  # the session's (``session_config``)
        barge_in=barge_in_choice(settings),
    )


def _assistants_barge_in(assistant: AssistantConfig | None) -> BargeInTaking | None:
    """What the call's assistant chose in ``turn_taking.barge_in``, if anything."""
    return assistant.turn_taking.barge_in if assistant is not None and assistant.turn_taking is not None else None


def barge_in_choice(settings: Settings, assistant: AssistantConfig | None = None) -> BargeInChoice:
    """Who decides barge-in on a call (``[barge_in]``), each field the call's assistant set in
    ``turn_taking.barge_in`` taking its place."""
    chosen = _assistants_barge_in(assistant)
    barge_in = settings.barge_in
    if chosen is not None:
        try:
            barge_in = BargeInSettings.model_validate({**barge_in.model_dump(), **chosen.model_dump(exclude_none=True)})
        except ValidationError as exc:  # its times out of order with the configured ones
            _log.warning("assistant_barge_in_ignored", reason=str(exc.errors()[0]["msg"]))
    if barge_in.mode != "bridge":
        return "engine"
    policy = InterruptionSettings(
        pause_after_ms=barge_in.pause_after_ms, confirm_after_ms=barge_in.confirm_after_ms, gap_ms=barge_in.gap_ms,
        resume_after_silence_ms=barge_in.resume_after_silence_ms, max_pause_ms=barge_in.max_pause_ms, backchannel_max_ms=barge_in.backchannel_max_ms,
    )  # fmt: skip
    return BridgeBargeInSettings(policy, speech_db=barge_in.speech_db, below_caller_db=barge_in.below_caller_db)


def session_config(settings: Settings, assistant: AssistantConfig | None = None) -> SessionConfig:
    """The duplex session a call opens: the engine detects turns and barge-in (server VAD). ``assistant``: what the
    call's application chose (``[app]``); each field it leaves out is the configured one."""
    engine = settings.engine
    chosen = assistant or AssistantConfig()
    instructions = chosen.instructions if chosen.instructions is not None else engine.instructions or None
    extra_body = {**engine.extra_body, **chosen.engine_options}
    if chosen.language is not None:
        said = f"Speak {chosen.language} on this call."
        instructions = f"{instructions}\n\n{said}" if instructions else said
        if engine.language_option is not None:
            extra_body[engine.language_option] = chosen.language
    return SessionConfig(
        model=engine.model,
        instructions=instructions,
        voice=chosen.voice if chosen.voice is not None else engine.voice,
        temperature=chosen.temperature,
        turn_detection=turn_detection(chosen),
        input_rate_hz=settings.audio.engine_input_rate_hz,
        extra_body=extra_body,
        tools=(telephony_tools(settings.call_actions.transfer_targets) if settings.call_actions.enabled else ())
        + (tuple(tool.to_realtime() for tool in chosen.tools) if model_calls_tools(engine) else ()),
    )


def turn_detection(assistant: AssistantConfig | None) -> TurnDetection:
    """The session's ``server_vad``: the engine's defaults, but for what the call's assistant set."""
    taking = assistant.turn_taking if assistant is not None else None
    if taking is None:
        return TurnDetection()
    return replace(TurnDetection(), **taking.model_dump(exclude_none=True, exclude={"barge_in"}))


def greeting(settings: Settings, assistant: AssistantConfig | None = None, *, recorded: bool = False) -> str | None:
    """What the agent is told to say first on a new call (the assistant's, else ``app.greeting``), after the
    recording's announcement where the call is ``recorded``; None: it waits."""
    text = assistant.greeting if assistant is not None and assistant.greeting is not None else settings.app.greeting
    announcement = settings.recording.announcement if recorded else ""
    return " ".join(part for part in (announcement, text) if part) or None


def greeting_interruptible(settings: Settings, assistant: AssistantConfig | None = None) -> bool:
    """Whether the caller may talk over the greeting (the assistant's say, else ``app.greeting_interruptible``)."""
    chosen = assistant.greeting_interruptible if assistant is not None else None
    return settings.app.greeting_interruptible if chosen is None else chosen


def silence_policy(settings: Settings, assistant: AssistantConfig | None = None) -> SilencePolicy | None:
    """What to do with a caller who says nothing (``[silence]``, the assistant's times first); None: nothing."""
    silence = settings.silence
    reprompt_s = assistant.silence_reprompt_after_s if assistant and assistant.silence_reprompt_after_s is not None else silence.reprompt_after_s
    hangup_s = assistant.silence_hangup_after_s if assistant and assistant.silence_hangup_after_s is not None else silence.hangup_after_s
    if not reprompt_s and not hangup_s:
        return None
    return SilencePolicy(int(reprompt_s * 1000), silence.reprompt, int(hangup_s * 1000), silence.goodbye)


def tool_filler(settings: Settings, assistant: AssistantConfig | None = None) -> str | None:
    """What the agent says while a tool is slow (the assistant's, else ``app.tool_filler``); None: nothing."""
    text = assistant.tool_filler if assistant is not None and assistant.tool_filler is not None else settings.app.tool_filler
    return text or None


def agent_setup(
    settings: Settings, assistant: AssistantConfig | None, *, new_session: bool, recordable: bool, call_ends_at_ms: int | None
) -> AgentSetup:
    """What the call's agent does on a stream: the settings, but for what the call's assistant chose. ``new_session``:
    the call's first session (it is greeted); ``recordable``: recordings are stored; ``call_ends_at_ms``: the
    assistant's own limit on the stream's clock."""
    records = assistant.recording if assistant is not None and assistant.recording is not None else settings.recording.enabled
    return AgentSetup(
        greeting=greeting(settings, assistant, recorded=records) if new_session else None,
        greeting_interruptible=greeting_interruptible(settings, assistant),
        application_tools=frozenset(tool.name for tool in assistant.tools) if assistant else frozenset(),
        tool_filler=tool_filler(settings, assistant),
        silence=silence_policy(settings, assistant),
        record=records and recordable,
        call_ends_at_ms=call_ends_at_ms,
        turn_silence_ms=turn_detection(assistant).silence_duration_ms,
        barge_in=barge_in_choice(settings, assistant) if _assistants_barge_in(assistant) is not None else None,
        machine_detection=assistant.machine_detection if assistant is not None and new_session else None,
    )


def assistant_source(settings: Settings) -> AssistantSource | None:
    """The application ``[app]`` names (its webhook, or its Python module, imported now: a module that does not
    load stops the start with ``ValueError``), under its deadline; None where none is configured."""
    app = settings.app
    if app.webhook_url is not None:
        assert app.webhook_secret is not None, "AppSettings validates that a webhook has a secret"
        application: Application = WebhookApplication(app.webhook_url, app.webhook_secret.get_secret_value())
    elif app.module is not None:
        application = load_module(app.module)
    else:
        return None
    return AssistantSource(
        application, deadline_s=app.assistant_timeout_s, on_failure=app.on_failure, tool_deadline_s=app.tool_timeout_s
    )
