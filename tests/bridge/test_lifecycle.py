"""CallLifecycle, pure: every way a stream finds (or does not find) its call's engine session, and ends with it."""

from __future__ import annotations

import pytest

from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.lifecycle import (
    DETACH_POLL_MS,
    DETACH_WAIT_MS,
    TAKEOVER_AFTER_MS,
    AskEnded,
    Bind,
    BindSource,
    CallLifecycle,
    CheckToken,
    ClaimCall,
    ClaimLive,
    CloseDetached,
    CloseEngineSession,
    CloseLive,
    CloseUnlessBack,
    CloseWaiting,
    DiscardAnswerSession,
    LifecycleError,
    MarkEnded,
    NudgeOldStream,
    Open,
    Park,
    Refuse,
    Resume,
    Step,
    StreamFacts,
    TakeAnswerSession,
    WaitUntil,
)
from callbridge.bridge.registry import CallClaim
from callbridge.engine.port import ResumeTicket

pytestmark = pytest.mark.core

TICKET = ResumeTicket("duplex-1", 1, "token", 7, "ws://gpu-a", heard_ms=(("resp-1", 1292),))


def steps(life: CallLifecycle) -> list[Step]:
    out = []
    while (step := life.next_step()) is not None:
        out.append(step)
    return out


def started(*, token: bool = True, answer: bool = False, window_ms: int | None = None) -> CallLifecycle:
    life = CallLifecycle(check_token=token, answer_sessions=answer, reconnect_window_ms=window_ms)
    life.stream_started()
    return life


FIRST_LOOK = ClaimCall(unless_ended=True)
AGAIN = ClaimCall(unless_ended=False)


def to_claim(life: CallLifecycle) -> None:
    assert steps(life) == [CheckToken()]
    life.token_checked(True)
    assert steps(life) == [FIRST_LOOK]


def ticket_taken(life: CallLifecycle, ticket: ResumeTicket, input_ms: int = 0, now_ms: int = 0) -> None:
    life.call_claimed(CallClaim(ticket=ticket, input_ms=input_ms), now_ms)


def none_parked(life: CallLifecycle, now_ms: int = 0, *, bound: bool = False, holder: str | None = None) -> None:
    """The claim took no ticket; the record says whether a stream holds the session (and its live ticket's holder)."""
    life.call_claimed(CallClaim(bound=bound, live_holder=holder), now_ms)


def bound_live(life: CallLifecycle) -> Bind:
    bind = life.stream_state_at_bind(StreamFacts(awaiting_engine=True))
    assert bind is not None
    return bind


class TestBinding:
    def test_a_new_call_opens_a_session(self) -> None:
        life = started()
        to_claim(life)
        none_parked(life)
        assert steps(life) == [Open()]
        life.opened()
        assert steps(life) == [] and bound_live(life) == Bind(BindSource.OPENED, "opened", 0, ())
        assert life.waited_ms is None

    def test_the_session_opened_at_the_answer_is_taken(self) -> None:
        life = started(answer=True)
        to_claim(life)
        none_parked(life)
        assert steps(life) == [TakeAnswerSession()]
        life.answer_session_taken(True)
        assert bound_live(life).source is BindSource.OPENED_AT_ANSWER

    def test_no_session_at_the_answer_opens_one(self) -> None:
        life = started(answer=True)
        to_claim(life)
        none_parked(life)
        steps(life)
        life.answer_session_taken(False)
        assert steps(life) == [Open()]

    def test_a_parked_session_is_resumed_where_the_call_stood(self) -> None:
        life = started()
        to_claim(life)
        ticket_taken(life, TICKET, 4_200, now_ms=0)
        assert steps(life) == [Resume(TICKET)]
        life.resumed()
        assert bound_live(life) == Bind(BindSource.RESUMED, "resumed", 4_200, TICKET.heard_ms)

    def test_a_session_parked_by_the_answer_is_the_first_streams_own(self) -> None:
        """With a shared registry the answer webhook parks the session it opened: the stream resumes it, and it
        counts as opened at the answer (not as a reconnect)."""
        life = started()
        to_claim(life)
        parked = ResumeTicket("duplex-2", 0, "token", 0, "ws://gpu-b", at_answer=True)
        ticket_taken(life, parked, 0, now_ms=0)
        assert steps(life) == [Resume(parked)]
        life.resumed()
        assert bound_live(life) == Bind(BindSource.OPENED_AT_ANSWER, "opened_at_answer", 0, ())

    def test_a_resume_that_fails_reopens_from_the_calls_start(self) -> None:
        life = started()
        to_claim(life)
        ticket_taken(life, TICKET, 4_200, now_ms=0)
        steps(life)
        life.resume_failed("session_resume_expired")
        assert steps(life) == [Open()]
        life.opened()
        assert bound_live(life) == Bind(BindSource.OPENED, "reopened_after_session_resume_expired", 0, ())

    def test_no_engine_plays_the_tone_and_hangs_the_call_up(self) -> None:
        life = started()
        to_claim(life)
        none_parked(life)
        steps(life)
        life.open_failed("resource_exhausted")
        reason = "engine_unavailable:resource_exhausted"
        assert steps(life) == [MarkEnded(reason), Refuse(reason, no_engine=True)]  # marked before the socket closes
        assert life.bound is None and life.refused == Refuse(reason, no_engine=True)

    def test_a_bad_token_is_refused_and_says_nothing_of_the_call(self) -> None:
        life = started()
        steps(life)
        life.token_checked(False)
        assert steps(life) == [Refuse(EndReason.BAD_TOKEN)]
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause(EndReason.BAD_TOKEN), detach=False), session_closed=True)
        assert steps(life) == []  # neither marks the call ended nor discards its answer session

    def test_a_call_already_over_is_refused(self) -> None:
        life = started(token=False)
        assert steps(life) == [FIRST_LOOK]
        life.call_claimed(CallClaim("caller_hung_up"), now_ms=0)
        assert steps(life) == [Refuse(EndReason.CALL_ALREADY_ENDED)]

    def test_a_registry_that_cannot_be_asked_refuses_the_stream(self) -> None:
        life = started()
        to_claim(life)
        life.registry_failed()
        assert steps(life) == [Refuse(EndReason.REGISTRY_UNAVAILABLE)]

    def test_a_stream_still_detaching_is_nudged_and_waited_for(self) -> None:
        life = started()
        to_claim(life)
        none_parked(life, 1_000, bound=True)
        assert steps(life) == [NudgeOldStream(None)]  # told once that it is superseded
        life.old_stream_nudged(gone=False, now_ms=1_000)
        assert steps(life) == [WaitUntil(1_020)]
        life.waited()
        assert steps(life) == [AGAIN]
        none_parked(life, 1_021, bound=True)
        assert steps(life) == [WaitUntil(1_041)]
        life.waited()
        steps(life)
        ticket_taken(life, TICKET, 900, now_ms=1_060)  # its detach came
        assert steps(life) == [Resume(TICKET)] and life.waited_ms == 60

    def test_a_mark_left_by_a_dead_process_costs_the_wait_once(self) -> None:
        """A bound mark with no live ticket (a process of an earlier version): the whole wait, then a new session."""
        life = started()
        to_claim(life)
        step, now = self._wait_for_a_holder(life, holder=None)
        assert step == Open() and now == DETACH_WAIT_MS and life.waited_ms is None

    def test_a_call_over_while_it_waits_is_not_refused_but_not_waited_for_either(self) -> None:
        """Only the first look refuses a call known over; a later one that finds it over waits no more (a new
        session, which the stream's own end, on its way, closes)."""
        life = started()
        to_claim(life)
        none_parked(life, 0, bound=True)
        assert steps(life) == [NudgeOldStream(None)]
        life.old_stream_nudged(gone=False, now_ms=0)
        assert steps(life) == [WaitUntil(DETACH_POLL_MS)]
        life.waited()
        assert steps(life) == [AGAIN]
        life.call_claimed(CallClaim("caller_hung_up"), DETACH_POLL_MS)
        assert steps(life) == [Open()]

    @staticmethod
    def _wait_for_a_holder(life: CallLifecycle, *, holder: str | None, gone: bool = False) -> tuple[Step | None, int]:
        """Claims that find nothing and records that name a bound stream (``holder``: its live ticket; ``gone``:
        its process known dead), until the lifecycle asks for something else than waiting; that step and the time
        it came."""
        now = 0
        none_parked(life, now, bound=True, holder=holder)
        while True:
            step = life.next_step()
            if isinstance(step, WaitUntil):
                now = step.at_ms
                life.waited()
            elif step == AGAIN:
                none_parked(life, now, bound=True, holder=holder)
            elif isinstance(step, NudgeOldStream):
                assert step.holder == holder
                life.old_stream_nudged(gone=gone, now_ms=now)
            else:
                return step, now

    def test_a_call_over_while_it_waits_for_the_holder_closes_what_the_holder_parks(self) -> None:
        """The caller hangs up while this stream waits for a half-open holder it told to detach: that holder parks
        the session meanwhile, and nobody would claim it but this stream. Its end takes the live ticket (a holder
        that died) and whatever was parked, and closes the session rather than leave it to the engine's grace."""
        life = started()
        to_claim(life)
        none_parked(life, 0, bound=True, holder="proc-a:MZ1")
        assert steps(life) == [NudgeOldStream("proc-a:MZ1")]
        life.old_stream_nudged(gone=False, now_ms=0)
        assert steps(life) == [WaitUntil(DETACH_POLL_MS)]
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up"), detach=False), session_closed=True)
        expected = [CloseLive("proc-a:MZ1", "caller_hung_up"), CloseWaiting("caller_hung_up"), MarkEnded("caller_hung_up")]
        assert steps(life) == expected

    def test_a_stream_that_never_detaches_is_taken_over_from_its_live_ticket(self) -> None:
        """Its process died (no detach will come): after the nudge goes unanswered for ``TAKEOVER_AFTER_MS``, the
        live ticket is claimed, and the session resumed from it where that stream's call stood."""
        life = started()
        to_claim(life)
        step, now = self._wait_for_a_holder(life, holder="proc-a:MZ1")
        assert step == ClaimLive("proc-a:MZ1") and now == TAKEOVER_AFTER_MS
        life.live_claimed(TICKET, 3_400, now_ms=now)
        assert steps(life) == [Resume(TICKET)] and life.waited_ms == TAKEOVER_AFTER_MS
        life.resumed()
        assert life.bound == Bind(BindSource.TAKEN_OVER, "taken_over", 3_400, TICKET.heard_ms)

    def test_a_holder_whose_process_is_known_dead_is_taken_over_at_once(self) -> None:
        """#40: its process no longer listens (killed: its sockets closed with it): no detach will come, and the
        session is taken from its live ticket as soon as that is known, not ``TAKEOVER_AFTER_MS`` later."""
        life = started()
        to_claim(life)
        step, now = self._wait_for_a_holder(life, holder="proc-a:MZ1", gone=True)
        assert step == ClaimLive("proc-a:MZ1") and now == 0
        life.live_claimed(TICKET, 3_400, now_ms=now)
        assert steps(life) == [Resume(TICKET)] and life.waited_ms == 0

    def test_a_mark_without_a_live_ticket_is_waited_for_even_where_its_process_is_gone(self) -> None:
        """Nothing to take it over from: the wait, then a new session, as before."""
        life = started()
        to_claim(life)
        step, now = self._wait_for_a_holder(life, holder=None, gone=True)
        assert step == Open() and now == DETACH_WAIT_MS

    def test_a_holder_that_detaches_as_it_is_taken_over_leaves_its_ticket_to_claim(self) -> None:
        life = started()
        to_claim(life)
        step, now = self._wait_for_a_holder(life, holder="proc-a:MZ1")
        life.live_claimed(None, 0, now_ms=now)  # it detached (or another stream took it) first
        assert steps(life) == [AGAIN]
        ticket_taken(life, TICKET, 900, now_ms=now + 1)
        assert steps(life) == [Resume(TICKET)]
        life.resumed()
        assert life.bound is not None and life.bound.source is BindSource.RESUMED and life.bound.call_offset_ms == 900

    def test_a_taken_over_session_that_cannot_be_resumed_is_replaced_by_a_new_one(self) -> None:
        life = started()
        to_claim(life)
        step, now = self._wait_for_a_holder(life, holder="proc-a:MZ1")
        life.live_claimed(TICKET, 3_400, now_ms=now)
        steps(life)
        life.resume_failed("invalid_resume_token")
        assert steps(life) == [Open()]
        life.opened()
        assert life.bound == Bind(BindSource.OPENED, "reopened_after_invalid_resume_token", 0, ())

    def test_an_answer_nobody_asked_for_is_a_driver_bug(self) -> None:
        life = started()
        with pytest.raises(LifecycleError):
            life.opened()


class TestEndedWhileBinding:
    def in_hand(self) -> CallLifecycle:
        life = started()
        to_claim(life)
        ticket_taken(life, TICKET, 4_200, now_ms=0)
        steps(life)
        life.resumed()
        return life

    def test_a_drop_parks_the_session_for_the_next_stream(self) -> None:
        life = self.in_hand()
        assert life.stream_state_at_bind(StreamFacts(end_reason=EndCause(EndReason.TRANSPORT_LOST))) is None
        assert steps(life) == [Park(4_200, TICKET.heard_ms)]
        life.parked(True)
        life.stream_ended(StreamFacts(call_over=False, end_reason=EndCause(EndReason.TRANSPORT_LOST), detach=False), session_closed=True)
        assert steps(life) == []

    def test_a_stop_closes_it_and_the_call_is_over(self) -> None:
        life = self.in_hand()
        assert life.stream_state_at_bind(StreamFacts(end_reason=EndCause.of("caller_hung_up"))) is None
        assert steps(life) == [CloseEngineSession("caller_hung_up")]
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up"), detach=False), session_closed=True)
        assert steps(life) == [MarkEnded("caller_hung_up")]


class TestEnding:
    def bound(self, *, window_ms: int | None = None, answer: bool = False) -> CallLifecycle:
        life = started(window_ms=window_ms, answer=answer)
        to_claim(life)
        ticket_taken(life, TICKET, 0, now_ms=0)
        steps(life)
        life.resumed()
        bound_live(life)
        return life

    def test_a_stop_closes_the_session_once_and_marks_the_call_ended(self) -> None:
        life = self.bound()
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up"), detach=False), session_closed=False)
        assert steps(life) == [CloseEngineSession("caller_hung_up"), MarkEnded("caller_hung_up")]
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up"), detach=False), session_closed=False)
        assert steps(life) == []  # once

    def test_a_session_the_engine_ended_is_not_closed_again(self) -> None:
        life = self.bound()
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("engine_SessionExpired:idle_ttl_expired"), detach=False), session_closed=True)
        assert steps(life) == [MarkEnded("engine_SessionExpired:idle_ttl_expired")]

    def test_a_drop_parks_the_session_unless_the_call_is_over_meanwhile(self) -> None:
        life = self.bound(window_ms=30_000)
        heard = (("resp-2", 505),)
        life.stream_ended(StreamFacts(call_over=False, end_reason=EndCause(EndReason.TRANSPORT_LOST), detach=True, input_ms=9_000, heard_ms=heard), session_closed=False)
        assert steps(life) == [AskEnded()]
        life.ended_is(None)
        assert steps(life) == [Park(9_000, heard)]
        life.parked(True)
        assert steps(life) == [CloseUnlessBack(30_000)]  # the carrier reconnects within its window, or never

    def test_a_drop_of_a_call_ended_meanwhile_closes_the_session(self) -> None:
        life = self.bound()
        life.stream_ended(StreamFacts(call_over=False, end_reason=EndCause(EndReason.TRANSPORT_LOST), detach=True), session_closed=False)
        steps(life)
        life.ended_is("completed")
        assert steps(life) == [CloseEngineSession(EndReason.TRANSPORT_LOST)]

    def test_a_registry_that_cannot_take_the_ticket_closes_the_session(self) -> None:
        life = self.bound()
        life.stream_ended(StreamFacts(call_over=False, end_reason=EndCause(EndReason.TRANSPORT_LOST), detach=True), session_closed=False)
        steps(life)
        life.registry_failed()  # not known to be over: parked
        assert steps(life) == [Park(0, ())]
        life.parked(False)
        assert steps(life) == [CloseDetached(EndReason.REGISTRY_UNAVAILABLE)]

    def test_a_stream_moved_off_a_draining_process_parks_before_its_socket_closes(self) -> None:
        life = self.bound(window_ms=30_000)
        life.moving_elsewhere(StreamFacts(input_ms=5_000, heard_ms=(("resp-3", 80),)))
        assert steps(life) == [Park(5_000, (("resp-3", 80),))]
        life.parked(True)
        assert steps(life) == []  # no window to wait out: the drain's redirect brings the next stream
        life.stream_ended(StreamFacts(call_over=False, end_reason=EndCause(EndReason.TRANSPORT_LOST), detach=True), session_closed=False)
        assert steps(life) == []  # parked already
        with pytest.raises(LifecycleError):
            life.moving_elsewhere(StreamFacts(input_ms=0, heard_ms=()))

    def test_a_stream_ended_before_it_bound_discards_the_answer_session(self) -> None:
        life = started(answer=True)
        steps(life)
        life.token_checked(True)
        assert steps(life) == [FIRST_LOOK]
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up"), detach=False), session_closed=True)
        assert steps(life) == [DiscardAnswerSession("caller_hung_up"), CloseWaiting("caller_hung_up"), MarkEnded("caller_hung_up")]
        assert life.next_step() is None

    def test_a_stream_ended_before_its_token_was_found_ours_says_nothing_of_the_call(self) -> None:
        """Anyone can open a media socket and name a call in its ``start``: a ``stop`` sent before the token check
        answers must not mark that call over, nor close the session opened at its answer."""
        life = started(answer=True)
        assert steps(life) == [CheckToken()]
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up")), session_closed=True)
        assert steps(life) == [CheckToken()]  # the check under way is waited for
        life.token_checked(False)
        assert steps(life) == []

    def test_a_stream_of_the_call_that_ended_while_its_token_was_checked_ends_the_call(self) -> None:
        life = started(answer=True)
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("caller_hung_up")), session_closed=True)  # check not begun
        assert steps(life) == [CheckToken()]
        life.token_checked(True)
        assert steps(life) == [DiscardAnswerSession("caller_hung_up"), CloseWaiting("caller_hung_up"), MarkEnded("caller_hung_up")]

    def test_a_drop_before_the_stream_bound_leaves_the_call_to_its_reconnect(self) -> None:
        life = started(answer=True)
        steps(life)
        life.token_checked(True)
        life.stream_ended(StreamFacts(end_reason=EndCause(EndReason.TRANSPORT_LOST)), session_closed=True)
        assert steps(life) == []  # neither over nor its answer session gone: the carrier's next stream takes it

    def test_binding_inputs_after_the_end_are_driver_bugs(self) -> None:
        life = self.bound()
        life.stream_ended(StreamFacts(call_over=True, end_reason=EndCause.of("stop"), detach=False), session_closed=False)
        steps(life)
        with pytest.raises(LifecycleError):
            life.stream_state_at_bind(StreamFacts(awaiting_engine=True))
        with pytest.raises(LifecycleError):
            life.resumed()
