"""The embedded engine's typed events as vllm-omni 0.30 puts them on the wire: which events, in which order.

vllm-omni's runner emits internal events that a stateful projection
(``engine/duplex/realtime_events.py``, ``project_internal_event``) turns into
OpenAI Realtime events plus its duplex extensions. A reply is not three
events but a conversation: ``response.created``, the assistant item
(``conversation.item.added`` / ``.created``, ``response.output_item.added``),
its audio part (``response.content_part.added``), ``response.speak``, pairs of
``response.output_audio.delta`` + ``…transcript.delta``, then the closing run
(``…output_audio.done``, ``…transcript.done``, ``response.content_part.done``,
``response.output_item.done``, ``conversation.item.done``, ``response.done``,
``rate_limits.updated``) — for a cancelled reply too. A client written against
the real server (that sequences on ``rate_limits.updated``, reads
``conversation.item.done``) works against ``callbridge engine-server`` unchanged.

``WireProjection`` is that projection for one session, pure: ``project(event)``
returns the wire objects for one typed event, in order. The server journals
and sends them. ``tests/engine/test_conformance.py`` runs the same events
through vllm-omni's own projection and compares.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from callbridge.engine.events import (
    AudioDelta,
    Capabilities,
    EngineErrorEvent,
    EngineEvent,
    FunctionCall,
    HeartbeatAck,
    InputCleared,
    InputCommitted,
    InputTranscript,
    ItemCreated,
    ItemTruncated,
    OutputAudioCleared,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionReplaced,
    SessionResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptDelta,
)
from callbridge.engine.wire import b64_audio, error_to_wire, new_event_id

__all__ = ["WireProjection", "session_object"]

_FORMAT_TYPES: Final = {"g711_ulaw": "audio/g711_ulaw", "g711_alaw": "audio/g711_alaw", "pcm_f32le": "audio/pcm_f32le"}


def _overlap_details(event: OverlapDecision) -> dict[str, Any]:
    """The decision's own fields, as ``overlap_policy.decide`` of vllm-omni 0.30 returns them for a turn model."""
    common = {"duration_ms": event.duration_ms, "overlap_speech_ms": event.overlap_speech_ms}
    match event.action, event.reason:
        case "drop", _:
            return {**common, "buffer_audio": False}
        case "barge_in", _:
            return {"cancel_reason": "turn_detected", **common, "buffer_audio": True}
        case "listen", "policy_listen_only":
            return {**common, "buffer_audio": True, "defer_runtime_append": True}
        case "listen", "client_overlap_action":  # the client said listen: its audio is not kept (#41's bridge mode)
            return {"duration_ms": event.duration_ms, "buffer_audio": False, "defer_runtime_append": True}
        case _:
            return {**common, "buffer_audio": True, "defer_runtime_append": False, "force_listen": True, "preserve_realtime_input": True}


def _wire(event_type: str, **fields: Any) -> dict[str, Any]:
    return {"type": event_type, "event_id": new_event_id(), **fields}


def session_object(
    session_id: str,
    client_session: Mapping[str, Any],
    capabilities: Capabilities,
    *,
    input_format: str,
    input_rate_hz: int,
    epoch: int = 0,
    state: str = "open",
    engine_fields_only: bool = False,
    model: str | None = None,
    idle_timeout_s: float | None = None,
    turn: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The public session object of ``session.created`` / ``.updated`` / ``.resumed``, in 0.30's shape: the
    engine session's own fields (``DuplexEngineSession.as_public_dict``; ``turn``: where the turn and its reply
    stand), the client's session keys it does not set itself, then, unless ``engine_fields_only``, the Realtime
    defaults (``realtime_session_payload``), ``audio.input.sample_rate_hz`` among them. ``session.resumed``
    carries the engine's fields only: 0.30's handler sends the handle's ``public_session`` as it is."""
    modalities = client_session.get("modalities") or ["text", "audio"]
    public: dict[str, Any] = {
        "id": session_id,
        "state": state,
        "turn_state": "idle",
        "epoch": epoch,
        "turn_id": 0,
        "active_request_id": None,
        "active_response_id": None,
        "active_response_turn_id": None,
        "model": client_session.get("model") or model,
        "modalities": modalities,
        "instructions": client_session.get("instructions"),
        "voice": client_session.get("voice"),
        "response_format": "pcm",  # duplex_response_format("pcm16"): the engine's own vocabulary
        "temperature": client_session.get("temperature"),
        "max_tokens": client_session.get("max_tokens"),
        "speed": client_session.get("speed"),
        "idle_timeout_s": idle_timeout_s,
        "overlap_policy": "barge_in_on_speech" if client_session.get("turn_detection") else "listen_only",
        "overlap_short_ack_ms": 700,  # DuplexSessionConfig's defaults
        "overlap_barge_in_ms": 1200,
        "overlap_silence_rms": 0.003,
        "playback_commit_policy": "ack_only",
        "playback": {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0},
        "capabilities": capabilities.to_wire(),
    }
    public.update(turn or {})
    for key, value in client_session.items():
        if key not in public and key not in ("id", "session_id", "type", "extra_body"):
            public[key] = value
    if engine_fields_only:
        return public
    public.setdefault("object", "realtime.session")
    public.setdefault("type", "realtime")
    public.setdefault("input_audio_format", input_format)
    public.setdefault("output_audio_format", "pcm16")
    public.setdefault("output_modalities", modalities)
    in_format = {"type": _FORMAT_TYPES.get(input_format, "audio/pcm"), "rate": input_rate_hz}
    public.setdefault(
        "audio",
        {"input": {"format": in_format, "sample_rate_hz": input_rate_hz}, "output": {"format": {"type": "audio/pcm"}}},
    )
    for key in ("turn_detection", "input_audio_transcription", "tracing"):
        public.setdefault(key, None)
    return public


_ITEMS_KEPT: Final = 256
"""Conversation items whose order the projection remembers (for ``previous_item_id``)."""


@dataclass(slots=True)
class _Reply:
    """What the projection keeps of one response until its ``response.done`` (vllm-omni's ``_ResponseProjection``)."""

    item_id: str
    transcript: list[str] = field(default_factory=list)
    audio_ms: int = 0
    audio_sent: bool = False


@dataclass(slots=True)
class WireProjection:
    """One session's typed events → vllm-omni 0.30's wire events (see the module docstring)."""

    session_id: str
    _replies: dict[str, _Reply] = field(default_factory=dict)
    _items: dict[str, None] = field(default_factory=dict)
    """Conversation item ids in order (the last ``_ITEMS_KEPT``)."""

    def project(self, event: EngineEvent) -> list[dict[str, Any]]:
        """The wire objects for ``event``, in the order the real server sends them. ``SessionCreated`` and
        ``SessionResumed`` carry the session object: the server renders them (``session_object``)."""
        match event:
            case SpeechStarted(audio_start_ms, item_id):
                return [_wire("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=item_id)]
            case SpeechStopped(audio_end_ms, item_id):
                return [_wire("input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms, item_id=item_id)]
            case InputCommitted(item_id):
                return self._committed(item_id or f"item_{secrets.token_hex(16)}")
            case InputCleared():
                return [_wire("input_audio_buffer.cleared")]
            case InputTranscript(item_id, transcript):
                return [_wire("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0, transcript=transcript)]
            case ResponseCreated(response_id, epoch):
                return self._response_created(response_id, epoch)
            case AudioDelta(pcm, rate_hz, response_id, item_id, epoch):
                reply = self._reply(response_id)
                reply.audio_sent = True
                reply.audio_ms += len(pcm) * 500 // rate_hz
                metadata = {"session_id": self.session_id, "epoch": epoch, "model_speak": True, "audio_duration_ms": reply.audio_ms}
                fields = _part_fields(response_id, item_id)
                return [_wire("response.output_audio.delta", **fields, delta=b64_audio(pcm), format="pcm16", sample_rate_hz=rate_hz, metadata=metadata)]
            case TranscriptDelta(response_id, delta):
                reply = self._reply(response_id)
                if delta:
                    reply.transcript.append(delta)
                return [_wire("response.output_audio_transcript.delta", **_part_fields(response_id, reply.item_id), delta=delta)]
            case ResponseDone(response_id, status, reason, epoch):
                return self._response_done(response_id, status, reason, epoch)
            case OutputAudioCleared(response_id):
                return [_wire("output_audio_buffer.cleared", response_id=response_id)]
            case OverlapDecision(action, reason, epoch):
                fields = {"session_id": self.session_id, "epoch": epoch, "policy": event.policy, "action": action, "reason": reason}
                return [_wire("overlap.decision", **fields, metadata={"type": "overlap.decision", **fields, **_overlap_details(event)})]
            case ResponseListen(reason, epoch):
                details = {"type": "response.listen", "session_id": self.session_id, "epoch": epoch, "reason": reason}
                response = {"object": "realtime.response", "status": "listening", "metadata": details}
                return [_wire("response.listen", session_id=self.session_id, epoch=epoch, response=response)]
            case PlaybackAcknowledged(response_id, played_ms):
                item_id = f"item_{response_id}" if response_id else None
                details = {"type": "playback.acknowledged", "session_id": self.session_id, "item_id": item_id, "played_ms": played_ms}
                return [_wire("playback.acknowledged", event={**details, "committed_ms": played_ms})]
            case ItemTruncated(item_id, audio_end_ms):
                details = {"item_id": item_id, "content_index": 0, "audio_end_ms": audio_end_ms}
                return [_wire("conversation.item.truncated", **details, event={"type": "conversation.item.truncated", **details})]
            case ItemCreated(item):
                return [*self._item_added(item), self._item_done(item)]
            case FunctionCall():
                return self._function_call(event)
            case HeartbeatAck():
                return [_wire("session.heartbeat_ack", session_id=self.session_id)]
            case SessionClosed(session_id, reason):
                return [_wire("session.closed", session_id=session_id, reason=reason, event={"type": "session.closed", "reason": reason})]
            case SessionExpired(session_id, reason):
                return [_wire("session.expired", session_id=session_id, reason=reason)]
            case SessionReplaced(session_id):
                return [_wire("session.replaced", session_id=session_id, attachment_generation=0)]
            case EngineErrorEvent(code, message, _, event_id):
                return [error_to_wire(code, message, event_id)]
            case SessionCreated() | SessionResumed():
                raise TypeError("session.created / session.resumed carry the session object: the server renders them")
        raise TypeError(f"not an engine event: {event!r}")  # pragma: no cover

    # ------------------------------------------------------------ items

    def _previous(self, item_id: str) -> str | None:
        previous = None
        for known in self._items:
            if known == item_id:
                return previous
            previous = known
        return previous

    def _item_added(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        item_id = item["id"]
        previous = next(reversed(self._items), None) if self._items else None
        self._items[item_id] = None
        if len(self._items) > _ITEMS_KEPT:
            del self._items[next(iter(self._items))]
        return [_wire("conversation.item.added", previous_item_id=previous, item=item), _wire("conversation.item.created", previous_item_id=previous, item=item)]

    def _item_done(self, item: dict[str, Any]) -> dict[str, Any]:
        return _wire("conversation.item.done", previous_item_id=self._previous(item["id"]), item=item)

    def _committed(self, item_id: str) -> list[dict[str, Any]]:
        content = [{"type": "input_audio", "transcript": ""}]
        item: dict[str, Any] = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed", "content": content}
        added = self._item_added(item)
        event = {"type": "input.committed", "realtime_item_id": item_id}
        committed = _wire("input_audio_buffer.committed", previous_item_id=self._previous(item_id), item_id=item_id, event=event)
        return [*added, committed, self._item_done(item)]

    # -------------------------------------------------------- responses

    def _reply(self, response_id: str) -> _Reply:
        reply = self._replies.get(response_id)
        if reply is None:
            reply = self._replies[response_id] = _Reply(f"item_{response_id}")
        return reply

    def _response_created(self, response_id: str, epoch: int | None) -> list[dict[str, Any]]:
        reply = self._reply(response_id)
        response = {
            "id": response_id,
            "object": "realtime.response",
            "status": "in_progress",
            "status_details": None,
            "output": [],
            "modalities": ["audio", "text"],
            "metadata": {"epoch": epoch},
        }
        item = self._assistant_item(reply, "in_progress")
        return [
            _wire("response.created", response=response, response_id=response_id),
            *self._item_added(item),
            _wire("response.output_item.added", response_id=response_id, output_index=0, item=item),
            _wire("response.content_part.added", **_part_fields(response_id, reply.item_id), part={"type": "audio", "transcript": ""}),
            _wire("response.speak", **_part_fields(response_id, reply.item_id), metadata={"session_id": self.session_id, "epoch": epoch, "model_speak": True}),
        ]

    def _response_done(self, response_id: str, status: str, reason: str | None, epoch: int | None) -> list[dict[str, Any]]:
        reply = self._replies.pop(response_id, None)
        if reply is None:  # a response never announced, or announced done already
            return []
        fields = _part_fields(response_id, reply.item_id)
        transcript = "".join(reply.transcript)
        out: list[dict[str, Any]] = []
        if reply.audio_sent or transcript:
            out.append(_wire("response.output_audio.done", **fields))
            if transcript:
                out.append(_wire("response.output_audio_transcript.done", **fields, transcript=transcript))
        item = self._assistant_item(reply, status)
        response = {
            "id": response_id,
            "object": "realtime.response",
            "status": status,
            "status_details": {"type": status, "reason": reason or ("stop" if status == "completed" else status)},
            "output": [item],
            "metadata": {"epoch": epoch},
        }
        return [
            *out,
            _wire("response.content_part.done", **fields, part={"type": "audio", "transcript": transcript}),
            _wire("response.output_item.done", response_id=response_id, output_index=0, item=item),
            self._item_done(item),
            _wire("response.done", response=response, response_id=response_id),
            _wire("rate_limits.updated", rate_limits=[]),
        ]

    def _assistant_item(self, reply: _Reply, status: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.audio_sent or reply.transcript:
            content.append({"type": "output_audio", "transcript": "".join(reply.transcript), "audio_duration_ms": reply.audio_ms})
        return {"id": reply.item_id, "object": "realtime.item", "type": "message", "role": "assistant", "status": status, "content": content}

    def _function_call(self, call: FunctionCall) -> list[dict[str, Any]]:
        """A tool call is a response of its own, as 0.30 projects ``function_call.done``."""
        response_id = call.response_id or f"resp_{secrets.token_hex(16)}"
        item_id = f"item_{call.call_id}"
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "function_call",
            "status": "completed",
            "name": call.name,
            "call_id": call.call_id,
            "arguments": call.raw_arguments,
        }
        response: dict[str, Any] = {"id": response_id, "object": "realtime.response", "status": "in_progress", "status_details": None, "output": [], "metadata": {}}
        done = {**response, "status": "completed", "status_details": {"type": "completed", "reason": "completed"}, "output": [item]}
        arguments = {"response_id": response_id, "item_id": item_id, "output_index": 0, "call_id": call.call_id}
        return [
            _wire("response.created", response=response, response_id=response_id),
            *self._item_added(item),
            _wire("response.output_item.added", response_id=response_id, output_index=0, item=item),
            _wire("response.function_call_arguments.delta", **arguments, delta=call.raw_arguments),
            _wire("response.function_call_arguments.done", **arguments, arguments=call.raw_arguments),
            _wire("response.output_item.done", response_id=response_id, output_index=0, item=item),
            self._item_done(item),
            _wire("response.done", response=done, response_id=response_id),
        ]


def _part_fields(response_id: str, item_id: str) -> dict[str, Any]:
    return {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}
