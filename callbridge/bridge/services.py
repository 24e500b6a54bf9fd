"""What one bridge process shares between its calls: configuration, the engine, the call registry, the
stream tokens, metrics and the carriers' REST clients."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from callbridge.bridge.actions import (
    ActionResult,
    CallActionPerformer,
    CarrierCallAction,
    SendDtmf,
    telephony_tools,
)
from callbridge.bridge.answer_policy import AnswerDecision, AnswerFact, AnswerKind, answer_step
from callbridge.bridge.answer_sessions import AnswerSessions
from callbridge.bridge.call import CallOptions, DtmfMode
from callbridge.bridge.cpu import CpuMeter
from callbridge.bridge.pacing import PacingClock
from callbridge.bridge.registry import (
    CallRegistry,
    CallSignal,
    MemoryCallRegistry,
    RegistryUnavailable,
    SignalKind,
    StreamTokens,
)
from callbridge.bridge.replay import REPLAY_WINDOW_S, ReplayGuard
from callbridge.config import Settings
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.pool import EnginePool
from callbridge.engine.port import (
    DuplexEngine,
    ResumeTicket,
    SessionConfig,
    TurnDetection,
)
from callbridge.logging import get_logger

__all__ = [
    "BridgeMetrics",
    "BridgeServices",
    "CarrierRest",
    "FLEET_HOLD_MS",
    "HangUpFn",
    "LiveStream",
    "SignalHandler",
    "build_engine",
    "call_options",
    "session_config",
]

log = get_logger(__name__)

_ENGINE_CALL_TIMEOUT_S = 5.0
FLEET_HOLD_MS = 30_000
"""With ``server.max_calls_fleet``: how long a call counts in the fleet unless its process keeps it (every 10 s):
the calls of a process that died are let go then."""
_GOODBYE_WAIT_S = 3.0
"""How long a drain that ran out waits for its calls' closing tones and hang-ups."""
_ANSWER_ENGINE_WAIT_S = 2.0
"""How long an answer webhook waits to learn whether the engine takes the call (busy if it refuses)."""
UNKNOWN_EVENT_NAMES: Final = 64
"""Distinct (carrier, event type) pairs a process counts by name; any others count as ``other``."""
_EVENT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
DRAIN_NEW_CALL_BOUNCES = 3
"""How many times a new call that reached a draining process is sent back through the load balancer (each a
carrier's pause and redirect, about a second) before it is refused busy (``BridgeServices.bounces_new_call``)."""
_DRAIN_BOUNCES_KEPT_MS = 60_000

HangUpFn = Callable[[str, str, str | None, str], Awaitable[None]]
"""``hang_up(provider, call_id, account_id, reason)``: end the phone call through the carrier."""
SignalHandler = Callable[[CallSignal], Awaitable[None]]
"""What a carrier does here with another process's ``CallSignal`` (``BridgeServices.on_signal``)."""


class BridgeMetrics:
    """Prometheus metrics of one bridge process, in its own registry."""

    def __init__(self, registry: CollectorRegistry, *, memory_registry: bool = True, local_engine: bool = True) -> None:
        """``memory_registry``, ``local_engine``: the process's registry is its own (not Redis), its engine the
        embedded one. A level gauge that only they can answer is not exported otherwise (it would read a constant
        0 there, which is not the truth): the registry's detached sessions and entries, the engine's sessions."""
        # ``multiprocess_mode``: how a gauge adds up over ``--workers`` processes (``group_metrics``); else unused
        self.calls_active = Gauge(
            "callbridge_calls_active", "Calls with a live media stream", ["provider"], registry=registry, multiprocess_mode="livesum"
        )
        self.calls_total = Counter("callbridge_calls_total", "Media streams ended, by how", ["provider", "end"], registry=registry)
        self.protocol_errors = Counter(
            "callbridge_carrier_protocol_errors_total", "Calls ended by invalid carrier input", ["provider", "reason"], registry=registry
        )
        self.stream_refused = Counter("callbridge_streams_refused_total", "Media streams not bridged", ["provider", "reason"], registry=registry)
        self.engine_sessions = Counter(
            "callbridge_engine_sessions_total", "Engine sessions bound to streams", ["how"], registry=registry
        )
        self.hangups = Counter("callbridge_hangups_total", "Hang-ups through carrier REST APIs", ["provider", "result"], registry=registry)
        self.stream_status = Counter(
            "callbridge_stream_status_total", "Carrier stream status callbacks", ["provider", "event"], registry=registry
        )
        self.audio_seconds = Counter(
            "callbridge_audio_seconds_total", "Audio bridged, counted as each stream ends", ["provider", "direction"],
            registry=registry,
        )  # fmt: skip
        self.frames_flushed = Counter(
            "callbridge_frames_flushed_total", "Agent frames dropped unsent by barge-in flushes", ["provider"], registry=registry
        )
        self.barge_ins = Counter("callbridge_barge_ins_total", "Barge-in flushes", ["provider"], registry=registry)
        self.late_audio_dropped = Counter(
            "callbridge_late_audio_dropped_total", "Engine audio deltas of an interrupted response, dropped", ["provider"],
            registry=registry,
        )  # fmt: skip
        self.engine_errors = Counter("callbridge_engine_errors_total", "Engine error events, by code", ["code"], registry=registry)
        self.sip_dropped = Counter(
            "callbridge_sip_dropped_total",
            "SIP datagrams and RTP packets dropped unanswered (garbage, strays, unexpected sources, late), by reason",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.sip_registration_state = Gauge(
            "callbridge_sip_registration_state", "1 for each SIP registration's current state (sip.registrations)",
            ["registration", "state"], registry=registry,
        )  # fmt: skip
        self.sip_registration_failures = Counter(
            "callbridge_sip_registration_failures_total", "REGISTERs that ended without a binding, by reason",
            ["registration", "reason"], registry=registry,
        )  # fmt: skip
        self.event_loop_lag_seconds = Histogram(
            "callbridge_event_loop_lag_seconds",
            "How late the event loop runs a timer (sampled twice a second): every call's pacing waits on it",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self.engine_failures = Counter(
            "callbridge_engine_failures_total",
            "Calls whose engine session failed mid-call (failure tone, then hang-up), by why (connection_failed: the "
            "server could not be reached within engine.reconnect_budget_s)",
            ["provider", "reason"], registry=registry,
        )  # fmt: skip
        self.call_actions = Counter(
            "callbridge_call_actions_total", "Carrier actions the agent asked for (transfer, DTMF), by result",
            ["provider", "action", "result"], registry=registry,
        )  # fmt: skip
        self.heard_corrections = Counter(
            "callbridge_heard_corrections_total", "Marker echoes that moved a call's playback model off the send clock",
            ["provider"], registry=registry,
        )  # fmt: skip
        self.playout_underruns = Counter(
            "callbridge_playout_underruns_total", "Agent audio that reached the carrier after its buffer ran dry mid-response",
            ["provider"], registry=registry,
        )  # fmt: skip
        self.mark_lag_seconds = Histogram(
            "callbridge_mark_lag_seconds",
            "Marker echo arrival after the moment its audio would have played, had the carrier played it as sent",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=registry,
        )
        self.message_seconds = Histogram(
            "callbridge_carrier_message_seconds",
            "Handling one inbound carrier message, sampled one in 50: parse, decode, resample, engine, what it sends",
            buckets=(0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05),
            registry=registry,
        )
        self.first_audio_seconds = Histogram(
            "callbridge_first_audio_to_engine_seconds",
            "A stream's first caller audio: read from the carrier to handed to the engine session (the engine's "
            "open or resume overlaps the reading; audio read before it is bound waits for it)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.unknown_events = Counter(
            "callbridge_unknown_events_total", "Carrier messages of an event type no codec here knows, ignored (the call goes on)",
            ["provider", "event"], registry=registry,
        )  # fmt: skip
        self.dtmf_received = Counter(
            "callbridge_dtmf_received_total", "Digits the caller pressed (RFC 4733, SIP INFO, carriers' dtmf events)", ["provider"],
            registry=registry,
        )  # fmt: skip
        self.webhook_replay_checks = Counter(
            "callbridge_webhook_replay_checks_total",
            "Signed webhooks checked for a replay: first (taken), replayed (refused 403), unchecked (registry away: taken)",
            ["provider", "result"], registry=registry,
        )  # fmt: skip
        self.admission_refused = Counter(
            "callbridge_admission_refused_total", "New calls refused by admission control, by limit", ["reason"], registry=registry
        )
        self.cpu_utilization = Gauge(
            "callbridge_cpu_utilization", "The process's CPU use as a share of one core, smoothed over 5 s", registry=registry,
            multiprocess_mode="liveall",  # admission's budget is per process: one series per worker (``pid``)
        )
        self.barge_in_clear_seconds = Histogram(
            "callbridge_barge_in_clear_seconds",
            "Engine interruption signal to carrier flush sent",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=registry,
        )
        # What the process holds, read at scrape time (``watch``): a leak shows as a level that never comes back.
        # With ``--workers``, each worker copies them into its files every second (``group_metrics``), summed.
        self.live_streams = Gauge("callbridge_live_streams", "Media streams bound to an engine session here", registry=registry, multiprocess_mode="livesum")
        in_memory, in_engine = (registry if memory_registry else None), (registry if local_engine else None)
        self.detached_sessions = Gauge(
            "callbridge_detached_sessions", "Engine sessions detached, waiting for their call's next stream (memory registry)",
            registry=in_memory, multiprocess_mode="livesum",
        )  # fmt: skip
        self.engine_sessions_open = Gauge(
            "callbridge_engine_sessions_open", "Engine sessions the bridge holds: live streams + detached (memory registry)",
            registry=in_memory, multiprocess_mode="livesum",
        )  # fmt: skip
        self.registry_entries = Gauge(
            "callbridge_registry_entries", "Calls the memory registry holds (live, detached, or recently ended)", registry=in_memory,
            multiprocess_mode="livesum",
        )
        self.local_engine_sessions = Gauge(
            "callbridge_local_engine_sessions", "Sessions the embedded engine holds (open or in their disconnect grace)",
            registry=in_engine, multiprocess_mode="livesum",
        )  # fmt: skip
        self.background_tasks = Gauge(
            "callbridge_background_tasks", "Tasks that outlive their stream (closing sessions nobody came back for)", registry=registry,
            multiprocess_mode="livesum",
        )
        self.asyncio_tasks = Gauge("callbridge_asyncio_tasks", "Tasks on the event loop", registry=registry, multiprocess_mode="livesum")
        self.answer_sessions = Gauge(
            "callbridge_answer_sessions", "Engine sessions opened at an answer webhook that no stream has taken yet",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        memory_levels = (self.detached_sessions, self.engine_sessions_open, self.registry_entries) if memory_registry else ()
        self.levels = (
            self.live_streams, *memory_levels, *((self.local_engine_sessions,) if local_engine else ()),
            self.background_tasks, self.asyncio_tasks, self.answer_sessions,
        )  # fmt: skip
        """The gauges read at scrape time (``watch``), those exported here."""

    def watch(self, services: BridgeServices, loop: asyncio.AbstractEventLoop) -> None:
        """Point the level gauges at ``services`` and ``loop``: each is computed when ``/metrics`` is scraped,
        nothing per frame. Gauges the registry or engine cannot answer (Redis, a remote engine) are not exported."""
        self.live_streams.set_function(lambda: len(services.live_streams))
        self.background_tasks.set_function(lambda: len(services.background))
        self.asyncio_tasks.set_function(lambda: len(asyncio.all_tasks(loop)))
        answering = services.answer_sessions
        self.answer_sessions.set_function(lambda: len(answering) if answering is not None else 0)
        registry = services.registry
        if isinstance(registry, MemoryCallRegistry):
            self.detached_sessions.set_function(lambda: registry.detached_count)
            self.engine_sessions_open.set_function(
                lambda: len(services.live_streams) + registry.detached_count + (len(answering) if answering is not None else 0)
            )
            self.registry_entries.set_function(lambda: registry.entry_count)
        engine = services.engine
        if isinstance(getattr(engine, "session_count", None), int):  # the embedded engine (``LocalEngine``)
            self.local_engine_sessions.set_function(lambda: float(getattr(engine, "session_count", 0)))


class CarrierRest(Protocol):
    """A carrier's REST API, as far as the bridge uses it (each carrier's ``Carrier.rest`` builds one)."""

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call; one that has already ended counts as done. Raises on failure."""
        ...

    async def aclose(self) -> None: ...


class LiveStream(Protocol):
    """A call's media stream being served by this process (``MediaStreamDriver``)."""

    async def end_by_carrier(self, reason: str) -> None:
        """The carrier said, out of band, that the call is over: end the stream as its ``stop`` would."""
        ...

    async def digit_by_carrier(self, digit: str) -> None:
        """The carrier said, out of band (a webhook), that the caller pressed ``digit``: as a digit on the wire."""
        ...

    async def superseded(self) -> None:
        """The carrier opened a new stream for this call: this one's connection is gone, whether or not its drop
        reached us. End it as lost (its engine session detached for the new stream)."""
        ...

    async def move_elsewhere(self) -> bool:
        """Draining: detach the engine session into the registry and close the carrier's socket without a
        goodbye, so the carrier reconnects (to another process); False where the carrier would not."""
        ...

    async def shut_down(self) -> None:
        """The process stops with the call still up (a lone process's drain ran out): the engine session is closed,
        the caller hears the closing tone, then the carrier's hang-up."""
        ...


@dataclass
class BridgeServices:
    settings: Settings
    engine: DuplexEngine
    registry: CallRegistry
    tokens: StreamTokens
    metrics: BridgeMetrics
    hang_up: HangUpFn
    draining: bool = False
    active_calls: set[str] = field(default_factory=set)
    admitted: dict[str, float] = field(default_factory=dict)
    """Calls admitted here whose stream has not bound here yet: call id → when the slot lapses (``time.monotonic``,
    ``engine.open_at_answer_ttl_s`` on). Counted against ``server.max_calls`` from the moment they are admitted,
    so a burst of answers cannot all pass before any of them is counted."""
    live_streams: dict[str, LiveStream] = field(default_factory=dict)
    """call id → the stream serving it here, once bound to its engine session."""
    carrier_state: dict[str, object] = field(default_factory=dict)
    """What a carrier keeps per bridge process beside its routes (Telnyx's Call Control state), by carrier."""
    background: set[asyncio.Task[None]] = field(default_factory=set)
    """Tasks that outlive the stream that started them (closing a session nobody came back for)."""
    action_performers: dict[str, CallActionPerformer] = field(default_factory=dict)
    """carrier → what transfers its calls and sends DTMF on them (its REST client, the SIP listener)."""
    carrier_rests: dict[str, CarrierRest] = field(default_factory=dict)
    """carrier → its REST client (the app's, one per process), for a carrier's webhooks that call its API."""
    pacing: PacingClock = field(default_factory=PacingClock)
    """The one timer that wakes every call's pacer."""
    cpu: CpuMeter = field(default_factory=CpuMeter)
    """The process's CPU use (sampled by the app), for ``server.cpu_budget_percent``."""
    process_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Names this process in the signals it sends (``CallSignal.origin``)."""
    signal_handlers: dict[SignalKind, list[SignalHandler]] = field(default_factory=dict)
    listener: asyncio.Task[None] | None = None
    """Takes other processes' signals (``start_listening``), from the app's start to its shutdown."""
    answer_sessions: AnswerSessions | None = None
    """Engine sessions opened at the answer webhook (``engine.open_at_answer``); None: each stream opens its own."""
    replays: ReplayGuard = field(init=False)
    """Which signed webhooks were taken already (fleet-wide with a shared registry): a replay is refused."""
    unknown_events: set[tuple[str, str]] = field(default_factory=set)
    """(carrier, event type) pairs seen here that no codec knows, each logged once and counted by name (at most
    ``UNKNOWN_EVENT_NAMES``)."""

    async def perform_action(self, provider: str, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """The agent's transfer or DTMF on a call, by its carrier; ``unsupported`` where the carrier has no way."""
        performer = self.action_performers.get(provider)
        if performer is None:
            return ActionResult.unsupported(provider, "send DTMF" if isinstance(action, SendDtmf) else "be transferred")
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
        max_call_s = self.settings.server.max_call_duration_s
        self.replays = ReplayGuard(self.registry, self.metrics.webhook_replay_checks, max_call_s or REPLAY_WINDOW_S)
        engine = self.settings.engine
        if engine.open_at_answer == "on" or (engine.open_at_answer == "auto" and self.settings.registry.backend == "memory"):
            self.answer_sessions = AnswerSessions(self.engine, engine.open_at_answer_ttl_s)

    @property
    def registry_shared(self) -> bool:
        """The registry is shared with other processes (Redis), which can resume this one's calls; the memory
        registry is one process's alone."""
        return not isinstance(self.registry, MemoryCallRegistry)

    @property
    def parks_at_answer(self) -> bool:
        """``engine.open_at_answer`` auto with a shared registry: the session opened at the answer is parked in the
        registry (detached, with its ticket), so the call's stream resumes it on whichever process it reaches."""
        return self.settings.engine.open_at_answer == "auto" and self.registry_shared

    async def decide_answer(self, call_id: str, provider: str, *, retries: bool = True) -> AnswerDecision:
        """A carrier's answer webhook for ``call_id``, decided the one way every carrier answers
        (``answer_policy.answer_step``: over already → hang up; draining, and another process can resume it
        (``retries``: the carrier can be sent back through the load balancer) → retry elsewhere; not admitted, or
        no engine takes it → busy; else answer with a fresh stream token). This finds out each fact the policy
        asks for. A registry that does not answer is a busy refusal too, logged as a warning: the caller hears
        busy rather than the carrier's "application error"."""
        facts: dict[AnswerFact, bool] = {}
        try:
            while isinstance(step := answer_step(facts, retries=retries, draining=self.draining), AnswerFact):
                facts[step] = await self._answer_fact(step, call_id)
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

    async def _answer_fact(self, fact: AnswerFact, call_id: str) -> bool:
        match fact:
            case AnswerFact.ENDED:
                return await self.registry.ended_reason(call_id) is not None
            case AnswerFact.MOVING_ELSEWHERE:
                return await self.moving_elsewhere(call_id)
            case AnswerFact.NEW_CALL_BOUNCES:
                return await self.bounces_new_call(call_id)
            case AnswerFact.ADMITTED:
                return await self.admits(call_id)
            case AnswerFact.ENGINE_TAKES:
                return await self.engine_takes(call_id)

    async def engine_takes(self, call_id: str) -> bool:
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
            self.answer_sessions.open(call_id, session_config(self.settings))
            refused = await self.answer_sessions.refusal(call_id, _ANSWER_ENGINE_WAIT_S)
        else:
            refused = await self._open_parked(call_id)
        if refused is None:
            return True
        self.metrics.admission_refused.labels("engine").inc()
        log.warning("admission_refused", reason="engine", call_id=call_id, code=refused.code, detail=refused.message)
        return False

    async def _open_parked(self, call_id: str) -> EngineError | None:
        """Open the call's session and park it in the shared registry for its stream; the engine's refusal, else
        None (parked, or slow: the stream then opens its own). A parked session no stream claims within
        ``engine.open_at_answer_ttl_s`` is closed."""
        try:
            session = await asyncio.wait_for(self.engine.open(session_config(self.settings)), _ANSWER_ENGINE_WAIT_S)
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
        listener, self.listener = self.listener, None
        for task in [*self.background, *([listener] if listener is not None else [])]:
            task.cancel()
        await asyncio.gather(*self.background, *([listener] if listener is not None else []), return_exceptions=True)

    def on_signal(self, kind: SignalKind, handler: SignalHandler) -> None:
        """Have ``handler`` take the signals of ``kind`` other processes send (a carrier's router registers)."""
        self.signal_handlers.setdefault(kind, []).append(handler)

    def start_listening(self) -> None:
        """Take the signals other processes send about calls whose stream is here (the app's lifespan); with a
        fleet limit, keep this process's calls counted there."""
        if self.listener is None:
            self.listener = asyncio.get_running_loop().create_task(self._listen())
            if self.settings.server.max_calls_fleet is not None:
                self.spawn(self.hold_fleet_admissions())

    async def _listen(self) -> None:
        while True:
            try:
                async for signal in self.registry.listen(self.process_id):
                    stream = self.live_streams.get(signal.call_id)
                    if stream is not None and signal.kind is SignalKind.CALL_ENDED:
                        self.spawn(self._take(signal, stream.end_by_carrier(signal.detail)))
                    elif stream is not None and signal.kind is SignalKind.STREAM_SUPERSEDED:
                        self.spawn(self._take(signal, stream.superseded()))
                    elif stream is not None and signal.kind is SignalKind.DTMF:
                        self.spawn(self._take(signal, stream.digit_by_carrier(signal.detail)))
                    for handler in self.signal_handlers.get(signal.kind, ()):
                        self.spawn(self._take(signal, handler(signal)))
            except Exception as exc:  # noqa: BLE001 - the listener outlives any one failure; it listens again
                log.error("call_signals_failed", error=repr(exc))
            await asyncio.sleep(1.0)

    async def _take(self, signal: CallSignal, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - one call's signal never stops the listener or another call
            log.warning("call_signal_failed", call_id=signal.call_id, signal=signal.kind.value, error=repr(exc))
        else:
            log.info("call_signal_handled", call_id=signal.call_id, signal=signal.kind.value, origin=signal.origin)

    async def send_signal(self, call_id: str, kind: SignalKind, detail: str) -> None:
        """Tell the other processes (whichever serves the call's stream) what a carrier's webhook said here. Best
        effort: with the registry unreachable it is logged and dropped, never failing the webhook that sent it."""
        try:
            await self.registry.signal(CallSignal(call_id, kind, detail, self.process_id))
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)

    async def digit_from_carrier(self, call_id: str, digit: str) -> None:
        """A carrier's webhook says the caller pressed ``digit`` (Bandwidth's ``<StartGather>``), where its media
        socket carries no digits: the call's stream takes it as a digit on the wire, here or, by signal, on the
        process that holds it."""
        stream = self.live_streams.get(call_id)
        if stream is not None:
            await stream.digit_by_carrier(digit)
        else:
            await self.send_signal(call_id, SignalKind.DTMF, digit)

    async def call_ended_by_carrier(self, call_id: str, reason: str) -> None:
        """A carrier's webhook says the call is over (Plivo's hangup URL, Vonage ``completed``, Telnyx
        ``call.hangup``), where its media socket says nothing: the live stream ends as on a ``stop`` (the engine
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
        """A drain moves calls only where another process can resume them (a shared registry). A lone process
        (the memory registry: the quick start, one container) serves its calls on to their end instead: moved,
        their carrier's reconnect would only come back here and be refused."""
        return not self.registry_shared

    async def drain(self, timeout_s: float) -> None:
        """SIGTERM: admit no new call (``/readyz`` turns 503 with ``draining``); with a shared registry, move every
        running call whose carrier reconnects to another process (``LiveStream.move_elsewhere``); wait up to
        ``timeout_s`` for the others to end. A lone process (``drains_in_place``) keeps serving its calls, and
        ends those still up at the timeout with the closing tone and the carrier's hang-up. Returns when no call
        is left here, or at the timeout."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        log.info("bridge_draining", active_calls=len(self.active_calls), timeout_s=timeout_s, in_place=self.drains_in_place)
        while self.active_calls or self.live_streams:
            if not self.drains_in_place:
                for stream in list(self.live_streams.values()):
                    await stream.move_elsewhere()
            if loop.time() >= deadline:
                log.warning("drain_timeout", calls_left=len(self.active_calls))
                if self.drains_in_place:
                    await self._shut_down_calls(loop.time() + _GOODBYE_WAIT_S)
                return
            await asyncio.sleep(0.05)
        log.info("bridge_drained")

    async def _shut_down_calls(self, until: float) -> None:
        """The drain ran out: each call still up hears the closing tone and is hung up; wait (until ``until``) for
        them to end."""
        for stream in list(self.live_streams.values()):
            await stream.shut_down()
        loop = asyncio.get_running_loop()
        while self.live_streams and loop.time() < until:
            await asyncio.sleep(0.05)

    async def admits(self, call_id: str) -> bool:
        """Whether a call may be answered now: not draining, and under ``server.max_calls`` — the calls bridged here
        and those admitted here whose stream has not bound yet (``admitted``: a call admitted is held at once) —
        unless the call is already known (a stream coming back, here or from another process)."""
        if self.draining:  # a lone process still serves its own calls: one whose socket dropped may come back
            return self.drains_in_place and await self._serves(call_id)
        server = self.settings.server
        if call_id in self.active_calls or call_id in self.admitted:
            return True
        over_cpu = bool(server.cpu_budget_percent) and self.cpu.utilization * 100 > server.cpu_budget_percent
        here = not over_cpu and self._calls_held() < server.max_calls
        if here and call_id:  # checked and held with no await between
            self.admitted[call_id] = time.monotonic() + self.settings.engine.open_at_answer_ttl_s
        in_fleet = True
        if here and call_id and server.max_calls_fleet is not None:
            try:
                in_fleet = await self.registry.admit(call_id, server.max_calls_fleet, FLEET_HOLD_MS)
            except RegistryUnavailable:
                self.admitted.pop(call_id, None)
                raise
        if here and in_fleet:
            return True
        if await self.registry.get(call_id) is not None:  # a call coming back is never refused for capacity
            return True
        self.admitted.pop(call_id, None)
        reason = "cpu_budget" if over_cpu else "max_calls" if not here else "max_calls_fleet"
        self.metrics.admission_refused.labels(reason).inc()
        log.warning("admission_refused", reason=reason, cpu_percent=round(self.cpu.utilization * 100, 1), calls=len(self.active_calls))
        return False

    def _calls_held(self) -> int:
        """Calls bridged here, and calls admitted here whose stream is still to come (lapsed ones let go)."""
        now = time.monotonic()
        for call_id in [c for c, until in self.admitted.items() if until <= now]:
            del self.admitted[call_id]
        return len(self.active_calls) + len(self.admitted)

    def give_back_admission(self, call_id: str) -> None:
        """A call admitted, then refused after all (no engine took it, the registry failed): its slot goes back,
        here and in the fleet's count."""
        if self.admitted.pop(call_id, None) is not None and self.settings.server.max_calls_fleet is not None:
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
            held = [*self.active_calls, *self.admitted]
            try:
                await self.registry.hold(held, FLEET_HOLD_MS)
            except RegistryUnavailable as exc:
                log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)

    def call_bound(self, call_id: str) -> None:
        """A stream bound the call's engine session here: it counts as bridged (no longer as admitted)."""
        self.active_calls.add(call_id)
        self.admitted.pop(call_id, None)

    async def _serves(self, call_id: str) -> bool:
        """The call is this process's and not over (its stream is up, or its session waits for the next one)."""
        return call_id in self.active_calls or await self._known_and_not_over(call_id)

    async def moving_elsewhere(self, call_id: str) -> bool:
        """Draining, a carrier's webhook for a call the fleet knows — its stream's reconnect, the stream moved off
        this process or another (``drain``): True where another process can resume it (the registry is shared),
        so the webhook's answer keeps the call going rather than refuse it, which would end a call that is only
        moving. Twilio-like carriers get a short pause and a redirect back through the load balancer
        (``twiml_retry``); Telnyx and Vonage, whose webhook is their only reconnect, a new stream to the public
        URL. False when not draining, for a call the registry does not know (a new call: refused) or has ended,
        and when the registry cannot be reached."""
        if not self.draining or not self.registry_shared:
            return False
        try:
            return await self._known_and_not_over(call_id)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail, call_id=call_id)
            return False

    async def bounces_new_call(self, call_id: str) -> bool:
        """Draining in a fleet (the registry shared), a new call's answer webhook: True for its first
        ``DRAIN_NEW_CALL_BOUNCES`` arrivals at draining processes, counted fleet-wide in the registry, so that it is
        sent back through the load balancer (as a moving call is) rather than refused busy. The load balancer
        takes a draining process out only at its next readiness check; calls answered meanwhile would otherwise be
        refused during every deploy. Past the bound (every process draining, or no load balancer in front), busy.
        Raises ``RegistryUnavailable``."""
        if not self.draining or not self.registry_shared:
            return False
        return await self.registry.count(call_id, "drain_bounces", keep_ms=_DRAIN_BOUNCES_KEPT_MS) <= DRAIN_NEW_CALL_BOUNCES

    async def _known_and_not_over(self, call_id: str) -> bool:
        """The registry has the call, and not as ended (raises ``RegistryUnavailable``)."""
        record = await self.registry.get(call_id)
        return record is not None and record.ended_reason is None


def call_options(settings: Settings) -> CallOptions:
    audio, server = settings.audio, settings.server
    return CallOptions(
        engine_rate_hz=audio.engine_input_rate_hz,
        lead_ms=audio.playout_lead_ms,
        mark_every_frames=audio.mark_interval_frames,
        resampler_quality=audio.resampler_quality,
        dtmf_mode=DtmfMode(settings.engine.dtmf),
        failure_tone_ms=settings.engine.failure_tone_ms,
        call_actions=settings.call_actions.enabled,
        transfer_targets=tuple(settings.call_actions.transfer_targets),
        first_message_timeout_ms=int(server.first_message_timeout_s * 1000),
        idle_timeout_ms=int(server.idle_timeout_s * 1000),
        max_call_ms=int(server.max_call_duration_s * 1000) if server.max_call_duration_s else None,
    )


def session_config(settings: Settings) -> SessionConfig:
    """The duplex session every call opens: the engine detects turns and barge-in (server VAD)."""
    engine = settings.engine
    return SessionConfig(
        model=engine.model,
        instructions=engine.instructions or None,
        voice=engine.voice,
        turn_detection=TurnDetection(),
        input_rate_hz=settings.audio.engine_input_rate_hz,
        tools=telephony_tools(settings.call_actions.transfer_targets) if settings.call_actions.enabled else (),
    )


def build_engine(settings: Settings) -> DuplexEngine:
    """The engine ``engine.kind`` names: embedded (default), vllm-omni over websockets, or in process."""
    kind = settings.engine.kind
    if kind == "local":
        from callbridge.engine.local.engine import LocalEngine
        from callbridge.engine.server import local_engine_options

        return LocalEngine(local_engine_options(settings))
    if kind == "realtime":  # one server or several: a pool (least loaded, failover, ejection, drain)
        engine = settings.engine
        if not engine.urls:
            raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "engine.kind = realtime needs engine.urls")
        return EnginePool(
            engine.urls,
            api_key=engine.api_key.get_secret_value() if engine.api_key else None,
            reconnect_budget_s=engine.reconnect_budget_s,
            liveness_interval_s=engine.liveness_interval_s,
            liveness_timeout_s=engine.liveness_timeout_s,
            heartbeat_interval_s=engine.heartbeat_interval_s,
            eject_after_failures=engine.eject_after_failures,
            probe_interval_s=engine.probe_interval_s,
            probe_backoff_max_s=engine.probe_backoff_max_s,
            probe_timeout_s=engine.probe_timeout_s,
        )
    from callbridge.engine.inline import InlineEngine

    return InlineEngine.create(settings.engine.model or "")
