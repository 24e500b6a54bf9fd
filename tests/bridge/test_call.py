"""CallSession under a fake clock: Twilio messages in, engine commands and Twilio messages out."""

from __future__ import annotations

import base64
from dataclasses import fields, replace
from typing import Any

import numpy as np
import orjson
import pytest

from callbridge.bridge.actions import ActionResult, ApplicationToolCall
from callbridge.bridge.binding import AgentSetup, EngineBinding
from callbridge.bridge.bridge_barge_in import BridgeBargeIn, EngineBargeIn
from callbridge.bridge.call import TAKEOVER_TELLS_HELD_MS, CallOptions, CallSession, CallState, DtmfMode
from callbridge.bridge.call_outputs import (
    BargeInFlushed,
    CallOutput,
    ClockDistrusted,
    HangUpCall,
    Notice,
    Observed,
    PendingAction,
    Perform,
    RecordingChunk,
    ToCarrier,
    ToEngine,
)
from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.inbound import TIMESTAMPS_AHEAD_MS
from callbridge.bridge.interruption_judge import BridgeBargeInSettings
from callbridge.bridge.turns import SilencePolicy
from callbridge.carriers.base import HangUp, ProtocolErrorReason, UnknownCarrierEvent
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.codecs import pcm16_to_ulaw, ulaw_to_pcm16
from callbridge.engine.commands import (
    AckPlayback,
    AppendAudio,
    BargeIn,
    CloseSession,
    CreateResponse,
    CreateTextItem,
    FunctionCallOutput,
    TruncateItem,
)
from callbridge.engine.events import (
    AudioDelta,
    Capabilities,
    FunctionCall,
    ItemTruncated,
    OutputAudioCleared,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionExpired,
    SessionReplaced,
    SpeechStarted,
    SpeechStopped,
)
from callbridge.stall import PROCESS_STALL_MS
from tests.carriers.test_twilio import CALL, CONNECTED, SID, START, media

pytestmark = pytest.mark.core

CAPS = Capabilities(supports_barge_in=True, supports_session_resume=True, supports_audio_truncate=True, supports_playback_ack=True)
AGENT_FIELDS = frozenset(field.name for field in fields(AgentSetup))
"""``Harness.live``'s keywords that set the agent (``AgentSetup``), not the session (``EngineBinding``)."""


def agent_audio(ms: int, rate_hz: int = 24000) -> bytes:
    t = np.arange(rate_hz * ms // 1000) / rate_hz
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


def caller_frame(i: int = 0) -> bytes:
    t = (np.arange(160) + 160 * i) / 8000
    return pcm16_to_ulaw((np.sin(2 * np.pi * 300 * t) * 8000).astype("<i2").tobytes())


class Harness:
    def __init__(self, **options: object) -> None:
        self.now_ms = 0
        self.call = CallSession(TwilioCodec(), CallOptions(**options))  # type: ignore[arg-type]
        self.sent: list[dict[str, object]] = []
        self.commands: list[object] = []
        self.performed: list[PendingAction] = []
        self.outputs: list[CallOutput] = []
        """Every output, in the call's order."""

    def drain(self) -> None:
        for output in self.call.outputs():
            self.outputs.append(output)
            if isinstance(output, ToCarrier):
                self.sent.append(orjson.loads(output.message))
            elif isinstance(output, ToEngine):
                self.commands.append(output.command)
            elif isinstance(output, Perform):
                self.performed.append(output.pending)

    def take_performed(self) -> list[PendingAction]:
        """The carrier work asked for since the last time."""
        performed, self.performed = self.performed, []
        return performed

    def receive(self, message: str | bytes) -> None:
        self.call.receive_message(message, self.now_ms)
        self.drain()

    def engine(self, event: object) -> None:
        self.call.receive_engine_event(event, self.now_ms)  # type: ignore[arg-type]
        self.drain()

    def advance(self, ms: int) -> None:
        end = self.now_ms + ms
        while True:
            deadline = self.call.next_deadline_ms()
            if deadline is None or deadline > end:
                break
            self.now_ms = max(self.now_ms, deadline)
            self.call.tick(self.now_ms)
            self.drain()
        self.now_ms = end

    def live(self, heard_ms: tuple[tuple[str, int], ...] = (), **bound: Any) -> Harness:
        self.receive(CONNECTED)
        self.receive(START)
        assert self.call.start_request is not None and self.call.start_request.call_id == CALL
        agent = {name: bound.pop(name) for name in AGENT_FIELDS & bound.keys()}
        self.call.engine_bound(EngineBinding(CAPS, heard_ms=heard_ms, agent=AgentSetup(**agent), **bound), self.now_ms)
        self.drain()
        return self

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [c for c in self.commands if isinstance(c, kind)]

    def events(self, name: str) -> list[dict[str, object]]:
        return [m for m in self.sent if m["event"] == name]

    def media_frames(self) -> list[bytes]:
        """The agent's audio sent, in 20 ms μ-law frames (a message may carry several: ``media_message_ms``)."""
        payloads = [base64.b64decode(str(m["media"]["payload"])) for m in self.events("media")]  # type: ignore[index]
        assert all(len(payload) % 160 == 0 for payload in payloads), "whole frames only"
        return [payload[i : i + 160] for payload in payloads for i in range(0, len(payload), 160)]


class CallerSays:
    """The caller's line into ``h``: each call one 20 ms payload, the next on the stream's media timeline (with its
    timestamp, as Twilio sends it, or none, as jambonz and AudioSocket)."""

    def __init__(self, h: Harness, *, timestamps: bool = True) -> None:
        self.h, self.timestamps, self.frames = h, timestamps, 0

    def __call__(self, payload: bytes) -> None:
        self.h.receive(media(payload, timestamp=str(20 * self.frames) if self.timestamps else None))
        self.frames += 1


def mark_name(message: dict[str, object]) -> str:
    return message["mark"]["name"]  # type: ignore[index,return-value]


class TestInbound:
    def test_media_reaches_the_engine_resampled(self) -> None:
        h = Harness().live()
        for i in range(50):
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
            h.now_ms += 20
        appended = h.of(AppendAudio)
        assert all(c.rate_hz == 16000 for c in appended)
        total_ms = sum(len(c.pcm) for c in appended) // 32
        assert 1000 - 120 <= total_ms <= 1000  # all of it, less what the resampler holds back
        assert h.call.caller.input_ms == 1000

    def test_audio_before_the_engine_is_bound_is_kept_and_sent_first(self) -> None:
        h = Harness()
        h.receive(CONNECTED)
        h.receive(START)
        for i in range(25):
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
        assert h.call.state is CallState.STARTING and h.of(AppendAudio) == []
        h.call.engine_bound(EngineBinding(CAPS), 0)
        h.drain()
        assert sum(len(c.pcm) for c in h.of(AppendAudio)) // 32 >= 500 - 120

    def test_the_recording_holds_what_the_caller_said_before_the_engine_was_bound(self) -> None:
        """The caller's first words wait for the engine in the starting buffer; the recording has them too, from
        the stream's first frame, and its clock starts there (the agent's channel stays where it played)."""
        h = Harness()
        h.receive(CONNECTED)
        h.receive(START)
        frames = [caller_frame(i) for i in range(60)]
        for i, frame in enumerate(frames[:10]):  # 200 ms before the bind
            h.now_ms += 20
            h.receive(media(frame, timestamp=str(20 * i)))
        h.call.engine_bound(EngineBinding(CAPS, agent=AgentSetup(record=True)), h.now_ms)
        h.drain()
        assert h.call.caller.recorder is not None and h.call.caller.recorder.started_ms == h.now_ms - 200
        for i, frame in enumerate(frames[10:], start=10):
            h.now_ms += 20
            h.receive(media(frame, timestamp=str(20 * i)))
        h.drain()
        chunks = b"".join(o.data for o in h.outputs if isinstance(o, RecordingChunk))
        chunks += h.call.caller.recorder.take(h.now_ms, final=True) or b""
        left = np.frombuffer(chunks, dtype="<i2")[0::2]
        received = np.frombuffer(ulaw_to_pcm16(b"".join(frames)), dtype="<i2")
        assert len(left) == len(received) and np.array_equal(left, received)

    def test_the_calls_assistant_chooses_who_decides_barge_in_on_its_stream(self) -> None:
        """``AgentSetup.barge_in`` (``turn_taking.barge_in``) over the options' at the bind; None keeps theirs."""
        assert isinstance(Harness().live().call.barge_in, EngineBargeIn)
        chosen = BridgeBargeInSettings(below_caller_db=10)
        h = Harness().live(barge_in=chosen)
        assert isinstance(h.call.barge_in, BridgeBargeIn) and h.call.barge_in.judge.below_caller_db == 10
        h.receive(media(caller_frame(), timestamp="0"))
        assert all(c.overlap is None for c in h.of(AppendAudio))  # the agent is quiet: nothing marked

    @pytest.mark.parametrize("timestamps", [True, False])  # Twilio's media has them; jambonz's, AudioSocket's none
    def test_a_late_first_payload_read_with_its_backlog_is_judged_when_it_was_said(self, timestamps: bool) -> None:
        """The bridge stalls as the caller's stream starts: its first 460 ms are read at once. Their said time comes
        from the on-time baseline, never ahead of the clock — from the first payload's arrival the caller's audio
        ran 460 ms ahead, so bridge mode judged the caller's speech over the agent against frames not yet sent,
        took the agent for silent, and the engine's VAD barged in unpaused (a flaky CI failure on jambonz)."""
        h = Harness(lead_ms=200).live(barge_in=BridgeBargeInSettings())
        said = CallerSays(h, timestamps=timestamps)
        quiet = pcm16_to_ulaw(bytes(320))
        h.now_ms = 460
        for _ in range(23):  # read late, at once
            said(quiet)
        assert h.call.caller.said_until_ms(h.now_ms) == h.now_ms
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        for i in range(40):  # on time: 500 ms of the reply, then the caller talks over it
            h.advance(20)
            said(caller_frame(i) if i >= 25 else quiet)
            assert h.call.caller.said_until_ms(h.now_ms) == h.now_ms
        assert h.call.speech.pauses == 1  # the bridge paused the agent
        assert {c.overlap for c in h.of(AppendAudio)[23:]} == {"listen"}  # the engine heard it all marked: never barged in

    def test_speech_over_the_end_of_a_reply_read_after_it_played_out_is_the_callers_turn(self) -> None:
        """Bridge mode: the caller starts talking over the reply's last 140 ms as the bridge stalls; read late, their
        speech would pause the agent, but the reply has played out by then — nothing to hold. Their words go to the
        engine whole, unmarked, from before their onset (marked *listen*, it kept none of them), and no barge-in is
        sent for a reply that is over; the policy is not left paused (it went on marking their turn *listen* and
        confirmed a barge-in on nothing at 600 ms)."""
        h = Harness(lead_ms=200).live(barge_in=BridgeBargeInSettings())
        said = CallerSays(h)
        quiet = pcm16_to_ulaw(bytes(320))
        for _ in range(10):
            said(quiet)
            h.advance(20)
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(400), 24000, "resp-1", "item_resp-1", 0))
        h.engine(ResponseDone("resp-1", "completed", None, 0))
        for _ in range(13):  # 260 ms of the reply, the caller quiet
            said(quiet)
            h.advance(20)
        commands = len(h.commands)
        h.now_ms += 400  # stalled: the reply plays out meanwhile, the caller's words wait in the socket
        for i in range(20):
            said(caller_frame(i))
        for i in range(20, 30):
            said(caller_frame(i))
            h.advance(20)
        for _ in range(40):
            said(quiet)
            h.advance(20)
        assert h.of(BargeIn) == [] and not h.call.barge_in.judge.policy.paused  # type: ignore[attr-defined]
        sent = [c for c in h.commands[commands:] if isinstance(c, AppendAudio)]
        assert all(c.overlap is None for c in sent[sent.index(next(c for c in sent if c.overlap is None)) :])
        unmarked_ms = sum(len(c.pcm) for c in sent if c.overlap is None) // 32
        assert unmarked_ms >= 600 + 300 + 800 - 40  # the words from before their onset, and the quiet after

    def test_timestamp_gap_is_filled_with_silence(self) -> None:
        h = Harness().live()
        h.receive(media(caller_frame(), timestamp="0"))
        h.receive(media(caller_frame(), timestamp="200"))  # 180 ms of frames lost on the way
        assert h.call.caller.input_ms == 220

    def test_dtmf_becomes_a_text_item(self) -> None:
        h = Harness().live()
        h.receive(f'{{"event":"dtmf","streamSid":"{SID}","dtmf":{{"digit":"5"}}}}')
        assert h.of(CreateTextItem) == [CreateTextItem("DTMF 5")]
        ignoring = Harness(dtmf_mode=DtmfMode.IGNORE).live()
        ignoring.receive(f'{{"event":"dtmf","streamSid":"{SID}","dtmf":{{"digit":"5"}}}}')
        assert ignoring.of(CreateTextItem) == []


class TestOutbound:
    def test_agent_audio_is_paced_in_exact_frames_with_markers(self) -> None:
        h = Harness(lead_ms=200, mark_every_frames=5).live()
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        assert len(h.media_frames()) == 10  # the lead: 200 ms ahead, no more
        h.engine(ResponseDone("resp-1", "completed", None, 0))
        h.advance(2000)
        frames = h.media_frames()
        assert len(frames) == 51  # 1000 ms and the resampler's ~3 ms tail, the last frame padded
        assert [mark_name(m) for m in h.events("mark")][-1] == "resp-1@1020"
        assert all(m["streamSid"] == SID for m in h.sent)

    def test_mark_echo_acks_heard_playback(self) -> None:
        h = Harness(lead_ms=200, mark_every_frames=5).live()
        h.engine(AudioDelta(agent_audio(400), 24000, "resp-1", "item_resp-1", 0))
        first_mark = mark_name(h.events("mark")[0])
        h.now_ms = 100
        h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"{first_mark}"}}}}')
        assert h.of(AckPlayback) == [AckPlayback("resp-1", 100, "item_resp-1")]

    def test_an_echo_read_in_a_backlog_does_not_move_the_playback_model(self) -> None:
        """The bridge stalls 80 ms: the caller's frames and Twilio's echo wait in the socket, then are read at
        once. The echo came on time; only our reading was late, and the barge-in's heard position says so."""
        h = Harness(lead_ms=200, mark_every_frames=5).live()
        for i in range(10):  # the caller talks at real time
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
            h.now_ms += 20
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        started = h.now_ms
        for i in range(10, 15):
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
            h.now_ms += 20
        h.now_ms += 80  # stalled: five more frames and the echo of the first marker (100 ms played) wait
        first_mark = mark_name(h.events("mark")[0])
        for i in range(15, 20):  # read at once, in the order they came: the echo came with frame 15
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
            if i == 15:
                h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"{first_mark}"}}}}')
        h.engine(OverlapDecision("barge_in", "server_vad_speech_started", 0))
        truncate = h.of(TruncateItem)[-1]
        assert abs(truncate.audio_end_ms - (h.now_ms - started)) <= 1  # what played: the whole time since it started
        # (reading the echo at face value would have put it at 100 ms: the stall taken for the carrier's delay)


class TestBargeIn:
    @pytest.mark.parametrize(
        "signal",
        [
            OverlapDecision("barge_in", "server_vad_speech_started", 0),
            ResponseDone("resp-1", "cancelled", "turn_detected", 0),
            OutputAudioCleared("resp-1"),
        ],
    )
    def test_engine_signal_clears_acks_and_truncates(self, signal: object) -> None:
        h = Harness(lead_ms=200).live()
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(500)
        sent_before = len(h.media_frames())
        h.engine(signal)
        assert h.sent[-1] == {"event": "clear", "streamSid": SID}
        ack = h.of(AckPlayback)[-1]
        assert ack.response_id == "resp-1" and abs(ack.played_ms - 500) <= 20
        assert h.of(TruncateItem) == [TruncateItem("item_resp-1", ack.played_ms)]
        h.engine(AudioDelta(agent_audio(500), 24000, "resp-1", "item_resp-1", 0))  # late audio
        h.engine(ResponseDone("resp-1", "cancelled", "turn_detected", 0))  # the second signal
        h.advance(1000)
        assert len(h.media_frames()) == sent_before
        assert len(h.events("clear")) == 1 and len(h.of(TruncateItem)) == 1
        assert h.call.speech.late_deltas_dropped == 1

    def test_a_barge_in_comes_out_in_the_order_it_happened(self) -> None:
        """One queue, in the order produced: the carrier's clear, the flush reported done (the driver times the
        barge-in there), the engine told what was heard, the truncation, then the application's note of it."""
        h = Harness(lead_ms=200).live()
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(500)
        start = len(h.outputs)
        h.engine(OverlapDecision("barge_in", "server_vad_speech_started", 0))
        kinds = [type(o.command) if isinstance(o, ToEngine) else type(o) for o in h.outputs[start:]]
        assert kinds == [ToCarrier, BargeInFlushed, AckPlayback, TruncateItem, Observed]
        assert h.outputs[-1] == Observed("barge-in", h.of(TruncateItem)[0].audio_end_ms, 2000, "resp-1", "engine")
        assert h.outputs[start] == ToCarrier(orjson.dumps({"event": "clear", "streamSid": SID}).decode())

    def test_a_barge_in_after_the_bridge_paused_the_reply_is_the_bridges(self) -> None:
        """Bridge mode (#41): paused (the carrier cleared at once, the engine told what was heard), then confirmed —
        the engine's cancel gives the held reply up, truncates it where the pause found it, and says who decided."""
        h = Harness(lead_ms=200).live()
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(500)
        assert h.call.speech.pause(h.now_ms)
        h.drain()
        assert h.sent[-1] == {"event": "clear", "streamSid": SID}
        h.advance(300)  # held: nothing more goes out
        sent = len(h.media_frames())
        h.engine(ResponseDone("resp-1", "cancelled", "barge_in", 0))
        h.advance(1000)
        assert len(h.media_frames()) == sent and len(h.events("clear")) == 1
        assert h.of(TruncateItem) == [TruncateItem("item_resp-1", h.of(TruncateItem)[0].audio_end_ms)]
        assert abs(h.of(TruncateItem)[0].audio_end_ms - 500) <= 20  # where the pause found it, not at the confirmation
        barge_in = [o for o in h.outputs if isinstance(o, Observed) and o.kind == "barge-in"]
        assert [o.detail for o in barge_in] == ["bridge"]

    def test_barge_in_before_anything_played_truncates_nothing(self) -> None:
        h = Harness().live()
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(OverlapDecision("barge_in", None, 0))
        assert h.of(TruncateItem) == [] and h.events("clear") == []

    def test_older_epoch_audio_is_dropped(self) -> None:
        h = Harness().live()
        h.engine(ResponseCreated("resp-2", 3))
        h.engine(AudioDelta(agent_audio(100), 24000, "resp-1", "item_resp-1", 2))
        assert h.events("media") == [] and h.call.speech.late_deltas_dropped == 1

    def test_the_next_response_plays_after_a_barge_in(self) -> None:
        h = Harness(lead_ms=200).live()
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(300)
        h.engine(ResponseDone("resp-1", "cancelled", "barge_in", 0))
        before = len(h.media_frames())
        h.engine(AudioDelta(agent_audio(100), 24000, "resp-2", "item_resp-2", 1))
        assert len(h.media_frames()) > before


class TestEnding:
    def test_stop_closes_the_engine_session_without_hanging_up(self) -> None:
        h = Harness().live()
        h.receive(f'{{"event":"stop","streamSid":"{SID}"}}')
        assert h.call.state is CallState.ENDED and h.call.phase.reason == "caller_hung_up"
        assert h.of(CloseSession) == [CloseSession("call_ended")]
        assert h.call.link.closed and h.call.link.hangup is None

    def test_the_agent_ending_the_session_hangs_up_at_once(self) -> None:
        h = Harness().live()
        h.engine(SessionClosed("duplex-1", "agent_ended_the_call"))
        assert h.call.state is CallState.ENDED and h.call.phase.engine_failure is None
        assert h.call.link.hangup == HangUp("engine_SessionClosed:agent_ended_the_call") and h.call.link.closed

    def test_a_tone_not_a_whole_number_of_frames_plays_whole_its_last_frame_padded(self) -> None:
        h = Harness(failure_tone_ms=610).live()
        media_before = len(h.media_frames())
        h.engine(SessionExpired("duplex-1", "disconnect_grace_expired"))
        h.advance(2000)
        tone = h.media_frames()[media_before:]
        assert len(tone) == 31 and h.call.state is CallState.ENDED  # 610 ms: 30 frames and a padded 31st

    def test_an_engine_failure_plays_the_fallback_tone_then_hangs_up(self) -> None:
        h = Harness(failure_tone_ms=600).live()
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(100)
        commands_before, media_before = len(h.commands), len(h.media_frames())
        h.engine(SessionExpired("duplex-1", "disconnect_grace_expired"))
        assert h.call.state is CallState.ENDING and h.call.link.hangup is None and not h.call.link.closed
        assert h.events("clear")  # the agent's stale audio is dropped at the carrier first
        h.receive(f'{{"event":"dtmf","streamSid":"{SID}","dtmf":{{"digit":"5"}}}}')
        h.receive(media(caller_frame(), timestamp="120"))
        h.advance(2000)
        tone = h.media_frames()[media_before:]
        assert len(tone) == 30  # 600 ms of 20 ms frames, paced out
        heard = np.frombuffer(ulaw_to_pcm16(tone[5]), dtype="<i2")
        assert np.abs(heard).max() > 2000  # a tone, not silence
        assert len(h.commands) == commands_before  # nothing more for an engine that is gone
        assert h.call.state is CallState.ENDED and h.call.link.closed
        assert h.call.link.hangup == HangUp("engine_SessionExpired:disconnect_grace_expired")
        assert h.call.phase.engine_failure == "engine_SessionExpired:disconnect_grace_expired"

    def test_no_engine_for_the_stream_plays_the_fallback_tone_then_hangs_up(self) -> None:
        h = Harness()
        h.receive(CONNECTED)
        h.receive(START)
        h.receive(media(caller_frame(), 0))  # buffered for an engine that never comes
        h.call.no_engine(EndCause.of("engine_unavailable:connection_failed"), h.now_ms)
        assert h.call.state is CallState.ENDING and h.commands == []
        h.advance(2000)
        assert 500 <= len(h.media_frames()) * 20 <= 700  # the 600 ms tone
        assert h.call.state is CallState.ENDED and h.call.link.hangup == HangUp("engine_unavailable:connection_failed")
        assert h.call.phase.engine_failure is None  # a refused stream, counted as such (not an engine failure mid-call)

    def test_without_a_fallback_tone_an_engine_failure_hangs_up_at_once(self) -> None:
        h = Harness(failure_tone_ms=0).live()
        h.engine(SessionClosed("duplex-1", "connection_failed"))
        h.advance(0)
        assert h.call.state is CallState.ENDED and h.call.link.hangup == HangUp("engine_SessionClosed:connection_failed")

    def test_the_caller_hanging_up_during_the_fallback_ends_it(self) -> None:
        h = Harness().live()
        h.engine(SessionClosed("duplex-1", "connection_failed"))
        h.advance(100)
        h.receive(f'{{"event":"stop","streamSid":"{SID}"}}')
        assert h.call.state is CallState.ENDED and h.call.link.hangup is None and h.of(CloseSession) == []

    def test_replaced_session_closes_this_stream_only(self) -> None:
        """A newer stream took the session over (this one was taken for dead): the call goes on there, so this
        stream ends without a hang-up, a close, a detach, or saying the call is over."""
        h = Harness().live()
        h.engine(SessionReplaced("duplex-1"))
        assert h.call.link.closed and h.call.link.hangup is None and h.of(CloseSession) == []
        facts = h.call.facts()
        assert h.call.finished and not facts.call_over and not facts.detach and facts.end_reason == "session_replaced"

    def test_socket_drop_detaches(self) -> None:
        h = Harness().live()
        h.call.transport_lost(100)
        assert h.call.state is CallState.DETACHED and h.call.phase.detach and h.of(CloseSession) == []
        h.call.transport_lost(120)  # idempotent
        assert h.call.state is CallState.DETACHED

    def test_socket_drop_mid_reply_tells_the_engine_what_was_heard(self) -> None:
        """The reply is still being generated: the engine is told what was heard (an ack), not cut there (no
        truncation): the next stream plays the rest of it."""
        h = Harness(lead_ms=200).live()
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(700)
        h.call.transport_lost(h.now_ms)
        h.drain()
        ack = h.of(AckPlayback)[-1]
        assert abs(ack.played_ms - 700) <= 20 and h.of(TruncateItem) == []
        assert not any(isinstance(o, ToCarrier) for o in h.call.outputs())  # no clear: the socket is gone
        assert h.call.facts().heard_ms == (("resp-1", ack.played_ms),)  # for the next stream, through the ticket

    def test_a_shut_down_mid_reply_tells_the_engine_what_was_heard_plays_the_tone_then_hangs_up(self) -> None:
        """A lone process's drain ran out with the call up: not a silent drop — the model's turn is cut to what
        was heard, its session closed, and the caller hears the closing tone before the carrier's hang-up."""
        h = Harness(lead_ms=200).live()
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(700)
        sent_before = len(h.media_frames())
        h.call.shut_down(h.now_ms)
        h.drain()
        (truncate,) = h.of(TruncateItem)
        assert abs(truncate.audio_end_ms - 700) <= 20 and h.of(CloseSession) == [CloseSession("bridge_shutdown")]
        assert h.events("clear") and h.call.speech.flushes == 0  # cleared, not counted as a barge-in
        assert not any(isinstance(o, HangUpCall) for o in h.outputs)
        h.advance(1000)  # the tone plays out
        tone_frames = len(h.media_frames()) - sent_before
        assert 600 // 20 <= tone_frames <= 600 // 20 + 1
        assert [o.reason for o in h.outputs if isinstance(o, HangUpCall)] == ["bridge_shutdown"]
        assert h.call.state is CallState.ENDED and h.call.report().facts.call_over
        assert h.call.report().engine_failure is None  # not the engine's failure

    def dropped_mid_reply(self) -> tuple[Harness, int]:
        """A complete 2 s reply, 700 ms of it heard, then the socket drops; what the first stream's ack said."""
        h = Harness(lead_ms=200).live()
        h.engine(AudioDelta(agent_audio(2000), 24000, "resp-1", "item_resp-1", 0))
        h.engine(ResponseDone("resp-1", "completed", None, 0))  # nothing more of it will come
        h.advance(700)
        h.call.transport_lost(h.now_ms)
        h.drain()
        return h, h.of(AckPlayback)[-1].played_ms

    def test_socket_drop_while_a_reply_plays_keeps_its_rest_for_the_next_stream(self) -> None:
        """What the carrier held unplayed and what was still queued here is the rest of the reply: the ticket
        carries it (as the carrier's own frames), so the next stream plays it from where the caller stopped. The
        model is told what was heard, and its turn is not cut (the rest is still to be heard)."""
        h, acked = self.dropped_mid_reply()
        assert abs(acked - 700) <= 20 and h.of(TruncateItem) == []
        heard = dict(h.call.facts().heard_ms)["resp-1"]
        assert heard % 20 == 0 and acked - 20 < heard <= acked  # from the frame the caller was in
        unheard = h.call.facts().unheard
        assert unheard is not None and unheard.response_id == "resp-1" and unheard.ended
        assert (unheard.encoding, unheard.rate_hz, unheard.frame_ms) == ("pcmu", 8000, 20)
        assert 0 <= len(base64.b64decode(unheard.audio)) // 8 - (2000 - heard) <= 20  # μ-law: 8 bytes a ms; a padded tail
        assert unheard.generated_ms == 2000 - heard  # what the model generated of it: never acked past that

    def test_the_next_stream_plays_the_rest_of_a_reply_from_where_the_caller_stopped(self) -> None:
        first, _ = self.dropped_mid_reply()
        cut, unheard = first.call.facts().heard_ms, first.call.facts().unheard
        heard = dict(cut)["resp-1"]
        h = Harness(lead_ms=200)
        h.receive(CONNECTED)
        h.receive(START)
        h.call.engine_bound(EngineBinding(CAPS, heard_ms=cut, unheard=unheard), h.now_ms)
        h.drain()
        h.advance(2000)
        assert unheard is not None and len(h.media_frames()) * 160 == len(base64.b64decode(unheard.audio))
        for mark in h.events("mark"):
            h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"{mark_name(mark)}"}}}}')
        acks = [a.played_ms for a in h.of(AckPlayback)]
        assert acks == sorted(acks) and acks[0] > heard and acks[-1] == 2000, acks  # on from what was heard, to its end
        assert h.of(TruncateItem) == []

    def test_a_next_stream_that_cannot_play_the_rest_cuts_the_models_turn_to_what_was_heard(self) -> None:
        first, _ = self.dropped_mid_reply()
        cut, unheard = first.call.facts().heard_ms, first.call.facts().unheard
        assert unheard is not None
        h = Harness(lead_ms=200)
        h.receive(CONNECTED)
        h.receive(START)
        h.call.engine_bound(EngineBinding(CAPS, heard_ms=cut, unheard=replace(unheard, encoding="pcma")), h.now_ms)
        h.drain()
        assert h.of(TruncateItem) == [TruncateItem("item_resp-1", dict(cut)["resp-1"])] and h.events("media") == []

    def test_the_next_stream_plays_the_rest_of_a_cut_reply_and_counts_it_on_from_what_was_heard(self) -> None:
        """The engine goes on sending the cut reply after the resume. Its audio here is counted after the 700 ms
        the caller heard before the drop: counted from 0, it would be acked 100, 200… — less than was heard."""
        h = Harness(lead_ms=200).live(heard_ms=(("resp-1", 700),))
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(400)
        assert len(h.media_frames()) == 30  # played: 400 ms, and the lead
        h.engine(OverlapDecision("barge_in", "server_vad_speech_started", 0))  # the caller talks over it
        (truncate,) = h.of(TruncateItem)
        assert 1080 <= truncate.audio_end_ms <= 1120, truncate  # 700 before the drop + 400 here
        assert [a.played_ms for a in h.of(AckPlayback)] == [truncate.audio_end_ms]
        h.call.transport_lost(h.now_ms)
        assert dict(h.call.facts().heard_ms)["resp-1"] == 700  # barged in: the ticket keeps what was heard before

    def test_socket_drop_before_start(self) -> None:
        h = Harness()
        h.call.transport_lost(0)
        assert h.call.state is CallState.ENDED and not h.call.phase.detach

    def test_refused_start(self) -> None:
        h = Harness()
        h.receive(START)
        h.call.start_refused(EndCause.of("bad_token"))
        assert h.call.state is CallState.ENDED and h.call.link.closed and h.commands == []

    def test_resumed_stream_continues_the_call_timeline(self) -> None:
        call = CallSession(TwilioCodec(), CallOptions())
        call.receive_message(START, 0)
        call.engine_bound(EngineBinding(CAPS, call_offset_ms=61_000), 0)
        call.receive_message(media(caller_frame(), timestamp="0"), 0)
        assert call.caller.input_ms == 61_020


class TestBadInput:
    @pytest.mark.parametrize(
        ("message", "reason"),
        [
            ("{not json", ProtocolErrorReason.NOT_JSON),
            (b"\x00binary", ProtocolErrorReason.BINARY_FRAME),
            (media(sid="MZwrong"), ProtocolErrorReason.WRONG_STREAM),
            (media().replace('"payload":"', '"payload":"%%'), ProtocolErrorReason.BAD_BASE64),
            ("x" * 300_000, ProtocolErrorReason.OVERSIZED),
            ('{"event":42}', ProtocolErrorReason.BAD_FIELD),
        ],
    )
    def test_ends_the_call_cleanly(self, message: str | bytes, reason: ProtocolErrorReason) -> None:
        h = Harness().live()
        h.receive(message)
        assert h.call.state is CallState.ENDED and h.call.phase.failure is not None and h.call.phase.failure.reason is reason
        assert h.of(CloseSession) == [CloseSession("carrier_protocol_error")]
        assert h.call.link.hangup == HangUp(f"protocol_error:{reason.value}") and h.call.link.closed
        h.receive(media())  # ignored from now on
        assert len(h.of(CloseSession)) == 1

    def test_an_event_type_added_since_changes_nothing(self) -> None:
        h = Harness().live()
        h.receive('{"event":"transcription","streamSid":"' + SID + '","text":"hi"}')
        assert h.call.state is CallState.LIVE and h.outputs[-1] == Notice(UnknownCarrierEvent("transcription"))
        h.receive(media())
        assert h.of(AppendAudio)

    def test_media_before_start(self) -> None:
        h = Harness()
        h.receive(media())
        assert h.call.phase.failure is not None and h.call.phase.failure.reason is ProtocolErrorReason.OUT_OF_ORDER
        assert h.call.link.hangup is None  # nothing was bridged: nothing to hang up

    def test_a_flood_faster_than_real_time(self) -> None:
        h = Harness().live()
        for i in range(700):  # 14 s of audio at once
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
            if h.call.state is CallState.ENDED:
                break
        assert h.call.phase.failure is not None and h.call.phase.failure.reason is ProtocolErrorReason.FLOOD

    def test_a_timestamp_clock_eight_times_fast_does_not_end_a_real_time_call(self) -> None:
        """#40: a sender that writes RTP sample units as ``media.timestamp`` (8 kHz: 160 a frame, not 20) sends its
        audio at exactly real time. Before, each frame's 140 ms "gap" was filled with silence and counted: a flood
        after 1.5 s. Now its timestamps are followed until they run ``TIMESTAMPS_AHEAD_MS`` ahead of the wall clock,
        then not (one ``ClockDistrusted``), and a flood is judged on the audio received."""
        h = Harness().live()
        for i in range(500):  # 10 s at real time
            h.receive(media(caller_frame(i), timestamp=str(160 * i)))
            h.now_ms += 20
        assert h.call.state is CallState.LIVE and h.call.phase.failure is None
        (distrusted,) = [o for o in h.outputs if isinstance(o, ClockDistrusted)]
        inbound = h.call.caller.inbound
        assert inbound.received_ms == 10_000 and inbound.stream_media_ms < 10_000 + TIMESTAMPS_AHEAD_MS, inbound.stream_media_ms
        assert h.call.caller.input_ms == inbound.stream_media_ms  # the engine's timeline: the audio, and a bounded fill

    def test_a_gap_a_carrier_clock_explains_is_still_filled_after_a_stall_of_ours(self) -> None:
        """Timestamps behind the wall clock (we read late) are the carrier's: followed, gaps filled."""
        h = Harness().live()
        h.receive(media(caller_frame(0), timestamp="0"))
        h.now_ms = 5000
        h.receive(media(caller_frame(1), timestamp="300"))  # 280 ms lost on the way, read 5 s late
        assert h.call.caller.input_ms == 320 and not [o for o in h.outputs if isinstance(o, ClockDistrusted)]

    def test_a_backlog_after_a_stall_is_not_a_flood(self) -> None:
        h = Harness().live()
        h.now_ms = 5000  # the server was stalled for 5 s: Twilio's frames waited in the socket
        for i in range(250):
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
        assert h.call.state is CallState.LIVE and h.call.phase.failure is None

    def test_a_backlog_after_a_stall_longer_than_the_burst_is_not_a_flood(self) -> None:
        """31 s stopped (past the idle limit, and more messages than the burst of 1000): the late tick puts the
        idle limit off, then the 1,550 frames and 31 mark echoes that waited in the socket are read at once."""
        h = Harness().live()
        h.receive(media(caller_frame(0), timestamp="0"))
        h.now_ms = 31_000
        h.call.tick(h.now_ms)
        h.drain()
        for i in range(1, 1551):
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
            if i % 50 == 0:
                h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"x"}}}}')
        assert h.call.state is CallState.LIVE and h.call.phase.failure is None

    def test_what_a_stall_earns_is_bounded_by_its_length(self) -> None:
        """After that backlog a flood still ends the call, once the stall's 150 messages a second are spent."""
        h = Harness().live()
        h.receive(media(caller_frame(0), timestamp="0"))
        h.now_ms = 31_000
        for i in range(1, 1551):
            h.receive(media(caller_frame(i), timestamp=str(20 * i)))
        assert h.call.state is CallState.LIVE
        for sent in range(31 * 150):
            h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"x"}}}}')
            if h.call.state is CallState.ENDED:
                break
        assert h.call.phase.failure is not None and h.call.phase.failure.reason is ProtocolErrorReason.FLOOD
        assert sent == 31 * 150 - 1550  # every message of 31 s at 150 a second, and not one more

    def test_a_carrier_quiet_under_the_idle_limit_earns_no_bigger_burst_than_its_quiet(self) -> None:
        h = Harness().live()
        h.now_ms = 9_000  # 1,350 messages earned
        for sent in range(2000):
            h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"x"}}}}')
            if h.call.state is CallState.ENDED:
                break
        assert h.call.phase.failure is not None and h.call.phase.failure.reason is ProtocolErrorReason.FLOOD
        assert sent == 1350

    def test_a_stream_not_yet_started_earns_no_more_than_the_burst(self) -> None:
        h = Harness()
        h.receive(CONNECTED)
        h.now_ms = 9_000  # within the first message limit: 1,350 earned, 1,000 held
        for sent in range(1100):
            h.receive(CONNECTED)
            if h.call.state is CallState.ENDED:
                break
        assert h.call.phase.failure is not None and h.call.phase.failure.reason is ProtocolErrorReason.FLOOD
        assert sent == 1000  # the burst, and not one more

    def test_a_flood_of_small_messages(self) -> None:
        h = Harness().live()
        for _ in range(1100):
            h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"x"}}}}')
        assert h.call.phase.failure is not None and h.call.phase.failure.reason is ProtocolErrorReason.FLOOD


class TestLimits:
    """The limits no message enforces, as deadlines of ``tick`` under the fake clock, with the shipped defaults."""

    def connected(self) -> Harness:
        h = Harness()
        h.call.connected(h.now_ms)
        return h

    def test_a_connection_that_never_starts_is_ended_after_the_first_message_timeout(self) -> None:
        h = self.connected()
        h.receive(CONNECTED)  # Twilio's first message, but no ``start``
        assert h.call.next_deadline_ms() == 10_000
        h.advance(9_999)
        assert h.call.state is CallState.AWAITING_START
        h.advance(1)
        assert h.call.state is CallState.ENDED and h.call.link.closed and h.call.phase.reason == "first_message_timeout"
        assert h.call.phase.limit_reached == "first_message_timeout" and h.call.link.hangup is None  # nothing was bridged

    def test_a_started_stream_gone_quiet_is_taken_for_dropped(self) -> None:
        h = self.connected()
        h.live()
        h.advance(3_000)
        h.receive(media(caller_frame(), 0))  # the carrier's last message, at 3 s
        h.advance(9_999)
        assert h.call.state is CallState.LIVE  # each message moves the limit: 10 s after the last one
        h.advance(1)
        assert h.call.state is CallState.DETACHED and h.call.phase.detach and h.call.link.closed
        assert h.call.phase.reason == h.call.phase.limit_reached == "idle_timeout" and h.call.link.hangup is None
        assert h.of(CloseSession) == []  # the session waits for the carrier's next stream

    def test_a_stall_of_this_process_is_not_taken_for_the_carriers_silence(self) -> None:
        """The process does not run for 12 s (SIGSTOP, a frozen VM) while the carrier goes on sending: after it the
        pacer's tick comes first, its deadline 12 s past, the carrier's messages still unread. The stream goes on
        (the idle limit is the carrier's silence, not this process's); the messages then read are the call's."""
        h = self.connected()
        h.live()
        h.advance(3_000)
        h.receive(media(caller_frame(), 0))  # the last message read before the stall, at 3 s
        asked = h.call.next_deadline_ms()
        assert asked is not None
        h.now_ms = 15_000  # the process runs again: the tick first
        h.call.tick(h.now_ms)
        h.drain()
        assert h.call.state is CallState.LIVE and h.call.phase.limit_reached is None
        for i in range(1, 4):  # then the reader: the carrier's backlog
            h.receive(media(caller_frame(i), i * 20))
        assert h.call.state is CallState.LIVE
        h.advance(9_999)  # and the limit is the carrier's again: 10 s after its last message
        assert h.call.state is CallState.LIVE
        h.advance(1)
        assert h.call.state is CallState.DETACHED and h.call.phase.limit_reached == "idle_timeout"

    def test_a_carrier_silent_through_a_stall_still_reaches_its_limit_once_the_reader_had_its_turn(self) -> None:
        h = self.connected()
        h.live()
        h.receive(media(caller_frame(), 0))
        h.advance(9_900)
        h.now_ms = 12_900  # stalled from 9.9 s; the tick of the 10 s deadline comes 2.9 s late
        h.call.tick(h.now_ms)
        h.drain()
        assert h.call.state is CallState.LIVE  # what came during the stall is not read yet
        assert h.call.next_deadline_ms() == 12_900 + PROCESS_STALL_MS
        h.advance(PROCESS_STALL_MS)  # nothing was: the carrier's silence, judged as ever
        assert h.call.state is CallState.DETACHED and h.call.phase.limit_reached == "idle_timeout"

    def test_a_process_late_on_every_tick_puts_the_verdict_off_once_only(self) -> None:
        """Late again on the put-off verdict, with nothing read between: the reader had its turn, the limit holds."""
        h = self.connected()
        h.live()
        h.receive(media(caller_frame(), 0))
        for now_ms in (12_000, 12_000 + PROCESS_STALL_MS + 600):
            h.now_ms = now_ms
            h.call.tick(now_ms)
            h.drain()
        assert h.call.state is CallState.DETACHED and h.call.phase.limit_reached == "idle_timeout"

    def test_a_stall_before_the_start_does_not_use_up_the_first_message_timeout(self) -> None:
        h = self.connected()
        h.receive(CONNECTED)
        h.advance(2_000)
        h.now_ms = 14_000  # stalled from 2 s to 14 s: the 10 s deadline's tick 4 s late
        h.call.tick(h.now_ms)
        h.drain()
        assert h.call.state is CallState.AWAITING_START
        h.receive(START)  # the carrier's start, read now
        h.advance(PROCESS_STALL_MS)
        assert h.call.start_request is not None and h.call.state is CallState.STARTING and h.call.phase.limit_reached is None

    def test_the_limit_check_does_not_move_with_every_message(self) -> None:
        h = self.connected()
        h.live()
        due = h.call.next_deadline_ms()
        for i in range(100):
            h.now_ms += 20
            h.receive(media(caller_frame(i), i * 20))
            assert h.call.next_deadline_ms() == due  # one wake-up per limit, not a new deadline per frame

    def test_a_call_past_the_longest_duration_is_hung_up(self) -> None:
        h = Harness(max_call_ms=60_000)
        h.call.connected(0)
        h.live()
        for second in range(1, 61):  # media keeps coming: the idle limit never fires
            h.advance(1_000)
            h.receive(media(caller_frame(second), second * 1000))
        assert h.call.state is CallState.ENDED and h.call.phase.limit_reached == "max_call_duration"
        assert h.of(CloseSession) == [CloseSession("max_call_duration")] and h.call.link.hangup is not None

    def test_without_connected_no_limit_runs(self) -> None:
        h = Harness().live()
        assert h.call.next_deadline_ms() is None


class TestSendFailed:
    """A send to the carrier failed (its side closed): the call decides what happens next, under the fake clock."""

    def failed(self) -> Harness:
        h = Harness().live()
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(100)
        h.call.send_failed(h.now_ms)
        return h

    def test_nothing_more_is_played_and_engine_events_are_left_for_the_next_stream(self) -> None:
        h = self.failed()
        sent = len(h.sent)
        h.advance(500)
        assert len(h.sent) == sent and not h.call.takes_engine_events

    def test_a_stop_read_meanwhile_is_the_callers_hang_up(self) -> None:
        h = self.failed()
        h.advance(400)
        h.receive(f'{{"event":"stop","streamSid":"{SID}"}}')
        assert h.call.state is CallState.ENDED and h.call.phase.reason == "caller_hung_up" and not h.call.phase.detach

    def test_without_a_stop_the_stream_is_taken_for_dropped_after_a_second(self) -> None:
        h = self.failed()
        failed_at = h.now_ms
        assert h.call.next_deadline_ms() == failed_at + 1000
        h.advance(999)
        assert h.call.state is CallState.LIVE
        h.advance(1)
        assert h.call.state is CallState.DETACHED and h.call.phase.detach and h.call.link.closed
        assert h.call.close_code == 1000 and h.call.next_deadline_ms() is None

    def test_close_codes(self) -> None:
        refused = Harness()
        refused.receive(START)
        refused.call.start_refused(EndCause.of("bad_token"))
        assert refused.call.close_code == 1008
        broken = Harness().live()
        broken.receive("{not json")
        assert broken.call.link.closed and broken.call.close_code == 1008


class TestTakingOver:
    """A stream that took the call over from a dead process: the engine's replay after the live ticket comes first,
    and may hold a barge-in the dead stream lived through and what that stream told the engine of it."""

    def taken_over(self) -> Harness:
        """The ticket (written before a barge-in whose own write timed out): 500 ms of resp-1 heard, 400 told. The
        replay: the rest of resp-1, then the caller's barge-in."""
        h = Harness(lead_ms=200).live(heard_ms=(("resp-1", 500),), told_ms=(("resp-1", 400),), taken_over=True)
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        h.engine(OverlapDecision("barge_in", "server_vad_speech_started", 0))
        return h

    def test_it_tells_nothing_the_dead_stream_told_more_of(self) -> None:
        h = self.taken_over()
        h.engine(PlaybackAcknowledged("resp-1", 1220))  # the dead stream's tells, replayed
        h.engine(ItemTruncated("item_resp-1", 1220))
        h.advance(TAKEOVER_TELLS_HELD_MS + 1000)
        assert h.of(AckPlayback) == [] and h.of(TruncateItem) == []
        assert dict(h.call.told_so_far)["resp-1"] == 1220  # for the next stream's ticket

    def test_what_the_replay_does_not_hold_it_tells_once_the_replay_is_in(self) -> None:
        h = self.taken_over()  # the dead process died before its tells went out
        h.advance(TAKEOVER_TELLS_HELD_MS - 1)
        assert h.of(AckPlayback) == [] and h.of(TruncateItem) == []
        h.advance(1)
        assert h.of(TruncateItem) == [TruncateItem("item_resp-1", 500)]  # what the ticket knew was heard

    def test_an_ack_the_replay_tells_more_of_is_not_sent(self) -> None:
        h = self.taken_over()
        h.engine(PlaybackAcknowledged("resp-1", 1220))  # acked, but not truncated (it died in between)
        h.advance(TAKEOVER_TELLS_HELD_MS)
        assert h.of(AckPlayback) == [] and h.of(TruncateItem) == [TruncateItem("item_resp-1", 1220)]

    def test_a_stream_that_ends_before_the_replay_is_in_tells_what_it_holds(self) -> None:
        h = self.taken_over()
        h.call.transport_lost(h.now_ms)
        h.drain()
        assert h.of(TruncateItem) == [TruncateItem("item_resp-1", 500)]

    def test_a_stream_resumed_from_a_parked_ticket_tells_at_once(self) -> None:
        h = Harness(lead_ms=200).live(heard_ms=(("resp-1", 500),), told_ms=(("resp-1", 400),))
        h.engine(AudioDelta(agent_audio(1000), 24000, "resp-1", "item_resp-1", 0))
        h.advance(300)
        h.engine(OverlapDecision("barge_in", "server_vad_speech_started", 0))
        truncated = h.of(TruncateItem)
        assert len(truncated) == 1 and truncated[0].audio_end_ms > 500


class TestLeavingTheStream:
    def test_a_superseded_stream_is_a_drop_closed_going_away(self) -> None:
        h = Harness().live()
        h.call.superseded(h.now_ms)
        assert h.call.state is CallState.DETACHED and h.call.phase.detach
        assert h.call.link.closed and h.call.close_code == 1001 and h.of(CloseSession) == []

    def test_a_stream_moves_off_a_draining_process_as_a_drop(self) -> None:
        h = Harness().live()
        assert h.call.move_elsewhere(h.now_ms)
        assert h.call.state is CallState.DETACHED and h.call.phase.detach and h.call.close_code == 1001
        assert not h.call.link.closed  # the driver closes it once the session is parked
        assert not h.call.move_elsewhere(h.now_ms)  # once

    def test_a_carrier_that_does_not_reconnect_stays(self) -> None:
        from callbridge.carriers.exotel.wire import ExotelCodec
        from tests.carriers import test_exotel

        call = CallSession(ExotelCodec(), CallOptions())
        call.receive_message(test_exotel.CONNECTED, 0)
        call.receive_message(test_exotel.START, 0)
        call.engine_bound(EngineBinding(CAPS), 0)
        assert call.state is CallState.LIVE
        assert not call.move_elsewhere(0) and call.state is CallState.LIVE  # closing Exotel's socket ends its call


class TestApplicationSurface:
    """The greeting and the application's tools, on the call core (``CallSession``)."""

    def test_a_new_session_greets_first(self) -> None:
        h = Harness().live(greeting="Greet the caller.")
        assert h.commands[-2:] == [CreateTextItem("Greet the caller."), CreateResponse()]

    def test_a_greeting_that_may_not_be_cut_keeps_the_caller_from_the_engine_until_it_has_played(self) -> None:
        """``greeting_interruptible`` False: vllm-omni cuts any reply its VAD hears speech over, so the caller's
        audio reaches the engine as silence while the greeting is coming and playing; then as it is."""
        loud = b"\x10" * 160  # μ-law, far from silence

        def heard_by_engine(h: Harness) -> bytes:
            h.commands.clear()
            h.now_ms += 20
            h.receive(media(loud, timestamp=str(h.now_ms)))
            return b"".join(c.pcm for c in h.of(AppendAudio))

        h = Harness().live(greeting="Greet the caller.", greeting_interruptible=False)
        assert not any(heard_by_engine(h))  # the greeting asked for, its reply not yet begun
        h.engine(AudioDelta(agent_audio(600), 24000, "resp-1", "item_resp-1", 0))
        h.engine(ResponseDone("resp-1", "completed", None, 0))
        assert not any(heard_by_engine(h))  # playing
        h.advance(700)
        assert any(heard_by_engine(h))  # played: the caller is heard again, for good
        h.engine(AudioDelta(agent_audio(600), 24000, "resp-2", "item_resp-2", 0))
        assert any(heard_by_engine(h))  # a later reply is interruptible as ever
        cut = Harness().live(greeting="Greet the caller.")
        cut.engine(AudioDelta(agent_audio(600), 24000, "resp-1", "item_resp-1", 0))
        assert any(heard_by_engine(cut))  # interruptible (the default): the caller is heard over it

    def test_a_greeting_whose_reply_never_comes_mutes_the_caller_no_longer_than_its_wait(self) -> None:
        h = Harness().live(greeting="Greet the caller.", greeting_interruptible=False)
        h.advance(4980)
        h.receive(media(b"\x10" * 160, timestamp="5000"))
        assert not any(b"".join(c.pcm for c in h.of(AppendAudio)))
        h.commands.clear()
        h.advance(40)
        h.receive(media(b"\x10" * 160, timestamp="5040"))
        assert any(b"".join(c.pcm for c in h.of(AppendAudio)))

    def test_a_tool_of_the_application_is_performed_and_its_result_answered(self) -> None:
        h = Harness().live(application_tools=frozenset({"look_up"}))
        h.engine(FunctionCall("look_up", "call_1", {"order": "A-17"}, '{"order":"A-17"}', "resp-0"))
        (pending,) = h.take_performed()
        assert pending == PendingAction("call_1", ApplicationToolCall("look_up", {"order": "A-17"}))
        h.call.action_finished("call_1", ActionResult.answered("shipped"), h.now_ms)
        h.drain()
        assert h.commands[-2:] == [FunctionCallOutput("call_1", "shipped"), CreateResponse()]  # the agent is silent

    def test_a_result_that_comes_while_the_agent_speaks_is_answered_once_the_engine_was_told_it_was_heard(self) -> None:
        """The engine refuses a response while it counts the last one as playing (``response_already_active``): the
        response for the tool's result is asked for once the final mark's ack is sent, not when the bridge's
        clock says the audio has played."""
        h = Harness(lead_ms=200, mark_every_frames=5).live(application_tools=frozenset({"look_up"}))
        h.engine(FunctionCall("look_up", "call_1", {}, "{}", "resp-0"))
        h.engine(ResponseCreated("resp-1", 0))
        h.engine(AudioDelta(agent_audio(600), 24000, "resp-1", "item_resp-1", 0))  # a filler, say
        h.engine(ResponseDone("resp-1", "completed", None, 0))
        h.call.action_finished("call_1", ActionResult.answered("shipped"), h.now_ms)
        h.drain()
        assert h.commands[-1] == FunctionCallOutput("call_1", "shipped")
        h.advance(900)  # played out by the bridge's clock; Twilio has echoed no mark yet
        assert CreateResponse() not in h.commands
        for message in h.events("mark"):  # the echoes arrive
            h.receive(f'{{"event":"mark","streamSid":"{SID}","mark":{{"name":"{mark_name(message)}"}}}}')
        told = h.of(AckPlayback)[-1]
        assert told.played_ms >= 600 - 20 and h.commands[-1] == CreateResponse()

    def test_with_no_echo_the_result_is_answered_a_second_after_the_playout(self) -> None:
        h = Harness(lead_ms=200, mark_every_frames=5).live(application_tools=frozenset({"look_up"}))
        h.engine(FunctionCall("look_up", "call_1", {}, "{}", "resp-0"))
        h.engine(AudioDelta(agent_audio(600), 24000, "resp-1", "item_resp-1", 0))
        h.engine(ResponseDone("resp-1", "completed", None, 0))
        h.call.action_finished("call_1", ActionResult.answered("shipped"), h.now_ms)
        h.drain()
        h.advance(1500)
        assert CreateResponse() not in h.commands
        h.advance(200)
        assert h.commands[-1] == CreateResponse()

    def test_a_slow_tool_gets_its_filler_once_and_never_over_the_agent(self) -> None:
        h = Harness().live(application_tools=frozenset({"look_up"}), tool_filler="Say one moment.")
        h.engine(FunctionCall("look_up", "call_1", {}, "{}", "resp-0"))
        h.call.tool_slow("call_1", h.now_ms)
        h.call.tool_slow("call_1", h.now_ms)
        h.drain()
        assert h.of(CreateTextItem) == [CreateTextItem("Say one moment.")] and h.of(CreateResponse) == [CreateResponse()]
        h.engine(FunctionCall("look_up", "call_2", {}, "{}", "resp-2"))
        h.engine(AudioDelta(agent_audio(600), 24000, "resp-3", "item_resp-3", 0))  # the agent speaks
        h.call.tool_slow("call_2", h.now_ms)
        h.drain()
        assert h.of(CreateTextItem) == [CreateTextItem("Say one moment.")]

    def test_a_tool_the_call_did_not_declare_is_refused_as_before(self) -> None:
        h = Harness().live(application_tools=frozenset({"look_up"}))
        h.engine(FunctionCall("book", "call_1", {}, "{}", "resp-0"))
        assert h.take_performed() == [] and isinstance(h.commands[-1], FunctionCallOutput)
        assert "unknown_tool" in h.commands[-1].output


class TestCallLimit:
    def test_the_calls_own_limit_ends_it_as_the_servers_does(self) -> None:
        h = Harness()
        h.call.connected(0)  # the limits run from the connection, as the driver's
        h.live(call_ends_at_ms=5000)
        h.advance(4990)
        assert h.call.state is CallState.LIVE
        h.advance(20)
        assert h.call.phase.limit_reached == "assistant_max_duration" and any(isinstance(o, HangUpCall) for o in h.outputs)
        assert CloseSession("assistant_max_duration") in h.commands


class TestSilence:
    """A caller who says nothing (``SilencePolicy``), on the call core's clock."""

    POLICY = SilencePolicy(reprompt_ms=4000, reprompt="Ask if they are there.", hangup_ms=10_000, goodbye="Say goodbye.")

    def test_prompted_once_then_said_goodbye_to_and_hung_up(self) -> None:
        h = Harness().live(silence=self.POLICY)
        h.advance(3990)
        assert h.of(CreateTextItem) == []
        h.advance(20)
        assert h.of(CreateTextItem) == [CreateTextItem("Ask if they are there.")] and h.of(CreateResponse) == [CreateResponse()]
        h.advance(5000)  # still nothing from the caller: no second prompt
        assert len(h.of(CreateTextItem)) == 1
        h.advance(1000)  # 10 s since the call began
        assert h.of(CreateTextItem)[-1] == CreateTextItem("Say goodbye.")
        assert not any(isinstance(o, HangUpCall) for o in h.outputs)  # not before the goodbye has been said
        h.engine(AudioDelta(agent_audio(800), 24000, "resp-9", "item_resp-9", 0))
        h.engine(ResponseDone("resp-9", "completed", None, 0))
        h.advance(2000)
        assert any(isinstance(o, HangUpCall) for o in h.outputs) and h.call.phase.reason == "caller_silent"

    def test_a_goodbye_that_never_comes_still_ends_the_call(self) -> None:
        h = Harness().live(silence=replace(self.POLICY, reprompt_ms=0))
        h.advance(10_000 + 4_990)
        assert not any(isinstance(o, HangUpCall) for o in h.outputs)
        h.advance(20)
        assert any(isinstance(o, HangUpCall) for o in h.outputs)

    def test_the_caller_speaking_starts_the_silence_over(self) -> None:
        h = Harness().live(silence=self.POLICY)
        h.advance(3000)
        h.engine(SpeechStarted(2900))
        h.advance(5000)  # speaking all along: no prompt
        h.engine(SpeechStopped(7900))
        h.advance(3900)
        assert h.of(CreateTextItem) == []
        h.advance(200)
        assert h.of(CreateTextItem) == [CreateTextItem("Ask if they are there.")]

    def test_a_tick_late_after_a_stall_waits_for_what_the_caller_said_meanwhile(self) -> None:
        """The process stopped for 20 s (its first tick comes that late, before the reader): the caller's speech of
        that time is still unread, so the silence is the bridge's — no goodbye on that tick. Once read, the
        silence counts from there."""
        h = Harness().live(silence=self.POLICY)
        h.now_ms = 20_000  # stopped: no tick ran, nothing was read
        h.call.tick(h.now_ms)
        h.drain()
        assert h.of(CreateTextItem) == []
        h.engine(SpeechStarted(19_000))  # the backlog, read now: the caller spoke
        h.engine(SpeechStopped(19_800))
        h.advance(3_900)
        assert h.of(CreateTextItem) == []
        h.advance(200)  # 4 s of silence after what was read
        assert h.of(CreateTextItem) == [CreateTextItem("Ask if they are there.")]

    def test_a_tick_late_after_a_stall_of_a_silent_caller_says_goodbye_soon_after(self) -> None:
        h = Harness().live(silence=replace(self.POLICY, reprompt_ms=0))
        h.now_ms = 20_000
        h.call.tick(h.now_ms)
        h.drain()
        assert h.of(CreateTextItem) == []
        h.advance(PROCESS_STALL_MS)  # the reader had its turn: nothing from the caller
        assert h.of(CreateTextItem) == [CreateTextItem("Say goodbye.")]

    def test_never_over_the_agent(self) -> None:
        h = Harness().live(silence=replace(self.POLICY, hangup_ms=0))
        h.advance(3000)
        h.engine(AudioDelta(agent_audio(3000), 24000, "resp-1", "item_resp-1", 0))
        h.engine(ResponseDone("resp-1", "completed", None, 0))
        h.advance(5000)  # the agent spoke until about 6 s: quiet since then, 4 s not yet
        assert h.of(CreateTextItem) == []
        h.advance(2500)
        assert h.of(CreateTextItem) == [CreateTextItem("Ask if they are there.")]
