"""One simulated call under faults (``sim/faults.py`` says what is simulated and which invariants hold): the real
cores on a virtual clock, stepped through a seed's plan, the lifecycle's steps done by the server's own executor
against the models."""

from __future__ import annotations

import random
from typing import Final, NoReturn, Protocol

from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call import CallOptions, CallSession, CallState
from callbridge.bridge.call_config import agent_setup
from callbridge.bridge.call_outputs import BargeInFlushed, Observed, ToCarrier, ToEngine
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.lifecycle import BindSource, CallLifecycle
from callbridge.bridge.lifecycle_steps import Held, Rejected, do_steps
from callbridge.bridge.registry import CallClaim, LiveCall
from callbridge.config import Settings
from callbridge.engine.commands import CloseSession, EngineCommand
from callbridge.engine.errors import EngineError
from callbridge.engine.events import AudioDelta, EngineEvent, SessionClosed
from callbridge.engine.local.agents import AGENTS
from callbridge.engine.local.core import LocalEngineOptions, LocalSessionCore, SessionState
from callbridge.engine.port import ResumeTicket, SessionConfig
from callbridge.sim.call_checks import ResumeExpected, check_carrier_not_blamed, check_command, check_end, check_step
from callbridge.sim.carrier_wire import CarrierWire
from callbridge.sim.fault_models import (
    SILENCE,
    SPEECH,
    Binding,
    CarrierModel,
    EngineServerModel,
    LoudnessScorer,
    RegistryModel,
    Silent,
    Wake,
    marking_far_end,
    stream_id,
)
from callbridge.sim.fault_plan import (
    FRAME_MS,
    FaultPlan,
    Violation,
    plan_for,
)
from callbridge.sim.live_tickets import LiveTickets

__all__ = ["SimulatedCall", "run_seed"]

_CALL_ID: Final = "CA" + "0" * 31 + "1"
_GRACE_MS: Final = 30_000
_SETTINGS: Final = Settings.model_construct()
"""The shipped defaults (not the environment's: a seed runs the same everywhere), under the plan's assistant."""


class _Clocked(Protocol):
    """A sans-I/O core clocked from outside (the call, the engine's session)."""

    def next_deadline_ms(self) -> int | None: ...

    def tick(self, now_ms: int) -> None: ...


def _tick_if_due(core: _Clocked, now_ms: int) -> None:
    deadline = core.next_deadline_ms()
    if deadline is not None and deadline <= now_ms:
        core.tick(now_ms)


def _new_engine(plan: FaultPlan, ids: random.Random, session_id: str, now_ms: int) -> LocalSessionCore:
    """The engine server's session for a call: the echo agent, its ids from the seed."""
    options = LocalEngineOptions(agent="echo", chunk_ms=500, generation_speed=plan.generation_speed, disconnect_grace_ms=_GRACE_MS)
    engine = LocalSessionCore(session_id, SessionConfig(), AGENTS["echo"](), options, now_ms, scorer=LoudnessScorer(),
                              token_hex=lambda n: ids.randbytes(n).hex())  # fmt: skip
    engine.events_to_send()  # session.created
    return engine


class _ModelEffects:
    """The lifecycle's effects in the simulation (``bridge/lifecycle_steps.py``'s ``LifecycleEffects``): the call's
    registry record, the engine server and the stream are the simulated call's models; where the server does a
    step against Redis and the engine, this does it against them, and checks what it sees there."""

    log = Silent()

    def __init__(self, sim: SimulatedCall) -> None:
        self.sim = sim

    def now_ms(self) -> int:
        return self.sim.now_ms

    async def token_is_ours(self) -> bool:
        self.sim.violation("a token check: the simulated carrier's streams are admitted by their address")

    async def ended_reason(self) -> str | None:
        return self.sim.registry.ended_reason

    async def claim_call(self, unless_ended: bool) -> CallClaim:
        sim, registry = self.sim, self.sim.registry
        if unless_ended and registry.ended_reason is not None:
            return CallClaim(registry.ended_reason, input_ms=registry.input_ms)
        ticket, registry.ticket = registry.ticket, None
        if ticket is not None:
            return CallClaim(registry.ended_reason, ticket, registry.input_ms)
        if registry.bound and sim.crashed_at_ms is None and sim.half_open is None:  # the last ended unparked
            sim.violation("the registry says a stream holds the session; the last one ended without parking it")
        holder = registry.live.holder if registry.live is not None else None
        return CallClaim(registry.ended_reason, None, registry.input_ms, registry.bound, holder)

    async def claim_live(self, holder: str) -> LiveCall | None:
        registry = self.sim.registry
        live = registry.live if registry.live is not None and registry.live.holder == holder else None
        if live is not None:
            registry.live, registry.bound = None, False
        return live

    async def nudge_old_stream(self, holder: str | None) -> bool:
        sim = self.sim
        sim._supersede_half_open()  # a half-open stream detaches; a dead process answers nothing
        return holder is not None and holder == sim._dead_holder and sim.plan.crash_closes_sockets  # it listens no more

    async def sleep_until(self, at_ms: int) -> None:
        await Wake(at_ms)

    async def take_answer_session(self) -> LocalSessionCore | None:
        return self.sim.engine if self.sim.streams == 1 else None  # opened at the answer, taken by the first stream

    async def resume(self, ticket: ResumeTicket) -> LocalSessionCore:
        sim = self.sim
        owner = sim.server.sessions.get(ticket.session_id, ("nobody",))[0]
        if owner != sim.call_id:
            sim.violation(f"a stream of {sim.call_id} was given the session of {owner} ({ticket.session_id})")
        if sim.engine_dead:  # the server is gone: the resume cannot reach it, and the session is known lost
            sim.session_lost = True
            raise EngineError("connection_failed")
        sim.engine.resume(ticket.lease_generation, sim.now_ms)
        sim.engine.events_to_send()  # session.resumed: taken by the wire client
        return sim.engine

    async def open(self) -> LocalSessionCore | Rejected:
        sim = self.sim
        if sim.engine_dead:  # no other endpoint in this simulation: no engine takes the call
            raise EngineError("connection_failed")
        beside = sim.engine.state is not SessionState.CLOSED
        if beside and sim.unnamed_session != sim.engine.session_id:
            sim.violation(f"a second engine session while the call's first is still {sim.engine.state.value}")
        if sim.close_requested:
            sim.violation("a new engine session for a call whose live one the bridge closed: the conversation restarts")
        if not sim.server.has_room():  # the other calls' sessions (or the one the registry lost) fill the server
            raise EngineError("resource_exhausted")
        if beside:  # the registry lost the first: its grace ends it. A half-open stream still serving it finds the
            # call held by this stream at its next checkpoint and stops writing; it ends quietly past its limits
            sim.server.orphaned.add(sim.engine.session_id)  # (not followed further)
            sim.unnamed_session, sim.expected.orphaned, sim.half_open = None, True, None
        sim.sessions += 1
        sim.engine = _new_engine(sim.plan, sim._ids, f"duplex-sim-{sim.call_id[-4:]}-{sim.sessions}", sim.now_ms)
        sim.server.sessions[sim.engine.session_id] = (sim.call_id, sim.engine)
        sim.closes_sent, sim.session_lost = 0, False
        sim.close_requested = False
        return sim.engine

    async def refuse(self, reason: EndCause, *, no_engine: bool) -> None:
        sim, call = self.sim, self.sim.call
        assert call is not None and sim.carrier is not None
        if no_engine:  # the tone, then the hang-up: the stream plays on
            call.no_engine(reason, sim.now_ms)
            sim.failed_at_ms = sim.now_ms
            sim.carrier.played_since_ms = sim.now_ms
            sim._after_input(call)
        else:
            call.start_refused(reason)
            sim.outcome = reason

    async def mark_ended(self, reason: str) -> None:
        registry = self.sim.registry
        registry.ended_reason = reason
        registry.bound, registry.live = False, None

    async def detach(self, session: LocalSessionCore) -> ResumeTicket:
        sim = self.sim
        if not sim.engine_dead:
            sim.engine.detach(sim.now_ms)
        return ResumeTicket(sim.engine.session_id, sim.engine.lease_generation)

    async def park(self, ticket: ResumeTicket, input_ms: int) -> bool:
        registry = self.sim.registry
        registry.ticket, registry.input_ms, registry.bound, registry.live = ticket, input_ms, False, None
        self.sim._named_again()
        return True

    async def close_parked(self, ticket: ResumeTicket, reason: str) -> bool:
        sim = self.sim
        if sim.engine_dead:  # the resume cannot reach its server: known lost, nothing to close
            sim.session_lost = True
            return False
        try:
            sim.engine.resume(ticket.lease_generation, sim.now_ms)
        except EngineError:
            return False
        sim.engine.events_to_send()
        sim._submit_all([CloseSession(reason)])
        return True

    async def close_waiting(self, reason: str) -> bool:
        """The session parked for this stream, claimed to be closed."""
        registry = self.sim.registry
        waiting, registry.ticket = registry.ticket, None
        if waiting is None:
            return False
        registry.bound = False
        return await self.close_parked(waiting, reason)

    async def close_unless_back(self, ticket: ResumeTicket, after_ms: int) -> None:
        self.sim.violation("a reconnect window: the simulated carrier names none")

    async def close_session(self, session: LocalSessionCore, reason: str) -> None:
        self.sim._submit_all([CloseSession(reason)])

    async def discard_answer_session(self, reason: str) -> None:
        pass  # the first stream's session was taken; nothing waits at the answer any more


class SimulatedCall:
    """One call of the plan, stepped on a virtual clock (see the module docstring)."""

    def __init__(
        self,
        seed: int,
        plan: FaultPlan | None = None,
        *,
        call_id: str = _CALL_ID,
        server: EngineServerModel | None = None,
        registry: dict[str, RegistryModel] | None = None,
        in_fleet: bool = False,
    ) -> None:
        """One call. With ``server`` and ``registry``: one of several calls sharing them (``SimulatedCalls``); the
        call is answered now (a busy refusal when the server has no room, or is dead already)."""
        self.seed = seed
        self.plan = plan or plan_for(seed)
        self.call_id = call_id
        self.now_ms = 0
        self.in_fleet = in_fleet
        self._ids = random.Random(f"{seed}:{call_id}")
        self.server = server or EngineServerModel(capacity=1)
        self.registry = (registry if registry is not None else {}).setdefault(call_id, RegistryModel())
        self.sessions = 1
        self.outcome: str | None = None
        dead_at_answer = self.plan.engine_dies_at_ms is not None and self.plan.engine_dies_at_ms <= 0
        self.engine = _new_engine(self.plan, self._ids, f"duplex-sim-{call_id[-4:]}-1", self.now_ms)
        if dead_at_answer or not self.server.has_room():  # engine_takes: busy before answer, no stream comes
            self.outcome = "busy"
            self.engine.submit(CloseSession("not_opened"), 0)
        else:
            self.server.sessions[self.engine.session_id] = (call_id, self.engine)
        self.life: CallLifecycle | None = None
        self.engine_dead = False
        self.engine_lost_reported = False
        self.session_lost = False
        """A resume found the session's server gone: the bridge knows the session lost (no close is owed)."""
        self.closes_sent = 0
        self.close_requested = False
        self.generated_bytes: dict[str, int] = {}
        """response → PCM16 bytes of audio the engine generated for it."""
        self.heard_told: dict[str, int] = {}
        """response → the highest heard position told to the engine (acks and truncations), all streams."""
        self.failed_at_ms: int | None = None
        self.streams = 0
        self.call: CallSession | None = None
        self.far_end = marking_far_end()
        self.carrier: CarrierModel | None = None
        self.wire = CarrierWire(self.plan)
        """The carrier's messages on their way to the bridge."""
        self._next_stream_at_ms: int | None = 0 if self.outcome is None else None
        self._stream_started_at_ms = 0
        self._end_ms = self.plan.hangup_at_ms + 15_000 + self.plan.stalled_ms(0, self.plan.hangup_at_ms + 15_000)
        self._ran_again = False
        """The process stall (``process_stall``) is over and its late timers have run."""
        self.crashed_at_ms: int | None = None
        self.drained = False
        self.half_open: tuple[CallSession, CallLifecycle] | None = None
        """A dropped stream the bridge still serves (``half_open_drops``), and its lifecycle, until superseded."""
        self._dead_holder: str | None = None  # the live ticket's holder when the bridge crashed
        self.registry_lost = False
        self.expected = ResumeExpected()
        """What the call's next stream must bind, after how the last ended."""
        self.unnamed_session: str | None = None
        """The session the registry lost all trace of (a parked ticket, or a live ticket not yet written anew):
        until a checkpoint writes it again, the next stream cannot find it and opens a new one beside it."""
        self._binding: Binding | None = None
        """A binding that waits (``WaitUntil``): its steps, when they go on, and the lifecycle they are of."""
        self.tickets = LiveTickets(self.registry, self.plan)
        """The bound stream's live ticket in the registry."""
        self._replay: list[EngineEvent] = []
        """The engine's replay after the live ticket when the bridge crashed: the next stream takes it first."""
        self.effects = _ModelEffects(self)
        """What the lifecycle's steps do here (the executor's effects, against the models)."""

    # ------------------------------------------------------------------ run

    def run(self) -> SimulatedCall:
        while self.advance():
            pass
        return self

    def advance(self) -> bool:
        """One step of the virtual clock (10 ms), its invariants checked; False once the call is over (and its
        end checked)."""
        if self.outcome is None:
            if self.now_ms > self._end_ms:
                self.violation(f"the call never ended (state {self.call.state if self.call else None})")
            self._step()
            check_step(self)
            self.now_ms += FRAME_MS // 2
            if self.outcome is None:
                return True
        check_end(self)
        return False

    def _step(self) -> None:
        now, plan = self.now_ms, self.plan
        stall = plan.process_stall
        if stall is not None and not self._ran_again and now >= stall[0]:
            if self.crashed_at_ms is not None or self.drained:
                self._ran_again = True  # the process it would have stopped is gone: the call is served elsewhere
            elif now < stall[0] + stall[1]:
                self._step_stalled()
                return
            else:
                self._ran_again = True
                self._late_timers()
        if self._next_stream_at_ms is not None and now >= self._next_stream_at_ms:
            self._open_stream()
        if self._binding is not None and self._binding.at_ms is not None and now >= self._binding.at_ms:
            binding, self._binding = self._binding, None
            if binding.life is self.life:  # not ended meanwhile
                self._go_on_binding(binding)
            else:
                binding.steps.close()
        self._world_goes_on()
        if self.half_open is not None:
            self._serve_half_open(*self.half_open)
        call, carrier = self.call, self.carrier
        if call is None or carrier is None:
            return
        if call.state is CallState.LIVE:
            crash = plan.bridge_crashes_at_ms
            if crash is not None and now >= crash and self.crashed_at_ms is None:
                self._crash()
                return
            drain = plan.bridge_drains_at_ms
            if drain is not None and now >= drain and not self.drained:
                self.drained = True
                self._move_elsewhere(call)
                return
            if self.tickets.due(self.now_ms):
                self._checkpoint(call)
        if now % FRAME_MS == 0:
            self._carrier_tick(call, carrier)
        self._deliver_to_bridge(call)
        if self.call is None:
            return
        if not self.engine_dead:
            _tick_if_due(self.engine, self.now_ms)
            self._engine_events(call)
        elif (
            not self.engine_lost_reported
            and plan.engine_dies_at_ms is not None
            and now >= plan.engine_dies_at_ms + plan.engine_gives_up_after_ms
        ):
            self.engine_lost_reported = True  # the wire client's reconnect budget is spent
            if call.state is CallState.LIVE:
                self.failed_at_ms = now
                carrier.played_since_ms = now
                call.receive_engine_event(SessionClosed(self.engine.session_id, "connection_failed"), now)
        _tick_if_due(call, now)
        self._drain(call, carrier)

    def _step_stalled(self) -> None:
        """A step while the bridge process does not run: the world goes on (the engine server, its death, the
        registry's loss), the carrier plays what it was sent and sends on; nothing of the bridge runs."""
        self._world_goes_on()
        call, carrier = self.call, self.carrier
        if call is not None and carrier is not None and self.now_ms % FRAME_MS == 0:
            self._carrier_tick(call, carrier, stalled=True)
        if not self.engine_dead:
            _tick_if_due(self.engine, self.now_ms)  # its events wait for the bridge to read them

    def _world_goes_on(self) -> None:
        """What happens whether or not the bridge runs: the engine server dies, the registry loses the call."""
        now, plan = self.now_ms, self.plan
        if plan.engine_dies_at_ms is not None and now >= plan.engine_dies_at_ms and not self.engine_dead:
            self.engine_dead = True
        lost_at = plan.registry_lost_at_ms
        if lost_at is not None and now >= lost_at and not self.registry_lost:
            self._lose_registry()

    def _late_timers(self) -> None:
        """The bridge process runs again: first the timers that came due while it did not (the streams' ticks),
        then its reader (the rest of the step)."""
        half_open = self.half_open[0] if self.half_open is not None else None
        for call in (self.call, half_open):
            if call is not None:
                _tick_if_due(call, self.now_ms)
        if self.call is not None and self.carrier is not None:
            self._drain(self.call, self.carrier)

    def _carrier_tick(self, call: CallSession, carrier: CarrierModel, *, stalled: bool = False) -> None:
        now, plan = self.now_ms, self.plan
        if now >= plan.hangup_at_ms and call.state is not CallState.ENDED:
            self._send(self.far_end.stop(stream_id(call)), 0)
            return
        if any(now == at for at in plan.drops_at_ms) and call.state is CallState.LIVE and not stalled:
            self._drop(call)
            return
        for mark in carrier.play(now):
            self._echo(call, mark)
        self.wire.release_held_echo(now)
        speaking = any(start <= now < start + length for start, length in plan.utterances)
        frame = SPEECH[now // FRAME_MS % len(SPEECH)] if speaking else SILENCE
        self._send(self.far_end.media(stream_id(call), frame, now - self._stream_started_at_ms), 0, speech=speaking)

    def _echo(self, call: CallSession, mark: str) -> None:
        self.wire.echo(self.far_end.mark_echo(stream_id(call), mark), self.now_ms)

    def _send(self, message: str | bytes, delay_ms: int, *, speech: bool = False) -> None:
        self.wire.send(message, self.now_ms, delay_ms, speech=speech)

    def _deliver_to_bridge(self, call: CallSession) -> None:
        for order, message in self.wire.due(self.now_ms):
            if self.call is not call or call.state in (CallState.ENDED, CallState.DETACHED):
                return
            self.wire.read(order)
            call.receive_message(message, self.now_ms)
            self._after_input(call)

    # ------------------------------------------------------------ lifecycle

    def _open_stream(self) -> None:
        """The carrier opens the call's (next) stream; its ``CallLifecycle`` binds it, each step done here against
        the registry model and the engine core, as ``MediaStreamDriver._bind`` does them."""
        self._next_stream_at_ms = None
        self.streams += 1
        self.call = call = CallSession(self.far_end.codec(), CallOptions(failure_tone_ms=600))
        call.connected(self.now_ms)  # as the driver: the carrier's limits (first message, idle) run from here
        self.carrier = CarrierModel()
        self._stream_started_at_ms = self.now_ms
        for message in self.far_end.opening(self.streams, self.call_id):
            call.receive_message(message, self.now_ms)
        self.life = life = CallLifecycle(check_token=False, answer_sessions=True)
        life.stream_started()
        live = self.registry.live
        self.expected.taking_over = live is not None and live.holder == self._dead_holder  # its holder's process died
        self._go_on_binding(Binding(life, self._bind_steps(life)))

    def _go_on_binding(self, binding: Binding) -> None:
        """The stream's binding steps (``bridge/lifecycle_steps.py``'s executor, against the models) until they are
        done — bound, refused — or wait (``WaitUntil``: then again once the clock gets there)."""
        try:
            wait = binding.steps.send(None)
        except StopIteration:
            return
        binding.at_ms = wait.at_ms
        self._binding = binding

    async def _bind_steps(self, life: CallLifecycle) -> None:
        await do_steps(life, self.effects, Held())
        if life.bound is not None:
            self._bind(life)

    def _bind(self, life: CallLifecycle) -> None:
        """The session in hand: bound to the stream as ``MediaStreamDriver._bind`` binds it."""
        call, registry = self.call, self.registry
        assert call is not None and self.carrier is not None
        bind = life.stream_state_at_bind(call.facts())
        assert bind is not None
        self.expected.check(self, bind, self._stream_started_at_ms)
        registry.bound = True
        agent = agent_setup(_SETTINGS, self.plan.assistant, new_session=bind.new_session, recordable=True, call_ends_at_ms=None)
        call.engine_bound(EngineBinding.of(bind, self.engine.capabilities, agent), self.now_ms)
        self._write_live_ticket(call)  # the replay after it: what this stream takes from now on
        replay, self._replay = (self._replay, []) if bind.source is BindSource.TAKEN_OVER else ([], [])
        for event in replay:  # the engine's replay after the live ticket comes first on the resumed socket
            call.receive_engine_event(event, self.now_ms)
            self.tickets.journal.append(event)
        self._after_input(call)

    def _write_live_ticket(self, call: CallSession) -> None:
        self.tickets.write(call, self.engine, self.now_ms)
        self._named_again()

    def _crash(self) -> None:
        """The bridge process dies (SIGKILL): nothing it had not sent goes out, nothing is parked; its sockets close
        with it (the engine keeps the session for its grace); the carrier reconnects after its delay."""
        self.crashed_at_ms = self.now_ms
        self._dead_holder = self.registry.live.holder if self.registry.live is not None else None
        self.half_open = None  # its process died with it
        if not self.engine_dead:
            self.engine.detach(self.now_ms)
        self._replay, self.tickets.journal = self.tickets.journal, []
        self.life = self.call = self.carrier = None
        self.tickets.due_at_ms = None
        self.wire.cut()
        self._next_stream_at_ms = self.now_ms + self.plan.redirect_delay_ms

    def _drop(self, call: CallSession) -> None:
        """The media socket drops (no stop): what was heard goes to the engine, then the stream's lifecycle parks
        the session with a ticket, as ``MediaStreamDriver._finish`` does; the carrier opens the next stream after
        its delay."""
        if self.plan.half_open_drops and self.life is not None and call.state is CallState.LIVE:
            self.half_open, self.life = (call, self.life), None  # the bridge does not know: it serves on
            self._gone_until_next_stream()
            self.expected.half_open = True
            return
        call.transport_lost(self.now_ms)
        self._submit_all([o.command for o in call.outputs() if isinstance(o, ToEngine)])  # nothing reaches the carrier
        self._end_stream(call)
        self._gone_until_next_stream()

    def _serve_half_open(self, call: CallSession, life: CallLifecycle) -> None:
        """The bridge serves a stream whose carrier is gone: its frames go into the void (no echo: nothing is heard),
        the engine's events reach it, it tells the engine what it does (acks of nothing new), its live ticket is
        kept; it ends by itself only past its own limits."""
        now = self.now_ms
        if not self.engine_dead:
            _tick_if_due(self.engine, self.now_ms)
            self._engine_events(call)  # not the current stream's: its outputs go nowhere
        _tick_if_due(call, now)
        if call.state is CallState.LIVE:
            if self.tickets.due(self.now_ms):
                self._checkpoint(call)
        self._submit_all([o.command for o in call.outputs() if isinstance(o, ToEngine)])  # the rest goes into the void
        if call.state in (CallState.ENDED, CallState.DETACHED):  # past its limits
            self.half_open = None
            self._end_stream_of(call, life)

    def _supersede_half_open(self) -> None:
        """The carrier's new stream tells the bridge the old one is superseded (``LiveStream.superseded``): it ends
        as a drop — what was heard to the engine, its session parked for the new stream."""
        if self.half_open is None:
            return  # nobody holds the call any more, or its process is dead: nobody answers
        call, life = self.half_open
        call.superseded(self.now_ms)
        self._submit_all([o.command for o in call.outputs() if isinstance(o, ToEngine)])
        if call.state is CallState.LIVE:  # it did not take the hint: served on, half-open
            return
        self.half_open = None
        self._end_stream_of(call, life)

    def _move_elsewhere(self, call: CallSession) -> None:
        """The process drains: the stream moves as ``MediaStreamDriver.move_elsewhere`` does it — what the caller
        heard to the engine, the session parked under the stream's lock, then the socket closed going away; its
        end finds the session parked already. The carrier's reconnect lands on another process."""
        life = self.life
        if life is None or not call.move_elsewhere(self.now_ms):
            return
        self._submit_all([o.command for o in call.outputs() if isinstance(o, ToEngine)])
        life.moving_elsewhere(call.facts())
        self._ending_steps(life)
        self._end_stream(call)
        self._gone_until_next_stream()
        self.expected.moved = True

    def _gone_until_next_stream(self) -> None:
        self.call = self.carrier = None
        self.wire.cut()
        self._next_stream_at_ms = self.now_ms + self.plan.redirect_delay_ms

    def _end_stream(self, call: CallSession) -> None:
        """The stream is over: do its lifecycle's ending steps (park, close, mark ended)."""
        life = self.life
        if life is None:
            return
        self.life = None
        self._end_stream_of(call, life)

    def _end_stream_of(self, call: CallSession, life: CallLifecycle) -> None:
        check_carrier_not_blamed(self, call)
        # the bridge knows its session is gone only once the wire client has given it up (or it closed)
        session_closed = self.engine_lost_reported or self.engine.state is SessionState.CLOSED
        life.stream_ended(call.facts(), session_closed=session_closed)
        self._ending_steps(life)

    def _ending_steps(self, life: CallLifecycle) -> None:
        """A stream's ending steps (park, close, mark ended …), done by the executor against the models, at once."""
        steps = do_steps(life, self.effects, Held(self.engine))
        try:
            steps.send(None)
        except StopIteration:
            return
        steps.close()
        self.violation("a stream's ending steps waited")

    def _after_input(self, call: CallSession) -> None:
        carrier = self.carrier
        assert carrier is not None
        self._drain(call, carrier)
        self._engine_events(call)

    def _checkpoint(self, call: CallSession) -> None:
        """One write of the stream's live ticket (``LiveTickets.checkpoint``): the session is named there again."""
        if self.tickets.checkpoint(call, self.engine, self.now_ms):
            self._named_again()

    def _named_again(self) -> None:
        """The registry holds a ticket of the call's session again (a live ticket written, a ticket parked)."""
        if self.unnamed_session == self.engine.session_id:
            self.unnamed_session = None

    def _lose_registry(self) -> None:
        """The registry loses the call's record. A parked session (its ticket) or a live one (until a checkpoint
        writes it anew) can no longer be found by a stream of the call: one opened beside it is no violation,
        and the engine's grace ends the first."""
        self.registry_lost = True
        if self.registry.lose_call():
            self.unnamed_session = self.engine.session_id

    def _engine_events(self, call: CallSession) -> None:
        """The engine's events to ``call``, its outputs to the carrier after each batch while it is the current
        stream (a half-open one's carrier is gone: its caller takes the outputs)."""
        if self.engine_dead or call.state is CallState.STARTING:  # not bound yet: the engine keeps them for the stream
            return
        while events := self.engine.events_to_send():
            for event in events:
                if isinstance(event, AudioDelta):
                    self.generated_bytes[event.response_id] = self.generated_bytes.get(event.response_id, 0) + len(event.pcm)
                if call.state is CallState.LIVE:
                    call.receive_engine_event(event, self.now_ms)
                    self.tickets.journal.append(event)
            if call is self.call and self.carrier is not None:
                self._drain(call, self.carrier)

    def _drain(self, call: CallSession, carrier: CarrierModel) -> None:
        """The call's outputs, in its order, as the driver does them: to the carrier, to the engine."""
        for output in call.outputs():
            if isinstance(output, ToCarrier):
                read = self.far_end.read(stream_id(call), output.message)
                if isinstance(read, str):
                    self.violation(f"the carrier refused a message from the bridge: {read}")
                for mark in carrier.receive(read):
                    self._echo(call, mark)
            elif isinstance(output, ToEngine):
                self._submit_all([output.command])
            elif isinstance(output, BargeInFlushed) and call.state is CallState.LIVE and self.tickets.due_at_ms is not None:
                self._checkpoint(call)  # as the driver: before what the engine is told of the cut reply
            elif isinstance(output, Observed) and output.kind == "silence" and self.wire.speech_waiting(self.now_ms):
                self.violation(f"the caller's silence was acted on ({output.detail}) with what they said still unread")
        if call.state is CallState.ENDED and self.outcome is None:
            failed = call.phase.engine_failure is not None and call.phase.reason != "caller_hung_up"
            no_engine = call.phase.reason is not None and call.phase.reason.kind is EndReason.ENGINE_UNAVAILABLE
            self.outcome = "failure_tone_and_hang_up" if failed else "no_engine_tone_and_hang_up" if no_engine else call.phase.reason or "ended"
            self._end_stream(call)

    def _submit_all(self, commands: list[EngineCommand]) -> None:
        for command in commands:
            if isinstance(command, CloseSession) and self.close_requested:
                continue  # as the wire client: one session.close per session, whoever asks (the call, the driver)
            self.close_requested = self.close_requested or isinstance(command, CloseSession)
            self._check_command(command)
            if self.engine_dead or self.engine.state is SessionState.CLOSED:
                continue  # kept by the wire client for a socket that never comes; the server is gone
            self.engine.submit(command, self.now_ms)

    def _check_command(self, command: EngineCommand) -> None:
        check_command(self, command)

    def violation(self, what: str) -> NoReturn:
        raise Violation(self.seed, self.now_ms, f"{self.call_id}: {what}" if self.in_fleet else what, calls=self.in_fleet)


def run_seed(seed: int) -> SimulatedCall:
    """Run seed ``seed``; raises ``Violation`` at the first invariant that fails."""
    return SimulatedCall(seed).run()
