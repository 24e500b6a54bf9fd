"""The asyncio driver of one carrier media stream: it moves bytes and time between the carrier's connection
(a websocket, or a carrier's raw TCP stream: a ``CarrierTransport``), a ``CallSession`` and the call's engine
session, and decides nothing.

Three tasks per stream: the reader (carrier messages → ``receive_message``),
the engine pump (engine events → ``receive_engine_event``) and the pacer
(woken at ``next_deadline_ms`` by the process's one pacing timer, ``pacing.py``
→ ``tick``; the core's limits — first message, idle, longest call — are
deadlines there too). Each drains the core's outputs
under one lock, so carrier messages and engine commands leave in the order
the core produced them. The carrier socket is read from the first message:
binding the engine (token check, open or resume) runs beside it while the
core buffers the caller's first audio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace

from starlette.websockets import WebSocket
from structlog.stdlib import BoundLogger

from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call import CallSession, CallState
from callbridge.bridge.call_config import agent_setup, call_options
from callbridge.bridge.call_feed import CallFeed
from callbridge.bridge.call_outputs import (
    BargeInFlushed,
    BindEngine,
    CallerAudioBegan,
    ClockDistrusted,
    CloseTransport,
    HangUpCall,
    MarkLag,
    Notice,
    Observed,
    Perform,
    RecordingChunk,
    ToCarrier,
    ToEngine,
)
from callbridge.bridge.call_setup import CallSetup, Rejection
from callbridge.bridge.carrier_transport import (
    BatchingTransport,
    CarrierTransport,
    MeasuredTransport,
    SizeLimitedTransport,
    TranscriptTransport,
    WebSocketTransport,
)
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.lifecycle import BindSource, CallLifecycle
from callbridge.bridge.lifecycle_steps import Held, do_steps
from callbridge.bridge.live_ticket import BOUND_KEPT_MS, LiveTicketKeeper
from callbridge.bridge.pacing import monotonic_ms
from callbridge.bridge.registry import LiveCall, stream_holder
from callbridge.bridge.stream_effects import StreamEffects, awaited, not_back_after_ms
from callbridge.bridge.stream_services import StreamServices
from callbridge.bridge.stream_setup import StreamSetup
from callbridge.bridge.stream_telemetry import StreamTelemetry
from callbridge.bridge.stream_work import CarrierWork, recorded
from callbridge.bridge.ws_protocol import MAX_MESSAGE_BYTES, PRE_AUTH_MAX_MESSAGE_BYTES
from callbridge.carriers.base import ProviderCodec, StreamStarted
from callbridge.engine.commands import AppendAudio
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import EngineErrorEvent, EngineEvent, is_chunk_verdict
from callbridge.engine.port import DuplexSession
from callbridge.logging import get_logger

__all__ = ["MediaStreamDriver"]

log = get_logger("callbridge.call")

_URGENT_CHECKPOINT_WAIT_S = 0.05
"""How long a barge-in's commands to the engine wait for its live ticket's write (a slow registry: no longer)."""
_TIMED_EVERY_MESSAGES = 50
"""One inbound message in this many is timed for ``callbridge_carrier_message_seconds`` (about once a second)."""


_now_ms = monotonic_ms


def _call_ends_at_ms(setup: CallSetup | None) -> int | None:
    """When the call's assistant's ``max_duration_s`` runs out, on the call's clock (counted from its answer)."""
    if setup is None or setup.assistant.max_duration_s is None:
        return None
    started = setup.chosen_at or time.time()
    return _now_ms() + max(0, int((started + setup.assistant.max_duration_s - time.time()) * 1000))


class MediaStreamDriver:
    """Serve one carrier media connection (already accepted) until the stream ends.

    ``check_token``: the stream must carry a token our answer webhook minted for its call (carriers whose
    calls we answer); carriers configured with a fixed URL (no answer webhook of ours) are admitted before this,
    by their own credentials or source address.
    """

    def __init__(
        self, transport: CarrierTransport | WebSocket, codec: ProviderCodec, services: StreamServices, *, check_token: bool = True
    ) -> None:
        self.transport = WebSocketTransport(transport) if isinstance(transport, WebSocket) else transport
        self._send_many = self.transport.send_many if isinstance(self.transport, BatchingTransport) else None
        self.check_token = check_token
        self.services = services
        self.call = CallSession(codec, call_options(services.settings))
        self.session: DuplexSession | None = None
        self._seen = StreamTelemetry(
            services.metrics, codec, log.bind(provider=codec.provider), services.unknown_carrier_event, services.refusal_log
        )
        """The stream's metrics and log lines."""
        self._lock = asyncio.Lock()
        self._pacing = services.pacing.slot()
        self._pump_holds_event = False
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._start: StreamStarted | None = None
        """The carrier's ``start``, once the call accepted it."""
        self._token_check: asyncio.Future[bool] | None = None
        """The one check of the stream's single-use token (``token_is_ours``)."""
        screen = self.transport if isinstance(self.transport, TranscriptTransport) else None
        self._feed = CallFeed(services.events, services.recordings, services.registry, services.spawn, self.log, screen)
        """The call's events, report and recording for its application, from what the call produces."""
        self._setup = StreamSetup(services.assistants, services.desk, services.settings.app)
        """The call's setup, and its application's tools."""
        self._work = CarrierWork(
            services.registry, (services.perform_action, services.hang_up), self._seen, self._feed, self._setup, self._to_call
        )
        """The agent's actions and the call's hang-up, under way beside the stream."""
        self._life: CallLifecycle | None = None
        """The stream's dealings with its call's engine session (from its ``start``)."""
        self._begun_at_ms = 0
        """When the call accepted the carrier's ``start`` (the engine session was looked for from then)."""
        self._live_keeper: LiveTicketKeeper | None = None
        """With a shared registry: what keeps the bound stream's live ticket current there."""
        self._authenticated_stream = False
        """The stream has shown it is the carrier's (its token, or its upgrade's credentials)."""

    @property
    def provider(self) -> str:
        """The carrier's name (a codec that recognises the carrier knows it once the stream has started)."""
        return self.call.codec.provider

    @property
    def log(self) -> BoundLogger:
        """The stream's log, bound to its carrier, then its call and stream, then its session."""
        return self._seen.log

    async def run(self) -> None:
        self.call.connected(_now_ms())  # the core's limits (first message, idle, longest call) run from here
        if not self.check_token:  # its credentials were checked before it was accepted
            await self._authenticated()
        self._pacing.schedule(self.call.next_deadline_ms())
        self._tasks.append(asyncio.create_task(self._pace()))
        try:
            await self._read()
        finally:
            await self._finish()

    # ------------------------------------------------------------------ reader

    async def _read(self) -> None:
        timed = self.services.metrics.message_seconds
        count = 0
        while not self._done():
            message = await self.transport.receive()
            count += 1
            now_s = time.monotonic() if count % _TIMED_EVERY_MESSAGES == 0 else 0.0
            async with self._lock:
                if message is None and isinstance(self.transport, SizeLimitedTransport) and self.transport.refused_too_large:
                    self.call.message_refused(f"a message over {self._message_limit()} bytes, refused unread (1009)")
                    await self._flush()
                    return
                if message is None:
                    self.call.transport_lost(_now_ms())
                    await self._flush()
                    return
                self.call.receive_message(message, _now_ms())
                await self._flush()
            if count % _TIMED_EVERY_MESSAGES == 0:
                timed.observe(time.monotonic() - now_s)

    def _done(self) -> bool:
        return self._closed or self.call.finished

    # ------------------------------------------------------------------- bind

    def _begin(self, start: StreamStarted) -> None:
        """The call accepted the carrier's ``start``: its lifecycle finds the engine session, beside the reader."""
        self._start = start
        self._begun_at_ms = _now_ms()
        self._seen.bind(provider=self.provider, call_id=start.call_id, stream_id=start.stream_id)
        self._life = life = CallLifecycle(
            check_token=self.check_token,
            answer_sessions=self.services.answer_sessions is not None,
            reconnect_window_ms=self.call.codec.profile.reconnect_window_ms or not_back_after_ms(self.services.settings),
        )
        life.stream_started()
        self._tasks.append(asyncio.create_task(self._bind(life, start)))

    async def _bind(self, life: CallLifecycle, start: StreamStarted) -> None:
        """Find the stream's engine session (the lifecycle's steps), then bind it to the call under the lock."""
        services = self.services
        held: Held[DuplexSession] = Held()
        await self._do_steps(life, start, held)
        bind, session = life.bound, held.session
        if bind is None or session is None:
            return
        if life.waited_ms is not None:
            self.log.info("resume_waited_for_detach", waited_ms=life.waited_ms)
        services.metrics.engine_sessions.labels("opened" if bind.source is BindSource.OPENED_AT_ANSWER else bind.detail).inc()
        self._seen.bind(session_id=session.session_id)
        setup = await self._setup.bound_setup(start, self.provider, self.log)
        assistant = setup.assistant if setup is not None else None
        resumed = bind.source in (BindSource.RESUMED, BindSource.TAKEN_OVER)
        await self._feed.bound(start.call_id, setup, session, self.log, resumed=resumed, context=lambda: self._setup.context(start, self.provider))
        try:
            await self._lock.acquire()
        except asyncio.CancelledError:  # the stream ended this instant (``_finish`` runs): park or close, as it ended
            life.stream_state_at_bind(self.call.facts())
            await asyncio.shield(self._do_steps(life, start, held))
            raise
        try:
            if life.stream_state_at_bind(self.call.facts()) is None:  # ended meanwhile
                await self._do_steps(life, start, held)
                return
            self.session = session
            agent = agent_setup(
                services.settings, assistant, new_session=bind.new_session, recordable=services.recordings is not None,
                call_ends_at_ms=_call_ends_at_ms(setup),
            )  # fmt: skip
            self.call.engine_bound(EngineBinding.of(bind, session.capabilities, agent), _now_ms())
            self._feed.record_from(start.call_id, self.call.caller.recorder)
            services.call_bound(start.call_id)
            services.live_streams[start.call_id] = self
            services.metrics.calls_active.labels(self.provider).inc()
            bound_after_ms = _now_ms() - self._begun_at_ms
            self.log.info("call_bridged", engine=bind.detail, call_offset_ms=bind.call_offset_ms, bound_after_ms=bound_after_ms)
            await self._flush()
            live = self._live_call(session, start)
            if services.registry_shared:  # another process may resume the call from it: the engine keeps its replay
                session.limit_acks(live.ticket.last_event_seq)
        finally:
            self._lock.release()
        written = await recorded(services.registry.mark_bound(start.call_id, BOUND_KEPT_MS, live), self.log)
        if self._done():  # the stream ended meanwhile: ``_finish`` has the session
            return
        pump = asyncio.create_task(self._pump(session))
        self._tasks.append(pump)
        if services.registry_shared and written:  # keep the live ticket current
            self._live_keeper = keeper = LiveTicketKeeper(
                services.registry, start.call_id, session, lambda: self._live_call(session, start), live, self.log
            )
            interval_ms = int(services.settings.registry.checkpoint_interval_s * 1000)
            self._tasks.append(asyncio.create_task(keeper.keep(interval_ms, self._done)))
        elif services.registry_shared:  # the registry has no live ticket of this stream: no ack need wait for one
            session.limit_acks(None)
        if services.draining and not services.drains_in_place:  # bound as the drain began: move it on at once
            await self.move_elsewhere()

    def _live_call(self, session: DuplexSession, start: StreamStarted) -> LiveCall:
        """The stream's live ticket now: its session's resume state, with what the caller has heard of the reply
        being generated and what the engine was told of each response, and the call's timeline."""
        call = self.call
        ticket = replace(session.resume_ticket(), heard_ms=call.speech.heard_so_far(_now_ms(), live=call.state is CallState.LIVE), told_ms=call.told_so_far)
        return LiveCall(self._holder(start), ticket, call.facts().input_ms)

    def _holder(self, start: StreamStarted) -> str:
        """This stream, as the registry names the stream that holds a call."""
        return stream_holder(self.services.process_id, start.stream_id)

    async def refuse(self, reason: EndCause, *, no_engine: bool) -> None:
        """The lifecycle refused the stream (``Refuse``)."""
        self._seen.refused(reason, self._start.call_id if self._start is not None else "", getattr(self.transport, "peer", None))
        async with self._lock:
            if no_engine:
                self.call.no_engine(reason, _now_ms())  # the tone, then the hang-up (the pacer plays it)
            else:
                self.call.start_refused(reason)
            await self._flush()

    async def move_elsewhere(self) -> bool:
        """The process is draining: the call decides whether this stream moves (``CallSession.move_elsewhere``);
        if so its engine session is detached into the registry *before* the carrier's socket closes, so the next
        stream finds its ticket wherever it lands. False when it stays."""
        async with self._lock:
            life, start, session = self._life, self._start, self.session
            if life is None or start is None or session is None or not self.call.move_elsewhere(_now_ms()):
                return False
            await self._flush()  # what the caller heard goes to the engine (ack, truncate) before the detach
            life.moving_elsewhere(self.call.facts())
            await self._do_steps(life, start, Held(session))  # parked, or closed if the registry is down
            self._closed = True
            with suppress(Exception):
                await self.transport.close(self.call.close_code)
        self.log.info("stream_moved", reason="draining")
        return True

    async def shut_down(self) -> None:
        async with self._lock:
            if self._done():
                return
            self.log.info("call_shut_down", reason="drain_timeout")
            self.call.shut_down(_now_ms())
            await self._flush()

    async def superseded(self) -> None:
        async with self._lock:
            if self._done():
                return
            self.log.info("stream_superseded")
            self.call.superseded(_now_ms())
            await self._flush()  # closes the socket (going away): wakes the reader; ``_finish`` detaches the session

    async def end_by_carrier(self, reason: EndCause) -> None:
        """The carrier's webhook says the call is over: end the stream as its ``stop`` would."""
        await self._to_call(lambda call, now_ms: call.carrier_ended(reason, now_ms))

    async def digit_by_carrier(self, digit: str) -> None:
        """The carrier's webhook says the caller pressed ``digit``: as a digit on the wire."""
        await self._to_call(lambda call, now_ms: call.carrier_digit(digit, now_ms))

    # ---------------------------------------------------------------- engine

    async def _pump(self, session: DuplexSession) -> None:
        """Engine events that come on their own (the rest are taken by ``_flush`` as the commands cause them)."""
        try:
            async for event in session.events():
                if is_chunk_verdict(event):  # one per input chunk, acted on by nobody: no lock, no flush for it
                    continue
                self._pump_holds_event = True  # set before any await: nobody may take later events meanwhile
                async with self._lock:
                    self._pump_holds_event = False
                    if not self._take_engine_event(event):
                        return
                    await self._flush()
        except Exception:
            self.log.exception("engine_pump_failed")
            # the caller hears the fallback, then the call is hung up
            await self._to_call(lambda call, now_ms: call.engine_failed(EndCause(EndReason.ENGINE_STREAM_FAILED), now_ms))

    async def _pace(self) -> None:
        try:
            while not self._done():
                await self._pacing.wait()
                await self._to_call(CallSession.tick)
        finally:
            self._pacing.close()

    # ----------------------------------------------------------------- output

    def _take_engine_event(self, event: EngineEvent) -> bool:
        """Hand one engine event to the call (lock held); False once the call no longer takes them."""
        if isinstance(event, EngineErrorEvent):  # counted and logged, taken or not
            self._seen.engine_error(event, expected=self.call.barge_in.expects(event.code))
        if not self.call.takes_engine_events:  # ended, or its carrier gone (a failed send): kept for a resume
            return False
        self._feed.engine_event(event)
        self._seen.engine_event_taken(event)
        self.call.receive_engine_event(event, _now_ms())
        return True

    async def _flush(self) -> None:
        """Send what the core produced, in order; hand the call the engine events its commands caused at once
        (the embedded engine answers within ``submit``), and send what those produced, until nothing is left;
        then put the pacer's next deadline on the clock. Called with the lock held."""
        while True:
            await self._send_outputs()
            session = self.session
            events = session.take_ready_events() if session is not None and not self._pump_holds_event else None
            if not events:
                break
            try:
                for event in events:
                    if not self._take_engine_event(event):
                        break
            except Exception:  # as in the pump: the caller hears the fallback, then the call is hung up
                self.log.exception("engine_event_failed")
                self.call.engine_failed(EndCause(EndReason.ENGINE_STREAM_FAILED), _now_ms())
        self._pacing.schedule(None if self._done() else self.call.next_deadline_ms())

    async def _send_outputs(self) -> None:
        """Do what the call produced, in its order: messages to the carrier, commands to the engine, the carrier
        work and hang-up it asks for, the close; what only reports goes to the log and the metrics."""
        call = self.call
        carrier_gone = engine_gone = False
        to_carrier: list[str | bytes] = []  # the carrier's messages in a row, sent together (audio and its marker)
        for output in call.outputs():
            if isinstance(output, ToCarrier):
                if not (self._closed or carrier_gone):
                    to_carrier.append(output.message)
                continue
            if to_carrier:
                carrier_gone = not await self._to_carrier(to_carrier)
                to_carrier = []
            match output:
                case ToEngine(command):
                    session = self.session
                    if session is None or engine_gone:
                        continue
                    if self._seen.first_audio_ms is None and isinstance(command, AppendAudio):
                        self._seen.audio_to_engine()
                    try:
                        await session.submit(command)
                    except EngineError as exc:
                        if exc.code != ErrorCode.SESSION_CLOSED:
                            self.log.warning("engine_command_failed", command=type(command).__name__, reason=exc.code)
                        engine_gone = True
                case BindEngine(start):
                    self._begin(start)
                case CallerAudioBegan():
                    self._seen.caller_audio_began()
                case Perform(pending):  # the agent's transfer / DTMF / tool: the carrier or application does it meanwhile
                    assert self._start is not None, "the agent acts on a bound call"
                    self._tasks.append(self._work.perform(pending, self._start))
                case HangUpCall(reason):
                    self._work.hang_up(reason, self._start)
                case CloseTransport(code):
                    if not self._closed:
                        self._closed = True
                        with suppress(Exception):
                            await self.transport.close(code)
                case Notice() as notice:
                    self._seen.notice(notice)
                case Observed() as seen:
                    self._seen.observed(seen)
                    self._feed.observed(seen)
                case RecordingChunk(data):
                    self._feed.record(data)
                case MarkLag(ms):
                    self._seen.mark_lag(ms)
                case ClockDistrusted(detail):
                    self.log.warning("timestamp_clock_mismatch", detail=detail)
                case BargeInFlushed():  # its clear has been sent: timed from the engine event that caused it
                    self._seen.barge_in_flushed()
                    keeper = self._live_keeper
                    if keeper is not None and not keeper.released:
                        # what the engine is about to be told of the cut reply goes to the live ticket first: a
                        # stream that takes the call over tells it no less (bounded: the clear is out already)
                        writing = asyncio.ensure_future(keeper.write())
                        done, _ = await asyncio.wait({writing}, timeout=_URGENT_CHECKPOINT_WAIT_S)
                        if not done:
                            self.services.spawn(awaited(writing))
        if to_carrier:
            await self._to_carrier(to_carrier)

    async def _to_carrier(self, messages: list[str | bytes]) -> bool:
        """Send ``messages`` to the carrier, in one write where the transport can; False if its side has closed."""
        try:
            if self._send_many is not None:
                await self._send_many(messages)
            else:
                for message in messages:
                    await self.transport.send(message)
        except Exception:
            # The carrier closed its side; what it sent before (a ``stop`` on a hang-up) may still wait in the
            # reader's buffer. The call decides how long to read for it.
            self.call.send_failed(_now_ms())
            return False
        return True

    async def _to_call(self, call_input: Callable[[CallSession, int], None]) -> None:
        """Hand the call one input under the lock (``CallInput``), then send what it produced."""
        async with self._lock:
            call_input(self.call, _now_ms())
            await self._flush()

    # ----------------------------------------------------------------- finish

    async def _finish(self) -> None:
        # Until none is left: a task may start another while it is being cancelled (a bind whose registry write
        # swallowed the cancellation starts the engine pump), and that one must not be left waiting forever.
        current = asyncio.current_task()
        await self._work.actions_answered()
        while pending := [task for task in self._tasks if not task.done() and task is not current]:
            for task in pending:
                task.cancel()
            for task in pending:
                with suppress(asyncio.CancelledError, Exception):
                    await task
        await self._work.hang_up_answered()
        services, start, session, life = self.services, self._start, self.session, self._life
        report = self.call.report()
        if start is not None and report.facts.call_over:
            services.call_over(start.call_id)
        if session is not None and start is not None:
            services.call_unbound(start.call_id)
            if services.live_streams.get(start.call_id) is self:
                del services.live_streams[start.call_id]
            services.metrics.calls_active.labels(self.provider).dec()
        await self._feed.close_recording(self.call.caller.recorder, _now_ms())
        if isinstance(self.transport, MeasuredTransport) and (media := self.transport.media_quality()) is not None:
            self._feed.measured(media)
            services.metrics.observe_line(media)
        if start is not None:
            await self._feed.stream_ended(start.call_id, report, session.session_id if session is not None else None)
        if life is not None:
            assert start is not None
            life.stream_ended(report.facts, session_closed=session is None or session.closed)
            await self._do_steps(life, start, Held(session))
        self._seen.ended(report)
        if not self._closed:
            with suppress(Exception):
                await self.transport.close(1000)

    async def _do_steps(self, life: CallLifecycle, start: StreamStarted, held: Held[DuplexSession]) -> None:
        """Do what the stream's lifecycle asks (``bridge/lifecycle_steps.py``), against the process's registry and
        engine: binding (``_bind``), and as the stream ends or moves."""
        await do_steps(life, StreamEffects(self.services, start.call_id, self._holder(start), self), held)

    async def setup(self, *, choose: bool) -> CallSetup | Rejection | None:
        """The call's setup (``StreamSetup.setup``): once per stream. Raises ``RegistryUnavailable``."""
        assert self._start is not None
        return await self._setup.setup(self._start, self.provider, self.log, choose=choose)

    def call_over(self, end_reason: EndCause) -> None:
        """The call is over, its last stream gone (a carrier that did not come back): its report to the application."""
        self._feed.call_over(end_reason, self.session.session_id if self.session is not None else None)

    async def token_is_ours(self) -> bool:
        """The stream's token checked (it is single-use): once, however often the lifecycle asks, and not cut short
        by the stream's end — a stream that ends while its check is under way waits for the same check."""
        start = self._start
        assert start is not None
        if self._token_check is None:
            self._token_check = asyncio.ensure_future(self.services.tokens.consume(start.custom_parameters.get("token"), start.call_id))
            if await asyncio.shield(self._token_check):
                await self._authenticated()
        return await asyncio.shield(self._token_check)

    def _message_limit(self) -> int:
        return getattr(self.call.codec, "max_message_bytes", MAX_MESSAGE_BYTES) if self._authenticated_stream else PRE_AUTH_MAX_MESSAGE_BYTES

    async def _authenticated(self) -> None:
        """The stream is the carrier's: its messages may now be as large as its codec takes (until now, a few KiB:
        ``ws_protocol.PRE_AUTH_MAX_MESSAGE_BYTES``)."""
        self._authenticated_stream = True
        if isinstance(self.transport, SizeLimitedTransport):
            with suppress(Exception):  # a socket closing meanwhile: nothing more will be read anyway
                await self.transport.authenticated(self._message_limit())

