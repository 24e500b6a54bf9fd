"""What one bridge process shares between its calls: configuration, the engine, the call registry, the
stream tokens, metrics and the carriers' REST clients."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

import structlog

from callbridge.application import AssistantConfig, CallContext
from callbridge.application.events import CallEvent
from callbridge.application.hooks import AssistantSource
from callbridge.bridge.actions import (
    ActionResult,
    CallActionPerformer,
    CarrierCallAction,
    SendDtmf,
)
from callbridge.bridge.admission import AdmissionBook, Refusal
from callbridge.bridge.answer_policy import AnswerDecision, AnswerFact, AnswerKind, answer_step
from callbridge.bridge.answer_sessions import AnswerSessions
from callbridge.bridge.app_events import EventDelivery
from callbridge.bridge.call_config import session_config
from callbridge.bridge.call_setup import SETUP_NOTE, CallSetup, Chosen, Rejection, TransferTo, setup_kept_ms
from callbridge.bridge.cpu import CpuMeter
from callbridge.bridge.fleet import (
    DRAIN_NEW_CALL_BOUNCES,
    FLEET_HOLD_MS,
    CallSignals,
    LiveStream,
    LoadBalancerGate,
    SignalHandler,
    drain_streams,
)
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.pacing import PacingClock
from callbridge.bridge.recording_store import RecordingStore
from callbridge.bridge.registry import (
    CallRegistry,
    CallSignal,
    RegistryUnavailable,
    SignalKind,
    StreamTokens,
)
from callbridge.bridge.replay import REPLAY_WINDOW_S, ReplayGuard
from callbridge.carriers.spec import Capabilities
from callbridge.config import Settings, model_calls_tools
from callbridge.engine.errors import EngineError
from callbridge.engine.pool import EnginePool
from callbridge.engine.port import (
    DuplexEngine,
    ResumeTicket,
)
from callbridge.logging import get_logger

__all__ = [
    "BridgeServices",
    "CarrierRest",
    "HangUpFn",
]

log = get_logger(__name__)

_ENGINE_CALL_TIMEOUT_S = 5.0
_GOODBYE_WAIT_S = 3.0
"""How long a drain that ran out waits for its calls' closing tones and hang-ups."""
_ANSWER_ENGINE_WAIT_S = 2.0
"""How long an answer webhook waits to learn whether the engine takes the call (busy if it refuses)."""
UNKNOWN_EVENT_NAMES: Final = 64
"""Distinct (carrier, event type) pairs a process counts by name; any others count as ``other``."""
_EVENT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_DRAIN_BOUNCES_KEPT_MS = 60_000

HangUpFn = Callable[[str, str, str | None, str], Awaitable[None]]
"""``hang_up(provider, call_id, account_id, reason)``: end the phone call through the carrier."""


class CarrierRest(Protocol):
    """A carrier's REST API, as far as the bridge uses it (each carrier's ``Carrier.rest`` builds one)."""

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call; one that has already ended counts as done. Raises on failure."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class BridgeServices:
    settings: Settings
    engine: DuplexEngine
    registry: CallRegistry
    tokens: StreamTokens
    metrics: BridgeMetrics
    hang_up: HangUpFn
    draining: bool = False
    lb_gate: LoadBalancerGate | None = None
    """Draining: when the load balancer has taken this process out, so that its calls may move (``drain``)."""
    moving_calls: bool = False
    """Draining: the gate opened, calls are being moved."""
    admission: AdmissionBook = field(init=False)
    """The calls held here against ``server.max_calls``: bridged, and admitted whose stream is still to come."""
    live_streams: dict[str, LiveStream] = field(default_factory=dict)
    """call id → the stream serving it here, once bound to its engine session."""
    carrier_state: dict[str, object] = field(default_factory=dict)
    """What a carrier keeps per bridge process beside its routes (a call-control client's state), by carrier."""
    background: set[asyncio.Task[None]] = field(default_factory=set)
    """Tasks that outlive the stream that started them (closing a session nobody came back for)."""
    action_performers: dict[str, CallActionPerformer] = field(default_factory=dict)
    """carrier → what transfers its calls and sends DTMF on them (its REST client, the SIP listener)."""
    carrier_capabilities: dict[str, Capabilities] = field(default_factory=dict)
    """carrier → what its spec says it can do on a live call (the agent's actions are offered by these)."""
    carrier_rests: dict[str, CarrierRest] = field(default_factory=dict)
    """carrier → its REST client (the app's, one per process), for a carrier's webhooks that call its API."""
    pacing: PacingClock = field(default_factory=PacingClock)
    """The one timer that wakes every call's pacer."""
    cpu: CpuMeter = field(default_factory=CpuMeter)
    """The process's CPU use (sampled by the app), for ``server.cpu_budget_percent``."""
    signals: CallSignals = field(init=False)
    """Other processes' word on calls whose stream is here, and this one's to them."""
    answer_sessions: AnswerSessions | None = None
    """Engine sessions opened at the answer webhook (``engine.open_at_answer``); None: each stream opens its own."""
    replays: ReplayGuard = field(init=False)
    """Which signed webhooks were taken already (fleet-wide with a shared registry): a replay is refused."""
    events: EventDelivery | None = None
    """Call events to the application (an application that takes them); None: none are built."""
    recordings: RecordingStore | None = None
    """Where recorded calls are written (``[recording]``; built by the app)."""
    assistants: AssistantSource | None = None
    """The application that chooses each new call's assistant (``[app]``); None: every call gets the configured one."""
    unknown_events: set[tuple[str, str]] = field(default_factory=set)
    """(carrier, event type) pairs seen here that no codec knows, each logged once and counted by name (at most
    ``UNKNOWN_EVENT_NAMES``)."""

    async def perform_action(self, provider: str, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """The agent's transfer or DTMF on a call, by its carrier; ``unsupported`` where the carrier's spec says it
        has no way (``Capabilities.dtmf_out`` / ``transfer``) or nothing here performs it."""
        dtmf = isinstance(action, SendDtmf)
        able = self.carrier_capabilities.get(provider)
        performer = self.action_performers.get(provider)
        if performer is None or able is None or not (able.dtmf_out if dtmf else able.transfer):
            return ActionResult.unsupported(provider, "send DTMF" if dtmf else "be transferred")
        return await performer.perform(call_id, account_id, action)

    def unknown_carrier_event(self, provider: str, event: str, call_log: structlog.stdlib.BoundLogger) -> None:
        """A carrier sent an event type no codec here knows (one it added since): the call goes on; the type is
        counted (``callbridge_unknown_events_total``) and logged the first time this process sees it. The name
        comes off the wire, unauthenticated: names past ``UNKNOWN_EVENT_NAMES``, or not name-like, count as
        ``other`` (logged once too), so nobody can grow the metric's series or the log without bound."""
        key = (provider, event)
        if key not in self.unknown_events and (len(self.unknown_events) >= UNKNOWN_EVENT_NAMES or not _EVENT_NAME.fullmatch(event)):
            key = (provider, "other")
        if key not in self.unknown_events:
            self.unknown_events.add(key)
            call_log.warning("unknown_carrier_event", event_type=key[1], detail="ignored; the call goes on (logged once per type)")
        self.metrics.unknown_events.labels(*key).inc()

    def __post_init__(self) -> None:
        server = self.settings.server
        self.signals = CallSignals(self.registry, self.live_streams, self.spawn)
        self.signals.on(SignalKind.STREAM_BOUND, self._bound_elsewhere)
        self.admission = AdmissionBook(server.max_calls, server.cpu_budget_percent or 0.0, self.settings.engine.open_at_answer_ttl_s)
        max_call_s = self.settings.server.max_call_duration_s
        self.replays = ReplayGuard(self.registry, self.metrics.webhook_replay_checks, max_call_s or REPLAY_WINDOW_S)
        engine = self.settings.engine
        if engine.open_at_answer == "on" or (engine.open_at_answer == "auto" and not self.registry.shared):
            self.answer_sessions = AnswerSessions(self.engine, engine.open_at_answer_ttl_s)

    @property
    def process_id(self) -> str:
        """Names this process in the signals it sends (``CallSignal.origin``)."""
        return self.signals.process_id

    @property
    def active_calls(self) -> set[str]:
        """Calls whose stream is bridged here."""
        return self.admission.bridged

    @property
    def registry_shared(self) -> bool:
        """The registry is shared with other processes (Redis), which can resume this one's calls; the memory
        registry is one process's alone."""
        return self.registry.shared

    @property
    def parks_at_answer(self) -> bool:
        """``engine.open_at_answer`` auto with a shared registry: the session opened at the answer is parked in the
        registry (detached, with its ticket), so the call's stream resumes it on whichever process it reaches."""
        return self.settings.engine.open_at_answer == "auto" and self.registry_shared

    async def decide_answer(
        self, call_id: str, provider: str, *, retries: bool = True, context: CallContext | None = None
    ) -> AnswerDecision:
        """A carrier's answer webhook for ``call_id``, decided the one way every carrier answers
        (``answer_policy.answer_step``: over already → hang up; draining, and another process can resume it
        (``retries``: the carrier can be sent back through the load balancer) → retry elsewhere; not admitted, or
        no engine takes it → busy; else answer with a fresh stream token). This finds out each fact the policy
        asks for. A registry that does not answer is a busy refusal too, logged as a warning: the caller hears
        busy rather than the carrier's "application error". With an application (``[app]``), a new call admitted is
        its to answer or refuse (``choose_assistant``, from ``context``: what the carrier's webhook said), and its
        engine session opens with the assistant chosen."""
        facts: dict[AnswerFact, bool] = {}
        asked = _Asked(context or CallContext(call_id=call_id, carrier=provider))
        asks_application = self.assistants is not None
        try:
            while isinstance(
                step := answer_step(facts, retries=retries, draining=self.draining, asks_application=asks_application), AnswerFact
            ):
                facts[step] = await self._answer_fact(step, call_id, asked)
            if asked.refused is not None:  # refused, or sent on (it leaves without a stream)
                self.not_answered_by_application(call_id, provider, asked.refused)
                return replace(step, target=asked.refused.target) if isinstance(asked.refused, TransferTo) else step
            if step.kind is AnswerKind.ANSWER:
                return AnswerDecision(AnswerKind.ANSWER, token=await self.tokens.mint(call_id))
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
                chosen = kept if kept is not None else await self.choose_assistant(asked.context)
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
                return await self.registry.ended_reason(call_id) is not None
            case AnswerFact.MOVING_ELSEWHERE:
                return await self.moving_elsewhere(call_id)
            case AnswerFact.NEW_CALL_BOUNCES:
                return await self.bounces_new_call(call_id)
            case AnswerFact.ADMITTED:
                return await self.admits(call_id)
            case AnswerFact.ENGINE_TAKES:
                return await self.engine_takes(call_id, asked.setup.assistant if asked.setup is not None else None)

    async def choose_assistant(self, context: CallContext) -> Chosen:
        """Ask the application for the call's assistant (``AssistantSource``: under ``app.assistant_timeout_s``,
        standing in for a slow or failing one); keep the setup in the registry for the call's streams. Else how the
        application refused the call. Logged with the call's context (its first log line), and counted."""
        assert self.assistants is not None
        outcome = await self.assistants.request(context)
        reply = outcome.reply
        label = "rejected" if reply.reject is not None else "transferred" if reply.transfer is not None else outcome.source
        self.metrics.assistant_requests.labels(label, outcome.failure or "").inc()
        fields = dict(context.log_fields(), source=outcome.source, elapsed_ms=outcome.elapsed_ms)
        if outcome.failure is not None:
            log.warning("assistant_fallback", call_id=context.call_id, failure=outcome.failure, detail=outcome.detail[:300],
                        on_failure=self.assistants.on_failure, **fields)  # fmt: skip
        else:
            log.info("assistant_chosen", call_id=context.call_id, reject=reply.reject, transfer=reply.transfer, **fields)
        if reply.transfer is not None:
            return TransferTo(reply.transfer)
        if reply.assistant is None:
            return reply.reject or "busy"
        if reply.assistant.tools and not model_calls_tools(self.settings.engine):
            log.warning("assistant_tools_left_out", call_id=context.call_id, tools=[tool.name for tool in reply.assistant.tools],
                        reason="the engine's model cannot call tools (engine.tools)")  # fmt: skip
        setup = CallSetup(context=context, assistant=reply.assistant, source=outcome.source, chosen_at=time.time())
        if self.events is not None:  # the application hears of the call before its media flows (``call.answered``)
            self.events.emit(context, CallEvent(type="call.started", call_id=context.call_id, at=setup.chosen_at, seq=0))
        try:
            await self.registry.keep_note(
                context.call_id, SETUP_NOTE, setup.model_dump_json(), setup_kept_ms(self.settings.server.max_call_duration_s)
            )
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=context.call_id)
        return setup

    async def call_setup(self, call_id: str) -> CallSetup | None:
        """The setup kept for the call where it was answered (``choose_assistant``), or None (none kept: no
        application, or the registry lost it). Raises ``RegistryUnavailable``."""
        if self.assistants is None:
            return None
        kept = await self.registry.note(call_id, SETUP_NOTE)
        return CallSetup.model_validate_json(kept) if kept is not None else None

    async def engine_takes(self, call_id: str, assistant: AssistantConfig | None = None) -> bool:
        """A carrier's answer webhook admitted the call: open its engine session now, for its stream to take
        (``engine.open_at_answer``), and say whether the engine took it. False when the engine refused it
        (``resource_exhausted`` from every endpoint, none reachable): the carrier gets its busy refusal rather than
        a call answered and dropped a moment later. True when it took it, when the open is still on its way after
        ``_ANSWER_ENGINE_WAIT_S`` (the stream opens or takes it), and where nothing is opened at the answer (a
        reconnect of a call known here or in the fleet; ``open_at_answer`` off). With a shared registry the session
        is parked there (``parks_at_answer``); with the memory one, kept here (``AnswerSessions``)."""
        if self.draining or (self.answer_sessions is None and not self.parks_at_answer):
            return True
        try:
            if await self.registry.get(call_id) is not None:
                return True
        except RegistryUnavailable:
            return True
        if self.answer_sessions is not None:
            self.answer_sessions.open(call_id, session_config(self.settings, assistant))
            refused = await self.answer_sessions.refusal(call_id, _ANSWER_ENGINE_WAIT_S)
        else:
            refused = await self._open_parked(call_id, assistant)
        if refused is None:
            return True
        self.metrics.admission_refused.labels(Refusal.ENGINE.value).inc()
        log.warning("admission_refused", reason="engine", call_id=call_id, code=refused.code, detail=refused.message)
        return False

    async def _open_parked(self, call_id: str, assistant: AssistantConfig | None) -> EngineError | None:
        """Open the call's session and park it in the shared registry for its stream; the engine's refusal, else
        None (parked, or slow: the stream then opens its own). A parked session no stream claims within
        ``engine.open_at_answer_ttl_s`` is closed."""
        try:
            session = await asyncio.wait_for(self.engine.open(session_config(self.settings, assistant)), _ANSWER_ENGINE_WAIT_S)
        except EngineError as refused:
            return refused
        except TimeoutError:
            return None
        try:
            ticket = replace(await session.detach(), at_answer=True)
            await self.registry.detach(call_id, ticket, 0, int(self.settings.engine.disconnect_grace_s * 1000))
        except (EngineError, RegistryUnavailable) as exc:
            log.warning("answer_session_not_parked", call_id=call_id, error=repr(exc))
            with suppress(EngineError):
                await session.close("not_parked")
            return None
        self.spawn(self._close_unclaimed(call_id, ticket))
        return None

    async def _close_unclaimed(self, call_id: str, ticket: ResumeTicket) -> None:
        await asyncio.sleep(self.settings.engine.open_at_answer_ttl_s)
        with suppress(RegistryUnavailable):
            if await self.close_detached(call_id, "not_claimed", ticket, mark_ended=False):
                log.info("answer_session_closed", call_id=call_id, reason="not_claimed")

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, held until done; cancelled at shutdown (``aclose_background``)."""
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def aclose_background(self) -> None:
        if self.answer_sessions is not None:
            await self.answer_sessions.aclose()
        await self.signals.aclose()
        for task in self.background:
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)

    def on_signal(self, kind: SignalKind, handler: SignalHandler) -> None:
        """Have ``handler`` take the signals of ``kind`` other processes send (a carrier's router registers)."""
        self.signals.on(kind, handler)

    def start_listening(self) -> None:
        """Take the signals other processes send about calls whose stream is here (the app's lifespan); with a
        fleet limit, keep this process's calls counted there."""
        if self.signals.listener is None:
            self.signals.start()
            if self.settings.server.max_calls_fleet is not None:
                self.spawn(self.hold_fleet_admissions())

    async def send_signal(self, call_id: str, kind: SignalKind, detail: str) -> None:
        """Tell the other processes what a carrier's webhook said here (``CallSignals.send``: best effort)."""
        await self.signals.send(call_id, kind, detail)

    async def digit_from_carrier(self, call_id: str, digit: str) -> None:
        """A carrier's webhook says the caller pressed ``digit`` (a gather callback), where its media
        socket carries no digits: the call's stream takes it as a digit on the wire, here or, by signal, on the
        process that holds it."""
        stream = self.live_streams.get(call_id)
        if stream is not None:
            await stream.digit_by_carrier(digit)
        else:
            await self.send_signal(call_id, SignalKind.DTMF, digit)

    async def call_ended_by_carrier(self, call_id: str, reason: str) -> None:
        """A carrier's webhook says the call is over (a hang-up callback, a
        ``completed`` event), where its media socket says nothing: the live stream ends as on a ``stop`` (the engine
        session closes, not kept for a resume), and a later stream or redirect for the call is refused."""
        if self.answer_sessions is not None:  # hung up while it rang: the session opened at its answer goes too
            self.answer_sessions.discard(call_id, "call_ended")
        stream = self.live_streams.get(call_id)
        closed = False
        if stream is not None:
            await stream.end_by_carrier(reason)
        else:  # the engine hears what a stop would tell it; the registry keeps the carrier's reason
            closed = await self.close_detached(call_id, "call_ended")
        if closed or await self.registry.ended_reason(call_id) is None:
            await self.registry.mark_ended(call_id, reason)
        if stream is None and not closed:  # its stream may be live on another process: it ends there, now
            await self.send_signal(call_id, SignalKind.CALL_ENDED, reason)

    async def close_parked(self, ticket: ResumeTicket, reason: str) -> bool:
        """Close a detached session by its ticket (resume it, then close). False when it is expired or gone already,
        or the engine does not answer: its grace ends it."""
        try:
            session = await asyncio.wait_for(self.engine.resume(ticket), _ENGINE_CALL_TIMEOUT_S)
            await asyncio.wait_for(session.close(reason), _ENGINE_CALL_TIMEOUT_S)
        except (EngineError, TimeoutError):
            return False
        return True

    async def close_detached(self, call_id: str, reason: str, ticket: ResumeTicket | None = None, *, mark_ended: bool = True) -> bool:
        """Close the engine session a call left detached (waiting for its next stream) now that the call is over,
        rather than leave it to the engine's grace. With ``ticket``: only if that is still the one waiting (no
        stream has come back since). True when a session was closed (and, with ``mark_ended``, the call marked
        over)."""
        waiting, _ = await self.registry.claim_ticket(call_id, ticket)
        if waiting is None or not await self.close_parked(waiting, reason):
            return False
        if mark_ended:
            await self.registry.mark_ended(call_id, reason)
        return True

    async def unready_because(self) -> str | None:
        """Why this process should be sent no new call now (``/readyz`` 503), or None: it is draining; its
        registry does not answer (a new call could not be recorded); or no engine endpoint is in service (every
        one ejected, or drained by the operator), so every new call would be refused."""
        if self.draining:
            return "draining"
        if not await self.registry.reachable():
            return "registry_unavailable"
        engine = self.engine  # an engine pool (``engine.kind = "realtime"``) knows its endpoints
        if isinstance(engine, EnginePool) and not any(endpoint.state == "healthy" for endpoint in engine.status()):
            return "no_engine"
        return None

    @property
    def drains_in_place(self) -> bool:
        """A drain moves calls only where a process of another host can resume them (Redis: a fleet). A lone
        process (the memory registry: the quick start, one container) and a ``serve --workers`` group without Redis
        (which drains as a whole) serve their calls on to their end instead: moved, their carrier's reconnect
        would only come back here and be refused."""
        return not self.registry.spans_hosts

    async def drain(self, timeout_s: float) -> None:
        """SIGTERM: admit no new call (``/readyz`` turns 503 with ``draining``); with a shared registry, move every
        running call whose carrier reconnects to another process (``LiveStream.move_elsewhere``); wait up to
        ``timeout_s`` for the others to end. A lone process (``drains_in_place``) keeps serving its calls, and
        ends those still up at the timeout with the closing tone and the carrier's hang-up
        (``fleet.drain_streams``)."""
        server = self.settings.server
        self.lb_gate = LoadBalancerGate(time.monotonic(), server.drain_lb_checks, server.drain_lb_wait_s)
        self.draining = True
        log.info("bridge_draining", active_calls=len(self.active_calls), timeout_s=timeout_s, in_place=self.drains_in_place)
        await drain_streams(
            self.live_streams, lambda: len(self.active_calls),
            in_place=self.drains_in_place, timeout_s=timeout_s, goodbye_s=_GOODBYE_WAIT_S, may_move=self._may_move,
        )  # fmt: skip

    def _may_move(self) -> bool:
        """Draining: whether the load balancer has taken this process out (``LoadBalancerGate``), logged once."""
        gate = self.lb_gate
        if gate is None or self.moving_calls:
            return self.moving_calls
        self.moving_calls = gate.taken_out(time.monotonic())
        if self.moving_calls:
            log.info("drain_moving_calls", because=gate.reason, readiness_answers=gate.unready_answers, calls=len(self.live_streams))
        return self.moving_calls

    def readiness_answered(self, reason: str | None) -> None:
        """``/readyz`` answered a check: draining, that answer is what takes this process out of the load balancer."""
        if reason == "draining" and self.lb_gate is not None:
            self.lb_gate.answered_unready(time.monotonic())

    async def admits(self, call_id: str) -> bool:
        """Whether a call may be answered now: not draining, and under ``server.max_calls`` (``AdmissionBook``: a
        call admitted is held at once) and ``server.max_calls_fleet`` — unless the call is already known (a stream
        coming back, here or from another process)."""
        if self.draining:  # a lone process still serves its own calls: one whose socket dropped may come back
            return self.drains_in_place and await self._serves(call_id)
        server, now = self.settings.server, time.monotonic()
        # what the process will use carrying every call it holds and this one (``CpuMeter.projected``); while it has
        # measured few calls, a call is taken to cost about what ``max_calls`` sized it at
        guess = server.cpu_budget_percent / 100 / server.max_calls
        cpu_percent = self.cpu.projected(self.admission.held(now) + 1, guess) * 100
        known_here = self.admission.knows(call_id)
        refusal = self.admission.take(call_id, now, cpu_percent)
        fleet_limit = self.settings.server.max_calls_fleet
        if refusal is None and not known_here and call_id and fleet_limit is not None:
            try:
                if not await self.registry.admit(call_id, fleet_limit, FLEET_HOLD_MS):
                    refusal = Refusal.MAX_CALLS_FLEET
            except RegistryUnavailable:
                self.admission.give_back(call_id)
                raise
        if refusal is None or await self.registry.get(call_id) is not None:  # a call coming back is never refused
            return True
        self.admission.give_back(call_id)
        self.metrics.admission_refused.labels(refusal.value).inc()
        log.warning(
            "admission_refused",
            reason=refusal.value,
            cpu_percent=round(self.cpu.utilization * 100, 1),
            projected_cpu_percent=round(cpu_percent, 1),
            calls=len(self.active_calls),
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
        if self.admission.give_back(call_id) and self.settings.server.max_calls_fleet is not None:
            self.spawn(self._release(call_id))

    def call_over(self, call_id: str) -> None:
        """The call has ended (not only its stream): it no longer counts against the fleet's limit."""
        if self.settings.server.max_calls_fleet is not None:
            self.spawn(self._release(call_id))

    async def _release(self, call_id: str) -> None:
        try:
            await self.registry.release(call_id)
        except RegistryUnavailable as exc:  # it lapses with its hold
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)

    async def hold_fleet_admissions(self) -> None:
        """With ``server.max_calls_fleet``: keep this process's calls counted in the fleet (every third of
        ``FLEET_HOLD_MS``), so that those of a process that died lapse."""
        while True:
            await asyncio.sleep(FLEET_HOLD_MS / 3000)
            try:
                await self.registry.hold(self.admission.holding(), FLEET_HOLD_MS)
            except RegistryUnavailable as exc:
                log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)

    def call_bound(self, call_id: str) -> None:
        """A stream bound the call's engine session here: it counts as bridged (no longer as admitted). A call this
        process did not admit was answered by another, which still holds a slot for it: told to let it go."""
        if not self.admission.knows(call_id):
            self.spawn(self.signals.send(call_id, SignalKind.STREAM_BOUND, ""))
        self.admission.bound(call_id)

    async def _bound_elsewhere(self, signal: CallSignal) -> None:
        """Another process bound the stream of a call admitted here: the slot it held goes (not the fleet's count,
        which that process keeps)."""
        self.admission.give_back(signal.call_id)

    def call_unbound(self, call_id: str) -> None:
        """The call's stream here ended: it no longer counts as bridged here (it may go on elsewhere)."""
        self.admission.unbound(call_id)

    async def _serves(self, call_id: str) -> bool:
        """The call is this process's and not over (its stream is up, or its session waits for the next one)."""
        return call_id in self.active_calls or await self._known_and_not_over(call_id)

    async def moving_elsewhere(self, call_id: str) -> bool:
        """Draining, a carrier's webhook for a call the fleet knows — its stream's reconnect, the stream moved off
        this process or another (``drain``): True where another host's process can resume it (``drains_in_place``),
        so the webhook's answer keeps the call going rather than refuse it, which would end a call that is only
        moving. Carriers that can be redirected get a short pause and a redirect back through the load
        balancer; those whose webhook is their only reconnect, a new stream to the public URL. False when not draining, for a call the registry does not know (a new call: refused) or has ended,
        and when the registry cannot be reached."""
        if not self.draining or self.drains_in_place:
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
        if not self.draining or self.drains_in_place:
            return False
        return await self.registry.count(call_id, "drain_bounces", keep_ms=_DRAIN_BOUNCES_KEPT_MS) <= DRAIN_NEW_CALL_BOUNCES

    async def _known_and_not_over(self, call_id: str) -> bool:
        """The registry has the call, and not as ended (raises ``RegistryUnavailable``)."""
        record = await self.registry.get(call_id)
        return record is not None and record.ended_reason is None


@dataclass(slots=True)
class _Asked:
    """What one answer's decision learnt of the application (``decide_answer``)."""

    context: CallContext
    setup: CallSetup | None = None
    refused: Rejection | TransferTo | None = None
    """What the application made of the call where it did not answer it: a refusal, or where to send it."""
