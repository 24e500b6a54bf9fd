"""What the application answers an ``assistant-request`` with: the call's assistant (``AssistantConfig``), or that
the call be refused. One pydantic schema for the webhook's JSON and the Python hook's return
value (``AssistantReply.model_json_schema()``, published as ``docs/application-schema.json``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, JsonValue, model_validator

__all__ = [
    "BRIDGE_SESSION_OPTIONS",
    "BargeInTaking",
    "BRIDGE_TOOLS",
    "ENGINE_OPTIONS_MAX_BYTES",
    "AssistantConfig",
    "AssistantReply",
    "MachineDetection",
    "Tool",
    "ToolResult",
    "bridge_owned_options",
]

BRIDGE_TOOLS = frozenset({"end_call", "transfer_call", "send_dtmf"})
"""The bridge's own tools' names (``call_actions``): an application's tool may not take one."""

BRIDGE_SESSION_OPTIONS: Final = frozenset({"overlap_policy", "playback_commit_policy"})
"""Keys of a session's ``extra_body`` that the bridge's barge-in and playback accounting rely on (vllm-omni 0.30:
barge in on the caller's speech, commit what was played from ``playback.ack``), with vllm-omni's own
``realtime_*`` keys (the tools and turn detection it derives from the session): never the application's."""
ENGINE_OPTIONS_MAX_BYTES: Final = 16 * 1024
"""The most an assistant's ``engine_options`` may take as JSON."""


def bridge_owned_options(keys: Iterable[str]) -> list[str]:
    """Those of ``keys`` (of a session's ``extra_body``) that are the bridge's or vllm-omni's to set."""
    return sorted(key for key in keys if key in BRIDGE_SESSION_OPTIONS or key.startswith("realtime_"))


class Tool(BaseModel):
    """A function of the application's that the model may call (Realtime's ``{"type": "function", …}``). Its calls
    go to the application (``tool-call``); what it answers goes back to the model, which speaks to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field(default="", max_length=2048)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """The arguments' JSON Schema."""

    def to_realtime(self) -> dict[str, Any]:
        return {"type": "function", "name": self.name, "description": self.description, "parameters": self.parameters}


class ToolResult(BaseModel):
    """The answer to a ``tool-call``: ``output`` (text the model reads: JSON, or a sentence) or ``error`` (said to
    the model as an error it can speak to: "I could not look that up")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: str | None = Field(default=None, max_length=16_384)
    error: str | None = Field(default=None, max_length=1024)

    @model_validator(mode="after")
    def _one(self) -> ToolResult:
        if (self.output is None) == (self.error is None):
            raise ValueError("exactly one of output, error")
        return self


class BargeInTaking(BaseModel):
    """Who decides that the caller interrupted the agent on this call, and how (the bridge's ``[barge_in]``). A
    field left out keeps the configured value; times out of order with the configured ones are ignored (logged)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["engine", "bridge"] | None = None
    """``engine``: the engine's VAD stops the agent on the first speech it hears over a reply. ``bridge``: the
    bridge pauses the agent, then confirms the barge-in or resumes the reply (not for its own echo, a cough or an
    "mm-hm")."""
    pause_after_ms: int | None = Field(default=None, ge=20, le=2000)
    confirm_after_ms: int | None = Field(default=None, ge=20, le=5000)
    """Longer for a caller who backchannels a lot, shorter for a snappier stop."""
    resume_after_silence_ms: int | None = Field(default=None, ge=20, le=2000)
    gap_ms: int | None = Field(default=None, ge=20, le=2000)
    backchannel_max_ms: int | None = Field(default=None, ge=20, le=5000)
    max_pause_ms: int | None = Field(default=None, ge=100, le=10_000)
    speech_db: float | None = Field(default=None, ge=0, le=90)
    below_caller_db: float | None = Field(default=None, ge=3, le=60)
    """Lower on a line with voices in the room (a shop, a car with passengers)."""


class TurnTaking(BaseModel):
    """How the engine's voice activity detection takes the caller's turns on this call (vllm-omni's ``server_vad``),
    and who decides a barge-in (``barge_in``). A field left out keeps the engine's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    silence_duration_ms: int | None = Field(default=None, ge=100, le=5000)
    """How long the caller must be quiet before their turn ends (default 500): longer for callers who pause
    mid-sentence (reading out a number), shorter for snappy replies."""
    threshold: float | None = Field(default=None, gt=0, lt=1)
    """How sure the VAD must be that it hears speech (default 0.5): higher on noisy lines."""
    prefix_padding_ms: int | None = Field(default=None, ge=0, le=2000)
    """Audio kept from before the speech was detected (default 300)."""
    barge_in: BargeInTaking | None = None
    """Who decides barge-in on this call, and its thresholds (``[barge_in]``'s, field by field)."""


class MachineDetection(BaseModel):
    """What a call the agent placed does about an answering machine (#42): the model's audio is held until the
    bridge knows who answered (``callbridge.outbound.answer``); a person hears it then, a machine never before its
    greeting is over. ``voicemail``: after the machine's beep (or the silence that ends its greeting) the model says
    ``voicemail_message``, then the call is hung up; ``hang_up``: the call ends once a machine is known. A call
    nobody is heard on (``uncertain``) is taken for ``on_uncertain``'s."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["hang_up", "voicemail"]
    voicemail_message: str | None = Field(default=None, max_length=2000)
    """What the model is told to say to the machine (an instruction, as a greeting is: "Leave a message that …");
    required for ``voicemail``."""
    on_uncertain: Literal["person", "machine"] = "person"

    @model_validator(mode="after")
    def _message(self) -> MachineDetection:
        if self.mode == "voicemail" and not self.voicemail_message:
            raise ValueError("voicemail: a voicemail_message is required")
        return self


class AssistantConfig(BaseModel):
    """The call's assistant. A field left out keeps the bridge's configured value (``[engine]``, ``[app]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instructions: str | None = Field(default=None, max_length=32_768)
    """The model's instructions for this call (the system prompt)."""
    voice: str | None = Field(default=None, max_length=128)
    temperature: float | None = Field(default=None, ge=0, le=2)
    language: str | None = Field(default=None, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9 ()-]{1,63}$")
    """The language of this call, a name ("Spanish") or a tag ("es-MX"). vllm-omni 0.30's session has no language
    field: the model is told it after its instructions ("Speak Spanish on this call."), and where
    ``engine.language_option`` names the model's own option (AURA-Omni's ``tts_language``, which takes names:
    "English") it is set there too. None: as configured."""
    engine_options: dict[str, JsonValue] = Field(default_factory=dict, max_length=32)
    """Options of the engine's model for this call: the session's ``extra_body`` in vllm-omni 0.30, over
    ``engine.extra_body`` key by key (AURA-Omni: ``tts_speaker``, ``tts_instruct``; MiniCPM-o: ``ref_audio``).
    At most 16 KiB of JSON; not the keys the bridge relies on (``overlap_policy``, ``playback_commit_policy``,
    ``realtime_*``)."""
    turn_taking: TurnTaking | None = None
    """How the caller's turns are detected on this call; None: the engine's defaults."""
    greeting: str | None = Field(default=None, max_length=4096)
    """The agent speaks first: what the model is told as the call starts, a text turn it answers at once (write
    it as an instruction, "Greet the caller and ask how you can help"); ``""``: it waits for the caller."""
    greeting_interruptible: bool | None = None
    """Whether the caller may talk over the greeting; None: ``app.greeting_interruptible``."""
    silence_reprompt_after_s: float | None = Field(default=None, ge=0, le=3600)
    """This call's ``silence.reprompt_after_s`` (0: never); None: the configured one."""
    silence_hangup_after_s: float | None = Field(default=None, ge=0, le=14_400)
    """This call's ``silence.hangup_after_s`` (0: never); None: the configured one."""
    tools: tuple[Tool, ...] = Field(default=(), max_length=64)
    """The application's own tools, beside the bridge's (``call_actions``): their calls come to the application."""
    tool_filler: str | None = Field(default=None, max_length=1024)
    """Said (as the greeting is) when a tool has not answered within ``app.tool_filler_after_s``: "Tell the caller
    you are looking it up." None: ``app.tool_filler``."""
    max_duration_s: float | None = Field(default=None, gt=0, le=14_400)
    """This call's longest duration from its answer: past it the bridge hangs up (within
    ``server.max_call_duration_s``, which holds for every call). None: only that."""
    recording: bool | None = None
    """Record this call (a stereo WAV: ``[recording]``); None: ``recording.enabled``."""
    recording_upload_url: HttpUrl | None = None
    """Where the recording is PUT when the call is over (a presigned URL: ``audio/wav``); the report then names
    it without its query. None: it stays in ``recording.directory``."""
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict, max_length=32)
    """The application's own, handed back in the end-of-call report."""
    machine_detection: MachineDetection | None = None
    """A call the agent placed: what an answering machine gets (``POST /calls``' ``machine_detection`` sets it);
    None: the agent talks to whoever answers."""

    @model_validator(mode="after")
    def _metadata_sizes(self) -> AssistantConfig:
        if any(len(key) > 128 or (isinstance(value, str) and len(value) > 1024) for key, value in self.metadata.items()):
            raise ValueError("metadata: keys up to 128 characters, values up to 1024")
        return self

    @model_validator(mode="after")
    def _engine_options(self) -> AssistantConfig:
        if taken := bridge_owned_options(self.engine_options):
            raise ValueError(f"engine_options: {', '.join(taken)} is the bridge's own")
        if len(json.dumps(self.engine_options)) > ENGINE_OPTIONS_MAX_BYTES:
            raise ValueError(f"engine_options: at most {ENGINE_OPTIONS_MAX_BYTES} bytes of JSON")
        return self

    @model_validator(mode="after")
    def _tool_names(self) -> AssistantConfig:
        names = [tool.name for tool in self.tools]
        if len(names) != len(set(names)):
            raise ValueError("tools: each name once")
        if taken := sorted(BRIDGE_TOOLS.intersection(names)):
            raise ValueError(f"tools: {', '.join(taken)} is the bridge's own")
        return self


TRANSFER_TARGET = r"^(\+[1-9][0-9]{6,14}|(sip|sips):[^\s<>\"']{3,250})$"
"""An E.164 number, or a SIP URI."""


class AssistantReply(BaseModel):
    """The answer to an ``assistant-request``: exactly one of ``assistant`` (answer the call with it), ``reject``
    (refuse it: ``busy``, or ``hang_up``) or ``transfer`` (send it on, unanswered by the agent, to a number or a SIP
    URI: the carrier's own transfer — ``<Dial>``, ``connect``, a SIP ``302``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    assistant: AssistantConfig | None = None
    reject: Literal["busy", "hang_up"] | None = None
    transfer: str | None = Field(default=None, pattern=TRANSFER_TARGET)

    @model_validator(mode="after")
    def _one_answer(self) -> AssistantReply:
        given = [name for name in ("assistant", "reject", "transfer") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of assistant, reject, transfer (given: {', '.join(given) or 'none'})")
        return self

    @classmethod
    def answer(cls, assistant: AssistantConfig | None = None) -> AssistantReply:
        return cls(assistant=assistant or AssistantConfig())
