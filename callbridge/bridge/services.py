"""What one bridge process shares between its calls: configuration, the engine, the call registry, the
stream tokens, metrics, the carriers' REST clients, and the answer desk every carrier asks (``answer_desk``)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import structlog

from callbridge.application.hooks import AssistantSource
from callbridge.bridge.actions import (
    ActionResult,
    CallActionPerformer,
    CarrierCallAction,
    SendDtmf,
)
from callbridge.bridge.admission import AdmissionBook
from callbridge.bridge.answer_desk import AnswerDesk
from callbridge.bridge.answer_sessions import AnswerSessions
from callbridge.bridge.app_events import EventDelivery
from callbridge.bridge.console_journal import CallJournal
from callbridge.bridge.cpu import CpuMeter
from callbridge.bridge.dialer import Dialer
from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.fleet import (
    FLEET_HOLD_MS,
    CallSignals,
    LiveStream,
    LoadBalancerGate,
    SignalHandler,
    drain_streams,
)
from callbridge.bridge.log_budget import LogBudget
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
from callbridge.bridge.stream_services import HangUpFn
from callbridge.carriers.spec import Capabilities
from callbridge.config import Settings
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
UNKNOWN_EVENT_NAMES: Final = 64
"""Distinct (carrier, event type) pairs a process counts by name; any others count as ``other``."""
_EVENT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


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
    desk: AnswerDesk = field(init=False)
    """What every carrier asks before it answers a call or takes a stream (``AnswerDesk``)."""
    signals: CallSignals = field(init=False)
    """Other processes' word on calls whose stream is here, and this one's to them."""
    answer_sessions: AnswerSessions | None = None
    """Engine sessions opened at the answer webhook (``engine.open_at_answer``); None: each stream opens its own."""
    replays: ReplayGuard = field(init=False)
    """Which signed webhooks were taken already (fleet-wide with a shared registry): a replay is refused."""
    events: EventDelivery | None = None
    """Call events to the application (an application that takes them) and the console's journal; None: none are
    built."""
    journal: CallJournal | None = None
    """The console's journal of calls in the registry (``console`` configured)."""
    recordings: RecordingStore | None = None
    """Where recorded calls are written (``[recording]``; built by the app)."""
    assistants: AssistantSource | None = None
    """The application that chooses each new call's assistant (``[app]``); None: every call gets the configured one."""
    dialer: Dialer | None = None
    """The calls the agent places (``POST /calls``; built by the app)."""
    unknown_events: set[tuple[str, str]] = field(default_factory=set)
    """(carrier, event type) pairs seen here that no codec knows, each logged once and counted by name (at most
    ``UNKNOWN_EVENT_NAMES``)."""
    refusal_log: LogBudget = field(default_factory=LogBudget)
    """How many refused streams' lines reach the log (``bridge/log_budget.py``)."""

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
        self.signals.on(SignalKind.STREAM_BOUND, self._bound_elsewhere, bookkeeping=True)
        self.signals.on(SignalKind.CALL_ENDED, self._ended_elsewhere, bookkeeping=True)
        self.admission = AdmissionBook(server.max_calls, server.cpu_budget_percent or 0.0, self.settings.engine.open_at_answer_ttl_s)
        self.desk = AnswerDesk(self)
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

    async def call_ended_by_carrier(self, call_id: str, reason: EndCause) -> None:
        """A carrier's webhook says the call is over (a hang-up callback, a
        ``completed`` event), where its media socket says nothing: the live stream ends as on a ``stop`` (the engine
        session closes, not kept for a resume), and a later stream or redirect for the call is refused."""
        if self.answer_sessions is not None:  # hung up while it rang: the session opened at its answer goes too
            self.answer_sessions.discard(call_id, "call_ended")
        stream = self.live_streams.get(call_id)
        closed = False
        self._rang_out(call_id)
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

    def call_over(self, call_id: str) -> None:
        """The call has ended (not only its stream): it no longer counts against the fleet's limit, nor, placed here,
        against its carrier's outbound calls."""
        if self.settings.server.max_calls_fleet is not None:
            self.spawn(self.release_fleet_slot(call_id))
        if self.dialer is not None:
            self.dialer.call_over(call_id)

    async def release_fleet_slot(self, call_id: str) -> None:
        try:
            await self.registry.release(call_id)
        except RegistryUnavailable as exc:  # it lapses with its hold
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)

    async def hold_fleet_admissions(self) -> None:
        """With ``server.max_calls_fleet``: keep this process's bridged calls counted in the fleet (every third of
        ``FLEET_HOLD_MS``), so that those of a process that died lapse. A call admitted whose stream has not come is
        not held on: its admission's hold is its answer's time to live (``engine.open_at_answer_ttl_s``)."""
        while True:
            await asyncio.sleep(FLEET_HOLD_MS / 3000)
            await self._hold_in_fleet(list(self.admission.bridged))

    async def _hold_in_fleet(self, call_ids: list[str]) -> None:
        try:
            await self.registry.hold(call_ids, FLEET_HOLD_MS)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)

    def call_bound(self, call_id: str) -> None:
        """A stream bound the call's engine session here: it counts as bridged (no longer as admitted). A call this
        process did not admit was answered by another, which still holds a slot for it: told to let it go."""
        if not self.admission.knows(call_id):
            self.spawn(self.signals.send(call_id, SignalKind.STREAM_BOUND, ""))
        self.admission.bound(call_id)
        if self.settings.server.max_calls_fleet is not None:  # counted from now as a call, not an answer's slot
            self.spawn(self._hold_in_fleet([call_id]))

    async def _bound_elsewhere(self, signal: CallSignal) -> None:
        """Another process bound the stream of a call admitted here: the slot it held goes (not the fleet's count,
        which that process keeps)."""
        self.admission.give_back(signal.call_id)

    async def _ended_elsewhere(self, signal: CallSignal) -> None:
        """Another process's webhook says a call is over (``call_ended_by_carrier`` there)."""
        self._rang_out(signal.call_id)

    def _rang_out(self, call_id: str) -> None:
        """The call is over: where its answer was admitted here and no stream came yet (the caller hung up while it
        rang), the slot goes back now, not at its time to live (``engine.open_at_answer_ttl_s``), here and in the
        fleet's count. A call bridged here keeps its slot until its stream ends."""
        self.desk.give_back_admission(call_id)

    def call_unbound(self, call_id: str) -> None:
        """The call's stream here ended: it no longer counts as bridged here (it may go on elsewhere)."""
        self.admission.unbound(call_id)

