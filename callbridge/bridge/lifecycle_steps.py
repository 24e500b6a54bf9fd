"""One executor of a stream's lifecycle steps, for the server and the fault simulator alike.

``CallLifecycle`` (``bridge/lifecycle.py``) decides; ``do_steps`` does what it asks through ``LifecycleEffects`` —
the registry, the engine, the stream, the clock — and feeds each answer back through the input that answers it,
until the lifecycle asks nothing more. The media driver gives it the real registry and engine
(``bridge/stream_effects.py``); the fault simulator its models of them (``sim/fault_effects.py``). So the simulator
runs this logic, not a copy of it (FoundationDB's rule: simulate the interfaces, run the production code).

The effects are coroutines. The simulator's never wait on anything but its virtual clock: its ``sleep_until``
hands control back to the simulator, which resumes the executor when its clock gets there, with no event loop.
What an effect may raise is part of the interface: ``EngineError`` from the engine's operations (``resume``,
``open``, ``detach``), ``RegistryUnavailable`` from the registry's; the executor turns each into the lifecycle's
input for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.lifecycle import (
    AskEnded,
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
    MarkEnded,
    NudgeOldStream,
    Open,
    Park,
    Refuse,
    Resume,
    TakeAnswerSession,
    WaitUntil,
)
from callbridge.bridge.registry import CallClaim, LiveCall, RegistryUnavailable
from callbridge.engine.errors import EngineError
from callbridge.engine.port import ResumeTicket

__all__ = ["Held", "LifecycleEffects", "Rejected", "StepLog", "do_steps"]

S = TypeVar("S")


@dataclass(slots=True)
class Held(Generic[S]):
    """What a stream's steps have in hand: its engine session, and the ticket it is parked under once parked."""

    session: S | None = None
    ticket: ResumeTicket | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """Asked for the call's assistant as its session opens, the application refused the call (``Open``)."""

    reason: str


class StepLog(Protocol):
    """Where the executor says what happened (a bound structlog logger; the simulator's says nothing)."""

    def info(self, event: str, **kw: Any) -> Any: ...

    def warning(self, event: str, **kw: Any) -> Any: ...


class LifecycleEffects(Protocol[S]):
    """What a stream's lifecycle steps do to the world, one coroutine a kind of step: the call's registry record,
    its engine sessions (of type ``S``), the stream itself, the clock."""

    @property
    def log(self) -> StepLog: ...

    def now_ms(self) -> int: ...

    async def token_is_ours(self) -> bool:
        """The stream's single-use token, consumed for its call."""
        ...

    async def ended_reason(self) -> str | None: ...

    async def claim_call(self, unless_ended: bool) -> CallClaim:
        """The call's parked ticket taken, or who holds its session; where its input timeline stood."""
        ...

    async def claim_live(self, holder: str) -> LiveCall | None:
        """The live ticket of ``holder`` taken for this stream; None when ``holder`` no longer holds the call."""
        ...

    async def nudge_old_stream(self, holder: str | None) -> bool:
        """Tell the stream that holds the call (here, or in another process) that it is superseded; whether
        ``holder``'s process is known gone (it no longer listens: no detach will come)."""
        ...

    async def sleep_until(self, at_ms: int) -> None: ...

    async def take_answer_session(self) -> S | None: ...

    async def resume(self, ticket: ResumeTicket) -> S: ...

    async def open(self) -> S | Rejected: ...

    async def refuse(self, reason: EndCause, *, no_engine: bool) -> None:
        """The stream ends unbridged (``no_engine``: the failure tone, then the hang-up)."""
        ...

    async def mark_ended(self, reason: str) -> None: ...

    async def detach(self, session: S) -> ResumeTicket:
        """The session detached from this stream: its ticket as the engine gives it."""
        ...

    async def park(self, ticket: ResumeTicket, input_ms: int) -> bool:
        """The ticket stored for the call's next stream; False when another stream has taken the call over."""
        ...

    async def close_parked(self, ticket: ResumeTicket, reason: str) -> bool:
        """Close a parked session by its ticket (resume it, then close); False when it was gone already."""
        ...

    async def close_waiting(self, reason: str) -> bool:
        """Claim the ticket waiting for the call's next stream and close its session; False when none waited."""
        ...

    async def close_unless_back(self, ticket: ResumeTicket, after_ms: int) -> None:
        """In ``after_ms``, close the parked session if its ticket still waits (in the background)."""
        ...

    async def close_session(self, session: S, reason: str) -> None: ...

    async def discard_answer_session(self, reason: str) -> None: ...


async def do_steps(life: CallLifecycle, effects: LifecycleEffects[S], held: Held[S]) -> None:
    """Do what the stream's lifecycle asks, feeding each answer back, until it asks nothing more: as the stream
    binds, and as it ends or moves. ``held``: the session in hand, and the ticket it is parked under once parked."""
    log = effects.log
    while (step := life.next_step()) is not None:
        try:
            match step:
                case CheckToken():
                    life.token_checked(await effects.token_is_ours())
                case AskEnded():
                    life.ended_is(await effects.ended_reason())
                case ClaimCall(unless_ended):
                    claim = await effects.claim_call(unless_ended)
                    life.call_claimed(claim, effects.now_ms())
                case ClaimLive(holder):
                    live = await effects.claim_live(holder)
                    if live is not None:
                        log.info("live_ticket_claimed", holder=holder, session_id=live.ticket.session_id)
                    life.live_claimed(live.ticket if live else None, live.input_ms if live else 0, effects.now_ms())
                case NudgeOldStream(holder):
                    gone = await effects.nudge_old_stream(holder)
                    if gone:
                        log.info("stream_holder_gone", holder=holder)
                    life.old_stream_nudged(gone=gone, now_ms=effects.now_ms())
                case WaitUntil(at_ms):
                    await effects.sleep_until(at_ms)
                    life.waited()
                case TakeAnswerSession():
                    held.session = await effects.take_answer_session()
                    life.answer_session_taken(held.session is not None)
                case Resume(ticket):
                    try:
                        held.session = await effects.resume(ticket)
                        life.resumed()
                    except EngineError as exc:
                        log.info(
                            "engine_resume_failed", reason=exc.code, detail=exc.message, session_id=ticket.session_id
                        )
                        life.resume_failed(exc.code)
                case Open():
                    await _open(life, effects, held)
                case Refuse(reason, no_engine):
                    await effects.refuse(reason, no_engine=no_engine)
                case MarkEnded(reason):
                    try:
                        await effects.mark_ended(reason)
                    except RegistryUnavailable as exc:  # the call goes on without it
                        log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
                case Park():
                    await _park(life, effects, held, step)
                case CloseDetached(reason):  # no stream could ever resume it: closed now, not left to its grace
                    if held.ticket is not None:
                        await effects.close_parked(held.ticket, reason)
                case CloseWaiting(reason):
                    if await effects.close_waiting(reason):
                        log.info("engine_session_closed", reason=reason, parked=True)
                case CloseLive(holder, reason):
                    live = await effects.claim_live(holder)
                    if live is not None and await effects.close_parked(live.ticket, reason):
                        log.info(
                            "engine_session_closed", reason=reason, holder=holder, session_id=live.ticket.session_id
                        )
                case CloseUnlessBack(after_ms):
                    if held.ticket is not None:
                        await effects.close_unless_back(held.ticket, after_ms)
                case CloseEngineSession(reason):
                    if held.session is not None:
                        await effects.close_session(held.session, reason)
                case DiscardAnswerSession(reason):
                    await effects.discard_answer_session(reason)
                case _:
                    raise AssertionError(f"a step the executor does not know: {step!r}")
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
            life.registry_failed()


async def _open(life: CallLifecycle, effects: LifecycleEffects[S], held: Held[S]) -> None:
    try:
        opened = await effects.open()
    except EngineError as exc:
        effects.log.warning("engine_unavailable", reason=exc.code, detail=exc.message)
        life.open_failed(exc.code)
        return
    if isinstance(opened, Rejected):
        life.rejected_by_application(opened.reason)
        return
    held.session = opened
    life.opened()


async def _park(life: CallLifecycle, effects: LifecycleEffects[S], held: Held[S], park: Park) -> None:
    """Detach the session and store its ticket, with what the caller heard, for the call's next stream."""
    assert held.session is not None
    log = effects.log
    try:
        detached = await effects.detach(held.session)
        held.ticket = replace(detached, heard_ms=park.heard_ms, unheard=park.unheard, told_ms=park.told_ms)
    except EngineError as exc:
        log.warning("engine_detach_failed", reason=exc.code)
        life.parked(True)  # nothing to park: the engine has let the session go
        return
    try:
        stored = await effects.park(held.ticket, park.input_ms)
    except RegistryUnavailable as exc:
        log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
        life.parked(False)
        return
    if not stored:  # another stream took the call over (this one was taken for dead): its session
        log.info("stream_taken_over_elsewhere", session_id=held.ticket.session_id)
        held.ticket = None  # is that stream's now: nothing parked here, nothing to close
    life.parked(True)
