"""The embedded engine's session, sans-I/O: vllm-omni's duplex semantics on a CPU agent.

Inputs: ``submit(command, now_ms)``, ``detach(now_ms)``, ``resume(generation, now_ms)``
and ``tick(now_ms)``. Outputs: ``events_to_send()`` (drain after every input)
and ``next_deadline_ms()`` (call ``tick`` then). No clock is read here.

Strategy and invariants (reference sections in brackets):
- Input audio is resampled (stateful) to 16 kHz; with ``server_vad`` each
  chunk goes through the streaming VAD [§5.3], otherwise the caller commits.
  The utterance kept for the agent starts ``prefix_padding_ms`` before speech.
- A response's audio is generated whole by the agent, then released in
  ``chunk_ms`` chunks, the first at once, the rest every
  ``chunk_ms / generation_speed`` ms (faster than real time, as MiniCPM-o).
- The assistant "speaks" from ``response.created`` until the caller has
  heard all of it: generation running, or ``played_ms < generated_ms``
  (playback acks drive it [§5.1], as vllm-omni's ``ack_only`` policy does).
  Caller speech while the assistant speaks is a barge-in: ``overlap.decision
  barge_in``, ``response.done cancelled (turn_detected)``, epoch + 1 [§5.2];
  ``response.cancel`` does the same (reason ``client_cancelled``).
- Every other chunk gets its verdict, as vllm-omni's runner gives a turn model
  one: no speech in it, ``response.listen`` while no response is in progress
  and ``overlap.decision drop`` during one; speech that starts nothing during
  a response, ``overlap.decision listen`` (``listen_only`` in commit mode,
  where speech never barges in). An agent answering each chunk as it comes
  (``streams_input``) gets none, as auto-response models do not.
- Acks for a response that predates a later commit are ``playback_ack_too_late``.
- Client items (user text, function outputs) are announced (``ItemCreated``).
  A user text item the agent turns into a call of a declared tool is one
  ``FunctionCall`` (on the wire a response of its own, as in vllm-omni 0.30).
  Its output must name a call made and come once
  (``invalid_function_call_output`` otherwise).
- Lease [§3.1]: generation 0 at open; ``resume`` is a compare-and-swap that
  bumps it; ``detach`` starts the disconnect grace; no activity for
  ``idle_ttl_ms`` expires the session; expiry emits ``session.expired``.
"""

from __future__ import annotations

import enum
import json
import secrets
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from callbridge.codecs import ResamplerQuality, StreamResampler, pcm16_rms
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
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import (
    AudioDelta,
    Capabilities,
    EngineErrorEvent,
    EngineEvent,
    FunctionCall,
    HeartbeatAck,
    InputCleared,
    InputCommitted,
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
    SessionResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptDelta,
)
from callbridge.engine.local.agents import OUTPUT_RATE_HZ, Agent
from callbridge.engine.local.vad import VAD_RATE_HZ, FrameScorer, StreamingVad
from callbridge.engine.port import SessionConfig

__all__ = ["LocalEngineOptions", "LocalSessionCore", "SessionState"]

_TURN_MODEL_CAPABILITIES: Final[Mapping[str, object]] = {
    # What vllm-omni 0.30's Qwen3-Omni plugin announces (``Qwen3OmniDuplexPlugin.capabilities``, a turn model
    # like this one), every key of ``DuplexCapabilities.as_dict``; where the embedded engine differs, its own
    # value: no image or video input, no text-only turn (a text item is not answered by itself).
    "implementation_level": "turn_based_duplex",
    "supports_session_adapter": True,
    "supports_model_native_turn_policy": False,
    "supports_external_turn_signal": True,
    "supports_client_commit": True,
    "supports_input_append": True,
    "supports_replace_latest_chunk": False,
    "supports_reencode_context": True,
    "supports_rollback_to_checkpoint": False,
    "supports_turn_commit_only": True,
    "supports_kv_lease": False,
    "supports_core_kv_lease": False,
    "supports_model_internal_state": False,
    "supports_stage_resumption": False,
    "supports_scheduler_native_append": False,
    "supports_core_resumable_request": False,
    "supports_concurrent_turn_requests": False,
    "required_input_modalities": ["audio"],
    "optional_input_modalities": [],
    "input_modes": ["append_audio_chunk"],
    "supports_stage_connector_handoff": False,
    "supports_independent_io_streams": True,
    "supports_realtime_endpoint": True,
    "supports_multi_session": True,
    "supports_multi_session_same_replica": True,
    "supports_session_lease": True,
    "session_admission_mode": "engine_managed",
    "supports_image_input": False,
    "supports_text_only_turn": False,
    "requires_model_runner_kv": False,
    "requires_native_stage_role": False,
    "adapter_patterns": ["turn_commit"],
    "signal_sources": ["client_event", "server_policy"],
    "stage_handoff_transport": "scheduler_data_plane",
    "target_barge_in_latency_ms": None,
}
_SILENCE_RMS: Final = 98  # vllm-omni's overlap_silence_rms 0.003 of full scale, in PCM16 units
_MAX_UTTERANCE_MS: Final = 60_000


@dataclass(frozen=True, slots=True)
class LocalEngineOptions:
    agent: str = "echo"
    chunk_ms: int = 1000
    generation_speed: float = 4.0
    """Chunks are released this many times faster than real time; ``inf`` releases them all at once."""
    disconnect_grace_ms: int = 30_000
    idle_ttl_ms: int | None = 300_000
    max_sessions: int = 16


class SessionState(enum.Enum):
    LIVE = "live"
    DETACHED = "detached"
    CLOSED = "closed"


@dataclass(slots=True)
class _Response:
    response_id: str
    item_id: str
    epoch: int
    commit_seq: int
    chunks: deque[bytes] = field(default_factory=deque)
    transcript: str = ""
    generated_ms: int = 0
    played_ms: int = 0
    audio_ms: int = 0
    """Length kept in the conversation (truncation cuts it)."""
    generating: bool = True
    next_chunk_ms: int = 0

    def playback_active(self) -> bool:
        return self.generating or self.played_ms < self.generated_ms


def _capabilities(options: LocalEngineOptions) -> Capabilities:
    return Capabilities(
        supports_barge_in=True,
        supports_session_resume=True,
        supports_audio_truncate=True,
        supports_playback_ack=True,
        chunk_period_ms=options.chunk_ms,
        raw=dict(_TURN_MODEL_CAPABILITIES),
    )


class _LoopbackResampler:
    """A loopback agent's input at the output rate, all of it now. Loopback measures the bridge's latency: it must
    add none of its own. soxr's QQ (cubic, no block delay) still holds 3 output samples back, so each 20 ms chunk
    would come out 3 samples short and every frame leave a chunk late (+20 ms on every loopback figure): the first
    output is primed with that many samples of silence (0.125 ms), after which each chunk comes out whole."""

    def __init__(self, input_rate_hz: int) -> None:
        self._resampler = StreamResampler(input_rate_hz, OUTPUT_RATE_HZ, ResamplerQuality.QQ)
        self._primed = False

    def process(self, pcm: bytes) -> bytes:
        out = self._resampler.process(pcm)
        if not self._primed and out:
            self._primed = True
            out = bytes(int(self._resampler.held_samples) * 2) + out
        return out


def _answer(outputs: dict[str, str | None], call_id: str, output: str) -> None:
    """The client's output for the function call ``call_id``: it must name a call made, and come once."""
    if call_id not in outputs:
        raise EngineError(ErrorCode.INVALID_FUNCTION_CALL_OUTPUT, "function_call_output requires the call_id of a completed function call")
    if outputs[call_id] is not None:
        raise EngineError(ErrorCode.INVALID_FUNCTION_CALL_OUTPUT, f"function_call_output already exists for call_id {call_id}")
    outputs[call_id] = output


class LocalSessionCore:
    """One embedded-engine session. See the module docstring for the contract."""

    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        agent: Agent,
        options: LocalEngineOptions,
        now_ms: int,
        scorer: FrameScorer | None = None,
        token_hex: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """``token_hex``: where the ids of responses and items come from (a simulation pins it to its seed)."""
        self._token_hex = token_hex
        self.session_id = session_id
        self.config = config
        self.agent = agent
        self.options = options
        self.capabilities = _capabilities(options)
        self.state = SessionState.LIVE
        self.lease_generation = 0
        self.epoch = 0
        self.close_reason: str | None = None
        self._last_activity_ms = now_ms
        self._detached_at_ms: int | None = None
        self._outbox: list[EngineEvent] = []
        self._in_rate_hz = config.input_rate_hz
        self._to_vad_rate = StreamResampler(config.input_rate_hz, VAD_RATE_HZ)
        self._to_output_rate = _LoopbackResampler(config.input_rate_hz) if agent.streams_input else None
        detection = config.turn_detection
        # loopback answers every chunk, not turns: no VAD to run (it is most of a loaded loopback's CPU)
        self._vad = StreamingVad(detection, scorer) if detection is not None and not agent.streams_input else None
        self._input_ms = 0
        """ms of input audio received (the session's input timeline)."""
        self._recent = bytearray()
        """The last ``prefix_padding_ms`` of 16 kHz input (before speech starts)."""
        self._utterance = bytearray()
        self._utterance_start_ms: int | None = None
        self._input_item_id: str | None = None
        self._speech_hint_sent = False
        self._overlap_speech_ms = 0  # the caller's speech over the response in progress (overlap.decision)
        self._commit_seq = 0
        self._last_utterance = b""
        self._text_turn: str | None = None
        """The last user text item not yet answered: a ``response.create`` now answers it (``Agent.say``)."""
        self._responses: dict[str, _Response] = {}
        self._active: _Response | None = None
        self._tools = {str(tool["name"]): tool for tool in config.tools}
        self.function_outputs: dict[str, str | None] = {}
        """call_id → the output the client sent (None: not yet)."""
        self._outbox.append(SessionCreated(session_id, self.capabilities, attachment_generation=0))
        greeting = agent.greeting()
        if greeting is not None:
            self._start_response(*greeting, now_ms=now_ms)

    # ------------------------------------------------------------------ inputs

    def submit(self, command: EngineCommand, now_ms: int) -> None:
        """Apply one command. Raises ``EngineError(session_closed)`` once closed; a rejected command
        queues an ``EngineErrorEvent``. Drain ``events_to_send()`` next."""
        if self.state is SessionState.CLOSED:
            raise EngineError(ErrorCode.SESSION_CLOSED, "session is closed", session_id=self.session_id)
        self._last_activity_ms = now_ms
        try:
            self._apply(command, now_ms)
        except EngineError as exc:
            self._outbox.append(EngineErrorEvent(exc.code, exc.message, exc.retryable))

    def detach(self, now_ms: int) -> None:
        """The client went away: start the disconnect grace."""
        if self.state is SessionState.LIVE:
            self.state = SessionState.DETACHED
            self._detached_at_ms = now_ms
            self._last_activity_ms = now_ms

    def resume(self, expected_generation: int, now_ms: int) -> int:
        """Compare-and-swap the lease to a new generation and re-attach; returns the new generation.

        Raises ``EngineError``: ``session_resume_expired`` when closed, ``session_resume_conflict`` when
        ``expected_generation`` is not the current one.
        """
        if self.state is SessionState.CLOSED:
            raise EngineError(ErrorCode.SESSION_RESUME_EXPIRED, f"session {self.close_reason}", session_id=self.session_id)
        if expected_generation != self.lease_generation:
            raise EngineError(
                ErrorCode.SESSION_RESUME_CONFLICT,
                f"expected lease generation {expected_generation}, current {self.lease_generation}",
                session_id=self.session_id,
            )
        self.lease_generation += 1
        self.state = SessionState.LIVE
        self._detached_at_ms = None
        self._last_activity_ms = now_ms
        self._outbox.append(SessionResumed(self.session_id, attachment_generation=self.lease_generation))
        return self.lease_generation

    def tick(self, now_ms: int) -> None:
        """Release due audio chunks and expire the lease when its time has come."""
        if self.state is SessionState.CLOSED:
            return
        active = self._active
        while active is not None and active.chunks and active.next_chunk_ms <= now_ms:
            self._release_chunk(active)
        if self._detached_at_ms is not None and now_ms >= self._detached_at_ms + self.options.disconnect_grace_ms:
            self._expire("disconnect_grace_expired")
        elif (idle := self._idle_deadline_ms()) is not None and now_ms >= idle:
            self._expire("idle_ttl_expired")

    # ----------------------------------------------------------------- outputs

    def events_to_send(self) -> list[EngineEvent]:
        """Events produced since the last call, in order."""
        events, self._outbox = self._outbox, []
        return events

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` has work next, or None."""
        if self.state is SessionState.CLOSED:
            return None
        deadlines = []
        if self._active is not None and self._active.chunks:
            deadlines.append(self._active.next_chunk_ms)
        if self._detached_at_ms is not None:
            deadlines.append(self._detached_at_ms + self.options.disconnect_grace_ms)
        if (idle := self._idle_deadline_ms()) is not None:
            deadlines.append(idle)
        return min(deadlines) if deadlines else None

    # ---------------------------------------------------------------- commands

    def _apply(self, command: EngineCommand, now_ms: int) -> None:
        match command:
            case AppendAudio(pcm, rate_hz, overlap):
                self._append(pcm, rate_hz, now_ms, listen=overlap == "listen")
            case Commit(create_response):
                self._commit(bool(create_response), now_ms)
            case CreateResponse():
                self._create_response(now_ms)
            case CancelResponse(response_id):
                # As vllm-omni 0.30: a cancel stops generation (or the unheard rest of a generated reply) and
                # starts the next epoch, so the next commit answers at once (no ``response_already_active``).
                active = self._active
                if active is None or not active.playback_active() or response_id not in (None, active.response_id):
                    raise EngineError(ErrorCode.RESPONSE_NOT_ACTIVE, "response.cancel requires an active response")
                self._interrupt(active, "client_cancelled")
            case BargeIn():
                self._barge_in("barge_in")
            case ClearOutputAudio(response_id):
                target = self._responses.get(response_id) if response_id else self._active
                self._outbox.append(OutputAudioCleared(target.response_id if target else response_id))
                if target is not None:
                    if target.generating:
                        self._cancel(target, "client_cancelled")
                    target.played_ms = target.generated_ms
                    if target is self._active:
                        self._active = None
            case ClearInput():
                self._clear_input()
                self._outbox.append(InputCleared())
            case AckPlayback(response_id, played_ms, item_id):
                self._ack(response_id, played_ms, item_id)
            case TruncateItem(item_id, audio_end_ms):
                self._outbox.append(_truncated(self._responses, item_id, audio_end_ms))
            case CreateTextItem(text):
                content = [{"type": "input_text", "text": text}]
                self._item_created({"type": "message", "role": "user", "content": content})
                self._text_turn = text
                call = self.agent.call_for_text(text, self._tools)
                if call is not None and call[0] in self._tools:
                    self._call_function(*call)
            case FunctionCallOutput(call_id, output):
                _answer(self.function_outputs, call_id, output)
                self._item_created({"type": "function_call_output", "call_id": call_id, "output": output})
                self._text_turn = output  # a response asked for now speaks to it
            case Heartbeat():
                self._outbox.append(HeartbeatAck())
            case CloseSession(reason):
                self._close(reason)

    def _append(self, pcm: bytes, rate_hz: int, now_ms: int, *, listen: bool = False) -> None:
        if rate_hz != self._in_rate_hz:
            raise EngineError(ErrorCode.BAD_AUDIO, f"input rate changed from {self._in_rate_hz} to {rate_hz} Hz")
        if len(pcm) % 2:
            raise EngineError(ErrorCode.BAD_AUDIO, "PCM16 audio of odd byte length")
        duration_ms = len(pcm) * 500 // rate_hz
        self._input_ms += duration_ms
        if self._to_output_rate is not None:
            self._loop_back(self._to_output_rate.process(pcm), now_ms)
        if listen and self._vad is not None and self._response_in_progress() and not self.agent.streams_input:
            self._listen_over_reply(self._to_vad_rate.process(pcm), duration_ms)
            return
        if self._vad is None:
            if not self.agent.streams_input:  # a streaming agent answers each chunk: no turn's audio to keep
                self._keep_utterance(self._to_vad_rate.process(pcm))
            loud = pcm16_rms(pcm) >= _SILENCE_RMS
            if not self._speech_hint_sent and loud:
                self._speech_hint_sent = True
                self._outbox.append(SpeechStarted(self._input_ms, self._new_input_item()))
            if not loud:
                self._judge_quiet_chunk(duration_ms)
            else:  # the client owns the turns: heard, never a barge-in
                self._judge_speech_chunk("policy_listen_only", duration_ms)
            return
        in_utterance = self._utterance_start_ms is not None
        audio = self._to_vad_rate.process(pcm)
        if self._utterance_start_ms is None:
            self._recent += audio
            keep = VAD_RATE_HZ * 2 * self._vad.params.prefix_padding_ms // 1000
            if len(self._recent) > keep:
                del self._recent[: len(self._recent) - keep]
        else:
            self._keep_utterance(audio)
        boundaries = self._vad.process(audio)
        if not in_utterance and not any(b.started for b in boundaries):
            self._judge_quiet_chunk(duration_ms)
        elif in_utterance:
            self._judge_speech_chunk("server_vad_utterance_active", duration_ms)
        for boundary in boundaries:
            if boundary.started:
                self._on_speech_started(boundary.audio_ms, duration_ms)
            else:
                self._on_speech_stopped(boundary.audio_ms, now_ms)

    def _listen_over_reply(self, audio: bytes, duration_ms: int) -> None:
        """A chunk marked *listen* during a reply (#41), as vllm-omni 0.30's runner takes it: the VAD hears it (its
        speech events go out), the verdict is the client's *listen*, never a barge-in, and nothing of it is kept (an
        open speech item stopped at the chunk's length; the VAD's commit at the utterance's end finds nothing)."""
        assert self._vad is not None  # in commit mode the client's turns never barge in anyway
        ended = False
        for boundary in self._vad.process(audio):
            self._utterance_start_ms = boundary.audio_ms if boundary.started else None
            if boundary.started:
                self._outbox.append(SpeechStarted(boundary.audio_ms, self._new_input_item()))
            ended = ended or not boundary.started
        self._overlap_speech_ms = 0
        self._overlap_decision("listen", "client_overlap_action", duration_ms, speech=False)
        if self._input_item_id is not None:
            self._outbox.append(SpeechStopped(duration_ms, self._input_item_id))
        self._clear_kept_input()
        if ended:
            self._outbox.append(EngineErrorEvent(ErrorCode.INPUT_AUDIO_BUFFER_EMPTY, "input_audio_buffer.commit requires a non-empty input audio buffer", False))

    def turn_facts(self) -> dict[str, object]:
        """The session object's turn fields (``DuplexEngineSession.as_public_dict`` of vllm-omni 0.30)."""
        return _turn_facts(self._active, self._commit_seq, user_speaking=self._utterance_start_ms is not None)

    def _response_in_progress(self) -> bool:
        return self._active is not None and self._active.playback_active()

    def _judge_quiet_chunk(self, duration_ms: int) -> None:
        """A chunk with no speech in it: dropped during a response, else nothing to answer (as vllm-omni's runner
        says of a turn model; an agent answering each chunk as it comes is its auto-response path, which does not)."""
        if self.agent.streams_input:
            return
        if self._response_in_progress():
            self._overlap_decision("drop", "silence_or_noise", duration_ms, speech=False)
        else:
            self._outbox.append(ResponseListen("silence_or_noise", self.epoch))

    def _judge_speech_chunk(self, reason: str, duration_ms: int) -> None:
        """A chunk of speech that starts nothing: heard over the response in progress, if one is."""
        if self._response_in_progress() and not self.agent.streams_input:
            self._overlap_decision("listen", reason, duration_ms, speech=True)

    def _overlap_decision(self, action: str, reason: str, duration_ms: int, *, speech: bool) -> None:
        """One verdict of ``overlap_policy.decide`` (vllm-omni 0.30): the caller's speech over the response adds up."""
        if speech:
            self._overlap_speech_ms += duration_ms
        policy = "barge_in_on_speech" if self.config.turn_detection is not None else "listen_only"
        self._outbox.append(OverlapDecision(action, reason, self.epoch, duration_ms, self._overlap_speech_ms, policy))

    def _keep_utterance(self, audio: bytes) -> None:
        """Add to the turn being spoken; past ``_MAX_UTTERANCE_MS`` its oldest second goes."""
        self._utterance += audio
        if len(self._utterance) > VAD_RATE_HZ * 2 * _MAX_UTTERANCE_MS // 1000:
            del self._utterance[: VAD_RATE_HZ * 2]

    def _on_speech_started(self, audio_start_ms: int, chunk_ms: int) -> None:
        self._utterance_start_ms = audio_start_ms
        self._utterance = self._recent
        self._recent = bytearray()
        self._outbox.append(SpeechStarted(audio_start_ms, self._new_input_item()))
        if self._active is not None and self._active.playback_active():
            self._overlap_decision("barge_in", "server_vad_speech_started", chunk_ms, speech=True)
            self._overlap_speech_ms = 0
            self._interrupt(self._active, "turn_detected")

    def _on_speech_stopped(self, audio_end_ms: int, now_ms: int) -> None:
        self._outbox.append(SpeechStopped(audio_end_ms, self._input_item_id))
        self._utterance_start_ms = None
        detection = self.config.turn_detection
        self._commit(detection is not None and detection.create_response, now_ms)

    def _commit(self, create_response: bool, now_ms: int) -> None:
        if not self._utterance and self._input_item_id is None:
            raise EngineError(ErrorCode.INPUT_AUDIO_BUFFER_EMPTY, "no input audio to commit")
        utterance = bytes(self._utterance)
        if self._vad is None and self._speech_hint_sent:  # commit mode: the commit ends the speech it announced
            self._outbox.append(SpeechStopped(0, self._input_item_id))
        self._outbox.append(InputCommitted(self._input_item_id or self._new_input_item()))
        self._commit_seq += 1
        self._text_turn = None  # the caller spoke since: the response answers that
        self._utterance.clear()
        self._input_item_id = None
        self._speech_hint_sent = False
        self._last_utterance = utterance
        if create_response:
            self._create_response(now_ms)

    def _create_response(self, now_ms: int) -> None:
        if self._active is not None and self._active.playback_active():
            raise EngineError(ErrorCode.RESPONSE_ALREADY_ACTIVE, f"response {self._active.response_id} is active")
        text, self._text_turn = self._text_turn, None
        if text is not None:  # a text turn (vllm-omni: Qwen3-Omni answers text-only turns): said, not echoed
            self._start_response(*self.agent.say(text), now_ms=now_ms)
            return
        if self._commit_seq == 0:
            raise EngineError(ErrorCode.RESPONSE_CREATE_WITHOUT_INPUT, "no committed input to respond to")
        reply = self.agent.reply(self._last_utterance)
        if reply is not None:
            self._start_response(*reply, now_ms=now_ms)

    def _ack(self, response_id: str, played_ms: int, item_id: str | None) -> None:
        response = _acked(self._responses, self._commit_seq, response_id, played_ms, item_id)
        self._outbox.append(PlaybackAcknowledged(response_id, response.played_ms))
        if response is self._active and not response.playback_active():
            self._active = None

    def _call_function(self, name: str, arguments: dict[str, object]) -> None:
        response_id = f"resp-{self.session_id}-{self.epoch}-{self._token_hex(4)}"
        call_id = f"call_{self._token_hex(12)}"
        self.function_outputs[call_id] = None
        # One event, as vllm-omni's runner emits one ``function_call.done``: the wire shows it as a response
        # of its own (``response.created`` … ``response.done``, engine/projection.py).
        self._outbox.append(FunctionCall(name, call_id, dict(arguments), json.dumps(arguments), response_id))

    # ------------------------------------------------------------- responses

    def _start_response(self, audio: bytes, transcript: str, now_ms: int) -> _Response:
        response_id = f"resp-{self.session_id}-{self.epoch}-{self._token_hex(4)}"
        response = _Response(response_id, f"item_{response_id}", self.epoch, self._commit_seq, transcript=transcript)
        chunk_bytes = OUTPUT_RATE_HZ * 2 * self.options.chunk_ms // 1000
        response.chunks.extend(audio[i : i + chunk_bytes] for i in range(0, len(audio), chunk_bytes))
        response.next_chunk_ms = now_ms
        self._responses[response_id] = response
        self._overlap_speech_ms = 0
        self._active = response
        self._outbox.append(ResponseCreated(response_id, self.epoch))
        self.tick(now_ms)
        if not response.chunks and response.generating and not self.agent.streams_input:
            self._finish(response)
        return response

    def _release_chunk(self, response: _Response) -> None:
        chunk = response.chunks.popleft()
        self._emit_audio(response, chunk)
        response.next_chunk_ms += int(self.options.chunk_ms / self.options.generation_speed)
        if not response.chunks:
            self._finish(response)

    def _emit_audio(self, response: _Response, pcm: bytes) -> None:
        ms = len(pcm) * 500 // OUTPUT_RATE_HZ
        response.generated_ms += ms
        response.audio_ms += ms
        self._outbox.append(AudioDelta(pcm, OUTPUT_RATE_HZ, response.response_id, response.item_id, response.epoch))
        # As vllm-omni 0.30: every audio delta is followed by one transcript delta, empty after the first.
        self._outbox.append(TranscriptDelta(response.response_id, response.transcript))
        response.transcript = ""

    def _loop_back(self, pcm: bytes, now_ms: int) -> None:
        response = self._active
        if response is None or response.epoch != self.epoch:
            response = self._start_response(b"", "", now_ms)
        if pcm:
            self._emit_audio(response, pcm)

    def _finish(self, response: _Response) -> None:
        response.generating = False
        self._outbox.append(ResponseDone(response.response_id, "completed", None, response.epoch))
        if response is self._active and not response.playback_active():
            self._active = None

    def _cancel(self, response: _Response, reason: str) -> None:
        response.chunks.clear()
        response.generating = False
        self._outbox.append(ResponseDone(response.response_id, "cancelled", reason, response.epoch))

    def _interrupt(self, response: _Response, reason: str) -> None:
        """Stop the assistant: cancel generation (or, if it was done, clear its unheard playback)."""
        if response.generating:
            self._cancel(response, reason)
        else:
            self._outbox.append(OutputAudioCleared(response.response_id))
        response.audio_ms = min(response.audio_ms, response.played_ms)
        self._active = None
        self.epoch += 1

    def _barge_in(self, reason: str) -> None:
        self._clear_input()
        if self._active is not None and self._active.playback_active():
            self._interrupt(self._active, reason)
        else:
            self.epoch += 1

    def _clear_input(self) -> None:
        self._clear_kept_input()
        self._utterance_start_ms = None
        self._speech_hint_sent = False
        if self._vad is not None:
            self._vad.reset()

    def _clear_kept_input(self) -> None:
        self._utterance.clear()
        self._recent.clear()
        self._input_item_id = None

    def _item_created(self, item: dict[str, object]) -> None:
        item_id = f"item_{self._token_hex(16)}"
        self._outbox.append(ItemCreated({"id": item_id, "object": "realtime.item", **item, "status": "completed"}, item_id))

    def _new_input_item(self) -> str:
        self._input_item_id = f"item_{self._token_hex(16)}"
        return self._input_item_id

    # ------------------------------------------------------------------ lease

    def _idle_deadline_ms(self) -> int | None:
        ttl = self.options.idle_ttl_ms
        if ttl is None or (self._active is not None and self._active.generating):
            return None
        return self._last_activity_ms + ttl

    def _expire(self, reason: str) -> None:
        self._terminate()
        self.close_reason = reason
        self._outbox.append(SessionExpired(self.session_id, reason))

    def _close(self, reason: str) -> None:
        self._terminate()
        self.close_reason = reason
        self._outbox.append(SessionClosed(self.session_id, reason))

    def _terminate(self) -> None:
        if self._active is not None and self._active.generating:
            self._cancel(self._active, "session_closed")
        self._active = None
        self.state = SessionState.CLOSED
        self.lease_generation += 1
        self._detached_at_ms = None


def _turn_facts(active: _Response | None, commit_seq: int, *, user_speaking: bool) -> dict[str, object]:
    """Where the turn stands, the reply in progress and its playback ledger (``LocalSessionCore.turn_facts``)."""
    turn_id = max(commit_seq - 1, 0)
    if active is not None and active.playback_active():
        state = "assistant_playing" if active.generated_ms else "assistant_generating"  # from its first audio on
        playback = {"generated_ms": active.generated_ms, "sent_ms": active.generated_ms, "played_ms": active.played_ms, "committed_ms": 0}
        return {"turn_state": state, "turn_id": turn_id, "active_response_id": active.response_id, "active_response_turn_id": turn_id, "playback": playback}
    idle_playback = {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}
    state = "user_speaking" if user_speaking else "idle"
    return {"turn_state": state, "turn_id": turn_id, "active_response_id": None, "active_response_turn_id": None, "playback": idle_playback}


def _acked(responses: Mapping[str, _Response], commit_seq: int, response_id: str, played_ms: int, item_id: str | None) -> _Response:
    """``playback.ack``: the response, its played position advanced (never back, never past what was generated)."""
    if item_id is not None and item_id != f"item_{response_id}":
        raise EngineError(ErrorCode.PLAYBACK_ITEM_MISMATCH, f"{item_id} is not the item of {response_id}")
    response = responses.get(response_id)
    if response is None:
        raise EngineError(ErrorCode.PLAYBACK_ITEM_NOT_FOUND, f"unknown response {response_id}")
    if response.commit_seq < commit_seq:
        raise EngineError(ErrorCode.PLAYBACK_ACK_TOO_LATE, f"input was committed after {response_id}")
    response.played_ms = max(response.played_ms, min(max(played_ms, 0), response.generated_ms))
    return response


def _truncated(responses: Mapping[str, _Response], item_id: str, audio_end_ms: int) -> ItemTruncated:
    """``conversation.item.truncate``: the reply's audio cut at ``audio_end_ms`` (and its played position with it)."""
    response = responses.get(item_id.removeprefix("item_"))
    if response is None or response.item_id != item_id:
        raise EngineError(ErrorCode.ITEM_NOT_FOUND, f"unknown item {item_id}")
    response.audio_ms = min(response.audio_ms, max(0, audio_end_ms))
    response.played_ms = min(response.played_ms, response.audio_ms)
    return ItemTruncated(item_id, response.audio_ms)

