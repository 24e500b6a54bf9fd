"""vllm-omni 0.30.0's duplex wire protocol (``/v1/realtime?duplex=1``), both directions, as pure functions.

The client (``realtime.py``) turns commands into JSON objects and the
server's JSON objects into typed events; the embedded engine's server
(``server.py``) does the reverse. Shapes follow the 0.30.0 wheel
(``protocol/realtime/events.py``, ``protocol/duplex/events.py``,
``engine/duplex/realtime_commands.py``); reference §1.2–1.3, §3.4, §4.

Parsing validates once, here: a frame that breaks the protocol raises
``EngineError`` with the code the peer would send (``bad_event``,
``unknown_event``, ``bad_audio``) or, for a server frame, ``protocol_error``.
Server events the bridge does not act on (``response.listen``,
``turn.event``, ``session.updated``…) parse to ``None``.
"""

from __future__ import annotations

import binascii
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from callbridge.codecs import AudioEncoding, decode_to_pcm16
from callbridge.engine.commands import (
    AckPlayback,
    AppendAudio,
    BargeIn,
    CancelResponse,
    ClearInput,
    ClearOutputAudio,
    CloseSession,
    Commit,
    CreateResponse,
    CreateTextItem,
    EngineCommand,
    FunctionCallOutput,
    Heartbeat,
    TruncateItem,
)
from callbridge.engine.errors import RETRYABLE_CODES, EngineError, ErrorCode
from callbridge.engine.events import (
    AudioDelta,
    Capabilities,
    EngineErrorEvent,
    EngineEvent,
    FunctionCall,
    HeartbeatAck,
    InputCommitted,
    InputTranscript,
    ItemTruncated,
    OutputAudioCleared,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionReplaced,
    SessionResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptDelta,
)
from callbridge.engine.port import ResumeTicket, SessionConfig, TurnDetection

__all__ = [
    "ENVELOPE_TYPES",
    "MAX_CLIENT_EVENT_BYTES",
    "InputFormat",
    "ParsedServerEvent",
    "b64_audio",
    "command_to_wire",
    "error_to_wire",
    "event_ack",
    "new_event_id",
    "parse_client_command",
    "parse_server_event",
    "session_config_from_wire",
    "session_resume",
    "session_update",
]

MAX_CLIENT_EVENT_BYTES: Final = 15 * 1024 * 1024
ENVELOPE_TYPES: Final = frozenset({"session.update", "session.resume", "session.event_ack"})

_ERROR_TYPES: Final = {ErrorCode.RESOURCE_EXHAUSTED: "rate_limit_error", ErrorCode.INPUT_BACKPRESSURE: "rate_limit_error"}
_SERVER_ERROR_CODES: Final = frozenset({"internal_error", "engine_error", "server_vad_unavailable", "commit_aborted"})
_OUTPUT_RATES_HZ: Final = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
"""Rates engine audio may come at (24 kHz from MiniCPM-o and Qwen3-Omni). Any other is refused: a call resamples
from it, and a resampler between coprime rates (24001 → 8000 Hz) costs seconds to build and blocks every call."""


def new_event_id() -> str:
    """A server event's ``event_id``."""
    return f"event_{secrets.token_hex(16)}"


def b64_audio(data: bytes) -> str:
    """Audio bytes as the wire carries them (base64, no newline)."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


# ----------------------------------------------------------------- client → server


def session_update(config: SessionConfig) -> dict[str, Any]:
    """The first frame of a new connection: opens the session with ``config``."""
    return {"type": "session.update", "session": config.to_realtime()}


def session_resume(ticket: ResumeTicket) -> dict[str, Any]:
    """The first frame of a reconnection (reference §4.5)."""
    return {
        "type": "session.resume",
        "session_id": ticket.session_id,
        "resume_token": ticket.resume_token,
        "last_received_server_event_seq": ticket.last_event_seq,
    }


def event_ack(server_event_seq: int) -> dict[str, Any]:
    return {"type": "session.event_ack", "server_event_seq": server_event_seq}


def command_to_wire(command: EngineCommand) -> dict[str, Any]:
    """One command as the client event vllm-omni's translator accepts."""
    match command:
        case AppendAudio(pcm, rate_hz, overlap):
            append = {"type": "input_audio_buffer.append", "audio": b64_audio(pcm), "format": "pcm16", "sample_rate_hz": rate_hz}
            return append if overlap is None else {**append, "overlap_action": overlap}
        case Commit(create_response):
            event: dict[str, Any] = {"type": "input_audio_buffer.commit"}
            if create_response is not None:
                event["response_create"] = create_response
            return event
        case CreateResponse():
            return {"type": "response.create"}
        case CancelResponse(response_id):
            return {"type": "response.cancel", **({"response_id": response_id} if response_id else {})}
        case BargeIn():
            return {"type": "barge_in"}
        case ClearOutputAudio(response_id):
            return {"type": "output_audio_buffer.clear", **({"response_id": response_id} if response_id else {})}
        case ClearInput():
            return {"type": "input_audio_buffer.clear"}
        case AckPlayback(response_id, played_ms, item_id):
            return {
                "type": "playback.ack",
                "response_id": response_id,
                "item_id": item_id or f"item_{response_id}",
                "played_ms": played_ms,
            }
        case TruncateItem(item_id, audio_end_ms):
            return {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms}
        case CreateTextItem(text):
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            return {"type": "conversation.item.create", "item": item}
        case FunctionCallOutput(call_id, output):
            return {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id, "output": output}}
        case Heartbeat():
            return {"type": "session.heartbeat"}
        case CloseSession(reason):
            return {"type": "session.close", "reason": reason}
    raise TypeError(f"not an engine command: {command!r}")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class ParsedServerEvent:
    """A server frame: the typed event (None when the bridge has no use for it) and its journal sequence."""

    event: EngineEvent | None
    server_event_seq: int | None
    type: str


def parse_server_event(payload: Mapping[str, Any]) -> ParsedServerEvent:
    """Parse one server JSON object. Raises ``EngineError(protocol_error)`` for a malformed one."""
    event_type = payload.get("type")
    if not isinstance(event_type, str):
        raise _protocol_error("server event without a type")
    seq = payload.get("server_event_seq")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
        raise _protocol_error(f"bad server_event_seq {seq!r}")
    parser = _SERVER_PARSERS.get(event_type)
    try:
        event: EngineEvent | None = parser(payload) if parser is not None else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # AttributeError: ``.get`` on a non-object
        raise _protocol_error(f"malformed {event_type}: {exc!r}") from exc
    return ParsedServerEvent(event, seq, event_type)


def _protocol_error(message: str) -> EngineError:
    return EngineError(ErrorCode.PROTOCOL_ERROR, message)


def _str(payload: Mapping[str, Any], key: str) -> str:
    value = payload[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string")
    return value


def _opt_str(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{key} must be a string")
    return value


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number")
    return int(value)


def _opt_int(value: Any, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _overlap_decision(payload: Mapping[str, Any]) -> OverlapDecision:
    """vllm-omni carries the decision's chunk length and the speech so far in its ``metadata`` only. They inform
    and decide nothing: one that is not a whole number reads as 0 rather than failing the frame."""
    metadata = payload.get("metadata")
    details: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}

    def whole(name: str) -> int:
        value = details.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    policy = payload.get("policy")
    return OverlapDecision(
        _str(payload, "action"),
        _opt_str(payload, "reason"),
        _opt_int(payload.get("epoch"), "epoch"),
        whole("duration_ms"),
        whole("overlap_speech_ms"),
        policy if isinstance(policy, str) else "barge_in_on_speech",
    )


def _response_id(payload: Mapping[str, Any]) -> str:
    response = payload.get("response")
    rid = payload.get("response_id") or (response.get("id") if isinstance(response, Mapping) else None)
    if not isinstance(rid, str):
        raise TypeError("response_id missing")
    return rid


def _parse_created(payload: Mapping[str, Any]) -> SessionCreated:
    session = payload["session"]
    caps = session.get("capabilities")
    if not isinstance(caps, Mapping):
        raise TypeError("session.capabilities missing: not a duplex server")
    return SessionCreated(
        _str(session, "id"),
        Capabilities.from_wire(dict(caps)),
        resume_token=_opt_str(payload, "resume_token"),
        attachment_generation=_opt_int(payload.get("attachment_generation"), "attachment_generation"),
    )


def _parse_resumed(payload: Mapping[str, Any]) -> SessionResumed:
    session = payload.get("session")
    caps = session.get("capabilities") if isinstance(session, Mapping) else None
    return SessionResumed(
        _str(payload, "session_id"),
        _opt_str(payload, "resume_token"),
        _opt_int(payload.get("attachment_generation"), "attachment_generation"),
        Capabilities.from_wire(dict(caps)) if isinstance(caps, Mapping) else None,
    )


def _parse_response_done(payload: Mapping[str, Any]) -> ResponseDone:
    response = payload["response"]
    details = response.get("status_details") or {}
    metadata = response.get("metadata") or {}
    return ResponseDone(
        _response_id(payload),
        _str(response, "status"),
        details.get("reason") if isinstance(details, Mapping) else None,
        _opt_int(metadata.get("epoch") if isinstance(metadata, Mapping) else None, "epoch"),
    )


def _parse_audio_delta(payload: Mapping[str, Any]) -> AudioDelta:
    fmt = payload.get("format", "pcm16")
    if fmt not in ("pcm16", "pcm_s16le", "s16le"):
        raise ValueError(f"audio format {fmt!r}: ask for pcm16 output")
    pcm = binascii.a2b_base64(_str(payload, "delta"), strict_mode=True)
    if len(pcm) % 2:
        raise ValueError("PCM16 audio of odd length")
    metadata = payload.get("metadata") or {}
    epoch = metadata.get("epoch") if isinstance(metadata, Mapping) else None
    rate_hz = _int(payload.get("sample_rate_hz", 24000), "sample_rate_hz")
    if rate_hz not in _OUTPUT_RATES_HZ:
        raise ValueError(f"output sample rate {rate_hz} Hz")
    return AudioDelta(
        pcm,
        rate_hz,
        _str(payload, "response_id"),
        _opt_str(payload, "item_id") or f"item_{payload['response_id']}",
        _opt_int(epoch, "epoch"),
    )


def _parse_error(payload: Mapping[str, Any]) -> EngineErrorEvent:
    """Both shapes: nested ``{"error": {"code", "message"}}`` and flat ``{"error": "…", "code": …}``."""
    error = payload.get("error")
    if isinstance(error, Mapping):
        code, message, event_id = error.get("code"), error.get("message", ""), error.get("event_id")
    else:
        code, message, event_id = payload.get("code"), error if isinstance(error, str) else payload.get("message", ""), None
    code = code if isinstance(code, str) else ErrorCode.INTERNAL_ERROR
    return EngineErrorEvent(code, str(message), code in RETRYABLE_CODES, event_id if isinstance(event_id, str) else None)


def _parse_playback_ack(payload: Mapping[str, Any]) -> PlaybackAcknowledged:
    event = payload.get("event") or {}
    item_id = event.get("item_id") if isinstance(event, Mapping) else None
    response_id = item_id.removeprefix("item_") if isinstance(item_id, str) else None
    return PlaybackAcknowledged(response_id, _int(event.get("played_ms", 0), "played_ms"))


def _parse_output_item_done(payload: Mapping[str, Any]) -> FunctionCall | None:
    """A finished output item: a ``function_call`` item is the model calling a tool (0.30 sends it complete
    here, name included, after ``response.function_call_arguments.done``, which lacks the name); other items
    (messages) carry nothing the bridge acts on."""
    item = payload["item"]
    if not isinstance(item, Mapping) or item.get("type") != "function_call":
        return None
    raw = item.get("arguments", "")
    raw = raw if isinstance(raw, str) else json.dumps(raw)
    try:
        decoded = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        decoded = None
    return FunctionCall(
        _str(item, "name"),
        _str(item, "call_id"),
        decoded if isinstance(decoded, dict) else {},
        raw,
        _opt_str(payload, "response_id"),
    )


_SERVER_PARSERS: Final[dict[str, Callable[[Mapping[str, Any]], EngineEvent | None]]] = {
    "session.created": _parse_created,
    "session.resumed": _parse_resumed,
    "session.closed": lambda p: SessionClosed(_str(p, "session_id"), _opt_str(p, "reason") or "closed"),
    "session.expired": lambda p: SessionExpired(_str(p, "session_id"), _opt_str(p, "reason") or "expired"),
    "session.replaced": lambda p: SessionReplaced(_str(p, "session_id")),
    "session.heartbeat_ack": lambda p: HeartbeatAck(),
    "input_audio_buffer.speech_started": lambda p: SpeechStarted(
        _int(p.get("audio_start_ms", 0), "audio_start_ms"), _opt_str(p, "item_id")
    ),
    "input_audio_buffer.speech_stopped": lambda p: SpeechStopped(
        _int(p.get("audio_end_ms", 0), "audio_end_ms"), _opt_str(p, "item_id")
    ),
    "input_audio_buffer.committed": lambda p: InputCommitted(_opt_str(p, "item_id")),
    "conversation.item.input_audio_transcription.completed": lambda p: InputTranscript(_opt_str(p, "item_id"), _str(p, "transcript")),
    "response.created": lambda p: ResponseCreated(
        _response_id(p), _opt_int((p.get("response", {}).get("metadata") or {}).get("epoch"), "epoch")
    ),
    "response.done": _parse_response_done,
    "response.output_audio.delta": _parse_audio_delta,
    "response.output_audio_transcript.delta": lambda p: TranscriptDelta(_str(p, "response_id"), _str(p, "delta")),
    "output_audio_buffer.cleared": lambda p: OutputAudioCleared(_opt_str(p, "response_id")),
    "overlap.decision": _overlap_decision,
    "playback.acknowledged": _parse_playback_ack,
    "response.output_item.done": _parse_output_item_done,
    "conversation.item.truncated": lambda p: ItemTruncated(_str(p, "item_id"), _int(p.get("audio_end_ms", 0), "audio_end_ms")),
    "error": _parse_error,
}


# ----------------------------------------------------------------- server side


@dataclass(frozen=True, slots=True)
class InputFormat:
    """How a connection's appends are encoded when they do not say (vllm-omni's envelope defaults)."""

    encoding: AudioEncoding = AudioEncoding.L16
    rate_hz: int = 16000


_INPUT_FORMATS: Final = {
    "pcm16": AudioEncoding.L16,
    "pcm_s16le": AudioEncoding.L16,
    "s16le": AudioEncoding.L16,
    "audio/pcm": AudioEncoding.L16,
    "audio/pcm16": AudioEncoding.L16,
    "g711_ulaw": AudioEncoding.PCMU,
    "audio/g711_ulaw": AudioEncoding.PCMU,
    "g711-ulaw": AudioEncoding.PCMU,
    "ulaw": AudioEncoding.PCMU,
    "mulaw": AudioEncoding.PCMU,
    "g711_alaw": AudioEncoding.PCMA,
    "audio/g711_alaw": AudioEncoding.PCMA,
    "alaw": AudioEncoding.PCMA,
}
"""vllm-omni's spellings (reference §2.1); OpenAI GA ``audio/pcmu``/``audio/pcma`` are not among them."""


def _parse_format(value: Any) -> tuple[AudioEncoding | None, int | None]:
    if isinstance(value, Mapping):
        name = value.get("type", value.get("format"))
        rate = value.get("rate", value.get("sample_rate_hz", value.get("sample_rate")))
        encoding, _ = _parse_format(name)
        return encoding, _int(rate, "rate") if rate is not None else None
    if value is None:
        return None, None
    if not isinstance(value, str) or value not in _INPUT_FORMATS:
        raise EngineError(ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"unsupported input audio format {value!r}")
    return _INPUT_FORMATS[value], None


def session_config_from_wire(session: Mapping[str, Any]) -> tuple[SessionConfig, InputFormat]:
    """A ``session.update`` session object → the config to open with and the connection's input defaults.

    The rate defaults to 16 kHz whatever the format, as in vllm-omni: 8 kHz μ-law must be declared.
    Raises ``EngineError`` (``unsupported_audio_format``, ``unsupported_turn_detection``,
    ``invalid_session_config``).
    """
    audio: Mapping[str, Any] = session["audio"] if isinstance(session.get("audio"), Mapping) else {}
    audio_in: Mapping[str, Any] = audio["input"] if isinstance(audio.get("input"), Mapping) else {}
    encoding, rate = _parse_format(session.get("input_audio_format", audio_in.get("format")))
    declared_rate = session.get("sample_rate_hz", session.get("sample_rate", audio_in.get("sample_rate_hz")))
    try:
        rate_hz = _int(declared_rate, "sample_rate_hz") if declared_rate is not None else (rate or 16000)
    except TypeError as exc:
        raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, str(exc)) from exc
    if not 8000 <= rate_hz <= 192000:
        raise EngineError(ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"input rate {rate_hz} Hz")
    detection_payload = session.get("turn_detection", audio_in.get("turn_detection"))
    if detection_payload is not None and not isinstance(detection_payload, Mapping):
        raise EngineError(ErrorCode.UNSUPPORTED_TURN_DETECTION, "turn_detection must be an object or null")
    modalities = session.get("modalities", session.get("output_modalities", ["text", "audio"]))
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
        raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "modalities must be a list of strings")
    extra_body = session.get("extra_body") or {}
    if not isinstance(extra_body, Mapping):
        raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "extra_body must be an object")
    tools = session.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) and isinstance(t.get("name"), str) for t in tools):
        raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "tools must be a list of objects with a name")
    tool_choice = session.get("tool_choice")
    config = SessionConfig(
        model=session.get("model") if isinstance(session.get("model"), str) else None,
        modalities=tuple(modalities),
        instructions=session.get("instructions") if isinstance(session.get("instructions"), str) else None,
        voice=session.get("voice") if isinstance(session.get("voice"), str) else None,
        ref_audio=session.get("ref_audio") if isinstance(session.get("ref_audio"), str) else None,
        turn_detection=TurnDetection.from_wire(detection_payload) if detection_payload is not None else None,
        input_rate_hz=16000,  # the engine is fed PCM16 16 kHz: the server converts each append
        extra_body=dict(extra_body),
        tools=tuple(dict(t) for t in tools),
        tool_choice=tool_choice if isinstance(tool_choice, str) else "auto",
    )
    return config, InputFormat(encoding or AudioEncoding.L16, rate_hz)


def parse_client_command(payload: Mapping[str, Any], defaults: InputFormat) -> EngineCommand:
    """One client event (not an envelope event) → command. Appends come back as PCM16 at
    ``defaults.rate_hz`` unless the event names its own format and rate; the caller resamples.

    Raises ``EngineError`` with ``unknown_event``, ``bad_event`` or ``bad_audio``.
    """
    event_type = payload.get("type")
    try:
        match event_type:
            case "input_audio_buffer.append":
                encoding, fmt_rate = _parse_format(payload.get("format", payload.get("input_audio_format")))
                rate = payload.get("sample_rate_hz", payload.get("sample_rate", fmt_rate))
                rate_hz = _int(rate, "sample_rate_hz") if rate is not None else defaults.rate_hz
                try:
                    raw = binascii.a2b_base64(_str(payload, "audio"), strict_mode=True)
                except ValueError as exc:  # binascii.Error, or text that is not ASCII at all
                    raise EngineError(ErrorCode.BAD_AUDIO, f"invalid base64 audio: {exc}") from exc
                encoding = encoding or defaults.encoding
                if encoding.sample_bytes == 2 and len(raw) % 2:
                    raise EngineError(ErrorCode.BAD_AUDIO, "PCM16 audio of odd length")
                return AppendAudio(bytes(decode_to_pcm16(encoding, raw)), rate_hz, _overlap_action(payload))
            case "input_audio_buffer.commit" | "input.commit":
                create = payload.get("response_create", payload.get("create_response"))
                if event_type == "input.commit" and create is None:
                    create = True
                return Commit(bool(create) if create is not None else None)
            case "response.create":
                return CreateResponse()
            case "response.cancel":
                return CancelResponse(_opt_str(payload, "response_id"))
            case "barge_in":
                return BargeIn()
            case "output_audio_buffer.clear":
                return ClearOutputAudio(_opt_str(payload, "response_id"))
            case "input_audio_buffer.clear":
                return ClearInput()
            case "playback.ack" | "audio.playback_ack":
                item_id = _opt_str(payload, "item_id")
                response_id = _opt_str(payload, "response_id") or (item_id.removeprefix("item_") if item_id else None)
                if response_id is None:
                    raise EngineError(ErrorCode.PLAYBACK_ITEM_NOT_FOUND, "playback.ack names no response")
                return AckPlayback(response_id, _int(payload["played_ms"], "played_ms"), item_id)
            case "conversation.item.truncate":
                return TruncateItem(_str(payload, "item_id"), _int(payload["audio_end_ms"], "audio_end_ms"))
            case "conversation.item.create":
                item = payload.get("item") or {}
                if item.get("type") == "function_call_output":
                    call_id, output = item.get("call_id"), item.get("output")
                    if not isinstance(call_id, str) or not call_id or not isinstance(output, str):
                        raise EngineError(ErrorCode.INVALID_FUNCTION_CALL_OUTPUT, "function_call_output needs a call_id and a string output")
                    return FunctionCallOutput(call_id, output)
                texts = [part.get("text", "") for part in item.get("content", []) if isinstance(part, Mapping)]
                return CreateTextItem("".join(t for t in texts if isinstance(t, str)))
            case "session.heartbeat":
                return Heartbeat()
            case "session.close" | "close" | "close_session":
                return CloseSession(_opt_str(payload, "reason") or "client_close")
    except (KeyError, TypeError, AttributeError) as exc:
        raise EngineError(ErrorCode.BAD_EVENT, f"malformed {event_type}: {exc!r}") from exc
    raise EngineError(ErrorCode.UNKNOWN_EVENT, f"unknown event type {event_type!r}")


def error_to_wire(code: str, message: str, event_id: str | None = None) -> dict[str, Any]:
    """An ``error`` event in 0.30.0's nested shape."""
    error_type = _ERROR_TYPES.get(code) or ("server_error" if code in _SERVER_ERROR_CODES else "invalid_request_error")
    error: dict[str, Any] = {"type": error_type, "code": code, "message": message}
    if event_id:
        error["event_id"] = event_id
    return {"type": "error", "event_id": new_event_id(), "error": error}


_LISTEN_ACTIONS: Final = frozenset({"listen", "continue", "continue_output", "ack"})
"""``overlap_action`` (or ``overlap``) values vllm-omni 0.30's ``overlap_policy.decide`` reads as *listen*."""


def _overlap_action(payload: Mapping[str, Any]) -> Literal["listen"] | None:
    """An append's explicit overlap action, as far as the embedded engine takes one: *listen*; any other value is
    left to the session's policy."""
    for key in ("overlap_action", "overlap"):
        value = payload.get(key)
        if isinstance(value, str):
            return "listen" if value.strip().lower() in _LISTEN_ACTIONS else None
    return None

