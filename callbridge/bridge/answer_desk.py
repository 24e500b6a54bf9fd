"""The answer desk: every carrier asks it before it answers a call or takes a stream, and only it decides — over
already, draining, at capacity, moving to another process, refused by the application, refused by the engine. A
carrier renders what it says in its own dialect (busy TwiML, a 486 or 503, a close before the upgrade, a hang-up
through its REST API); no carrier module re-decides draining or capacity (``StreamRefusal``, ``restart``,
``takes_reconnect``)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Coroutine
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, Protocol

from callbridge.application import AssistantConfig, CallContext, MachineDetection
from callbridge.application.assistant import AssistantReply
from callbridge.application.events import CallEvent
from callbridge.application.hooks import AssistantOutcome, AssistantSource
from callbridge.bridge.admission import AdmissionBook, Refusal
from callbridge.bridge.answer_policy import (
    AnswerDecision,
    AnswerFact,
    AnswerKind,
    RestartDecision,
    answer_step,
    restart_decision,
)
from callbridge.bridge.answer_sessions import AnswerSessions
from callbridge.bridge.app_events import EventDelivery
from callbridge.bridge.call_config import session_config
from callbridge.bridge.call_setup import SETUP_NOTE, CallSetup, Chosen, Rejection, TransferTo, setup_kept_ms
from callbridge.bridge.cpu import CpuMeter
from callbridge.bridge.dialer import Answering, Dialer
from callbridge.bridge.fleet import DRAIN_NEW_CALL_BOUNCES
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.registry import CallRegistry, RegistryUnavailable, StreamTokens
from callbridge.config import Settings, model_calls_tools
from callbridge.engine.errors import EngineError
from callbridge.engine.port import DuplexEngine, ResumeTicket
from callbridge.logging import get_logger

__all__ = ["AnswerDesk", "DeskHost", "StreamRefusal"]

log = get_logger(__name__)

_ANSWER_ENGINE_WAIT_S = 2.0
"""How long an answer webhook waits to learn whether the engine takes the call (busy if it refuses)."""
_DRAIN_BOUNCES_KEPT_MS = 60_000


class StreamRefusal(enum.StrEnum):
    """Why a stream or call is not taken here (``AnswerDesk.stream_refusal``): carriers map it to their wire
    (a SIP answer: 503 draining, 486 capacity)."""

    DRAINING = "draining"
    CAPACITY = "capacity"


class DeskHost(Protocol):
    """What the desk reads of its bridge process (``BridgeServices``): some of it changes as the process runs
    (``draining``; ``events``, set once the application is known), so it is read at each decision."""

    settings: Settings
    engine: DuplexEngine
    registry: CallRegistry
    tokens: StreamTokens
    metrics: BridgeMetrics
    admission: AdmissionBook
    cpu: CpuMeter
    draining: bool
    answer_sessions: AnswerSessions | None
    events: EventDelivery | None
    assistants: AssistantSource | None
    dialer: Dialer | None

    @property
    def active_calls(self) -> set[str]: ...
    @property
    def drains_in_place(self) -> bool: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...
    async def close_detached(self, call_id: str, reason: str, ticket: ResumeTicket | None = None, *, mark_ended: bool = True) -> bool: ...
    async def release_fleet_slot(self, call_id: str) -> None: ...


class AnswerDesk:
    """One answer decision for every carrier's webhook (``decide_answer``), one admission for streams that arrive
    without one (``stream_refusal``), one for a stream's restart (``restart``, ``takes_reconnect``)."""

    def __init__(self, host: DeskHost) -> None:
        self._host = host

    @property
    def draining(self) -> bool:
        """The process admits no new call (it may still take back one of its own, or send one on): for what else
        a drain changes (a SIP registration's removal), never to decide a call's admission."""
        return self._host.draining

    def refusal_before_call_id(self) -> StreamRefusal | None:
        """A stream whose call is not known yet, before anything of it is read: refused while draining (no slot is
        taken here; ``stream_refusal`` decides once the call id is read)."""
        return StreamRefusal.DRAINING if self._host.draining else None

    async def stream_refusal(self, call_id: str) -> StreamRefusal | None:
        """Why a stream (or a call offered with no webhook before it) is not taken here, or None:
        admitted (``admits``). ``call_id`` "": not known before the stream's ``start`` (capacity only)."""
        if await self.admits(call_id):
            return None
        return StreamRefusal.DRAINING if self._host.draining else StreamRefusal.CAPACITY

    async def takes_reconnect(self, call_id: str) -> bool:
        """A known call's new stream after a drop: admitted here, or, draining, movable to another process (it goes
        through the public URL to whichever takes it)."""
        return await self.admits(call_id) or await self.moving_elsewhere(call_id)

    async def restart(self, call_id: str, restarts: int, max_restarts: int) -> RestartDecision:
        """A call whose stream stopped while the call is not over: a new stream, or the hang-up and its reason
        (``restart_decision``). ``restarts``: this one included."""
        admitted = await self.takes_reconnect(call_id)
        return restart_decision(restarts=restarts, max_restarts=max_restarts, admitted=admitted, draining=self._host.draining)

    @property
    def parks_at_answer(self) -> bool:
        """``engine.open_at_answer`` auto with a shared registry: the session opened at the answer is parked in the
        registry (detached, with its ticket), so the call's stream resumes it on whichever process it reaches."""
        return self._host.settings.engine.open_at_answer == "auto" and self._host.registry.shared

    async def decide_answer(
        self,
        call_id: str,
        provider: str,
        *,
        retries: bool = True,
        context: CallContext | None = None,
        dial_id: str | None = None,
        dialled_as: str | None = None,
    ) -> AnswerDecision:
        """A carrier's answer webhook for ``call_id``, decided the one way every carrier answers
        (``answer_policy.answer_step``: over already → hang up; draining, and another process can resume it
        (``retries``: the carrier can be sent back through the load balancer) → retry elsewhere; not admitted, or
        no engine takes it → busy; else answer with a fresh stream token). This finds out each fact the policy
        asks for. A registry that does not answer is a busy refusal too, logged as a warning: the caller hears
        busy rather than the carrier's "application error". With an application (``[app]``), a new call admitted is
        its to answer or refuse (``choose_assistant``, from ``context``: what the carrier's webhook said), and its
        engine session opens with the assistant chosen. ``dial_id``: the answer webhook's of a call the agent placed
        (its answer URL names it; ``dialled_as``: the id the carrier's dial API gave, where not the call's): the
        call's context gets the dial id and metadata, its assistant is the request's where it gave one (the
        application not asked), and the request's machine detection is put on the assistant chosen."""
        facts: dict[AnswerFact, bool] = {}
        dialer = self._host.dialer
        placed = await dialer.answering(dial_id, provider, dialled_as or call_id) if dialer is not None and dial_id else None
        context = context or CallContext(call_id=call_id, carrier=provider)
        if placed is not None:
            context = placed.applied_to(context)
        assistant, detection = (placed.assistant, placed.machine_detection) if placed is not None else (None, None)
        asked = _Asked(context, preset=assistant, detection=detection)
        asks_application = self._host.assistants is not None or assistant is not None or detection is not None
        try:
            while isinstance(
                step := answer_step(facts, retries=retries, draining=self._host.draining, asks_application=asks_application), AnswerFact
            ):
                facts[step] = await self._answer_fact(step, call_id, asked)
            if asked.refused is not None:  # refused, or sent on (it leaves without a stream)
                self.not_answered_by_application(call_id, provider, asked.refused)
                return replace(step, target=asked.refused.target) if isinstance(asked.refused, TransferTo) else step
            if step.kind is AnswerKind.ANSWER:
                return AnswerDecision(AnswerKind.ANSWER, token=await self._host.tokens.mint(call_id))
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)
            step = AnswerDecision(AnswerKind.BUSY, reason="registry_unavailable")
        if step.kind is AnswerKind.RETRY_ELSEWHERE:
            log.info("call_redirected", call_id=call_id, provider=provider, reason=step.reason)
        elif step.kind is AnswerKind.BUSY:
            self.give_back_admission(call_id)  # refused after all: its slot goes back
            log.warning("call_refused", call_id=call_id, provider=provider, reason=step.reason)
        return step

    async def _answer_fact(self, fact: AnswerFact, call_id: str, asked: _Asked) -> bool:
        match fact:
            case AnswerFact.APPLICATION_ANSWERS:
                kept = await self.call_setup(call_id)  # a call coming back (a reconnect): chosen once, at its answer
                chosen = kept if kept is not None else await self.choose_assistant(asked.context, asked.preset, asked.detection)
                if isinstance(chosen, CallSetup):
                    asked.setup = chosen
                    return True
                asked.refused = chosen
                return False
            case AnswerFact.APPLICATION_TRANSFERS:
                return isinstance(asked.refused, TransferTo)
            case AnswerFact.APPLICATION_HANGS_UP:
                return asked.refused == "hang_up"
            case AnswerFact.ENDED:
                return await self._host.registry.ended_reason(call_id) is not None
            case AnswerFact.MOVING_ELSEWHERE:
                return await self.moving_elsewhere(call_id)
            case AnswerFact.NEW_CALL_BOUNCES:
                return await self.bounces_new_call(call_id)
            case AnswerFact.ADMITTED:
                return await self.admits(call_id)
            case AnswerFact.ENGINE_TAKES:
                return await self.engine_takes(call_id, asked.setup.assistant if asked.setup is not None else None)

    async def choose_for_placed(self, placed: Answering, context: CallContext) -> Chosen | None:
        """A placed call's assistant, answered without ``decide_answer`` (a SIP dial, a call-control answer event):
        the request's own, else the application's, asked with ``context`` as the answer tells it plus what the dial
        adds; the request's machine detection on it. None: neither gives one (the configured assistant serves)."""
        if self._host.assistants is None and placed.assistant is None and placed.machine_detection is None:
            return None
        return await self.choose_assistant(placed.applied_to(context), placed.assistant, placed.machine_detection)

    async def choose_assistant(
        self, context: CallContext, preset: AssistantConfig | None = None, detection: MachineDetection | None = None
    ) -> Chosen:
        """Ask the application for the call's assistant (``AssistantSource``: under ``app.assistant_timeout_s``,
        standing in for a slow or failing one) — or take ``preset``, a placed call's own; keep the setup in the
        registry for the call's streams. Else how the application refused the call. Logged with the call's context
        (its first log line), and counted. ``detection``: a placed call's machine detection, put on the assistant."""
        if preset is not None or self._host.assistants is None:  # a placed call's own, or the configured one
            outcome = AssistantOutcome(AssistantReply.answer(preset), "request", None, 0)
        else:
            assert self._host.assistants is not None
            outcome = await self._host.assistants.request(context)
        reply = outcome.reply
        label = "rejected" if reply.reject is not None else "transferred" if reply.transfer is not None else outcome.source
        self._host.metrics.assistant_requests.labels(label, outcome.failure or "").inc()
        fields = dict(context.log_fields(), source=outcome.source, elapsed_ms=outcome.elapsed_ms)
        if outcome.failure is not None:
            on_failure = self._host.assistants.on_failure if self._host.assistants is not None else None
            log.warning("assistant_fallback", call_id=context.call_id, failure=outcome.failure, detail=outcome.detail[:300],
                        on_failure=on_failure, **fields)  # fmt: skip
        else:
            log.info("assistant_chosen", call_id=context.call_id, reject=reply.reject, transfer=reply.transfer, **fields)
        if reply.transfer is not None:
            return TransferTo(reply.transfer)
        if reply.assistant is None:
            return reply.reject or "busy"
        if reply.assistant.tools and not model_calls_tools(self._host.settings.engine):
            log.warning("assistant_tools_left_out", call_id=context.call_id, tools=[tool.name for tool in reply.assistant.tools],
                        reason="the engine's model cannot call tools (engine.tools)")  # fmt: skip
        assistant = reply.assistant if detection is None else reply.assistant.model_copy(update={"machine_detection": detection})
        setup = CallSetup(context=context, assistant=assistant, source=outcome.source, chosen_at=time.time())
        if self._host.events is not None:  # the application hears of the call before its media flows (``call.answered``)
            self._host.events.emit(context, CallEvent(type="call.started", call_id=context.call_id, at=setup.chosen_at, seq=0))
        try:
            await self._host.registry.keep_note(
                context.call_id, SETUP_NOTE, setup.model_dump_json(), setup_kept_ms(self._host.settings.server.max_call_duration_s)
            )
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=context.call_id)
        return setup

    @property
    def keeps_setups(self) -> bool:
        """Calls' setups are kept where they are answered: with an application, and where the agent places calls
        (a placed call's own assistant, its machine detection)."""
        return self._host.assistants is not None or self._host.settings.outbound.api_token is not None

    async def call_setup(self, call_id: str) -> CallSetup | None:
        """The setup kept for the call where it was answered (``choose_assistant``), or None (none kept: none are
        (``keeps_setups``), or the registry lost it). Raises ``RegistryUnavailable``."""
        if not self.keeps_setups:
            return None
        kept = await self._host.registry.note(call_id, SETUP_NOTE)
        return CallSetup.model_validate_json(kept) if kept is not None else None

    async def engine_takes(self, call_id: str, assistant: AssistantConfig | None = None) -> bool:
        """A carrier's answer webhook admitted the call: open its engine session now, for its stream to take
        (``engine.open_at_answer``), and say whether the engine took it. False when the engine refused it
        (``resource_exhausted`` from every endpoint, none reachable): the carrier gets its busy refusal rather than
        a call answered and dropped a moment later. True when it took it, when the open is still on its way after
        ``_ANSWER_ENGINE_WAIT_S`` (the stream opens or takes it), and where nothing is opened at the answer (a
        reconnect of a call known here or in the fleet; ``open_at_answer`` off). With a shared registry the session
        is parked there (``parks_at_answer``); with the memory one, kept here (``AnswerSessions``)."""
        if self._host.draining or (self._host.answer_sessions is None and not self.parks_at_answer):
            return True
        try:
            if await self._host.registry.get(call_id) is not None:
                return True
        except RegistryUnavailable:
            return True
        if self._host.answer_sessions is not None:
            self._host.answer_sessions.open(call_id, session_config(self._host.settings, assistant))
            refused = await self._host.answer_sessions.refusal(call_id, _ANSWER_ENGINE_WAIT_S)
        else:
            refused = await self._open_parked(call_id, assistant)
        if refused is None:
            return True
        self._host.metrics.admission_refused.labels(Refusal.ENGINE.value).inc()
        log.warning("admission_refused", reason="engine", call_id=call_id, code=refused.code, detail=refused.message)
        return False

    async def _open_parked(self, call_id: str, assistant: AssistantConfig | None) -> EngineError | None:
        """Open the call's session and park it in the shared registry for its stream; the engine's refusal, else
        None (parked, or slow: the stream then opens its own). A parked session no stream claims within
        ``engine.open_at_answer_ttl_s`` is closed."""
        try:
            session = await asyncio.wait_for(self._host.engine.open(session_config(self._host.settings, assistant)), _ANSWER_ENGINE_WAIT_S)
        except EngineError as refused:
            return refused
        except TimeoutError:
            return None
        try:
            ticket = replace(await session.detach(), at_answer=True)
            await self._host.registry.detach(call_id, ticket, 0, int(self._host.settings.engine.disconnect_grace_s * 1000))
        except (EngineError, RegistryUnavailable) as exc:
            log.warning("answer_session_not_parked", call_id=call_id, error=repr(exc))
            with suppress(EngineError):
                await session.close("not_parked")
            return None
        self._host.spawn(self._close_unclaimed(call_id, ticket))
        return None

    async def _close_unclaimed(self, call_id: str, ticket: ResumeTicket) -> None:
        await asyncio.sleep(self._host.settings.engine.open_at_answer_ttl_s)
        with suppress(RegistryUnavailable):
            if await self._host.close_detached(call_id, "not_claimed", ticket, mark_ended=False):
                log.info("answer_session_closed", call_id=call_id, reason="not_claimed")

    async def admits(self, call_id: str) -> bool:
        """Whether a call may be answered now: not draining, and under ``server.max_calls`` (``AdmissionBook``: a
        call admitted is held at once) and ``server.max_calls_fleet`` — unless the call is already known (a stream
        coming back, here or from another process)."""
        if self._host.draining:  # a lone process still serves its own calls: one whose socket dropped may come back
            return self._host.drains_in_place and await self._serves(call_id)
        server, now = self._host.settings.server, asyncio.get_running_loop().time()  # monotonic; virtual in the simulator
        # what the process will use carrying every call it holds and this one (``CpuMeter.projected``), leaning on
        # what ``max_calls`` sized a call at while it has measured few (``CpuMeter.guess``)
        guess = self._host.cpu.guess(server.cpu_budget_percent / 100, server.max_calls)
        cpu_percent = self._host.cpu.projected(self._host.admission.held(now) + 1, guess) * 100
        known_here = self._host.admission.knows(call_id)
        refusal = self._host.admission.take(call_id, now, cpu_percent)
        fleet_limit = self._host.settings.server.max_calls_fleet
        if refusal is None and not known_here and call_id and fleet_limit is not None:
            try:
                # held as long as the answer's own slot (``engine.open_at_answer_ttl_s``): a stream that never comes
                # frees the fleet's place when it frees this process's, not a fleet hold later
                answer_hold_ms = int(self._host.settings.engine.open_at_answer_ttl_s * 1000)
                if not await self._host.registry.admit(call_id, fleet_limit, answer_hold_ms):
                    refusal = Refusal.MAX_CALLS_FLEET
            except RegistryUnavailable:
                self._host.admission.give_back(call_id)
                raise
        if refusal is None or await self._host.registry.get(call_id) is not None:  # a call coming back is never refused
            return True
        self._host.admission.give_back(call_id)
        self._host.metrics.admission_refused.labels(refusal.value).inc()
        log.warning(
            "admission_refused",
            reason=refusal.value,
            cpu_percent=round(self._host.cpu.utilization * 100, 1),
            projected_cpu_percent=round(cpu_percent, 1),
            calls=len(self._host.active_calls),
        )
        return False

    def not_answered_by_application(self, call_id: str, provider: str, refused: Rejection | TransferTo) -> None:
        """The application refused the call, or sent it on: its admission slot goes back; logged."""
        self.give_back_admission(call_id)
        if isinstance(refused, TransferTo):
            log.info("call_transferred_by_application", call_id=call_id, provider=provider, target=refused.target)
        else:
            log.info("call_rejected_by_application", call_id=call_id, provider=provider, reject=refused)

    def give_back_admission(self, call_id: str) -> None:
        """A call admitted, then refused after all (no engine took it, the registry failed): its slot goes back,
        here and in the fleet's count."""
        if self._host.admission.give_back(call_id) and self._host.settings.server.max_calls_fleet is not None:
            self._host.spawn(self._host.release_fleet_slot(call_id))

    async def _serves(self, call_id: str) -> bool:
        """The call is this process's and not over (its stream is up, or its session waits for the next one)."""
        return call_id in self._host.active_calls or await self._known_and_not_over(call_id)

    async def moving_elsewhere(self, call_id: str) -> bool:
        """Draining, a carrier's webhook for a call the fleet knows — its stream's reconnect, the stream moved off
        this process or another (``drain``): True where another host's process can resume it (``drains_in_place``),
        so the webhook's answer keeps the call going rather than refuse it, which would end a call that is only
        moving. Carriers that can be redirected get a short pause and a redirect back through the load
        balancer; those whose webhook is their only reconnect, a new stream to the public URL. False when not draining, for a call the registry does not know (a new call: refused) or has ended,
        and when the registry cannot be reached."""
        if not self._host.draining or self._host.drains_in_place:
            return False
        try:
            return await self._known_and_not_over(call_id)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)
            return False

    async def bounces_new_call(self, call_id: str) -> bool:
        """Draining in a fleet (the registry spans hosts), a new call's answer webhook: True for its first
        ``DRAIN_NEW_CALL_BOUNCES`` arrivals at draining processes, counted fleet-wide in the registry, so that it is
        sent back through the load balancer (as a moving call is) rather than refused busy. The load balancer
        takes a draining process out only at its next readiness check; calls answered meanwhile would otherwise be
        refused during every deploy. Past the bound (every process draining, or no load balancer in front), busy.
        Raises ``RegistryUnavailable``."""
        if not self._host.draining or self._host.drains_in_place:
            return False
        return await self._host.registry.count(call_id, "drain_bounces", keep_ms=_DRAIN_BOUNCES_KEPT_MS) <= DRAIN_NEW_CALL_BOUNCES

    async def _known_and_not_over(self, call_id: str) -> bool:
        """The registry has the call, and not as ended (raises ``RegistryUnavailable``)."""
        record = await self._host.registry.get(call_id)
        return record is not None and record.ended_reason is None


@dataclass(slots=True)
class _Asked:
    """What one answer's decision learnt of the application (``decide_answer``)."""

    context: CallContext
    preset: AssistantConfig | None = None
    """A placed call's own assistant (its request's): the application is not asked."""
    detection: MachineDetection | None = None
    """A placed call's machine detection (its request's)."""
    setup: CallSetup | None = None
    refused: Rejection | TransferTo | None = None
    """What the application made of the call where it did not answer it: a refusal, or where to send it."""
