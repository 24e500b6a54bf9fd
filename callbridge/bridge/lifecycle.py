"""What one carrier stream does with its call's engine session, across the call's streams, sans-I/O.

A call can have several streams in its life (the carrier's redirect after a
dropped socket, a stream moved off a draining process, a half-open socket a
reconnect supersedes) and one engine session that outlives each of them. For
one stream, ``CallLifecycle`` decides everything about that session: whether
the stream may have the call at all (its token, a call already over), where
its session comes from (the ticket a dropped stream parked, a stream still
detaching that it waits for, the live ticket of a stream that never will (its
process died), the session opened at the answer, a new one, a resume that
failed and so a new one), what happens when none can be had
(refused, the call hung up the carrier's way and marked ended), what happens
when the stream ends before or after it is bound (the session parked for the
next stream, or closed exactly once), and what the registry must remember.

In the style of h11's ``Connection``: all state here, inputs in, one step out
at a time. The driver (``bridge/media.py``) asks ``next_step()``, does it (a
registry read, an engine open, a sleep), and feeds the result back through the
input that answers it; it decides nothing. Time comes in from outside
(``now_ms``). ``EndReason`` names the ends this module reasons about.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.registry import CallClaim
from callbridge.engine.port import ResumeTicket, UnheardAudio

__all__ = [
    "AskEnded",
    "Bind",
    "BindSource",
    "CallLifecycle",
    "CheckToken",
    "ClaimCall",
    "ClaimLive",
    "CloseDetached",
    "CloseEngineSession",
    "CloseLive",
    "CloseUnlessBack",
    "CloseWaiting",
    "DiscardAnswerSession",
    "LifecycleError",
    "MarkEnded",
    "NudgeOldStream",
    "Open",
    "Park",
    "Refuse",
    "Resume",
    "Step",
    "StreamFacts",
    "TakeAnswerSession",
    "WaitUntil",
]

DETACH_WAIT_MS: Final = 2000
"""How long a new stream waits for the ticket of a stream that still holds the call's session and left no live
ticket (a process of an earlier version)."""
TAKEOVER_AFTER_MS: Final = 300
"""How long a new stream waits for the ticket of a stream that still holds the call's session before it takes the
session from that stream's live ticket. A stream whose process is alive detaches within milliseconds of being told
it is superseded (the carrier has reconnected: its socket is gone or half-open); one that has not by now is taken
for dead (a host gone, a process stalled). One whose process is known dead (it no longer listens for signals:
SIGKILL, a crash) is not waited for at all. A live process that is only slow loses the session to the new stream
(the engine tells its old socket ``session.replaced``) and ends its stream quietly."""
DETACH_POLL_MS: Final = 20


class BindSource(enum.StrEnum):
    """Where the stream's engine session came from (``callbridge_engine_sessions_total{how}``)."""

    OPENED = "opened"
    OPENED_AT_ANSWER = "opened_at_answer"
    RESUMED = "resumed"
    TAKEN_OVER = "taken_over"
    """Resumed from the live ticket of a stream that never detached (its process died, or stopped answering)."""


class LifecycleError(Exception):
    """The driver fed an input the lifecycle did not ask for (a bug in the driver)."""


# ---------------------------------------------------------------- steps out


@dataclass(frozen=True, slots=True)
class CheckToken:
    """Consume the stream's token for the call (``StreamTokens.consume``); answer ``token_checked``."""


@dataclass(frozen=True, slots=True)
class AskEnded:
    """Ask the registry whether the call is over (as the stream ends); answer ``ended_is``."""


@dataclass(frozen=True, slots=True)
class ClaimCall:
    """Look at the call in the registry in one round trip (``CallRegistry.claim_call``): take its resume ticket, or
    see whether a stream still holds its session; answer ``call_claimed``. ``unless_ended``: the stream's first look,
    which a call known over refuses."""

    unless_ended: bool


@dataclass(frozen=True, slots=True)
class ClaimLive:
    """Take the call's live ticket from ``holder``, the stream that will not detach; answer ``live_claimed``."""

    holder: str


@dataclass(frozen=True, slots=True)
class NudgeOldStream:
    """Tell the stream that still holds the session (here, or by a signal to another process) that it is
    superseded: it may not know its socket is gone (half-open). Answer ``old_stream_nudged``: whether its process
    is known gone (it no longer listens for signals: killed, crashed)."""

    holder: str | None
    """The stream that holds the session, where it left a live ticket (``LiveCall.holder``)."""


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Sleep until ``at_ms``; answer ``waited``."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class TakeAnswerSession:
    """Take the session opened at the call's answer webhook; answer ``answer_session_taken``."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Resume the parked session; answer ``resumed`` or ``resume_failed``."""

    ticket: ResumeTicket


@dataclass(frozen=True, slots=True)
class Open:
    """Open a new session; answer ``opened`` or ``open_failed``."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """End the stream unbridged. ``no_engine``: no engine takes the call — the caller hears the fallback tone, then
    the call is hung up the carrier's way (``CallSession.no_engine``); else only the stream ends."""

    reason: EndCause
    no_engine: bool = False


@dataclass(frozen=True, slots=True)
class MarkEnded:
    """Record in the registry that the call is over (a redirect then hangs up instead of streaming again)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Bind:
    """Hand the session to the stream (``CallSession.engine_bound``) at ``call_offset_ms``, carrying ``heard_ms``;
    then mark the call bound in the registry. Answer ``stream_state_at_bind`` first (under the stream's lock)."""

    source: BindSource
    detail: str
    """How, for the log (``opened``, ``resumed``, ``reopened_after_<code>`` …)."""
    call_offset_ms: int
    heard_ms: tuple[tuple[str, int], ...]
    unheard: UnheardAudio | None = None
    """The rest of the reply the last stream was playing (``EngineBinding.unheard``)."""
    told_ms: tuple[tuple[str, int], ...] = ()
    """What the engine was told of recent responses, from the ticket (``EngineBinding.told_ms``)."""

    @property
    def new_session(self) -> bool:
        """The session is new (opened, not resumed): the call's agent greets the caller on it."""
        return self.source in (BindSource.OPENED, BindSource.OPENED_AT_ANSWER)


@dataclass(frozen=True, slots=True)
class Park:
    """Detach the session and store its ticket (with ``heard_ms``) and ``input_ms`` for the call's next stream;
    answer ``parked``. ``close_after_ms``: the carrier reconnects within this or never (then close it)."""

    input_ms: int
    heard_ms: tuple[tuple[str, int], ...]
    close_after_ms: int | None = None
    unheard: UnheardAudio | None = None
    """The rest of the reply playing as the stream ended, for the ticket."""
    told_ms: tuple[tuple[str, int], ...] = ()
    """What the engine was told of recent responses, for the ticket (``ResumeTicket.told_ms``)."""


@dataclass(frozen=True, slots=True)
class CloseEngineSession:
    """Close the session (exactly once per session, from here)."""

    reason: str


@dataclass(frozen=True, slots=True)
class CloseDetached:
    """The registry could not take the ticket: no stream could ever resume the session, so close it now (resume it
    with its ticket, then close) rather than leave it to the engine's grace."""

    reason: str


@dataclass(frozen=True, slots=True)
class CloseWaiting:
    """The call is over before this stream was bound, and a session may wait in the registry for it: parked by a
    dropped stream this one had not claimed yet, or by a half-open one it told to detach. Claim that ticket and
    close the session (resume it, then close) rather than leave it to the engine's grace. Nothing when none waits."""

    reason: str


@dataclass(frozen=True, slots=True)
class CloseLive:
    """The call is over before this stream was bound, and its session is held by a stream that never detached
    (its process died): take that stream's live ticket and close the session (resume it, then close) rather than
    leave it to the engine's grace. Nothing when the holder detached meanwhile: it parked the session, and the
    ``CloseWaiting`` that follows closes it."""

    holder: str
    reason: str


@dataclass(frozen=True, slots=True)
class CloseUnlessBack:
    """In ``after_ms``, close the parked session if its ticket is still waiting (the carrier never came back)."""

    after_ms: int


@dataclass(frozen=True, slots=True)
class DiscardAnswerSession:
    """The stream never took the session opened at the call's answer: close it."""

    reason: str


Step = (
    CheckToken
    | AskEnded
    | ClaimCall
    | ClaimLive
    | NudgeOldStream
    | WaitUntil
    | TakeAnswerSession
    | Resume
    | Open
    | Refuse
    | MarkEnded
    | Bind
    | Park
    | CloseEngineSession
    | CloseDetached
    | CloseWaiting
    | CloseLive
    | CloseUnlessBack
    | DiscardAnswerSession
)


class _Phase(enum.Enum):
    IDLE = "idle"
    BINDING = "binding"
    BOUND = "bound"
    UNBOUND = "unbound"
    """Refused, or its session dealt with as it bound (the stream had ended): it ends without one."""
    ENDING = "ending"
    DONE = "done"


_ANSWERED: Final = (CheckToken, AskEnded, ClaimCall, ClaimLive, NudgeOldStream, WaitUntil, TakeAnswerSession, Resume, Open, Park)
"""Steps that wait for an answer (the input named in their docstring) before the next step."""


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """What the stream's own core knows of it, as the lifecycle needs it (``CallSession.facts()``)."""

    awaiting_engine: bool = False
    """Started, and still waiting for its engine session (it has not ended meanwhile)."""
    call_over: bool = False
    """The call ended with the stream (a stop, a hang-up, a failure), not a drop."""
    end_reason: EndCause | None = None
    detach: bool = False
    """The stream wants its session kept for the call's next stream (a drop)."""
    input_ms: int = 0
    """ms of caller audio the call's session has had: the next stream's audio continues the timeline from there."""
    heard_ms: tuple[tuple[str, int], ...] = ()
    """The replies cut off while being generated, with what the caller heard of each (``CallSession.facts().heard_ms``)."""
    unheard: UnheardAudio | None = None
    """The rest of the reply playing as the stream dropped, for the next stream to play."""
    told_ms: tuple[tuple[str, int], ...] = ()
    """What the engine was told the caller heard of recent responses (``CallSession.told_so_far``)."""

    @property
    def end_kind(self) -> EndReason | None:
        return self.end_reason.kind if self.end_reason is not None else None


class CallLifecycle:
    """One stream's dealings with its call's engine session. See the module docstring."""

    def __init__(self, *, check_token: bool, answer_sessions: bool, reconnect_window_ms: int | None = None) -> None:
        """``check_token``: the stream must carry the token our answer minted. ``answer_sessions``: sessions are
        opened at the answer webhook (one may wait for this call). ``reconnect_window_ms``: the carrier reconnects
        a dropped stream within this, or never (None: it does not say)."""
        self._check_token = check_token
        self._answer_sessions = answer_sessions
        self._window_ms = reconnect_window_ms
        self._phase = _Phase.IDLE
        self._steps: list[Step] = []
        self._awaiting: type[Step] | None = None
        self._offset_ms = 0
        self._heard_ms: tuple[tuple[str, int], ...] = ()
        self._unheard: UnheardAudio | None = None
        self._detail = BindSource.OPENED.value
        self._wait_from_ms: int | None = None
        self._wait_until_ms: int | None = None
        self._nudged = False
        self._first_look = True
        self._at_answer = False
        self._taking_over = False
        self._told_ms: tuple[tuple[str, int], ...] = ()
        self._live_holder: str | None = None
        """The stream the record named as holding the session with a live ticket, while this one waits for it."""
        self._moved = False
        self._session_closed = False
        self._verified: bool | None = None if check_token else True
        """Whether the stream's token is ours (None: not known yet; True too where none is needed). Only a stream
        whose token is ours may speak for the call as it ends."""
        self._ending: StreamFacts | None = None
        self.waited_ms: int | None = None
        """How long the stream waited for another stream's detach before it got the ticket (None: it did not)."""
        self.bound: Bind | None = None
        self.refused: Refuse | None = None

    def next_step(self) -> Step | None:
        """The next thing to do, or None: nothing until the input that answers the last step."""
        if not self._steps or self._awaiting is not None:
            return None
        step = self._steps.pop(0)
        if isinstance(step, _ANSWERED):
            self._awaiting = type(step)
        return step

    # ------------------------------------------------------------------ binding

    def stream_started(self) -> None:
        """The carrier's ``start`` named the call: find its engine session."""
        if self._phase is not _Phase.IDLE:
            raise LifecycleError(f"stream_started in {self._phase.value}")
        self._phase = _Phase.BINDING
        self._steps.append(CheckToken() if self._check_token else ClaimCall(unless_ended=True))

    def token_checked(self, ok: bool) -> None:
        self._answered(CheckToken)
        self._verified = ok
        if self._ending is not None:  # the stream ended while its token was being checked: now its end may count
            if ok:
                self._end_unbound(self._ending)
        elif ok:
            self._steps.append(ClaimCall(unless_ended=True))
        else:
            self._refuse(Refuse(EndCause(EndReason.BAD_TOKEN)))

    def ended_is(self, reason: str | None) -> None:
        """The registry's answer to ``AskEnded``, as the stream ends: why the call is over, or None."""
        self._answered(AskEnded)
        self._end_detached(known_ended=reason is not None)

    def call_claimed(self, claim: CallClaim, now_ms: int) -> None:
        """The registry's answer to ``ClaimCall``. The first look refuses a call known over. A ticket taken is
        resumed; none: a stream may still hold the session (its socket dropped, its detach on the way, here or in
        another process while the carrier already reconnected), as the claim says (``_record_seen``)."""
        self._answered(ClaimCall)
        first, self._first_look = self._first_look, False
        if first and claim.ended_reason is not None:
            self._refuse(Refuse(EndCause(EndReason.CALL_ALREADY_ENDED)))
            return
        self._offset_ms = claim.input_ms
        if claim.ticket is None:
            ended = claim.ended_reason is not None
            self._record_seen(bound=claim.bound, ended=ended, now_ms=now_ms, live_holder=claim.live_holder)
        else:
            self._ticket_taken(claim.ticket, now_ms)

    def _ticket_taken(self, ticket: ResumeTicket, now_ms: int) -> None:
        if self._wait_from_ms is not None:
            self.waited_ms = now_ms - self._wait_from_ms
        self._heard_ms, self._unheard, self._told_ms = ticket.heard_ms, ticket.unheard, ticket.told_ms
        self._at_answer = ticket.at_answer
        self._steps.append(Resume(ticket))

    def _record_seen(self, *, bound: bool, ended: bool, now_ms: int, live_holder: str | None = None) -> None:
        """No ticket taken; the call's record (``bound``: a stream holds its session; ``live_holder``: that stream,
        when it left a live ticket; all False or None when there is no record). Wait a moment for the holder's
        detach rather than open a second session: it is told it is superseded, and one that is alive detaches at
        once. One that has not within ``TAKEOVER_AFTER_MS`` never will: its session is taken from its live ticket.
        Without a live ticket, a new session after ``DETACH_WAIT_MS``."""
        if self._wait_from_ms is None:
            self._wait_from_ms, self._wait_until_ms = now_ms, now_ms + DETACH_WAIT_MS
        assert self._wait_until_ms is not None
        self._live_holder = live_holder if bound and not ended else None
        if not bound or ended:
            self._new_session()
        elif live_holder is not None and now_ms - self._wait_from_ms >= TAKEOVER_AFTER_MS:
            self._steps.append(ClaimLive(live_holder))
        elif now_ms >= self._wait_until_ms:
            self._new_session()
        elif not self._nudged:  # the old stream may not know its connection dropped (half-open): tell it
            self._nudged = True
            self._steps.append(NudgeOldStream(self._live_holder))
        else:
            self._steps.append(WaitUntil(now_ms + DETACH_POLL_MS))

    def old_stream_nudged(self, *, gone: bool, now_ms: int) -> None:
        """The holder was told. ``gone``: its process is known dead (no detach will come): its session is taken
        from its live ticket now, not ``TAKEOVER_AFTER_MS`` later. Else wait for its detach."""
        self._answered(NudgeOldStream)
        if gone and self._live_holder is not None:
            self._steps.append(ClaimLive(self._live_holder))
        else:
            self._steps.append(WaitUntil(now_ms + DETACH_POLL_MS))

    def live_claimed(self, ticket: ResumeTicket | None, input_ms: int, now_ms: int) -> None:
        """The live ticket taken (``input_ms``: the call's timeline when it was written): resume the session from
        it. None: the holder detached meanwhile (its ticket is there to claim), or another stream took it first
        (then this one finds nothing, and waits or opens)."""
        self._answered(ClaimLive)
        self._live_holder = None
        if ticket is None:
            self._steps.append(ClaimCall(unless_ended=False))
            return
        assert self._wait_from_ms is not None
        self.waited_ms = now_ms - self._wait_from_ms
        self._offset_ms, self._heard_ms, self._unheard, self._at_answer = input_ms, ticket.heard_ms, None, False
        self._taking_over, self._told_ms = True, ticket.told_ms
        self._steps.append(Resume(ticket))

    def waited(self) -> None:
        self._answered(WaitUntil)
        self._steps.append(ClaimCall(unless_ended=False))

    def answer_session_taken(self, found: bool) -> None:
        self._answered(TakeAnswerSession)
        if found:
            self._bind(BindSource.OPENED_AT_ANSWER)
        else:
            self._steps.append(Open())

    def resumed(self) -> None:
        """Resumed: the session a dropped stream parked — or, parked by the answer (a shared registry), the one
        opened there for this first stream (``opened_at_answer``)."""
        self._answered(Resume)
        source = BindSource.OPENED_AT_ANSWER if self._at_answer else BindSource.TAKEN_OVER if self._taking_over else BindSource.RESUMED
        self._detail = source.value
        self._bind(source)

    def resume_failed(self, code: str) -> None:
        """The parked session could not be resumed (expired, its server gone): a new one, from the call's start."""
        self._answered(Resume)
        self._offset_ms, self._heard_ms, self._unheard, self._at_answer, self._taking_over = 0, (), None, False, False
        self._told_ms = ()
        self._detail = f"reopened_after_{code}"
        self._steps.append(Open())

    def opened(self) -> None:
        self._answered(Open)
        self._bind(BindSource.OPENED)

    def open_failed(self, code: str) -> None:
        """No engine takes the call: it is over — marked so before the socket closes (the carrier's redirect that
        follows must get a hang-up, not a retry), and hung up the carrier's way."""
        self._answered(Open)
        reason = EndCause(EndReason.ENGINE_UNAVAILABLE, code)
        self._steps.append(MarkEnded(reason))
        self._refuse(Refuse(reason, no_engine=True))

    def rejected_by_application(self, reject: str) -> None:
        """Asked for the call's assistant as its stream opens the session (no answer webhook asked it), the
        application refused the call: it is over, marked so, and the stream ends unbridged (no tone)."""
        self._answered(Open)
        reason = EndCause(EndReason.APPLICATION_REJECTED, reject)
        self._steps.append(MarkEnded(reason))
        self._refuse(Refuse(reason))

    def registry_failed(self) -> None:
        """The registry could not be asked. Binding: the stream is refused (it cannot know the call). Ending: the
        call is not known to be over; its session is kept for a resume."""
        awaiting, self._awaiting = self._awaiting, None
        if self._ending is not None and awaiting is AskEnded:
            self._end_detached(known_ended=False)
        elif self._phase is _Phase.BINDING:
            self._refuse(Refuse(EndCause(EndReason.REGISTRY_UNAVAILABLE)))

    def stream_state_at_bind(self, stream: StreamFacts) -> Bind | None:
        """The session is in hand; the stream (read under its lock) still awaits it, or has ended meanwhile.
        Awaiting: the ``Bind`` to do now, under the lock. Ended: None, and the session is parked for the next
        stream (a drop: the carrier may come back) or closed (the call is over)."""
        bind = self.bound
        if bind is None or self._phase is not _Phase.BINDING:
            raise LifecycleError("stream_state_at_bind without a session in hand")
        if stream.awaiting_engine:
            self._phase = _Phase.BOUND
            return bind
        self._phase = _Phase.UNBOUND
        if stream.end_kind is EndReason.TRANSPORT_LOST:
            self._steps.append(Park(self._offset_ms, self._heard_ms, unheard=self._unheard, told_ms=self._told_ms))
        else:
            self._close(stream.end_reason or EndReason.CALL_ENDED)
        return None

    # ------------------------------------------------------------------ ending

    def stream_ended(self, stream: StreamFacts, *, session_closed: bool) -> None:
        """The stream is over. ``session_closed``: its session is closed already (the engine ended it). A stream
        that moved (``moving_elsewhere``) has parked its session already. A stream whose token was never found
        ours says nothing of the call: its end marks nothing and discards nothing, since anyone can open a socket and
        name a call. One that ended while its token was being checked waits for the check first (``CheckToken``
        again: the driver answers it from the check under way, not a second one)."""
        if self._ending is not None or self._phase is _Phase.DONE:
            return
        bound, started = self._phase is _Phase.BOUND, self._phase is not _Phase.IDLE
        end_reason = stream.end_reason
        self._ending = stream
        self._awaiting = None  # a bind cut short: its answer never comes
        self._steps.clear()
        if not bound:
            self._phase = _Phase.DONE
            if started and self._verified is None:  # first the token (the check under way, or the one not begun)
                self._steps.append(CheckToken())
            elif started and self._verified:
                self._end_unbound(stream)
            return
        self._phase = _Phase.ENDING
        if self._moved:
            self._conclude()
        elif stream.detach and not session_closed:
            self._steps.append(AskEnded())  # over meanwhile (a webhook, another process)? then not parked
        else:
            if not session_closed:
                self._close(end_reason or EndReason.CALL_ENDED)
            self._conclude()

    def moving_elsewhere(self, stream: StreamFacts) -> None:
        """The process drains and this live stream moves (``CallSession.move_elsewhere``): its session is parked now,
        before the carrier's socket closes, so the next stream finds the ticket wherever it lands."""
        if self._phase is not _Phase.BOUND or self._moved:
            raise LifecycleError("moving_elsewhere of a stream not bound, or moved already")
        self._moved = True
        self._steps.append(Park(stream.input_ms, stream.heard_ms, unheard=stream.unheard, told_ms=stream.told_ms))

    def parked(self, ok: bool) -> None:
        """``ok``: the ticket is stored. Not: the registry could not take it, and no stream could resume the session."""
        self._answered(Park)
        if not ok:
            self._steps.insert(0, CloseDetached(EndReason.REGISTRY_UNAVAILABLE))
        elif self._window_ms is not None and self._ending is not None:
            self._steps.insert(0, CloseUnlessBack(self._window_ms))

    def _end_unbound(self, stream: StreamFacts) -> None:
        """A stream of the call (its token ours) ended before it was bound: the session opened at the answer goes,
        and the call is over if the stream says so. A drop is neither: the carrier's reconnect takes the session
        opened at the answer (or its time to live ends it)."""
        if stream.end_kind is EndReason.TRANSPORT_LOST:
            return
        if self._answer_sessions:
            self._steps.append(DiscardAnswerSession(stream.end_reason or "stream_ended"))
        if stream.call_over and not _says_nothing_about_the_call(stream.end_kind):
            reason = stream.end_reason or EndReason.CALL_ENDED
            if self._live_holder is not None:  # the session a dead process held: nobody else will close it (first:
                self._steps.append(CloseLive(self._live_holder, reason))  # the end drops the live ticket)
            if self.bound is None:  # one parked for this stream (by a holder told to detach, too), not in hand yet
                self._steps.append(CloseWaiting(reason))
            self._steps.append(MarkEnded(stream.end_reason or "ended"))  # over all the same

    def _end_detached(self, *, known_ended: bool) -> None:
        ending = self._ending
        assert ending is not None
        if known_ended:
            self._close(ending.end_reason or EndReason.CALL_ENDED)
        else:
            self._steps.append(Park(ending.input_ms, ending.heard_ms, unheard=ending.unheard, told_ms=ending.told_ms))
        self._conclude()

    def _conclude(self) -> None:
        ending = self._ending
        assert ending is not None
        self._phase = _Phase.DONE
        if ending.call_over:
            self._steps.append(MarkEnded(ending.end_reason or "ended"))

    # ----------------------------------------------------------------- helpers

    def _new_session(self) -> None:
        self._wait_from_ms = None
        self._steps.append(TakeAnswerSession() if self._answer_sessions else Open())

    def _bind(self, source: BindSource) -> None:
        detail = self._detail if source is not BindSource.OPENED_AT_ANSWER else source.value
        self.bound = Bind(source, detail, self._offset_ms, self._heard_ms, self._unheard, self._told_ms)

    def _refuse(self, refusal: Refuse) -> None:
        self._phase = _Phase.UNBOUND
        self.refused = refusal
        self._steps.append(refusal)

    def _close(self, reason: str) -> None:
        if self._session_closed:
            raise LifecycleError("a second close of the call's session")
        self._session_closed = True
        self._steps.append(CloseEngineSession(reason))

    def _answered(self, kind: type[Step]) -> None:
        if self._awaiting is not kind:
            raise LifecycleError(f"{kind.__name__} answered, but the lifecycle waits for {self._awaiting}")
        self._awaiting = None


def _says_nothing_about_the_call(end_kind: EndReason | None) -> bool:
    """A stream with someone else's token, for a call already over, or whose registry could not be asked: its
    end is not the call's."""
    return end_kind in (EndReason.BAD_TOKEN, EndReason.CALL_ALREADY_ENDED, EndReason.REGISTRY_UNAVAILABLE)
