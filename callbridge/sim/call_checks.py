"""The invariants a simulated call (``sim/simulated_call.py``) is checked against, as ``sim/faults.py`` lists them:
after each command it sends the engine (``check_command``), after every step of the virtual clock
(``check_step``: no dead air after an engine death, a lost registry record written again, no stream blamed on the
carrier) and once the call is over (``check_end``). Each reads the call through ``CheckedCall`` and raises
``Violation`` (``CheckedCall.violation``) at the first that fails."""

from __future__ import annotations

from typing import NoReturn, Protocol

from callbridge.bridge.call import CallSession, CallState
from callbridge.bridge.lifecycle import Bind, BindSource, CallLifecycle
from callbridge.carriers.base import ProtocolErrorReason
from callbridge.engine.commands import AckPlayback, CloseSession, EngineCommand, TruncateItem
from callbridge.engine.local.agents import OUTPUT_RATE_HZ
from callbridge.engine.local.core import LocalSessionCore, SessionState
from callbridge.sim.fault_models import CarrierModel, EngineServerModel, RegistryModel
from callbridge.sim.fault_plan import (
    KILLED_TAKEOVER_BOUND_MS,
    RESTORE_BOUND_MS,
    TAKEOVER_BOUND_MS,
    TONE_BOUND_MS,
    FaultPlan,
)

__all__ = ["CheckedCall", "ResumeExpected", "check_carrier_not_blamed", "check_command", "check_end", "check_step"]


class CheckedCall(Protocol):
    """What the invariants read of a simulated call (``SimulatedCall``)."""

    now_ms: int
    plan: FaultPlan
    call: CallSession | None
    carrier: CarrierModel | None
    outcome: str | None
    engine: LocalSessionCore
    server: EngineServerModel
    registry: RegistryModel
    streams: int
    engine_dead: bool
    engine_lost_reported: bool
    session_lost: bool
    failed_at_ms: int | None
    crashed_at_ms: int | None
    closes_sent: int
    generated_bytes: dict[str, int]
    heard_told: dict[str, int]
    unnamed_session: str | None
    half_open: tuple[CallSession, CallLifecycle] | None

    def violation(self, what: str) -> NoReturn: ...


def check_command(sim: CheckedCall, command: EngineCommand) -> None:
    """A command the bridge sends the engine: one ``session.close`` a session (none to one lost with its server); a
    heard position that never goes back, and never passes what the engine generated."""
    if isinstance(command, CloseSession):
        sim.closes_sent += 1
        if sim.closes_sent > 1:
            sim.violation("a second session.close for the same session")
        if sim.engine_lost_reported:
            sim.violation("session.close to a session lost with its server")
        return
    if isinstance(command, AckPlayback):
        response_id, heard = command.response_id, command.played_ms
    elif isinstance(command, TruncateItem):
        response_id, heard = command.item_id.removeprefix("item_"), command.audio_end_ms
    else:
        return
    told = sim.heard_told.get(response_id)
    if told is not None and heard < told:
        sim.violation(f"heard position of {response_id} went back from {told} to {heard} ms")
    generated = sim.generated_bytes.get(response_id, 0) * 1000 // (2 * OUTPUT_RATE_HZ)
    if heard > generated:
        sim.violation(f"heard {heard} ms of {response_id}, which has only {generated} ms")
    sim.heard_told[response_id] = max(heard, told or 0)


def check_step(sim: CheckedCall) -> None:
    """Dead air after an engine death: by ``TONE_BOUND_MS`` after it, a live call plays the failure tone. A live
    call the registry lost is resumable from it again within ``RESTORE_BOUND_MS`` (its next checkpoint). No
    stream is ended by a carrier limit: the carrier here is never silent on a live stream."""
    call, restore_by = sim.call, _restored_by_ms(sim)
    if call is not None:
        check_carrier_not_blamed(sim, call)
    if (
        restore_by is not None and sim.now_ms > restore_by and sim.unnamed_session == sim.engine.session_id
        and call is not None and call.state is CallState.LIVE
    ):  # fmt: skip
        lost_at = sim.plan.registry_lost_at_ms
        sim.violation(f"the registry lost the call at {lost_at} ms; its live stream has not written it again")
    died, carrier = sim.plan.engine_dies_at_ms, sim.carrier
    if died is None or sim.outcome is not None or call is None:
        return
    if sim.now_ms <= died + TONE_BOUND_MS + sim.plan.stalled_ms(died, died + TONE_BOUND_MS):
        return
    if call.state is CallState.LIVE:
        sim.violation(f"engine died at {died} ms; the caller still hears nothing of it (dead air)")
    if call.state is CallState.ENDING and (carrier is None or carrier.first_played_at_ms is None):
        sim.violation(f"engine died at {died} ms; no failure tone has played")


def check_carrier_not_blamed(sim: CheckedCall, call: CallSession) -> None:
    """The carrier here is never silent on a live stream and never floods it: a stream ended by a carrier limit
    or taken for a flood is the bridge blaming it (for a stall of its own)."""
    if call.phase.limit_reached is not None:
        sim.violation(f"the stream was ended by a limit the carrier gave no cause for: {call.phase.limit_reached}")
    if call.phase.failure is not None and call.phase.failure.reason is ProtocolErrorReason.FLOOD:
        sim.violation("the carrier's messages were taken for a flood")


def _restored_by_ms(sim: CheckedCall) -> int | None:
    """When a live call the registry lost must be written there again: a checkpoint after the loss, or after
    the end of a stall that keeps that checkpoint from going through. None: no loss in this plan."""
    lost_at, stall = sim.plan.registry_lost_at_ms, sim.plan.registry_stall
    if lost_at is None:
        return None
    if stall is not None and stall[0] < lost_at + RESTORE_BOUND_MS and sum(stall) > lost_at:
        lost_at = sum(stall)
    return lost_at + RESTORE_BOUND_MS + sim.plan.stalled_ms(lost_at, lost_at + RESTORE_BOUND_MS)


def check_end(sim: CheckedCall) -> None:
    """The call is over: it ended as the caller hears it ended, and nothing of it is left (session, registry)."""
    call, outcome = sim.call, sim.outcome
    unnamed = sim.unnamed_session == sim.engine.session_id  # the registry lost it; no stream found it again
    if unnamed and sim.engine.state is not SessionState.CLOSED:
        sim.server.orphaned.add(sim.engine.session_id)  # left to the grace
    if outcome == "busy":
        if sim.streams or sim.engine.session_id in sim.server.sessions:
            sim.violation("refused busy at the answer, yet a stream or a session was had")
        return
    if outcome in ("failure_tone_and_hang_up", "no_engine_tone_and_hang_up"):  # mid-call, or at the next stream
        carrier = sim.carrier
        if call is None or call.link.hangup is None:
            sim.violation("the engine failed the call, which was never hung up")
        hung_up_first = sim.failed_at_ms is not None and sim.plan.hangup_at_ms <= sim.failed_at_ms  # the
        if (carrier is None or carrier.first_played_at_ms is None) and not hung_up_first:  # stop not read yet
            sim.violation("the engine failed the call; the caller heard no failure tone")
        if outcome == "no_engine_tone_and_hang_up" and sim.registry.ended_reason is None:
            sim.violation("no engine took the call's next stream; the registry does not know the call is over")
        return
    if outcome == "caller_silent":  # the agent said goodbye to a caller who said nothing, then hung up
        assistant = sim.plan.assistant
        if assistant is None or not assistant.silence_hangup_after_s:
            sim.violation("the call was hung up for the caller's silence; no silence limit was set")
        if call is None or call.link.hangup is None:
            sim.violation("the call ended for the caller's silence and was never hung up")
    elif outcome != "caller_hung_up":
        sim.violation(f"the call ended as {outcome!r}: not an outcome the caller hears as such")
    if call is None or call.state is not CallState.ENDED:
        sim.violation(f"the call ended ({outcome}); the stream did not end")
    if not sim.engine_dead:
        sim.engine.events_to_send()
        # a session the registry lost is left to the engine's grace, or (a half-open stream still serving it,
        # which no stream of the call could find to supersede) to that socket's keepalive
        left_to = {SessionState.DETACHED, SessionState.LIVE} if sim.half_open is not None else {SessionState.DETACHED}
        if sim.engine.state is not SessionState.CLOSED and not (unnamed and sim.engine.state in left_to):
            sim.violation(f"the call is over; its engine session is left {sim.engine.state.value}")
    lost = sim.engine_lost_reported or sim.session_lost or unnamed  # a close sent before the loss was known
    if sim.closes_sent > 1 or (not lost and sim.closes_sent != 1):  # is fine; one after it is caught as sent
        sim.violation(f"{sim.closes_sent} session.close for one session")
    if sim.registry.ended_reason is None or sim.registry.ticket is not None or sim.registry.live is not None:
        sim.violation("the call is over; the registry does not know it (or still holds a ticket)")


class ResumeExpected:
    """What the call's next stream must bind, after how the last one ended: a crashed bridge's call taken over from
    its live ticket, at once (``TAKEOVER_BOUND_MS``; ``KILLED_TAKEOVER_BOUND_MS`` where its process is known dead); a half-open stream's, or a drained process's, resumed from what
    it parked — unless the session's server died, or the registry lost the session (``orphaned``: a new one beside
    it is no violation then)."""

    def __init__(self) -> None:
        self.taking_over = False
        """A stream after the crash is binding: it must resume the session from the live ticket."""
        self.half_open = False
        """The next stream resumes the session the superseded one parks."""
        self.moved = False
        """The last stream moved off a draining process: the next resumes its session."""
        self.orphaned = False
        """The session to resume was lost by the registry: a new one was opened beside it."""

    def check(self, sim: CheckedCall, bind: Bind, started_at_ms: int) -> None:
        """The stream that started at ``started_at_ms`` is bound as ``bind`` says; what was expected of it is
        checked, then forgotten."""
        unnamed, self.orphaned = self.orphaned, False
        if self.taking_over:  # the crashed bridge's call: resumed from its live ticket, at once, unless its server died
            self.taking_over = False
            if not sim.session_lost and not unnamed and bind.source is not BindSource.TAKEN_OVER:
                sim.violation(f"the call of a crashed bridge was bound {bind.detail}, not resumed from its live ticket")
            bound_ms = KILLED_TAKEOVER_BOUND_MS if sim.plan.crash_closes_sockets else TAKEOVER_BOUND_MS
            if sim.now_ms - started_at_ms > bound_ms:
                sim.violation(f"the call of a crashed bridge waited {sim.now_ms - started_at_ms} ms for its session")
        if self.half_open:  # the superseded stream parked its session: this one resumes it
            self.half_open = False
            resumable = not sim.session_lost and not sim.engine_dead and sim.crashed_at_ms is None and not unnamed
            if resumable and bind.source is not BindSource.RESUMED:
                sim.violation(f"the call of a half-open stream was bound {bind.detail}, not resumed from what it parked")
        if self.moved:  # a drained process's call: the same session, unless its server died
            self.moved = False
            if not sim.session_lost and not sim.engine_dead and not unnamed and bind.source is not BindSource.RESUMED:
                sim.violation(f"the call moved off a draining bridge was bound {bind.detail}, not resumed")
