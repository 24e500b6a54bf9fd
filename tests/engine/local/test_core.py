"""The embedded engine's session core under a fake clock: turns, responses, barge-in, acks, leases."""

from __future__ import annotations

import pytest

from callbridge.engine.commands import (
    AckPlayback,
    AppendAudio,
    BargeIn,
    CancelResponse,
    ClearOutputAudio,
    CloseSession,
    Commit,
    CreateResponse,
    Heartbeat,
    TruncateItem,
)
from callbridge.engine.errors import EngineError
from callbridge.engine.events import (
    AudioDelta,
    EngineErrorEvent,
    EngineEvent,
    HeartbeatAck,
    InputCommitted,
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
    is_chunk_verdict,
)
from callbridge.engine.local.agents import AGENTS
from callbridge.engine.local.core import (
    LocalEngineOptions,
    LocalSessionCore,
    SessionState,
)
from callbridge.engine.port import SessionConfig, TurnDetection
from tests.engine.audio import LoudnessScorer, chunks, silence, tone

pytestmark = pytest.mark.core


class Harness:
    """One core, a fake clock, and the events it emitted."""

    def __init__(self, agent: str = "echo", turn_detection: TurnDetection | None = TurnDetection(), **options: object) -> None:
        self.now_ms = 0
        opts = LocalEngineOptions(agent=agent, **options)  # type: ignore[arg-type]
        config = SessionConfig(turn_detection=turn_detection)
        self.core = LocalSessionCore("duplex-test", config, AGENTS[agent](), opts, 0, scorer=LoudnessScorer())
        self.events: list[EngineEvent] = list(self.core.events_to_send())

    def drain(self) -> list[EngineEvent]:
        new = self.core.events_to_send()
        self.events += new
        return new

    def send(self, pcm: bytes, chunk_ms: int = 20, *, listen: bool = False) -> list[EngineEvent]:
        """Stream ``pcm`` in real time, ticking the core at every chunk (``listen``: each marked so, #41)."""
        out: list[EngineEvent] = []
        for chunk in chunks(pcm, chunk_ms=chunk_ms):
            self.core.submit(AppendAudio(chunk, 16000, "listen" if listen else None), self.now_ms)
            self.now_ms += chunk_ms
            self.core.tick(self.now_ms)
            out += self.drain()
        return out

    def submit(self, command: object) -> list[EngineEvent]:
        self.core.submit(command, self.now_ms)  # type: ignore[arg-type]
        return self.drain()

    def advance(self, ms: int) -> list[EngineEvent]:
        self.now_ms += ms
        self.core.tick(self.now_ms)
        return self.drain()

    def turn(self, speech_ms: int = 640) -> list[EngineEvent]:
        return self.send(tone(speech_ms) + silence(600))


def of(events: list[EngineEvent], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def spoken(events: list[EngineEvent]) -> list[EngineEvent]:
    """The events of the conversation, without the verdicts on quiet chunks."""
    return [e for e in events if not is_chunk_verdict(e)]


def test_open_announces_the_session() -> None:
    h = Harness()
    (created,) = h.events
    assert isinstance(created, SessionCreated) and created.session_id == "duplex-test"
    assert created.capabilities.supports_barge_in and created.capabilities.supports_session_resume
    assert created.capabilities.supports_playback_ack and created.capabilities.chunk_period_ms == 1000
    assert h.core.lease_generation == 0


class TestTurns:
    def test_echo_turn_end_to_end(self) -> None:
        h = Harness(chunk_ms=200, generation_speed=2.0)
        events = h.send(silence(400) + tone(640) + silence(600))
        kinds = [type(e) for e in spoken(events)]
        assert kinds[:5] == [SpeechStarted, SpeechStopped, InputCommitted, ResponseCreated, AudioDelta]
        start, stop = of(events, SpeechStarted)[0], of(events, SpeechStopped)[0]
        assert start.audio_start_ms == 400 - 300 + 0 or start.audio_start_ms == 384 - 300  # frame-aligned onset
        assert stop.item_id == start.item_id
        created = of(events, ResponseCreated)[0]
        assert created.response_id.startswith("resp-duplex-test-0-") and created.epoch == 0
        events += h.advance(5000)
        audio = of(events, AudioDelta)
        assert all(d.rate_hz == 24000 and d.item_id == f"item_{created.response_id}" for d in audio)
        assert all(len(d.pcm) == 24000 * 2 * 200 // 1000 for d in audio[:-1])
        echoed_ms = sum(len(d.pcm) for d in audio) // 48
        assert abs(echoed_ms - (640 + 300 + 500)) <= 100  # prefix padding + speech + trailing silence
        transcripts = of(events, TranscriptDelta)
        assert len(transcripts) == len(audio) and transcripts[0].delta.startswith("(echo of")
        (done,) = of(events, ResponseDone)
        assert done.status == "completed" and done.response_id == created.response_id

    def test_chunks_are_released_every_chunk_ms_over_speed(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=4.0)
        assert of(h.turn(640), ResponseCreated)
        deadline = h.core.next_deadline_ms()
        assert deadline is not None
        assert of(h.advance(deadline - 1 - h.now_ms), AudioDelta) == []
        assert len(of(h.advance(1), AudioDelta)) == 1
        assert h.core.next_deadline_ms() == deadline + 25  # 100 ms of audio every 25 ms: 4× real time

    def test_commit_mode_without_turn_detection(self) -> None:
        h = Harness(turn_detection=None, generation_speed=float("inf"))
        events = h.send(tone(300))
        assert [type(e) for e in events] == [SpeechStarted]  # the RMS hint, once per item
        events = h.submit(Commit(create_response=True))
        assert [type(e) for e in events][:3] == [SpeechStopped, InputCommitted, ResponseCreated]  # as vllm-omni's commit
        assert sum(len(d.pcm) for d in of(events, AudioDelta)) == 300 * 48

    def test_commit_without_input_is_an_error_event(self) -> None:
        h = Harness(turn_detection=None)
        (error,) = h.submit(Commit())
        assert isinstance(error, EngineErrorEvent) and error.code == "input_audio_buffer_empty"

    def test_response_create_needs_committed_input(self) -> None:
        (error,) = Harness().submit(CreateResponse())
        assert isinstance(error, EngineErrorEvent) and error.code == "response_create_without_input"

    def test_bad_audio_keeps_the_session(self) -> None:
        h = Harness()
        (error,) = h.submit(AppendAudio(b"\x00" * 3, 16000))
        assert isinstance(error, EngineErrorEvent) and error.code == "bad_audio"
        (error,) = h.submit(AppendAudio(b"\x00" * 320, 8000))
        assert isinstance(error, EngineErrorEvent) and "rate changed" in error.message
        assert h.core.state is SessionState.LIVE


class TestVerdictsOnQuietChunks:
    """vllm-omni's runner answers every chunk with no speech in it: ``response.listen`` while no response is in
    progress, ``overlap.decision`` ``drop`` during one; a chunk of an utterance spoken over a reply is heard
    (``listen``). One verdict per chunk, as its runner emits them."""

    def test_quiet_chunks_while_idle_are_listened_to(self) -> None:
        h = Harness()
        events = h.send(silence(100))
        assert events == [ResponseListen("silence_or_noise", 0)] * 5

    def test_quiet_chunks_during_a_reply_are_dropped(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        assert of(h.turn(640), ResponseCreated)
        events = [e for e in h.send(silence(60)) if not isinstance(e, AudioDelta | TranscriptDelta)]
        assert events == [OverlapDecision("drop", "silence_or_noise", 0, 20)] * 3

    def test_a_reply_heard_out_ends_the_drops(self) -> None:
        h = Harness(generation_speed=float("inf"))
        created = of(h.turn(640), ResponseCreated)[0]
        generated_ms = sum(len(d.pcm) for d in of(h.events, AudioDelta)) // 48
        assert of(h.send(silence(20)), OverlapDecision) == [OverlapDecision("drop", "silence_or_noise", 0, 20)]
        h.submit(AckPlayback(created.response_id, generated_ms, f"item_{created.response_id}"))
        assert h.send(silence(20)) == [ResponseListen("silence_or_noise", 0)]

    def test_no_verdict_on_the_chunks_of_an_utterance(self) -> None:
        h = Harness()
        events = h.send(tone(640))
        first_speech = events.index(of(events, SpeechStarted)[0])
        assert not any(is_chunk_verdict(e) for e in events[first_speech:])

    def test_an_utterance_under_way_when_a_reply_starts_is_listened_to_chunk_by_chunk(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        h.turn(640)  # the first turn and its reply, heard out
        h.submit(AckPlayback(of(h.events, ResponseCreated)[0].response_id, 10_000, None))
        assert of(h.send(tone(300)), SpeechStarted)  # the caller is speaking again …
        assert of(h.submit(CreateResponse()), ResponseCreated)  # … when the client asks for a reply
        events = h.send(tone(60))
        heard = [OverlapDecision("listen", "server_vad_utterance_active", h.core.epoch, 20, overlap_ms) for overlap_ms in (20, 40, 60)]
        assert of(events, OverlapDecision) == heard  # the speech over the reply adds up

    def test_in_commit_mode_speech_over_a_reply_is_heard_never_a_barge_in(self) -> None:
        h = Harness(turn_detection=None, chunk_ms=100, generation_speed=1.0)
        h.send(tone(300))
        assert of(h.submit(Commit(create_response=True)), ResponseCreated)
        events = h.send(tone(60) + silence(20))
        heard = [OverlapDecision("listen", "policy_listen_only", 0, 20, overlap_ms, "listen_only") for overlap_ms in (20, 40, 60)]
        assert of(events, OverlapDecision) == [*heard, OverlapDecision("drop", "silence_or_noise", 0, 20, 60, "listen_only")]
        assert of(events, ResponseDone) == []

    def test_an_agent_answering_each_chunk_gives_no_verdicts(self) -> None:
        h = Harness(agent="loopback", turn_detection=None)
        assert not any(is_chunk_verdict(e) for e in h.send(silence(60) + tone(60)))


class TestBargeIn:
    def test_caller_speech_during_generation_cancels_it(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        created = of(h.turn(640), ResponseCreated)[0]
        events = h.send(tone(300))
        decision = of(spoken(events), OverlapDecision)[0]
        assert decision.action == "barge_in" and decision.reason == "server_vad_speech_started" and decision.epoch == 0
        (done,) = of(events, ResponseDone)
        assert done.response_id == created.response_id and done.status == "cancelled" and done.reason == "turn_detected"
        assert of(events, OutputAudioCleared) == []  # mid-generation: only the cancelled response.done
        assert h.core.epoch == 1
        assert of(h.advance(2000), AudioDelta) == []

    def test_caller_speech_during_unacked_playback_clears_it(self) -> None:
        h = Harness(generation_speed=float("inf"))
        created = of(h.turn(640), ResponseCreated)[0]
        events = h.send(tone(300))
        assert of(spoken(events), OverlapDecision)[0].action == "barge_in"
        assert of(events, OutputAudioCleared) == [OutputAudioCleared(created.response_id)]
        assert of(events, ResponseDone) == []

    def test_no_barge_in_once_playback_is_acked(self) -> None:
        h = Harness(generation_speed=float("inf"))
        events = h.turn(640)
        created = of(events, ResponseCreated)[0]
        generated_ms = sum(len(d.pcm) for d in of(events, AudioDelta)) // 48
        h.submit(AckPlayback(created.response_id, generated_ms + 500, f"item_{created.response_id}"))
        events = h.send(tone(300))
        assert of(events, SpeechStarted) and of(events, OverlapDecision) == []

    def test_barge_in_command(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        h.turn(640)
        (done,) = of(h.submit(BargeIn()), ResponseDone)
        assert done.status == "cancelled" and done.reason == "barge_in"
        assert h.core.epoch == 1

    def test_cancel_and_clear(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        (error,) = h.submit(CancelResponse())
        assert isinstance(error, EngineErrorEvent) and error.code == "response_not_active"
        created = of(h.turn(640), ResponseCreated)[0]
        events = h.submit(ClearOutputAudio(created.response_id))
        assert events[0] == OutputAudioCleared(created.response_id)
        assert of(events, ResponseDone)[0].reason == "client_cancelled"

    def test_cancel_starts_the_next_epoch(self) -> None:
        """As vllm-omni 0.30: after ``response.cancel`` the next commit is answered at once, in a new epoch,
        not refused (``response_already_active``) until the cancelled reply's playback is acked."""
        h = Harness(chunk_ms=100, generation_speed=1.0, turn_detection=None)
        h.send(tone(300))
        created = of(h.submit(Commit(create_response=True)), ResponseCreated)[0]
        (done,) = of(h.submit(CancelResponse()), ResponseDone)
        assert done == ResponseDone(created.response_id, "cancelled", "client_cancelled", 0) and h.core.epoch == 1
        h.send(tone(300))
        events = h.submit(Commit(create_response=True))
        assert of(events, EngineErrorEvent) == [] and of(events, ResponseCreated)[0].epoch == 1

    def test_cancel_of_a_generated_reply_still_playing_clears_it(self) -> None:
        h = Harness(generation_speed=float("inf"))
        created = of(h.turn(640), ResponseCreated)[0]
        events = h.submit(CancelResponse())
        assert events == [OutputAudioCleared(created.response_id)] and h.core.epoch == 1


class TestListenOverTheReply:
    """Appends marked ``overlap_action: listen`` (#41's bridge mode), as vllm-omni 0.30 takes them (the exchange
    ``listen_over_the_reply`` in ``tests/engine/test_real_server.py`` holds the two side by side)."""

    def test_speech_marked_listen_never_barges_in_and_the_reply_goes_on(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        created = of(h.turn(640), ResponseCreated)[0]
        events = h.send(tone(400) + silence(700), listen=True)
        decisions = of(events, OverlapDecision)
        assert decisions and {(d.action, d.reason) for d in decisions} == {("listen", "client_overlap_action")}
        assert of(events, SpeechStarted) and of(events, SpeechStopped)[0].audio_end_ms == 20  # heard, then dropped
        assert [e.code for e in of(events, EngineErrorEvent)] == ["input_audio_buffer_empty"]  # nothing kept to commit
        (done,) = of(events + h.advance(3000), ResponseDone)
        assert (done.response_id, done.status, h.core.epoch) == (created.response_id, "completed", 0)  # not cancelled

    def test_the_bridge_then_confirms_and_the_words_resent_make_the_turn(self) -> None:
        h = Harness(chunk_ms=100, generation_speed=1.0)
        h.turn(640)
        h.send(tone(300), listen=True)
        (done,) = of(h.submit(BargeIn()), ResponseDone)
        assert done.status == "cancelled" and h.core.epoch == 1
        events = h.send(tone(640) + silence(600))  # what the caller said from the onset, sent again unmarked
        assert of(events, InputCommitted) and of(events, ResponseCreated)

    def test_outside_a_reply_the_mark_changes_nothing(self) -> None:
        marked, plain = Harness(), Harness()
        assert [type(e) for e in marked.send(tone(640) + silence(600), listen=True)] == [
            type(e) for e in plain.send(tone(640) + silence(600))
        ]


class TestPlayback:
    def response(self, h: Harness) -> tuple[str, int]:
        events = h.turn(640)
        created = of(events, ResponseCreated)[0]
        return created.response_id, sum(len(d.pcm) for d in of(events, AudioDelta)) // 48

    def test_ack_advances_monotonically_and_clamps(self) -> None:
        h = Harness(generation_speed=float("inf"))
        rid, generated = self.response(h)
        assert h.submit(AckPlayback(rid, 400)) == [PlaybackAcknowledged(rid, 400)]
        assert h.submit(AckPlayback(rid, 200)) == [PlaybackAcknowledged(rid, 400)]
        assert h.submit(AckPlayback(rid, 10**6)) == [PlaybackAcknowledged(rid, generated)]

    @pytest.mark.parametrize(
        ("make", "code"),
        [
            (lambda rid: AckPlayback(rid, 100, "item_other"), "playback_item_mismatch"),
            (lambda rid: AckPlayback("resp-unknown", 100), "playback_item_not_found"),
        ],
    )
    def test_ack_errors(self, make, code: str) -> None:  # type: ignore[no-untyped-def]
        h = Harness(generation_speed=float("inf"))
        rid, _ = self.response(h)
        (error,) = h.submit(make(rid))
        assert isinstance(error, EngineErrorEvent) and error.code == code

    def test_ack_after_a_later_commit_is_too_late(self) -> None:
        h = Harness(generation_speed=float("inf"))
        rid, generated = self.response(h)
        h.submit(AckPlayback(rid, generated))
        h.turn(640)  # the caller's next turn is committed
        (error,) = [e for e in h.submit(AckPlayback(rid, generated)) if isinstance(e, EngineErrorEvent)]
        assert error.code == "playback_ack_too_late"

    def test_truncate(self) -> None:
        h = Harness(generation_speed=float("inf"))
        rid, generated = self.response(h)
        assert h.submit(TruncateItem(f"item_{rid}", 700)) == [ItemTruncated(f"item_{rid}", 700)]
        assert h.submit(TruncateItem(f"item_{rid}", 10**6)) == [ItemTruncated(f"item_{rid}", 700)]
        (error,) = h.submit(TruncateItem("item_nope", 1))
        assert isinstance(error, EngineErrorEvent) and error.code == "item_not_found"


class TestLease:
    def test_detach_expires_after_the_grace(self) -> None:
        h = Harness(disconnect_grace_ms=30_000)
        h.core.detach(h.now_ms)
        assert h.core.next_deadline_ms() == 30_000
        assert h.advance(29_999) == []
        assert h.advance(1) == [SessionExpired("duplex-test", "disconnect_grace_expired")]
        assert h.core.state is SessionState.CLOSED
        with pytest.raises(EngineError) as exc:
            h.core.resume(0, h.now_ms)
        assert exc.value.code == "session_resume_expired"

    def test_heartbeat_does_not_cancel_the_grace(self) -> None:
        h = Harness(disconnect_grace_ms=1000)
        h.core.detach(0)
        h.advance(500)
        assert h.submit(Heartbeat()) == [HeartbeatAck()]
        assert h.advance(500) == [SessionExpired("duplex-test", "disconnect_grace_expired")]

    def test_resume_is_compare_and_swap(self) -> None:
        h = Harness()
        h.core.detach(0)
        with pytest.raises(EngineError) as exc:
            h.core.resume(5, 10)
        assert exc.value.code == "session_resume_conflict"
        assert h.core.resume(0, 10) == 1
        assert h.drain() == [SessionResumed("duplex-test", attachment_generation=1)]
        with pytest.raises(EngineError):
            h.core.resume(0, 20)  # the old generation is stale now
        assert h.advance(60_000) == []  # re-attached: no grace running

    def test_idle_ttl(self) -> None:
        h = Harness(idle_ttl_ms=5000)
        h.advance(4000)
        h.submit(Heartbeat())
        assert h.advance(4999) == []
        assert h.advance(1) == [SessionExpired("duplex-test", "idle_ttl_expired")]

    def test_close(self) -> None:
        h = Harness()
        assert h.submit(CloseSession("client_close")) == [SessionClosed("duplex-test", "client_close")]
        with pytest.raises(EngineError) as exc:
            h.core.submit(Heartbeat(), 0)
        assert exc.value.code == "session_closed"
        assert h.core.next_deadline_ms() is None


class TestAgents:
    def test_loopback_returns_each_chunk_at_once(self) -> None:
        h = Harness(agent="loopback", turn_detection=None)
        events = h.submit(AppendAudio(tone(20), 16000))
        assert [type(e) for e in events][:1] == [ResponseCreated]
        events += h.send(tone(200))
        audio = of(events, AudioDelta)
        assert abs(sum(len(d.pcm) for d in audio) // 48 - 220) <= 1  # nothing held back
        assert len({d.response_id for d in audio}) == 1
        assert [type(e) for e in h.submit(AppendAudio(tone(20), 16000))] == [AudioDelta, TranscriptDelta]

    def test_loopback_returns_each_chunk_whole_from_the_first(self) -> None:
        """Each 20 ms in is 20 ms out at once, not 3 samples short (soxr QQ's hold): short, every outbound frame
        completed a chunk late and added 20 ms to every loopback round trip."""
        h = Harness(agent="loopback", turn_detection=None)
        for _ in range(25):
            audio = of(h.submit(AppendAudio(tone(20), 16000)), AudioDelta)
            assert sum(len(d.pcm) for d in audio) == 480 * 2

    def test_loopback_keeps_no_audio_of_a_long_call(self) -> None:
        h = Harness(agent="loopback", turn_detection=None)
        h.send(tone(10_000))
        assert len(h.core._utterance) == 0  # it answered every chunk: a long call must not grow its memory

    def test_without_turn_detection_a_turn_keeps_at_most_a_minute(self) -> None:
        h = Harness(turn_detection=None)
        for _ in range(13):
            h.send(tone(5_000))
        assert 59 * 32_000 <= len(h.core._utterance) <= 60 * 32_000

    def test_tone_greets_then_listens(self) -> None:
        h = Harness(agent="tone", generation_speed=float("inf"))
        kinds = [type(e) for e in h.events]
        assert kinds[:3] == [SessionCreated, ResponseCreated, AudioDelta]
        assert of(h.events, ResponseDone)[0].status == "completed"
        rid = of(h.events, ResponseCreated)[0].response_id
        h.submit(AckPlayback(rid, 10_000))
        assert of(h.turn(640), ResponseCreated) == []


def test_the_turn_facts_follow_the_reply() -> None:
    """The session object's turn fields (``session.resumed`` carries them mid-call, as vllm-omni's does)."""
    h = Harness(chunk_ms=100, generation_speed=1.0)
    assert h.core.turn_facts()["turn_state"] == "idle"
    h.send(tone(200))
    assert h.core.turn_facts()["turn_state"] == "user_speaking"
    h.send(tone(440) + silence(600))
    created = of(h.events, ResponseCreated)[0]
    facts = h.core.turn_facts()
    assert facts["turn_state"] == "assistant_playing" and facts["active_response_id"] == created.response_id
    generated_ms = sum(len(d.pcm) for d in of(h.events, AudioDelta)) // 48
    assert facts["playback"] == {"generated_ms": generated_ms, "sent_ms": generated_ms, "played_ms": 0, "committed_ms": 0}
    h.advance(10_000)
    h.submit(AckPlayback(created.response_id, 100_000, None))
    assert h.core.turn_facts()["turn_state"] == "idle" and h.core.turn_facts()["active_response_id"] is None
