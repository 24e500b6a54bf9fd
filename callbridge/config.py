"""Configuration: defaults < TOML file < ``CALLBRIDGE_*`` env vars < CLI flags.

The TOML file is given with ``--config`` (or ``CALLBRIDGE_CONFIG``); its tables
are the sections below (``[server]``, ``[engine]``…). Env vars name a key as
``CALLBRIDGE_<SECTION>__<KEY>`` (``CALLBRIDGE_SERVER__PORT=9000``). CLI flags
are named options of the subcommands and ``--set section.key=value``.

Every key, with its default, is documented in ``config/callbridge.example.toml``
(a test keeps the two in step). Unknown keys are errors, so a typo never
silently falls back to a default. ``load_settings`` turns every problem into a
``ConfigError`` that names the key.

A carrier's section is defined in its package (``callbridge/carriers/<name>/settings.py``) from the value types
of ``callbridge.config_types``; ``Settings`` composes them.
"""

from __future__ import annotations

import enum
import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    JsonValue,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from callbridge.application.assistant import bridge_owned_options
from callbridge.carriers import CarrierSections
from callbridge.codecs import ResamplerQuality
from callbridge.config_types import (
    HttpUrl,
    Port,
    Section,
    TransferTarget,
    url_check,
    whole_number,
)
from callbridge.logging import LogFormat

__all__ = [
    "CONFIG_FILE_ENV",
    "ConfigError",
    "ConfigProblem",
    "MASK",
    "LogFormat",
    "Settings",
    "load_settings",
    "parse_assignment",
]

CONFIG_FILE_ENV = "CALLBRIDGE_CONFIG"

class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: Port = 8080
    public_url: HttpUrl | None = None
    """The https URL carriers reach this bridge at; stream URLs and webhook signatures use it."""
    max_calls: Annotated[int, Field(ge=1)] = 100
    """Concurrent calls admitted by one process; beyond it new calls are refused."""
    max_calls_fleet: Annotated[int, Field(ge=1)] | None = None
    """Concurrent calls admitted by every process sharing the Redis registry together (a call counts from its
    admission at the answer to its end), besides each one's ``max_calls``; beyond it new calls are refused busy.
    None: no fleet-wide limit. With the memory registry it is one more per-process limit."""
    cpu_budget_percent: Annotated[float, Field(ge=0, le=400)] = 85.0
    """A new call is refused when the process, carrying every call it holds and that one, would use more than this
    share of one core: past it every call on the process would fall behind real time. A carried call's cost is
    measured (the use over the calls carried, both smoothed over 5 s); while few calls have been, it leans on a guess:
    ``max_calls`` calls fill what the budget leaves beside the process's own use. ``max_calls`` is checked first (the
    reason logged and counted is the first limit reached). Calls coming back are still admitted. 0: no CPU budget."""
    stream_token_secret: Annotated[SecretStr, Field(min_length=32)] | None = None
    """A secret shared with your application, for streams that do not start at callbridge's answer webhook (your
    own TwiML's ``<Connect><Stream>``): the application mints each stream's token with it (an HMAC over the call id
    and an expiry: ``callbridge.bridge.stream_token.mint_stream_token``, or ``callbridge stream-token CALL_ID``) and
    passes it as the ``token`` parameter; each is admitted once, for that call, until it expires. None: only tokens
    callbridge's own answers minted."""
    generic_media_requires_token: bool = True
    """Streams on the one-URL-for-all ``/media`` endpoint need a token our answer webhook minted, unless a
    carrier's own credentials admit them (``Carrier.generic_upgrade``). Switch off only where the network admits nothing but your carriers."""
    workers: Annotated[int, Field(ge=1, le=256)] = 1
    """Bridge processes on the one listening socket (``serve --workers``). A call's webhook and its streams may
    reach different workers, so they share one registry: the supervisor's, in memory (``registry.backend`` memory),
    or Redis."""
    drain_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    """On SIGTERM: how long calls that cannot move to another process (their carrier does not reconnect) may
    run on before the process exits anyway."""
    drain_lb_checks: Annotated[int, Field(ge=1)] = 1
    """On SIGTERM with a shared registry: calls move to other processes once ``/readyz`` has answered this many
    load-balancer checks with 503 (those that take a process out: HAProxy's ``fall``, the shipped config's 1), so
    that a moved call's reconnect is not routed back here."""
    drain_lb_wait_s: Annotated[float, Field(ge=0)] = 5.0
    """…or once this long has passed since the SIGTERM, where fewer checks came (nothing probes ``/readyz``, or
    Kubernetes' preStop took the pod out before the signal). The calls go on here meanwhile."""
    first_message_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """A media connection that has not started its stream by then is closed."""
    idle_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """A stream with no message from the carrier for this long is taken as dropped (its engine session waits
    for the next stream); carriers send media every 20–100 ms. Time this process itself did not run (stopped,
    its VM frozen) is not taken for the carrier's silence: the verdict waits until what came meanwhile is read."""
    max_call_duration_s: Annotated[float, Field(ge=0)] = 14_400.0
    """A stream longer than this is ended and the call hung up (0: no limit)."""
    admin_token: SecretStr | None = None
    """Bearer token for ``/admin/…`` (engine pool: list, drain, undrain); unset: those routes are off (404)."""


class LogSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: LogFormat = LogFormat.AUTO


class AudioSettings(Section):
    engine_input_rate_hz: Annotated[Literal[8000, 16000, 24000], BeforeValidator(whole_number)] = 16000
    resampler_quality: ResamplerQuality = ResamplerQuality.LD
    """LD: low-delay polyphase FIR (~3 ms); QQ…VHQ: soxr recipes, which hold 20–170 ms back per stream."""
    playout_lead_ms: Annotated[int, Field(ge=20, le=2000)] = 200
    """How far audio sent to the carrier may run ahead of what the caller has heard."""
    mark_interval_frames: Annotated[int, Field(ge=1, le=500)] = 5
    """A playback marker every N 20 ms frames (carriers with markers); a reply's first comes 100 ms in whatever N
    (its echo pins where the carrier started playing the reply; the playout clock carries the position between
    markers, which only correct it for drift). Without markers, how often the heard position is reported."""
    media_message_ms: Annotated[int, Field(ge=20, le=2000)] = 100
    """The most agent audio one media message carries, for carriers that play a message of any length (their
    profile's ``joins_frames``): where the engine is ahead of real time, up to this much goes in one message,
    sent once the playout lead has room for all of it; audio at real time still goes frame by frame. Capped by
    ``playout_lead_ms``."""


class EngineSettings(Section):
    kind: Literal["local", "realtime", "inline"] = "local"
    """local: the embedded CPU engine; realtime: vllm-omni servers over websockets; inline: vllm-omni in process."""
    urls: list[Annotated[str, url_check("ws", "wss")]] = Field(default_factory=list, validate_default=True)
    """vllm-omni servers (``ws://host:port``) for kind = realtime."""
    api_key: SecretStr | None = None
    model: str | None = None
    tools: Literal["auto", "yes", "no"] = "auto"
    """Whether the engine's model calls function tools (``call_actions``, an application's own tools). ``auto``: no
    for a ``model`` named Qwen3-Omni (vllm-omni 0.30's plugin refuses a session that declares tools: "Qwen duplex
    tool calls are not implemented"), yes otherwise. Where it cannot, ``call_actions`` is refused here and an
    application's tools are left out of its calls' sessions (logged), rather than each call failing as it opens."""
    instructions: str = ""
    voice: str | None = None
    extra_body: dict[str, JsonValue] = Field(default_factory=dict)
    """Options of the engine's model for every call: the session's ``extra_body`` in vllm-omni 0.30, which each
    model's plugin reads its own from (AURA-Omni: ``tts_language``, ``tts_speaker``; MiniCPM-o: ``ref_audio``). Not
    the keys the bridge relies on (``overlap_policy``, ``playback_commit_policy``, ``realtime_*``). A call's
    assistant may set its own over these (``engine_options``)."""
    language_option: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_]{1,64}$")
    """The ``extra_body`` key the model takes a call's language in, where it has one (AURA-Omni: ``tts_language``);
    an assistant's ``language`` is then set there as well as told in the instructions."""
    disconnect_grace_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """How long a call's session is kept for its next stream after a stream drops (the engine server holds it as
    long: vllm-omni's disconnect grace)."""
    reconnect_budget_s: Annotated[float, Field(gt=0, le=60)] = 2.0
    """kind = realtime: when a live session's connection to its engine server is lost, how long it tries to
    reconnect, from when the server was last heard from, before the call is given up (``failure_tone_ms`` of
    reorder tone, then the hang-up). Independent of ``disconnect_grace_s``: a dead server costs the caller this,
    not the grace. Time this process itself did not run (stopped, its VM frozen) is not counted: after such a
    stall the budget runs from its end."""
    liveness_interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    """kind = realtime: each engine connection is pinged this often (a websocket ping)."""
    liveness_timeout_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    """kind = realtime: a ping unanswered this long means the server stopped answering (a stalled process keeps
    its socket open): the connection is dropped and reconnected within ``reconnect_budget_s``."""
    dtmf: Literal["text_item", "ignore"] = "text_item"
    """What a caller's key press becomes: a user text item ("DTMF 5") in the conversation, or nothing."""
    failure_tone_ms: Annotated[int, Field(ge=0, le=10_000)] = 600
    """When the engine fails mid-call (expired, lost past resume), the caller hears this long a reorder tone,
    then the call is hung up; 0: hang up at once."""
    eject_after_failures: Annotated[int, Field(ge=1, le=100)] = 3
    """kind = realtime: an endpoint (one of ``urls``) that fails this many times in a row (connect, handshake,
    health probe) gets no new calls until a probe passes; a call's session lost past resume ejects it at once."""
    probe_interval_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    """How often each endpoint's ``/health`` is checked; an ejected one first this long after, then with the
    interval doubling up to ``probe_backoff_max_s``."""
    probe_backoff_max_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    probe_timeout_s: Annotated[float, Field(gt=0, le=60)] = 2.0
    open_at_answer: Literal["auto", "on", "off"] = "auto"
    """Open a call's engine session when its answer webhook is answered, so that its stream finds it ready (the
    engine's handshake off the call's start) and a call no engine takes is refused busy, never answered. auto:
    one process (the memory registry) keeps the session where it answered; a shared registry (Redis, or a
    ``serve --workers`` group's) parks it there (detached, with its ticket) and the stream resumes it on whichever
    process it reaches (the embedded engine's sessions are its process's own: a stream on another worker opens
    its own). on: kept in the process that answered, whatever the registry. off: the stream opens its session."""
    open_at_answer_ttl_s: Annotated[float, Field(gt=0, le=600)] = 15.0
    """A session opened at the answer that no stream takes within this is closed."""
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """kind = realtime: how often a live session sends vllm-omni's ``session.heartbeat`` (with an ack), which keeps
    the server from expiring a session whose events are quiet; keep it under the server's session timeout."""

    @field_validator("extra_body", mode="after")
    @classmethod
    def _not_the_bridges_options(cls, extra_body: dict[str, JsonValue]) -> dict[str, JsonValue]:
        if taken := bridge_owned_options(extra_body):
            raise ValueError(f"{', '.join(taken)} is the bridge's own")
        return extra_body

    @field_validator("language_option", mode="after")
    @classmethod
    def _not_the_bridges_option(cls, key: str | None) -> str | None:
        if key is not None and bridge_owned_options([key]):
            raise ValueError(f"{key} is the bridge's own")
        return key

    @field_validator("urls", mode="after")
    @classmethod
    def _realtime_needs_urls(cls, urls: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("kind") == "realtime" and not urls:
            raise ValueError('engine.kind = "realtime" needs the vllm-omni servers here: urls = ["ws://host:port"]')
        return urls


class CallActionsSettings(Section):
    """What the agent (the speech model) may do to the call: the telephony tools declared to it."""

    enabled: bool = False
    """Declare ``end_call``, ``send_dtmf`` and (with targets) ``transfer_call`` to the model and act on its calls."""
    transfer_targets: list[TransferTarget] = Field(default_factory=list)
    """Where ``transfer_call`` may send a call (E.164 numbers, SIP URIs): the model picks one of these, never
    another number. Empty: no transfer tool."""


class LocalEngineSettings(Section):
    """The embedded CPU engine (engine.kind = "local", and ``callbridge engine-server``)."""

    agent: Literal["echo", "loopback", "tone", "actions"] = "echo"
    chunk_ms: Annotated[int, Field(ge=20, le=5000)] = 1000
    """Audio per response chunk (MiniCPM-o: about one second)."""
    generation_speed: Annotated[float, Field(gt=0)] = 4.0
    """Chunks are produced this many times faster than real time."""
    max_sessions: Annotated[int, Field(ge=1)] = 1000
    idle_ttl_s: Annotated[float, Field(gt=0)] = 300.0


class EngineServerSettings(Section):
    """``callbridge engine-server``: the embedded engine behind vllm-omni's duplex websocket protocol."""

    host: str = "127.0.0.1"
    port: Port = 8091
    config_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """How long a new connection may wait before its first frame."""
    resume_replay_ttl_s: Annotated[float, Field(gt=0)] = 60.0
    resume_replay_max_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024


class RegistrySettings(Section):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: Annotated[SecretStr, url_check("redis", "rediss", "unix")] | None = None
    """``redis://[:password@]host:port/db``; masked in output since it may hold a password."""
    checkpoint_interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    """With a shared registry: how often a live call's ticket (its engine session's resume state) is brought up to
    date there, for another process to resume the call should this one die. A rotated resume token is written at
    once; the engine is acknowledged no further than the ticket written, so its replay covers the gap."""

    @model_validator(mode="after")
    def _redis_needs_url(self) -> RegistrySettings:
        if self.backend == "redis" and self.redis_url is None:
            raise ValueError("backend = redis needs redis_url")
        return self


class AppSettings(Section):
    """The voice agent's application: who is asked for each call's assistant (``callbridge.application``)."""

    webhook_url: HttpUrl | None = None
    """POSTed ``{"type": "assistant-request", "call": CallContext}`` for each new call (signed with
    ``webhook_secret``: the ``Callbridge-Signature`` header); answers ``AssistantReply``'s JSON."""
    webhook_secret: SecretStr | None = None
    """The shared secret of ``webhook_url``'s signatures (required with it)."""
    module: str | None = None
    """A Python application instead of a webhook: ``"myagent:app"``, an object (or class) with
    ``async def assistant(self, call) -> AssistantReply | AssistantConfig``."""
    assistant_timeout_s: Annotated[float, Field(gt=0, le=10)] = 1.5
    """How long a call waits for its assistant: well within a carrier's answer budget (carriers wait about 15 s
    for an answer document, and the caller hears ringing all along). Past it, ``on_failure``."""
    on_failure: Literal["fallback", "busy"] = "fallback"
    """When the application is slow, down or answers nonsense: ``fallback``, the assistant configured here
    (``[engine]``'s instructions and voice, ``greeting``); ``busy``, the carrier's busy refusal."""
    greeting: str = ""
    """The agent speaks first: what the model is told to say as each call starts (an application's assistant
    may set its own). Empty: the agent waits for the caller."""
    greeting_interruptible: bool = True
    """The caller may talk over the greeting (barge-in, as over any reply). False: until it has played, the model
    hears silence in place of the caller (what they said meanwhile is not heard; it is in a recording)."""
    tool_timeout_s: Annotated[float, Field(gt=0, le=120)] = 10.0
    """How long the model's call of an application tool may take; past it the model hears an error it can speak
    to ("the tool did not answer in time"), and the call goes on."""
    tool_filler: str = ""
    """Said while a tool is slow (``tool_filler_after_s``), as the greeting is: "Tell the caller you are looking
    it up." (an assistant may set its own). Empty: silence until the result."""
    tool_filler_after_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    context_parameters: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)
    """Which of a call's own parameters reach the application in ``CallContext.parameters``: custom parameters,
    client state, extra headers, SIP ``X-`` headers, by name (case-insensitive). Empty: none."""

    @model_validator(mode="after")
    def _one_application(self) -> AppSettings:
        if self.webhook_url is not None and self.module is not None:
            raise ValueError("webhook_url or module, not both")
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ValueError("webhook_url needs webhook_secret (callbridge signs what it sends the application)")
        return self


class SilenceSettings(Section):
    """A caller who says nothing: prompted, then said goodbye to and hung up on (each off at 0; a call's assistant
    may set its own times)."""

    reprompt_after_s: Annotated[float, Field(ge=0, le=3600)] = 0.0
    """After this long with neither the caller nor the agent speaking, the model is told ``reprompt`` (once, until
    the caller speaks again). 0: never."""
    reprompt: str = "The caller has said nothing for a while. Ask, briefly, whether they are still there."
    hangup_after_s: Annotated[float, Field(ge=0, le=14_400)] = 0.0
    """After this long with neither the caller nor the agent speaking (a prompted caller has this long to answer),
    the model is told ``goodbye`` and the call is hung up once it has been said. 0: never."""
    goodbye: str = "The line has been silent for a while. Say a short goodbye; the call then ends."


class RecordingSettings(Section):
    """Each call's stereo WAV (left: the caller as received; right: the agent as the caller heard it), written
    as the call goes; a call's assistant may switch it on or off and name where to upload it."""

    enabled: bool = False
    """Record every call (an application's assistant may say otherwise per call: ``recording``)."""
    directory: Path = Path("recordings")
    """Where ``<call id>.wav`` is written (created if missing). A call that reconnects to this process goes on in
    the same file."""
    announcement: str = ""
    """Said before the greeting on every recorded call, as the greeting is (an instruction to the model): "Tell
    the caller this call is recorded." Empty: none."""
    max_pending_mb: Annotated[int, Field(ge=1, le=4096)] = 64
    """Recording data waiting for the disk, over all calls: past it, chunks are dropped (logged, counted) rather
    than held in memory."""
    upload_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    """The HTTP PUT of a recording to the URL a call's assistant gave (``recording_upload_url``)."""


class BargeInSettings(Section):
    """Who decides that the caller interrupted the agent (#41). ``bridge`` (the default): the bridge pauses the agent
    on speech over it that is more than its echo, then confirms the barge-in or resumes the reply. ``engine``: the
    engine's own VAD, on the first speech it hears over the reply (the agent's echo and a backchannel included).
    ``bench/RESULTS.md`` has both measured on the same corpus."""

    mode: Literal["engine", "bridge"] = "bridge"
    pause_after_ms: Annotated[int, Field(ge=20, le=2000)] = 80
    """``bridge``: the caller's speech over the agent this long pauses it."""
    confirm_after_ms: Annotated[int, Field(ge=20, le=5000)] = 600
    """``bridge``: speech this long from its onset confirms the barge-in (at least ``pause_after_ms``)."""
    resume_after_silence_ms: Annotated[int, Field(ge=20, le=2000)] = 220
    """``bridge``: a quiet line this long in a pause resumes the reply."""
    gap_ms: Annotated[int, Field(ge=20, le=2000)] = 200
    """``bridge``: a gap in the caller's speech shorter than this does not end it (between syllables, and where the
    echo hides their quieter ones)."""
    backchannel_max_ms: Annotated[int, Field(ge=20, le=5000)] = 300
    """``bridge``: the longest speech taken for a backchannel ("mm-hm"): past it, a pause resumes only after
    ``gap_ms`` of quiet where that is longer than ``resume_after_silence_ms`` (the caller more likely between two
    words than done; at the defaults it is not)."""
    max_pause_ms: Annotated[int, Field(ge=100, le=10_000)] = 1500
    """``bridge``: no pause lasts longer (at least ``confirm_after_ms``)."""
    speech_db: Annotated[float, Field(ge=0, le=90)] = 45.0
    """``bridge``: a frame of the caller's at least this loud (20·log10 of its RMS in PCM16 units; speech is about
    60–75) may be speech, once the agent's echo is taken out."""
    below_caller_db: Annotated[float, Field(ge=3, le=60)] = 15.0
    """``bridge``: once the caller has spoken, a sound more than this under their own level (their turn's loud
    frames) is not theirs — a voice across the room, a television — and counts as quiet in a pause."""

    @model_validator(mode="after")
    def _in_order(self) -> BargeInSettings:
        if self.confirm_after_ms < self.pause_after_ms:
            raise ValueError("confirm_after_ms must be at least pause_after_ms")
        if self.max_pause_ms < self.confirm_after_ms:
            raise ValueError("max_pause_ms must be at least confirm_after_ms")
        return self


class OutboundSettings(Section):
    """``[outbound]``: calls the agent places (``POST /calls``). Each carrier is paced on its own by the bounds below
    (``callbridge.outbound.pacing``)."""

    api_token: Annotated[SecretStr, Field(min_length=16)] | None = None
    """``POST /calls`` takes ``Authorization: Bearer <api_token>``; unset, every request to it is refused (403)."""
    calls_per_second: Annotated[float, Field(gt=0, le=100)] = 1.0
    """Dials a second at most, per carrier (a carrier account's usual default is 1). Each interval has 5 % (at most
    20 ms) on top: a dial's request can reach the carrier a few ms later than the one before, and it counts by its
    own clock."""
    max_concurrent: Annotated[int, Field(ge=1)] = 50
    """Outbound calls dialled and not over, per carrier, at most."""
    max_queued: Annotated[int, Field(ge=0, le=100_000)] = 100
    """Calls waiting for the rate or a slot, per carrier; past it a request is refused (``queue_full``)."""
    max_wait_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """A call waits this long at most for its turn; then it is refused (``waited_too_long``)."""
    ring_timeout_s: Annotated[int, Field(ge=5, le=120)] = 30
    """How long a call rings unanswered before it is given up (a request may say otherwise)."""


class ConsoleSettings(Section):
    """``/console``: the operators' view of the calls across the fleet (``bridge/console_http.py``). Off (every route
    404) unless ``token`` or ``password`` is set; then every route asks for one of them (401 without)."""

    token: Annotated[SecretStr, Field(min_length=16)] | None = None
    """``Authorization: Bearer <token>`` (a script), or HTTP basic with any user name and this as its password (a
    browser's own prompt)."""
    username: Annotated[str, Field(min_length=1, max_length=64)] = "operator"
    password: Annotated[SecretStr, Field(min_length=12)] | None = None
    """HTTP basic: ``username`` with this password."""
    calls_kept: Annotated[int, Field(ge=10, le=100_000)] = 2000
    """Finished calls the console keeps (the newest), each with its timeline."""
    kept_hours: Annotated[float, Field(gt=0, le=2160)] = 24.0
    """How long a call's timeline is kept after its last event."""
    max_viewers: Annotated[int, Field(ge=1, le=100)] = 8
    """Live views (``/console/api/live``) open at once, at most: each reads the registry twice a second."""


class _BridgeSections(BaseSettings):
    """The sections that are callbridge's own (first when the settings are shown)."""

    model_config = SettingsConfigDict(
        env_prefix="CALLBRIDGE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerSettings = ServerSettings()
    log: LogSettings = LogSettings()
    audio: AudioSettings = AudioSettings()
    engine: EngineSettings = EngineSettings()
    call_actions: CallActionsSettings = CallActionsSettings()
    local_engine: LocalEngineSettings = LocalEngineSettings()
    engine_server: EngineServerSettings = EngineServerSettings()
    registry: RegistrySettings = RegistrySettings()
    app: AppSettings = AppSettings()
    silence: SilenceSettings = SilenceSettings()
    recording: RecordingSettings = RecordingSettings()
    barge_in: BargeInSettings = BargeInSettings()
    outbound: OutboundSettings = OutboundSettings()
    console: ConsoleSettings = ConsoleSettings()


class Settings(CarrierSections, _BridgeSections):
    """The whole configuration of one callbridge process: its own sections, then every carrier's
    (``callbridge.carriers.CarrierSections``, one per carrier of the registry)."""

    model_config = _BridgeSections.model_config

    @model_validator(mode="after")
    def _tools_the_model_can_call(self) -> Settings:
        if self.call_actions.enabled and not model_calls_tools(self.engine):
            raise ValueError(
                f"call_actions.enabled: the engine's model ({self.engine.model}) cannot call tools (vllm-omni 0.30's "
                "Qwen3-Omni refuses a session that declares any): switch call_actions off, or set engine.tools = \"yes\""
            )
        return self

    def public_dict(self) -> dict[str, Any]:
        """Plain values for display: enums as their values, secrets masked, unset secrets ``None``."""
        shown: dict[str, Any] = _masked(self.model_dump(mode="python"))
        return shown


def model_calls_tools(engine: EngineSettings) -> bool:
    """``engine.tools``, ``auto`` decided by the model's name (see there)."""
    if engine.tools != "auto":
        return engine.tools == "yes"
    name = (engine.model or "").lower().replace("-", "").replace("_", "")
    return not (engine.kind != "local" and "qwen3omni" in name)


class ConfigProblem(BaseModel):
    """One thing wrong with the configuration: ``key`` is dotted (``server.port``), or the file."""

    key: str
    problem: str


class ConfigError(Exception):
    """The configuration could not be loaded; ``problems`` names each key and what is wrong."""

    def __init__(self, problems: list[ConfigProblem]) -> None:
        super().__init__("; ".join(f"{p.key}: {p.problem}" for p in problems))
        self.problems = problems


def load_settings(
    config_file: Path | str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Load the configuration; ``overrides`` (nested dicts, from the CLI) win over everything.

    ``config_file`` defaults to ``$CALLBRIDGE_CONFIG`` when set. Raises
    ``ConfigError`` for a missing or unreadable file, bad TOML, unknown keys
    and invalid values.
    """
    if config_file is None:
        config_file = os.environ.get(CONFIG_FILE_ENV) or None
    path = Path(config_file) if config_file is not None else None
    if path is not None:
        _check_toml_file(path)

    class _LoadedSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            environment = _TomlFormEnvSource(settings_cls)
            if path is None:
                return (init_settings, environment)
            return (init_settings, environment, TomlConfigSettingsSource(settings_cls, toml_file=path))

    try:
        loaded = _LoadedSettings(**dict(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(list(_problems(exc))) from exc
    except ValueError as exc:  # an env var that is not valid JSON for a list or a section
        raise ConfigError([ConfigProblem(key="environment", problem=str(exc))]) from exc
    return loaded


def parse_assignment(text: str) -> dict[str, Any]:
    """``"server.port=9000"`` → ``{"server": {"port": "9000"}}`` (pydantic converts the value).

    A value in ``[...]`` is a list, read as TOML reads an array (``["ws://a", 'ws://b']``), or as bare
    comma-separated items (``[ws://a, ws://b]``). Raises ``ConfigError`` when there is no ``=`` or no key.
    """
    key, sep, value = text.partition("=")
    parts = [p.strip() for p in key.strip().split(".")]
    if not sep or not all(parts):
        raise ConfigError([ConfigProblem(key=key.strip() or text, problem="expected section.key=value")])
    parsed: Any = value.strip()
    listed = _list_from_text(parsed)
    if listed is not None:
        parsed = listed
    nested: dict[str, Any] = {parts[-1]: parsed}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def _list_from_text(text: str) -> list[Any] | None:
    """A list written in an env var or ``--set``: JSON, TOML's array form, or ``[a, b]`` (bare items, each
    stripped); None when ``text`` is not in brackets."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    for parse in (json.loads, lambda array: tomllib.loads(f"v = {array}")["v"]):
        try:
            parsed = parse(text)
        except ValueError:  # json.JSONDecodeError and tomllib.TOMLDecodeError both are
            continue
        if isinstance(parsed, list):
            return parsed
    items = (item.strip() for item in text[1:-1].split(","))
    return [item[1:-1] if len(item) > 1 and item[0] == item[-1] and item[0] in "'\"" else item for item in items if item]


class _TomlFormEnvSource(EnvSettingsSource):
    """``CALLBRIDGE_*`` env vars, whose lists may be written as in TOML or ``--set`` (``['ws://a']``, ``[a, b]``),
    not only as JSON."""

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            listed = _list_from_text(value) if isinstance(value, str) else None
            if listed is None:
                raise
            return listed


def merge_overrides(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge nested override dicts; later layers win."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
                merged[key] = merge_overrides(merged[key], value)
            else:
                merged[key] = dict(value) if isinstance(value, Mapping) else value
    return merged


def _check_toml_file(path: Path) -> None:
    try:
        with path.open("rb") as handle:
            tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError([ConfigProblem(key=str(path), problem="config file not found")]) from exc
    except IsADirectoryError as exc:
        raise ConfigError([ConfigProblem(key=str(path), problem="is a directory: give the TOML file's path")]) from exc
    except OSError as exc:
        raise ConfigError([ConfigProblem(key=str(path), problem=f"cannot read: {exc.strerror}")]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([ConfigProblem(key=str(path), problem=f"invalid TOML: {exc}")]) from exc


def _problems(exc: ValidationError) -> Iterator[ConfigProblem]:
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            yield ConfigProblem(key=key, problem="unknown key")
            continue
        problem = error["msg"].removeprefix("Value error, ")
        if key not in _SECRET_KEYS and not isinstance(error["input"], dict):
            problem += f" (got {error['input']!r})"
        yield ConfigProblem(key=key, problem=problem)


def _secret_keys() -> frozenset[str]:
    """Dotted keys whose values are never echoed back in an error."""
    keys = set()
    for section_name, section in Settings.model_fields.items():
        model = section.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            if "SecretStr" in str(field.annotation):
                keys.add(f"{section_name}.{name}")
    return frozenset(keys)


_SECRET_KEYS: Final = _secret_keys()


MASK: Final = "********"
"""How ``public_dict`` shows a secret that is set."""


def _masked(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value
