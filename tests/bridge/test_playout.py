"""The playout ledger under a fake clock: lead bound, pacing, markers, flush accounting, heard position."""

from __future__ import annotations

import pytest

from callbridge.bridge.playout import FlushResult, HeardUpdate, PlayoutLedger
from callbridge.carriers.base import SendClear, SendMark, SendMedia

pytestmark = pytest.mark.core

FRAME = b"\xff" * 160


def sent_frames(actions: list[object]) -> int:
    return sum(isinstance(a, SendMedia) for a in actions)


def marks(actions: list[object]) -> list[str]:
    return [a.name for a in actions if isinstance(a, SendMark)]


def fill(ledger: PlayoutLedger, response_id: str, frames: int, now_ms: int = 0) -> list[object]:
    for _ in range(frames):
        ledger.enqueue(response_id, [FRAME], now_ms)
    return list(ledger.actions_to_send())


class TestPacing:
    def test_lead_is_bounded(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        assert sent_frames(fill(ledger, "r", 50)) == 10
        assert ledger.lead_at(0) == 200 and ledger.queued_frames == 40
        for now in range(1, 2000):
            ledger.tick(now)
            assert ledger.lead_at(now) <= 200
        assert ledger.queued_frames == 0 and ledger.frames_sent == 50

    def test_one_frame_per_frame_time_in_steady_state(self) -> None:
        ledger = PlayoutLedger(lead_ms=100)
        fill(ledger, "r", 20)
        deadline = ledger.next_deadline_ms()
        assert deadline == 20  # as soon as one frame has played
        ledger.tick(deadline - 1)
        assert sent_frames(ledger.actions_to_send()) == 0
        ledger.tick(deadline)
        assert sent_frames(ledger.actions_to_send()) == 1
        assert ledger.next_deadline_ms() == 40

    def test_nothing_waiting_means_no_deadline(self) -> None:
        ledger = PlayoutLedger()
        fill(ledger, "r", 3)
        assert ledger.next_deadline_ms() is None


class TestJoinedFrames:
    """``frames_per_message``: audio ahead of real time goes several frames to a message, once the lead has room
    for all of them; audio at real time goes frame by frame; the model (heard, marks' places) is the same."""

    @staticmethod
    def message_frames(actions: list[object]) -> list[int]:
        return [len(a.payload) // len(FRAME) for a in actions if isinstance(a, SendMedia)]

    def test_a_burst_goes_in_full_messages_and_the_lead_swings_by_one_message(self) -> None:
        ledger = PlayoutLedger(lead_ms=200, frames_per_message=5, mark_every_frames=5)
        ledger.enqueue("r", [FRAME] * 50, 0)
        first = ledger.actions_to_send()
        assert self.message_frames(first) == [5, 5] and ledger.lead_at(0) == 200
        assert ledger.next_deadline_ms() == 100  # room for a whole message, not for one frame
        sizes, leads = [], []
        for now in range(1, 2000):
            ledger.tick(now)
            sizes += self.message_frames(ledger.actions_to_send())
            leads.append(ledger.lead_at(now))
        assert sizes == [5] * 8 and ledger.frames_sent == 50
        assert max(leads) <= 200 and min(leads[:900]) >= 100  # while audio waits, never under a message short

    def test_audio_at_real_time_goes_frame_by_frame_at_once(self) -> None:
        ledger = PlayoutLedger(lead_ms=200, frames_per_message=5)
        for i in range(20):
            ledger.enqueue("r", [FRAME], 20 * i)
            assert self.message_frames(ledger.actions_to_send()) == [1]  # sent as it came: nothing held back

    def test_a_marker_follows_the_message_that_reaches_its_place(self) -> None:
        ledger = PlayoutLedger(lead_ms=200, frames_per_message=3, mark_every_frames=5)
        ledger.enqueue("r", [FRAME] * 9, 0)
        ledger.end_response("r", 0)
        actions = ledger.actions_to_send()
        kinds = ["media" if isinstance(a, SendMedia) else a.name for a in actions if isinstance(a, SendMedia | SendMark)]
        assert kinds == ["media", "media", "r@120", "media", "r@180"]  # 6 frames in: past the 5th; then the end

    def test_a_message_holds_one_response(self) -> None:
        ledger = PlayoutLedger(lead_ms=200, frames_per_message=5, uses_marks=False)
        ledger.enqueue("a", [FRAME] * 2, 0)
        ledger.enqueue("b", [FRAME] * 6, 0)
        assert self.message_frames(ledger.actions_to_send()) == [2, 5, 1]

    def test_heard_positions_and_flush_are_those_of_one_frame_a_message(self) -> None:
        single, joined = PlayoutLedger(lead_ms=200), PlayoutLedger(lead_ms=200, frames_per_message=5)
        for ledger in (single, joined):
            ledger.enqueue("r", [FRAME] * 40, 0)
        for now in range(0, 700, 7):
            for ledger in (single, joined):
                ledger.tick(now)
            assert single.heard_ms("r", now) == joined.heard_ms("r", now)
        flushed = [ledger.flush(700) for ledger in (single, joined)]
        assert flushed[0].heard_ms == flushed[1].heard_ms == 700 and all(f.cleared for f in flushed)
        assert single.queued_frames == joined.queued_frames == 0

    def test_more_frames_to_a_message_than_the_lead_holds_is_refused(self) -> None:
        with pytest.raises(ValueError, match="frames_per_message"):
            PlayoutLedger(lead_ms=100, frames_per_message=6)


class TestMarks:
    def test_the_first_marker_comes_early_then_one_every_interval(self) -> None:
        ledger = PlayoutLedger(lead_ms=2000, mark_every_frames=25, first_mark_frames=5)
        ledger.enqueue("r", [FRAME] * 90, 0)
        ledger.end_response("r", 0)
        assert marks(ledger.actions_to_send()) == ["r@100", "r@600", "r@1100", "r@1600", "r@1800"]

    def test_an_unknown_echo_leaves_the_outstanding_markers_alone(self) -> None:
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5)
        fill(ledger, "r", 10)
        ledger.mark_echoed("someone-elses@100", 100)
        assert ledger.heard_updates() == []
        ledger.mark_echoed("r@100", 100)
        ledger.mark_echoed("r@200", 200)
        assert ledger.heard_updates() == [HeardUpdate("r", 100), HeardUpdate("r", 200)]

    def test_without_echoes_on_clear_flushed_markers_are_not_remembered(self) -> None:
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5, marks_echoed_on_clear=False)
        fill(ledger, "r", 10)
        ledger.flush(50)
        assert ledger._flushed_marks == set()
        fill(ledger, "s", 5, now_ms=60)
        ledger.mark_echoed("s@100", 160)
        assert HeardUpdate("s", 100) in ledger.heard_updates()

    def test_marker_every_n_frames_and_after_the_last(self) -> None:
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5)
        actions = fill(ledger, "resp-1", 12)
        ledger.end_response("resp-1", 0)
        actions += ledger.actions_to_send()
        assert marks(actions) == ["resp-1@100", "resp-1@200", "resp-1@240"]
        assert isinstance(actions[5], SendMark)  # right after the fifth frame

    def test_no_extra_final_marker_on_a_boundary(self) -> None:
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5)
        fill(ledger, "r", 10)
        ledger.end_response("r", 0)
        assert marks(ledger.actions_to_send()) == []

    def test_echoes_advance_heard_monotonically(self) -> None:
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5)
        fill(ledger, "r", 15)
        ledger.mark_echoed("r@100", 100)
        ledger.mark_echoed("r@200", 200)
        assert ledger.heard_updates() == [HeardUpdate("r", 100), HeardUpdate("r", 200)]
        ledger.mark_echoed("r@100", 250)  # a stale duplicate changes nothing
        assert ledger.heard_updates() == []

    def test_how_far_the_echoes_moved_the_model_is_kept_a_while(self) -> None:
        """What bridge-mode barge-in widens its echo bound by (``moved_ms``): moves of half a frame or more."""
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5)
        fill(ledger, "r", 40)
        ledger.mark_echoed("r@100", 105)  # 5 ms late: under half a frame
        assert ledger.corrections == 1 and ledger.moved_ms(0) == 0
        ledger.mark_echoed("r@200", 170)  # 35 ms early (the model moved back)
        ledger.mark_echoed("r@300", 282)  # 12 ms late
        assert ledger.moved_ms(0) == 35 and ledger.moved_ms(171) == 12 and ledger.moved_ms(283) == 0

    def test_no_marks_for_carriers_without_them(self) -> None:
        ledger = PlayoutLedger(uses_marks=False, lead_ms=1000)
        actions = fill(ledger, "r", 12)
        ledger.end_response("r", 0)
        assert marks(actions + list(ledger.actions_to_send())) == []


class TestFlush:
    def test_flush_drops_the_queue_and_clears_the_carrier(self) -> None:
        ledger = PlayoutLedger(lead_ms=200, mark_every_frames=5)
        fill(ledger, "r", 50)
        result = ledger.flush(90)
        assert result == FlushResult("r", 90, 200, 40, True)
        assert ledger.actions_to_send() == [SendClear()]
        assert ledger.queued_frames == 0 and ledger.frames_dropped == 40
        assert ledger.heard_updates() == [HeardUpdate("r", 90)]

    def test_heard_position_is_within_a_frame_of_playback(self) -> None:
        for flush_at in (0, 13, 20, 199, 555, 999):
            ledger = PlayoutLedger(lead_ms=200)
            fill(ledger, "r", 100)
            for now in range(flush_at + 1):
                ledger.tick(now)
            assert abs(ledger.flush(flush_at).heard_ms - flush_at) <= 20

    def test_marks_echoed_after_clear_count_as_flushed(self) -> None:
        ledger = PlayoutLedger(lead_ms=400, mark_every_frames=5)
        fill(ledger, "r", 20)
        ledger.mark_echoed("r@100", 100)
        ledger.heard_updates()
        result = ledger.flush(150)
        assert result.heard_ms == 150
        ledger.heard_updates()
        for name in ("r@200", "r@300", "r@400"):  # Twilio echoes every pending mark on clear
            ledger.mark_echoed(name, 151)
        assert ledger.heard_updates() == []

    def test_flush_with_nothing_playing_sends_no_clear(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        fill(ledger, "r", 3)
        result = ledger.flush(1000)
        assert not result.cleared and ledger.actions_to_send() == []
        assert result.heard_ms == 60

    def test_flush_before_any_audio(self) -> None:
        assert PlayoutLedger().flush(5) == FlushResult(None, 0, 0, 0, False)

    def test_audio_after_a_flush_plays_at_once(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        fill(ledger, "r1", 30)
        ledger.flush(100)
        ledger.actions_to_send()
        assert sent_frames(fill(ledger, "r2", 3, now_ms=100)) == 3
        assert ledger.heard_ms("r2", 130) == 30


class TestHeardModel:
    def test_late_echo_shifts_the_model(self) -> None:
        ledger = PlayoutLedger(lead_ms=400, mark_every_frames=5)
        fill(ledger, "r", 20)
        ledger.mark_echoed("r@100", 160)  # the carrier started 60 ms later than we sent
        assert ledger.heard_ms("r", 200) == 140
        assert abs(ledger.flush(260).heard_ms - 200) <= 1

    def test_an_echo_read_late_does_not_stay_in_the_model(self) -> None:
        """The bridge stalled 60 ms before reading one echo; the next echo, read on time, puts the model back."""
        ledger = PlayoutLedger(lead_ms=400, mark_every_frames=5)
        fill(ledger, "r", 20)
        ledger.mark_echoed("r@100", 160)  # played at 100, read at 160
        assert ledger.heard_ms("r", 180) == 120
        ledger.mark_echoed("r@200", 200)  # played at 200, read at once
        assert ledger.heard_ms("r", 250) == 250
        assert ledger.corrections == 2

    def test_an_echo_earlier_than_its_audio_could_play_is_no_lag(self) -> None:
        """A carrier whose clock runs ahead of ours echoes a marker before the audio before it could have played:
        the model moves back, and the lag it reports (``callbridge_mark_lag_seconds``) is 0, never negative."""
        ledger = PlayoutLedger(lead_ms=400, mark_every_frames=5)
        fill(ledger, "r", 20)
        ledger.mark_echoed("r@100", 80)
        ledger.mark_echoed("r@200", 230)
        assert ledger.mark_lags_ms == [0, 30] and ledger.heard_ms("r", 230) == 200  # 230 against 200 sent

    def test_underrun_pauses_the_heard_clock(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        fill(ledger, "r", 5, now_ms=0)  # 100 ms, then the engine is late
        fill(ledger, "r", 5, now_ms=300)  # 200 ms of silence at the carrier in between
        assert ledger.heard_ms("r", 100) == 100
        assert ledger.heard_ms("r", 250) == 100
        assert ledger.heard_ms("r", 350) == 150

    def test_a_stream_that_keeps_underrunning_keeps_a_bounded_model(self) -> None:
        """Loopback audio arrives a little late for every frame: a new run each time, none of them kept long (those
        that ended in the last two seconds, for what the caller heard a moment ago)."""
        ledger = PlayoutLedger(lead_ms=200, uses_marks=False)
        for i in range(2000):
            ledger.enqueue("r", [FRAME], now_ms=21 * i)
            assert len(ledger._segments) <= 2 and len(ledger._played_runs) <= 2000 // 21 + 1
        assert ledger.heard_ms("r", 21 * 1999 + 10) == 1999 * 20 + 10

    def test_heard_of_an_earlier_response_is_its_last_position(self) -> None:
        ledger = PlayoutLedger(lead_ms=1000, mark_every_frames=5)
        fill(ledger, "a", 5)
        ledger.end_response("a", 0)
        ledger.mark_echoed("a@100", 100)
        fill(ledger, "b", 5, now_ms=100)
        assert ledger.heard_ms("a", 500) == 100


class TestWithoutMarkers:
    """Carriers that echo nothing (AudioSocket, RTP): heard positions come from the playback model."""

    def test_heard_is_reported_every_interval_and_at_the_end(self) -> None:
        ledger = PlayoutLedger(lead_ms=40, mark_every_frames=5, uses_marks=False)
        fill(ledger, "r", 12)
        ledger.end_response("r", 0)
        reported: list[HeardUpdate] = []
        now = 0
        while (deadline := ledger.next_deadline_ms()) is not None:
            assert deadline >= now  # never a deadline in the past: the pacer would spin
            now = deadline
            ledger.tick(now)
            ledger.actions_to_send()
            reported += ledger.heard_updates()
        assert reported == [HeardUpdate("r", 100), HeardUpdate("r", 200), HeardUpdate("r", 240)]
        assert now == 240  # the last one when the last frame has played

    def test_a_response_still_coming_waits_for_its_end(self) -> None:
        ledger = PlayoutLedger(lead_ms=40, mark_every_frames=5, uses_marks=False)
        fill(ledger, "r", 3)
        for now in range(0, 200, 5):
            ledger.tick(now)
        assert ledger.heard_updates() == [] and ledger.next_deadline_ms() is None
        ledger.end_response("r", 200)
        assert ledger.heard_updates() == [HeardUpdate("r", 60)]  # it has all played out by now

    def test_a_carrier_that_cannot_flush_hears_what_was_sent(self) -> None:
        ledger = PlayoutLedger(lead_ms=60, uses_marks=False, flushes=False)
        fill(ledger, "r", 10)
        result = ledger.flush(10)
        assert result.sent_ms == 60 and result.heard_ms == 60 and not result.cleared
        assert not any(isinstance(a, SendClear) for a in ledger.actions_to_send())
        assert ledger.heard_updates() == [HeardUpdate("r", 60)]


def numbered(count: int) -> list[bytes]:
    """Frames that say which they are (the first two bytes: the index)."""
    return [index.to_bytes(2, "big") + b"\xff" * 158 for index in range(count)]


def media_indexes(actions: list[object]) -> list[int]:
    return [int.from_bytes(a.payload[:2], "big") for a in actions if isinstance(a, SendMedia)]


class TestPause:
    """Bridge-mode barge-in (#41): a pause clears the carrier and holds the reply; a resume plays it on from where
    the caller stopped hearing it, every frame once (the one they were in, again); a flush during a pause (the
    barge-in confirmed) gives it up."""

    def played(self, ledger: PlayoutLedger, until_ms: int, start_ms: int = 0) -> list[int]:
        sent: list[int] = []
        for now in range(start_ms, until_ms):
            ledger.tick(now)
            sent += media_indexes(ledger.actions_to_send())
        return sent

    def test_a_resumed_reply_goes_on_from_the_frame_the_caller_was_in(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        ledger.enqueue("r", numbered(50), 0)
        before = media_indexes(ledger.actions_to_send()) + self.played(ledger, 310)
        result = ledger.pause(310)
        assert result is not None and result.heard_ms == 310 and result.cleared
        assert isinstance(ledger.actions_to_send()[-1], SendClear)
        assert self.played(ledger, 900, 311) == [] and ledger.next_deadline_ms() is None  # held, no deadline to spin on
        ledger.resume(900)
        after = media_indexes(ledger.actions_to_send()) + self.played(ledger, 3000, 901)
        assert after == list(range(15, 50))  # 310 ms heard: frame 15 (300–320 ms) was playing, and plays again
        assert max(before) >= 15 and ledger.heard_ms("r", 3000) == 1000

    def test_a_carrier_that_cannot_be_cleared_hears_every_frame_once(self) -> None:
        """SIP and AudioSocket play what they were sent: a resume goes on after it, not from where the caller was
        when it paused (it replayed up to the lead: a resumed pause repeated audio on these carriers)."""
        ledger = PlayoutLedger(lead_ms=200, flushes=False)
        ledger.enqueue("r", numbered(50), 0)
        before = media_indexes(ledger.actions_to_send()) + self.played(ledger, 310)
        result = ledger.pause(310)
        assert result is not None and not result.cleared and result.heard_ms == result.sent_ms == 20 * len(before)
        ledger.resume(900)
        after = media_indexes(ledger.actions_to_send()) + self.played(ledger, 3000, 901)
        assert before + after == list(range(50))

    def test_frames_that_come_during_the_pause_wait_and_follow_in_order(self) -> None:
        ledger = PlayoutLedger(lead_ms=100)
        frames = numbered(30)
        ledger.enqueue("r", frames[:10], 0)
        self.played(ledger, 120)
        ledger.pause(120)
        assert ledger.actions_to_send() == [SendClear()]
        ledger.enqueue("r", frames[10:], 200)
        ledger.end_response("r", 250)
        assert ledger.actions_to_send() == []  # nothing, not even the final mark
        ledger.resume(400)
        actions = ledger.actions_to_send()
        for now in range(401, 2000):
            ledger.tick(now)
            actions += ledger.actions_to_send()
        assert media_indexes(actions) == list(range(6, 30))
        assert marks(actions)[-1] == "r@600"  # the final mark after the last frame, at its place in the reply

    def test_a_flush_during_the_pause_gives_the_reply_up_with_the_pauses_account(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        ledger.enqueue("r", numbered(50), 0)
        self.played(ledger, 310)
        paused = ledger.pause(310)
        ledger.actions_to_send()
        ledger.enqueue("r", numbered(5), 400)
        confirmed = ledger.flush(500)
        assert paused is not None and (confirmed.response_id, confirmed.heard_ms) == ("r", paused.heard_ms)
        assert ledger.actions_to_send() == [] and not ledger.paused and ledger.queued_frames == 0
        ledger.resume(600)  # nothing held: nothing happens
        assert ledger.actions_to_send() == []

    def test_a_stream_that_drops_during_the_pause_hands_on_what_was_held(self) -> None:
        ledger = PlayoutLedger(lead_ms=200)
        ledger.enqueue("r", numbered(50), 0)
        self.played(ledger, 310)
        ledger.pause(310)
        unplayed = ledger.unplayed(700)
        assert unplayed is not None and unplayed.from_ms == 300 and len(unplayed.frames) == 35

    def test_nothing_playing_nothing_to_pause(self) -> None:
        ledger = PlayoutLedger()
        assert ledger.pause(0) is None and not ledger.paused


def test_the_frame_playing_now_or_a_moment_ago() -> None:
    """What bridge-mode barge-in compares the caller's audio with: the frame they heard as they spoke."""
    ledger = PlayoutLedger(lead_ms=200)
    ledger.enqueue("r", numbered(20), 0)
    for now in range(1, 400):
        ledger.tick(now)
    assert [int.from_bytes((ledger.playing_frame(at) or b"\xff\xff")[:2], "big") for at in (0, 19, 20, 250, 399)] == [0, 0, 1, 12, 19]
    assert ledger.playing_frame(400) is None  # played out
    ledger.pause(300)
    assert ledger.playing_frame(250) is None  # held: the caller hears nothing of it now


def test_the_frame_heard_a_moment_ago_is_kept_past_an_underrun() -> None:
    """The bridge stalled (CI, session 35): the carrier played the lead out, then the bridge sent the next frames,
    then read the caller's audio said during the stall — judged against what they heard then, not silence (their
    line's echo of it taken for their own voice paused the agent)."""
    ledger = PlayoutLedger(lead_ms=200)
    ledger.enqueue("r", numbered(40), 0)
    for now in range(0, 101, 20):
        ledger.tick(now)
    assert ledger.playing_until_ms == 300
    ledger.tick(640)  # 540 ms later: the carrier played to 300, then nothing; the next frames sent now
    assert ledger.underruns == 1
    assert [int.from_bytes((ledger.playing_frame(at) or b"\xff\xff")[:2], "big") for at in (250, 299, 300, 639, 640)] == [12, 14, 0xFFFF, 0xFFFF, 15]
