"""How every carrier's answer (and every stream restart) is decided, sans-I/O: the facts it needs are asked for
one at a time, in the order that makes each side effect happen only when it must (admission reserves a slot,
the engine's consent opens a session), and the decision is a value each carrier renders in its own dialect
(an XML document, a JSON call-control object, REST commands: whatever its webhook answers with).

    decision = answer_step(facts, retries=…, draining=…)     # an ``AnswerFact`` to find out, or the decision
    while isinstance(decision, AnswerFact):
        facts[decision] = await find_out(decision)
        decision = answer_step(facts, …)

``AnswerDesk.decide_answer`` is that loop; the table of outcomes is tested here, without a registry or engine.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["AnswerDecision", "AnswerFact", "AnswerKind", "RestartDecision", "answer_step", "restart_decision"]


class AnswerKind(enum.Enum):
    ANSWER = "answer"
    """Answer with the carrier's stream verb and ``AnswerDecision.token``."""
    HANG_UP = "hang_up"
    """The call is over already (a late webhook, a reconnect after its end)."""
    RETRY_ELSEWHERE = "retry_elsewhere"
    """Draining, a call another process can resume: back through the load balancer after a pause."""
    BUSY = "busy"
    """The carrier's busy refusal (``AnswerDecision.reason`` says why)."""
    TRANSFER = "transfer"
    """The application sends the call on (``AnswerDecision.target``): the carrier's transfer, no stream."""


@dataclass(frozen=True, slots=True)
class AnswerDecision:
    kind: AnswerKind
    token: str | None = None
    reason: str | None = None
    target: str | None = None
    """``TRANSFER``: an E.164 number or a SIP URI."""


class AnswerFact(enum.Enum):
    """What the answer may need to know about the call, asked in this order."""

    ENDED = "ended"
    """The call is over (the registry has its end)."""
    MOVING_ELSEWHERE = "moving_elsewhere"
    """A reconnect that reached this draining process, of a call another process can resume."""
    NEW_CALL_BOUNCES = "new_call_bounces"
    """A new call reaching this draining process that the load balancer can send to another."""
    ADMITTED = "admitted"
    """Admission took the call (it reserves a slot: asked only when the answer may be yes)."""
    APPLICATION_ANSWERS = "application_answers"
    """With an application (``[app]``): it chose an assistant for the call, rather than refuse it. Asked once the
    call is admitted, before the engine session opens (with that assistant)."""
    APPLICATION_TRANSFERS = "application_transfers"
    """The application sends the call on (a transfer) rather than refuse it."""
    APPLICATION_HANGS_UP = "application_hangs_up"
    """The application refused the call with a hang-up, not busy."""
    ENGINE_TAKES = "engine_takes"
    """The engine took the call's session (it opens one: asked last)."""


def answer_step(
    facts: Mapping[AnswerFact, bool], *, retries: bool, draining: bool, asks_application: bool = False
) -> AnswerFact | AnswerDecision:
    """The next fact to find out, or the decision. ``retries``: the carrier can be sent back through the load
    balancer (a redirect with a pause). ``asks_application``: an application chooses each new call's assistant.
    An ``ANSWER`` decision carries no token yet: the caller mints it."""
    if (ended := facts.get(AnswerFact.ENDED)) is None:
        return AnswerFact.ENDED
    if ended:
        return AnswerDecision(AnswerKind.HANG_UP)
    if retries:
        for fact, reason in ((AnswerFact.MOVING_ELSEWHERE, "draining"), (AnswerFact.NEW_CALL_BOUNCES, "draining_new_call")):
            if (known := facts.get(fact)) is None:
                return fact
            if known:
                return AnswerDecision(AnswerKind.RETRY_ELSEWHERE, reason=reason)
    if (admitted := facts.get(AnswerFact.ADMITTED)) is None:
        return AnswerFact.ADMITTED
    if not admitted:
        return AnswerDecision(AnswerKind.BUSY, reason="draining" if draining else "capacity")
    if asks_application:
        if (answers := facts.get(AnswerFact.APPLICATION_ANSWERS)) is None:
            return AnswerFact.APPLICATION_ANSWERS
        if not answers:
            if (transfers := facts.get(AnswerFact.APPLICATION_TRANSFERS)) is None:
                return AnswerFact.APPLICATION_TRANSFERS
            if transfers:
                return AnswerDecision(AnswerKind.TRANSFER, reason="application_transferred")
            if (hangs_up := facts.get(AnswerFact.APPLICATION_HANGS_UP)) is None:
                return AnswerFact.APPLICATION_HANGS_UP
            return AnswerDecision(AnswerKind.HANG_UP if hangs_up else AnswerKind.BUSY, reason="application_rejected")
    if (takes := facts.get(AnswerFact.ENGINE_TAKES)) is None:
        return AnswerFact.ENGINE_TAKES
    if not takes:
        return AnswerDecision(AnswerKind.BUSY, reason="engine_capacity")
    return AnswerDecision(AnswerKind.ANSWER)


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """What to do when the stream of a call that is not over stopped and the carrier can start another (a REST
    command or a redirect of its own): ``restart``, or hang the call up for ``hang_up_reason``."""

    restart: bool = False
    hang_up_reason: str | None = None


def restart_decision(*, restarts: int, max_restarts: int, admitted: bool, draining: bool) -> RestartDecision:
    """A stream gets a new one while it has restarts left and a process takes it (this
    one, or, draining, the next through the load balancer: ``admitted``); otherwise the call is hung up rather
    than left in silence. ``restarts``: this one included."""
    if restarts > max_restarts:
        return RestartDecision(hang_up_reason="stream_restarts_exhausted")
    if not admitted:
        return RestartDecision(hang_up_reason="draining" if draining else "capacity")
    return RestartDecision(restart=True)
