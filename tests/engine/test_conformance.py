"""``callbridge engine-server`` says what vllm-omni 0.30 says, event for event (issue #13 item 7).

The embedded engine's core runs an exchange (a turn, a barge-in, a cancel, a
tool call …) under a virtual clock. Its typed events go two ways:

- through ours: ``WireProjection``, what ``engine-server`` sends;
- through theirs: each event as the internal event vllm-omni's runner emits
  for the same happening (``model_channel.py``, ``runner.py``, ``control.py``,
  ``helpers.py``, ``playback_ledger.py`` of the 0.30.0 wheel), then the wheel's
  own projection (``realtime_events.project_internal_event``) and typed events'
  ``to_realtime()``; events the runner builds typed (speech, overlap, acks,
  heartbeats) are built with the wheel's classes.

Both must give the same event types in the same order, each with the same
keys. The translation below is the one thing written by hand: each line says
which internal event of the real runner it stands for.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from callbridge.engine.commands import (
    AckPlayback,
    AppendAudio,
    BargeIn,
    CancelResponse,
    ClearInput,
    ClearOutputAudio,
    CloseSession,
    Commit,
    CreateTextItem,
    EngineCommand,
    FunctionCallOutput,
    Heartbeat,
    TruncateItem,
)
from callbridge.engine.events import (
    AudioDelta,
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
    SpeechStarted,
    SpeechStopped,
    TranscriptDelta,
    is_chunk_verdict,
)
from callbridge.engine.local.agents import AGENTS
from callbridge.engine.local.core import LocalEngineOptions, LocalSessionCore
from callbridge.engine.port import SessionConfig, TurnDetection
from callbridge.engine.projection import WireProjection
from tests.engine.audio import LoudnessScorer, caller_speech_16k, chunks, silence, tone
from tests.engine.vllm_omni_wheel import vllm_omni  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("vllm_omni")

SESSION_ID = "duplex-conformance"
TOOLS = ({"type": "function", "name": "send_dtmf", "parameters": {"type": "object"}}, {"type": "function", "name": "end_call"})


class Exchange:
    """The embedded engine's core under a virtual clock, every event it emits kept in order."""

    def __init__(self, *, agent: str = "echo", vad: bool = True, generation_speed: float = 4.0, tools: tuple[dict[str, Any], ...] = ()) -> None:
        options = LocalEngineOptions(agent=agent, chunk_ms=200, generation_speed=generation_speed)
        config = SessionConfig(turn_detection=TurnDetection() if vad else None, tools=tools)
        self.now_ms = 0
        self.core = LocalSessionCore(SESSION_ID, config, AGENTS[agent](), options, 0, scorer=LoudnessScorer())
        self.events: list[EngineEvent] = [e for e in self.core.events_to_send() if not isinstance(e, SessionCreated)]

    def submit(self, command: EngineCommand) -> None:
        self.core.submit(command, self.now_ms)
        self.events += self.core.events_to_send()

    def speak(self, pcm: bytes) -> None:
        for chunk in chunks(pcm):
            self.submit(AppendAudio(chunk, 16000))
            self.advance(20)

    def advance(self, ms: int) -> None:
        end = self.now_ms + ms
        while (deadline := self.core.next_deadline_ms()) is not None and deadline <= end:
            self.now_ms = max(self.now_ms, deadline)
            self.core.tick(self.now_ms)
            self.events += self.core.events_to_send()
        self.now_ms = end

    def response_ids(self) -> list[str]:
        return [e.response_id for e in self.events if isinstance(e, ResponseCreated)]

    def generated_ms(self, response_id: str) -> int:
        return sum(len(e.pcm) // 48 for e in self.events if isinstance(e, AudioDelta) and e.response_id == response_id)


# ------------------------------------------------------------------ theirs


class RealServer:
    """Our typed events as vllm-omni 0.30's runner would have emitted them, through the wheel's projection."""

    def __init__(self) -> None:
        from vllm_omni.engine.duplex.realtime_events import RealtimeProjectionState

        self.state = RealtimeProjectionState(session_id=SESSION_ID)
        self.epoch = 0

    def wire(self, events: list[EngineEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for typed in self._translate(events):
            bound = dataclasses.replace(typed, session_id=SESSION_ID, epoch=self.epoch)  # as DuplexSessionManager.emit
            out.append(bound.to_realtime())
        return out

    def _project(self, internal: dict[str, Any]) -> list[Any]:
        from vllm_omni.engine.duplex.realtime_events import project_internal_event

        projected: list[Any] = project_internal_event(self.state, internal)
        return projected

    def _translate(self, events: list[EngineEvent]) -> Iterator[Any]:
        import vllm_omni.engine.duplex.events as real
        from vllm_omni.engine.duplex.realtime_events import register_user_item

        pending_delta: dict[str, Any] | None = None
        for index, event in enumerate(events):
            if pending_delta is not None and not isinstance(event, TranscriptDelta):
                raise AssertionError("every audio delta is followed by its transcript delta")
            match event:
                case SpeechStarted(ms, item_id):  # turn detection / note_input_append build it typed
                    yield real.SpeechStarted(audio_start_ms=ms, item_id=item_id)
                case SpeechStopped(ms, item_id):
                    yield real.SpeechStopped(audio_end_ms=ms, item_id=item_id)
                case InputCommitted(item_id):  # helpers.input_committed_payload
                    yield from self._project({"type": "input.committed", "session_id": SESSION_ID, "turn_id": 1, "epoch": self.epoch, "realtime_item_id": item_id})
                case InputCleared():  # runner: input.cancelled
                    yield from self._project({"type": "input.cancelled", "session_id": SESSION_ID})
                case ResponseCreated(response_id, epoch):  # model_channel: response.created, then response.speak
                    self.epoch = epoch or 0
                    yield from self._project({"type": "response.created", "session_id": SESSION_ID, "response_id": response_id, "epoch": epoch, "modalities": ["audio", "text"]})
                    speak = {"type": "response.speak", "session_id": SESSION_ID, "response_id": response_id, "epoch": epoch, "text": "", "end_of_turn": False, "model_speak": True}
                    yield from self._project(speak)
                case AudioDelta(pcm, rate_hz, response_id, _, epoch):  # model_channel: one delta carries audio and text
                    pending_delta = {
                        "type": "response.output_audio.delta",
                        "session_id": SESSION_ID,
                        "response_id": response_id,
                        "epoch": epoch,
                        "audio": base64.b64encode(pcm).decode(),
                        "format": "pcm16",
                        "sample_rate_hz": rate_hz,
                        "end_of_turn": False,
                        "model_speak": True,
                    }
                case TranscriptDelta(_, text):
                    assert pending_delta is not None, "a transcript delta follows an audio delta"
                    following = events[index + 1] if index + 1 < len(events) else None
                    if isinstance(following, ResponseDone) and following.status == "completed":
                        pending_delta["end_of_turn"] = True  # the last chunk ends the turn
                    yield from self._project({**pending_delta, "text": text})
                    pending_delta = None
                case ResponseDone(response_id, "completed", _, epoch):  # model_channel: response.done after the last delta
                    yield from self._project({"type": "response.done", "session_id": SESSION_ID, "response_id": response_id, "epoch": epoch, "committed": True})
                case ResponseDone(response_id, _, reason, epoch):  # runner: audio.cancelled, the epoch advances
                    cancelled = {"type": "audio.cancelled", "session_id": SESSION_ID, "response_id": response_id, "reason": reason, "cancelled_epoch": epoch, "committed_ms": 0}
                    yield from self._project(cancelled)
                    self.epoch = (epoch or 0) + 1
                case OutputAudioCleared(response_id):  # audio.cancelled of a reply already generated: the clear alone
                    yield real.OutputAudioCleared(response_id=response_id)
                    self.epoch += 1
                case OverlapDecision(action, reason, epoch, duration_ms):  # runner._on_append: overlap_policy.decide, then helpers.overlap_decision_event
                    decision = {"action": action, "reason": reason, "duration_ms": duration_ms}
                    details = {"type": "overlap.decision", "session_id": SESSION_ID, "epoch": epoch, "policy": "barge_in_on_speech", **decision}
                    yield real.OverlapDecision(policy="barge_in_on_speech", action=action, reason=reason, details=details)
                case ResponseListen(reason, epoch):  # runner._on_append: a turn model's silent chunk, no response in progress
                    yield from self._project({"type": "response.listen", "session_id": SESSION_ID, "epoch": epoch, "reason": reason})
                case PlaybackAcknowledged(response_id, played_ms):  # playback_ledger
                    details = {"type": "playback.acknowledged", "item_id": f"item_{response_id}", "played_ms": played_ms}
                    yield real.PlaybackAcknowledged(details=details)
                case ItemTruncated(item_id, audio_end_ms):  # control: conversation.item.truncated
                    yield from self._project({"type": "conversation.item.truncated", "item_id": item_id, "audio_end_ms": audio_end_ms, "content_index": 0})
                case ItemCreated(item):  # resolve_create_item's user ack, then control: conversation.item.created
                    if item.get("role") == "user":
                        yield from register_user_item(self.state, dict(item))
                    yield from self._project({"type": "conversation.item.created", "session_id": SESSION_ID, "item": dict(item), "created": True})
                case FunctionCall(name, call_id, _, raw_arguments, _):  # model_channel: function_call.done
                    yield from self._project({"type": "function_call.done", "call_id": call_id, "name": name, "arguments": raw_arguments})
                case HeartbeatAck():  # runner._on_heartbeat
                    yield real.SessionHeartbeatAck()
                case SessionClosed(_, reason):  # runner: session.closed
                    yield from self._project({"type": "session.closed", "session_id": SESSION_ID, "reason": reason})
                case EngineErrorEvent(code, message, _, event_id):
                    yield real.error_event(code, message, event_id=event_id)
                case _:
                    raise AssertionError(f"no vllm-omni counterpart written for {event!r}")


# ------------------------------------------------------------------ compare


def ours_by_source(events: list[EngineEvent]) -> list[tuple[dict[str, Any], EngineEvent]]:
    """Each wire frame ours sends, with the typed event it came from."""
    projection = WireProjection(SESSION_ID)
    return [(payload, event) for event in events for payload in projection.project(event)]


def ours(events: list[EngineEvent]) -> list[dict[str, Any]]:
    return [payload for payload, _ in ours_by_source(events)]


def shape(payload: dict[str, Any]) -> tuple[str, frozenset[str], frozenset[str]]:
    """An event's type, its keys, and the keys of the object it carries (response / item / part)."""
    carried: dict[str, Any] = next((payload[k] for k in ("response", "item", "part") if isinstance(payload.get(k), dict)), {})
    return payload["type"], frozenset(payload) - {"event_id"}, frozenset(carried)


def assert_same_wire(events: list[EngineEvent]) -> list[str]:
    """Ours and theirs frame for frame; the types of the frames, the verdicts on quiet chunks left out."""
    by_source = ours_by_source(events)
    mine, theirs = [payload for payload, _ in by_source], RealServer().wire(events)
    assert [p["type"] for p in mine] == [p["type"] for p in theirs]
    for m, t in zip(mine, theirs, strict=True):
        assert shape(m) == shape(t), (m["type"], sorted(shape(m)[1] ^ shape(t)[1]), sorted(shape(m)[2] ^ shape(t)[2]))
    return [payload["type"] for payload, source in by_source if not is_chunk_verdict(source)]


REPLY_OPENS = [
    "response.created",
    "conversation.item.added",
    "conversation.item.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
]


def test_a_whole_turn() -> None:
    x = Exchange()
    x.speak(silence(200) + caller_speech_16k() + silence(700))
    x.advance(3000)
    (rid,) = x.response_ids()
    x.submit(AckPlayback(rid, x.generated_ms(rid), f"item_{rid}"))
    kinds = assert_same_wire(x.events)
    start = kinds.index("response.created")
    assert kinds[:start] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "conversation.item.added",
        "conversation.item.created",
        "input_audio_buffer.committed",
        "conversation.item.done",
    ]
    assert kinds[start : start + 6] == REPLY_OPENS
    end = kinds.index("response.output_audio.done")
    assert kinds[end - 2 : end] == ["response.output_audio.delta", "response.output_audio_transcript.delta"]
    assert kinds[end:] == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
        "playback.acknowledged",
    ]


def test_a_barge_in_mid_reply() -> None:
    x = Exchange(generation_speed=1.0)
    x.speak(silence(200) + caller_speech_16k() + silence(700))
    x.speak(tone(400))  # the caller talks over the reply
    kinds = assert_same_wire(x.events)
    cut = kinds.index("overlap.decision")
    assert kinds[cut + 1 : cut + 4] == ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done"]
    assert "response.done" in kinds[cut:] and kinds[kinds.index("response.done", cut) + 1] == "rate_limits.updated"


def test_a_barge_in_after_the_reply_was_generated() -> None:
    x = Exchange(generation_speed=float("inf"))
    x.speak(silence(200) + caller_speech_16k() + silence(700))
    x.speak(tone(400))
    kinds = assert_same_wire(x.events)
    assert kinds[kinds.index("overlap.decision") + 1] == "output_audio_buffer.cleared"


def test_a_cancel_then_the_next_turn() -> None:
    x = Exchange(vad=False, generation_speed=1.0)
    x.speak(tone(300))
    x.submit(Commit(create_response=True))
    x.submit(CancelResponse())
    x.speak(tone(300))
    x.submit(Commit(create_response=True))
    kinds = assert_same_wire(x.events)
    assert "error" not in kinds and kinds.count("response.created") == 2
    assert kinds[:5] == [
        "input_audio_buffer.speech_started",  # commit mode: the first loud append, as vllm-omni's note_input_append
        "input_audio_buffer.speech_stopped",  # and the commit ends it
        "conversation.item.added",
        "conversation.item.created",
        "input_audio_buffer.committed",
    ]


@pytest.mark.parametrize("clear", [ClearOutputAudio, BargeIn])
def test_clearing_the_reply(clear: Callable[..., EngineCommand]) -> None:
    x = Exchange(generation_speed=1.0)
    x.speak(silence(200) + caller_speech_16k() + silence(700))
    (rid,) = x.response_ids()
    x.submit(clear(rid) if clear is ClearOutputAudio else clear())
    kinds = assert_same_wire(x.events)
    assert kinds[-2:] == ["response.done", "rate_limits.updated"]


def test_a_tool_call_and_its_output() -> None:
    x = Exchange(agent="actions", vad=False, tools=TOOLS)
    x.submit(CreateTextItem("DTMF 0"))
    call = next(e for e in x.events if isinstance(e, FunctionCall))
    x.submit(FunctionCallOutput(call.call_id, '{"ok":true}'))
    x.submit(FunctionCallOutput(call.call_id, '{"ok":true}'))  # twice: an error
    kinds = assert_same_wire(x.events)
    assert kinds[:3] == ["conversation.item.added", "conversation.item.created", "conversation.item.done"]
    assert kinds[3:11] == [
        "response.created",
        "conversation.item.added",
        "conversation.item.created",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
    ]
    assert kinds[11:] == ["response.done", "conversation.item.added", "conversation.item.created", "conversation.item.done", "error"]


def test_the_session_housekeeping() -> None:
    x = Exchange(generation_speed=float("inf"))
    x.speak(silence(200) + caller_speech_16k() + silence(700))
    (rid,) = x.response_ids()
    x.submit(AckPlayback(rid, 300, f"item_{rid}"))
    x.submit(TruncateItem(f"item_{rid}", 300))
    x.submit(Heartbeat())
    x.submit(ClearInput())
    x.submit(CloseSession("client_closed"))
    kinds = assert_same_wire(x.events)
    assert kinds[-5:] == ["playback.acknowledged", "conversation.item.truncated", "session.heartbeat_ack", "input_audio_buffer.cleared", "session.closed"]


# ------------------------------------------------------- the session object

AS_PUBLIC_DICT_KEYS = (  # DuplexEngineSession.as_public_dict, engine/duplex/session/engine_session.py
    "id", "state", "turn_state", "epoch", "turn_id", "active_request_id", "active_response_id", "active_response_turn_id",
    "model", "modalities", "instructions", "voice", "response_format", "temperature", "max_tokens", "speed", "idle_timeout_s",
    "overlap_policy", "overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms", "playback_commit_policy",
    "playback", "capabilities",
)  # fmt: skip


async def test_the_session_is_announced_as_vllm_omni_announces_it() -> None:
    from vllm_omni.engine.duplex.realtime_events import RealtimeProjectionState, realtime_session_payload

    from tests.engine.serving import RawClient, engine_server

    client_session = {"input_audio_format": "g711_ulaw", "sample_rate_hz": 8000, "turn_detection": None, "instructions": "hi"}
    async with engine_server() as running:
        client = await RawClient.connect(running.url)
        created = await client.open(client_session)
        updated = client.updated
        assert updated is not None
        state = RealtimeProjectionState(session_id=created["session"]["id"], default_payload=client_session)
        engine_side = {key: None for key in AS_PUBLIC_DICT_KEYS} | {k: v for k, v in client_session.items() if k not in AS_PUBLIC_DICT_KEYS}
        expected = realtime_session_payload(state, engine_side)
        assert set(created) == {"type", "event_id", "session", "attachment_generation", "resume_token"}  # not journaled
        assert set(updated) == {"type", "event_id", "session", "server_event_seq"} and updated["server_event_seq"] == 1
        for announced in (created["session"], updated["session"]):
            assert set(announced) == set(expected)
            assert announced["audio"]["input"] == expected["audio"]["input"] == {"format": {"type": "audio/g711_ulaw", "rate": 8000}, "sample_rate_hz": 8000}
            assert announced["state"] == "open" and announced["instructions"] == "hi"
        await client.send({"type": "session.update", "session": {"instructions": "bye"}})
        later = await client.recv()
        assert later["type"] == "session.updated" and later["server_event_seq"] == 2 and later["session"]["instructions"] == "bye"


@pytest.mark.parametrize(
    "session",
    [{"input_audio_format": "audio/pcmu"}, {"turn_detection": {"type": "server_vad", "interrupt_response": False}}],
)
async def test_a_session_object_either_server_refuses_is_invalid_session_config(session: dict[str, Any]) -> None:
    """vllm-omni's serving code answers any ``ValueError`` of ``DuplexSessionConfig.from_realtime`` at the open
    with ``invalid_session_config`` (``OmniDuplexSessionHandler._open``), whatever the validator's own code."""
    from vllm_omni.engine.duplex.config import DuplexSessionConfig

    from tests.engine.serving import RawClient, engine_server

    with pytest.raises(ValueError):
        DuplexSessionConfig.from_realtime(session)
    async with engine_server() as running:
        client = await RawClient.connect(running.url)
        assert (await client.open(session))["error"]["code"] == "invalid_session_config"


async def test_a_resume_and_a_takeover_are_announced_as_vllm_omni_announces_them() -> None:
    """``session.resumed`` to the new socket, ``session.replaced`` to the old one: the real classes' keys."""
    import vllm_omni.engine.duplex.events as real

    from tests.engine.serving import RawClient, engine_server

    async with engine_server() as running:
        old = await RawClient.connect(running.url)
        created = await old.open({"input_audio_format": "pcm16", "sample_rate_hz": 16000, "turn_detection": None})
        session_id = created["session"]["id"]
        new = await RawClient.connect(running.url)
        await new.send({"type": "session.resume", "session_id": session_id, "resume_token": created["resume_token"], "last_received_server_event_seq": 1})
        resumed, replaced = await new.recv(), await old.recv()
    expected_resumed = real.SessionResumed(session_id=session_id, session={}, attachment_generation=2, resume_token="t").to_realtime()
    expected_replaced = real.SessionReplaced(session_id=session_id, attachment_generation=1).to_realtime()
    assert set(resumed) == set(expected_resumed) and resumed["attachment_generation"] == 2
    assert set(replaced) == set(expected_replaced) and replaced["attachment_generation"] == 1
    assert resumed["session"]["id"] == session_id and resumed["resume_token"] != created["resume_token"]


async def test_a_model_in_the_url_opens_the_session_at_once_unless_autostart_is_off() -> None:
    """As vllm-omni's ``RealtimeEnvelope.initial_open_payload`` (``entrypoints/duplex/realtime_input.py``, not
    loadable without its serving stack): ``?model=`` opens the default session before any client message;
    ``?autostart=0`` (what callbridge's own client sends) or ``?resume=1`` waits for the first."""
    from tests.engine.serving import RawClient, engine_server

    async with engine_server() as running:
        eager = await RawClient.connect(running.url, "/v1/realtime?model=m")
        created, updated = await eager.recv(), await eager.recv()  # nothing sent
        assert created["type"] == "session.created" and created["session"]["model"] == "m"
        assert updated["type"] == "session.updated"
        waiting = await RawClient.connect(running.url, "/v1/realtime?model=m&autostart=0")
        with pytest.raises(TimeoutError):
            await waiting.recv(timeout_s=0.3)
        assert (await waiting.open())["type"] == "session.created"
