"""Deterministic simulation of calls under faults: the pure cores, one virtual clock, a seed, invariants.

In the manner of FoundationDB's simulator and TigerBeetle's VOPR: no sockets, no asyncio, no wall clock. One
seed picks a call — what the caller says and when, the engine's speed — and a fault schedule: media socket drops
(the carrier reconnects after a delay; in some seeds the bridge's side stays half-open, serving the dead stream
until the new one tells it it is superseded), the engine server dying (the session lost after the wire client's
reconnect budget), the bridge process dying (SIGKILL: no detach, no ticket; the carrier reconnects to another
process, which has only the registry's live ticket, written at the bind, every second and at a barge-in, and the
engine's replay of what followed it), the bridge process draining (SIGTERM with a shared registry: the stream
moves — what the caller heard to the engine, the session parked, the socket closed going away — and the
carrier's reconnect lands on another process), the registry losing everything it held of the call (Redis
restarted empty: a live stream's next checkpoint writes the record anew; a parked ticket is gone, its session
left to the engine's grace), the registry stalling under the live ticket's writes (each times out, tried again a
second on: a takeover meanwhile resumes from the last one written, the engine replaying the rest), the bridge
reading late (a backlog arrives in a burst), the bridge process stopped (up to 35 s, the caller at times holding on
through it: no tick, no read; when it runs again its late timers run before its reader), mark echoes late, repeated
or out of order. The
parts that run are the real cores: a marking carrier's wire codec (the registry's first carrier that echoes marks
and flushes, whose spec names its ``far_end``), ``CallSession`` with its ``PlayoutLedger``, and the
embedded engine's ``LocalSessionCore``; around them that carrier, playing frames at real time and echoing marks
(a mark is echoed once the audio before it has played, every pending mark at a clear), and
each stream's ``CallLifecycle`` (``bridge/lifecycle.py``, the core ``bridge/media.py`` runs), whose steps are
done here against a model of the call's registry record and the engine core: the first stream takes the
session opened at the answer; a drop parks it with a ticket; the next stream resumes it, or — the engine gone —
opens a new one or, with no engine to take the call, plays the failure tone and hangs the call up. As the wire client does,
one ``session.close`` goes to a session whoever asks for it (the call at a ``stop``, the lifecycle at the end).

After every step the invariants are checked (``Violation`` names the first that fails):

- heard positions: every ``playback.ack`` and truncation of a response, across all the call's streams, never
  decreases and never exceeds the audio the engine generated for it;
- one ``session.close`` per session, and none to a session lost with its server;
- one engine session per call: a new one only once the last is lost (expired, its server gone), never beside
  one still detached or live, nor after the bridge closed the live one; the registry never says a stream holds
  the session when none does (a stream that ended without parking it), unless that stream's process died;
- a live call the registry lost is written there anew within ``RESTORE_BOUND_MS`` (its stream's next checkpoint);
  only a session the registry lost all trace of may have a new one opened beside it (left to the grace);
- a call whose bridge died is resumed on its next stream from the live ticket (the same session, never a new
  one while its server lives), within ``TAKEOVER_BOUND_MS`` of that stream's start; a call moved off a draining
  bridge is resumed on its next stream (its parked session, while its server lives), and so is the call of a
  half-open stream, from what it parks once superseded;
- an engine death is heard: the failure tone starts playing within ``TONE_BOUND_MS`` of the death (later by a
  stall of the bridge process in that time), then the call is hung up;
- no stream is ended by a carrier limit (idle, first message) or taken for a flood: the carrier here is never
  silent on a live stream and never floods it, so such an end is the bridge blaming it for its own stall;
- the call ends with an outcome the caller hears (the caller hung up on a conversation; the tone, then the
  hang-up, mid-call or for a stream no engine would take), and nothing is left open: the engine session
  closed (or lost with its server, or past its grace), the stream ended, the registry knows the call is over
  and holds no ticket.

Several calls at once (``SimulatedCalls``, ``--calls``): a seed picks 2-4 calls, when each is answered, an engine
server with room for all of them or one fewer, and whether it dies (under every call on it). They share the
server and the registry (a record per call). Besides each call's invariants: the server never holds more
sessions than it has room for; a call the server cannot take at its answer is refused busy (no stream, no
session); a stream is only ever given a session its own call opened; and once every call is over, a living
server holds no open session.

A failing seed prints itself; ``python -m callbridge.sim.faults --seed N`` replays it exactly (``--calls --seed
N`` one of several calls), ``--seeds 100000`` runs many.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field, replace
from typing import Any, Final, NoReturn

import numpy as np

from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call import CallOptions, CallSession, CallState
from callbridge.bridge.call_outputs import BargeInFlushed, ToCarrier, ToEngine
from callbridge.bridge.lifecycle import TAKEOVER_AFTER_MS, BindSource, CallLifecycle, EndReason
from callbridge.bridge.lifecycle_steps import Held, RecordSeen, Rejected, do_steps
from callbridge.bridge.registry import LiveCall
from callbridge.carriers import CARRIERS
from callbridge.carriers.base import ProtocolErrorReason
from callbridge.carriers.spec import FarEnd, FarEndMessage
from callbridge.codecs import pcm16_to_ulaw
from callbridge.engine.commands import AckPlayback, CloseSession, EngineCommand, TruncateItem
from callbridge.engine.errors import EngineError
from callbridge.engine.events import AudioDelta, EngineEvent, SessionClosed
from callbridge.engine.local.agents import AGENTS, OUTPUT_RATE_HZ
from callbridge.engine.local.core import LocalEngineOptions, LocalSessionCore, SessionState
from callbridge.engine.local.vad import FrameScorer
from callbridge.engine.port import ResumeTicket, SessionConfig

__all__ = [
    "CallsPlan",
    "FaultPlan",
    "SimulatedCall",
    "SimulatedCalls",
    "Violation",
    "calls_plan_for",
    "main",
    "plan_for",
    "run_calls_seed",
    "run_seed",
]

FRAME_MS: Final = 20
TONE_BOUND_MS: Final = 3000
"""Engine death → the failure tone playing (issue #13: within 3 s)."""
GIVE_UP_MS: Final = (1000, 2500)
"""Engine death → the wire client gives the session up: from a refused reconnect (SIGKILL) at about 1–2 s to a
frozen server found by a missed ping and then the budget, 2.5 s at most (``engine.reconnect_budget_s`` 2 s,
``engine.liveness_*`` 1 s)."""
_CALL_ID: Final = "CA" + "0" * 31 + "1"
_HELD_ECHO_MS: Final = 250
"""An echo held back for reordering goes alone after this long (two markers are 100 ms of audio apart)."""
_GRACE_MS: Final = 30_000
CHECKPOINT_MS: Final = 1000
"""How often the live ticket is written (``registry.checkpoint_interval_s``, shipped 1 s)."""
CHECKPOINT_POLL_MS: Final = 250
"""How often the driver looks whether it is due (and at a barge-in, before the engine is told of it)."""
RESTORE_BOUND_MS: Final = CHECKPOINT_MS + CHECKPOINT_POLL_MS
"""The registry lost a live call's record → its stream's checkpoint has written it anew."""
TAKEOVER_BOUND_MS: Final = TAKEOVER_AFTER_MS + 100
"""A crashed bridge's call, resumed on the next stream: from that stream's start to its session in hand."""


class Violation(AssertionError):
    """An invariant failed: which, when, and the seed that replays it."""

    def __init__(self, seed: int, at_ms: int, what: str, *, calls: bool = False) -> None:
        replay = f"python -m callbridge.sim.faults {'--calls ' if calls else ''}--seed {seed}"
        super().__init__(f"seed {seed} at {at_ms} ms: {what}  (replay: {replay})")
        self.seed = seed
        self.at_ms = at_ms
        self.what = what


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What one seed picked. Times are ms from the call's start."""

    utterances: tuple[tuple[int, int], ...]
    """(start, length) of what the caller says."""
    hangup_at_ms: int
    generation_speed: float
    drops_at_ms: tuple[int, ...] = ()
    redirect_delay_ms: int = 200
    engine_dies_at_ms: int | None = None
    engine_gives_up_after_ms: int = 2000
    read_stall: tuple[int, int] | None = None
    """(from, length): the bridge reads nothing meanwhile; what came arrives in a burst at its end."""
    echo_delay_ms: int = 0
    repeated_echoes: bool = False
    reordered_echoes: bool = False
    """Mark echoes come two by two, the later first (a carrier's echoes are not promised in order)."""
    bridge_crashes_at_ms: int | None = None
    """The bridge process serving the call dies (SIGKILL): no detach, no ticket; the carrier reconnects (to
    another process) after ``redirect_delay_ms``."""
    half_open_drops: bool = False
    """Each drop leaves the bridge's side of the socket half-open: the bridge goes on serving the dead stream (its
    audio into the void, no echoes) until the carrier's next stream tells it it is superseded."""
    bridge_drains_at_ms: int | None = None
    """The bridge process serving the call drains (SIGTERM, a shared registry): the stream moves — what the
    caller heard goes to the engine, the session is parked, the socket closes going away — and the carrier
    reconnects (to another process) after ``redirect_delay_ms``."""
    registry_stall: tuple[int, int] | None = None
    """(from, length): the live ticket's writes time out meanwhile (a Redis that stalls); each is tried again an
    interval later, the engine's replay after the last written ticket growing until one goes through."""
    registry_lost_at_ms: int | None = None
    """The registry loses everything it held of the call (Redis restarted empty, or failed over to a replica that
    never had it): a live stream's next checkpoint writes its record anew; a parked ticket is gone for good."""
    process_stall: tuple[int, int] | None = None
    """(from, length): the bridge process serving the call does not run (SIGSTOP, a frozen VM; up to 35 s, past the
    idle limit and the flood limit's burst): no tick, no read, nothing sent, no checkpoint, no new stream taken; the
    carrier plays, echoes and sends on, the engine server runs on. When it runs again the timers that came due run
    before its reader (as uvloop's do), then what waited is read in a burst. A drop the plan puts inside the stall
    does not happen; a process that crashed or drained before it is not there to stall."""


def plan_for(seed: int) -> FaultPlan:
    """The call and faults seed ``seed`` stands for (the same, on every machine)."""
    rng = random.Random(seed)
    utterances: list[tuple[int, int]] = []
    at = rng.randrange(100, 600, 20)
    for _ in range(rng.randint(1, 3)):
        length = rng.randrange(400, 1200, 20)
        utterances.append((at, length))
        at += length + rng.randrange(200, 2400, 20)  # short gaps talk over the agent: barge-ins
    hangup = at + rng.randrange(0, 1500, 20)
    drops = tuple(sorted(rng.randrange(300, hangup, 20) for _ in range(rng.choice((0, 0, 1, 1, 2)))))
    dies = rng.randrange(300, hangup, 20) if rng.random() < 0.3 else None
    stall = (rng.randrange(300, hangup, 20), rng.randrange(100, 1500, 20)) if rng.random() < 0.3 else None
    plan = FaultPlan(
        utterances=tuple(utterances),
        hangup_at_ms=hangup,
        generation_speed=rng.choice((1.0, 2.0, 4.0)),
        drops_at_ms=drops,
        redirect_delay_ms=rng.randrange(0, 1000, 20),
        engine_dies_at_ms=dies,
        engine_gives_up_after_ms=rng.randrange(GIVE_UP_MS[0], GIVE_UP_MS[1] + 1, 20),
        read_stall=stall,
        echo_delay_ms=rng.randrange(0, 120, 20),
        repeated_echoes=rng.random() < 0.3,
        reordered_echoes=rng.random() < 0.3,
        bridge_crashes_at_ms=rng.randrange(300, hangup, 20) if rng.random() < 0.25 else None,  # drawn late: the
        bridge_drains_at_ms=rng.randrange(300, hangup, 20) if rng.random() < 0.2 else None,  # faults drawn before
        half_open_drops=rng.random() < 0.4,  # keep their values
        registry_lost_at_ms=rng.randrange(300, hangup, 20) if rng.random() < 0.2 else None,
        registry_stall=(rng.randrange(300, hangup, 20), rng.randrange(200, 3000, 20)) if rng.random() < 0.2 else None,
    )
    if rng.random() < 0.15:  # drawn last, as above
        start, length = rng.randrange(300, hangup, 20), rng.randrange(500, 35_000, 20)
        if rng.random() < 0.5:  # the caller holds on through the silence (the carrier sending on), then hangs up
            hangup = max(hangup, start + length + rng.randrange(500, 3000, 20))
        plan = replace(plan, process_stall=(start, length), hangup_at_ms=hangup)
    return plan


class _LoudnessScorer(FrameScorer):
    """Speech is loud (RMS ≥ 0.05 of full scale): deterministic and cheap where Silero is neither."""

    def score(self, frame: np.ndarray) -> float:
        return 0.95 if float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) >= 0.05 else 0.02


def _speech_frames() -> tuple[bytes, ...]:
    """Loud voiced sound (180 Hz and harmonics), μ-law, one 20 ms frame each; 180 Hz repeats every 100 ms."""
    t = np.arange(160 * 5) / 8000
    wave = np.sin(2 * np.pi * 180 * t) + 0.5 * np.sin(2 * np.pi * 540 * t) + 0.3 * np.sin(2 * np.pi * 900 * t)
    ulaw = pcm16_to_ulaw((wave * 7000).astype("<i2").tobytes())
    return tuple(ulaw[i * 160 : (i + 1) * 160] for i in range(5))


_SPEECH: Final = _speech_frames()


_SILENCE: Final = b"\xff" * 160
"""20 ms of μ-law 8 kHz silence: the far end's frame."""


def marking_far_end() -> FarEnd:
    """The far end of the registry's first carrier that plays what it is sent, echoes marks and flushes."""
    spec = next(spec for spec in CARRIERS if spec.far_end is not None and spec.capabilities.marks and spec.capabilities.flush)
    return spec.far_end_wire()


def _stream_id(call: CallSession) -> str:
    stream_id = call.codec.stream_id
    assert stream_id is not None, "the stream has started"
    return stream_id


@dataclass(slots=True)
class _Carrier:
    """The carrier's side of one stream: plays media frames at real time, echoes marks in order once played."""

    queue: deque[tuple[str, bytes | str]] = field(default_factory=deque)
    played_since_ms: int | None = None
    """Watch playback from then on (the engine failed the call: its failure tone comes next)."""
    first_played_at_ms: int | None = None
    """When the first frame played since ``played_since_ms``: the tone was heard."""

    def receive(self, read: FarEndMessage) -> list[str]:
        """A message from the bridge, as the far end read it; returns the marks echoed at once (a clear echoes
        every pending one)."""
        if read[0] == "media":  # a message may join several frames: each plays its 20 ms
            audio = read[1]
            self.queue.extend(("media", audio[i : i + len(_SILENCE)]) for i in range(0, len(audio), len(_SILENCE)))
        elif read[0] == "mark":
            self.queue.append(read)
            return self._echo_head()
        else:
            echoed = [str(name) for kind, name in self.queue if kind == "mark"]
            self.queue.clear()
            return echoed
        return []

    def play(self, now_ms: int) -> list[str]:
        """One 20 ms tick: play a frame if one waits; returns marks now passed."""
        if self.queue and self.queue[0][0] == "media":
            self.queue.popleft()
            if self.first_played_at_ms is None and self.played_since_ms is not None and now_ms >= self.played_since_ms:
                self.first_played_at_ms = now_ms
        return self._echo_head()

    def _echo_head(self) -> list[str]:
        echoed = []
        while self.queue and self.queue[0][0] == "mark":
            echoed.append(str(self.queue.popleft()[1]))
        return echoed


@dataclass(slots=True)
class _RegistryModel:
    """The call's registry record (``bridge/registry.py``'s ``CallRecord``), in memory."""

    ticket: ResumeTicket | None = None
    input_ms: int = 0
    ended_reason: str | None = None
    bound: bool = False
    live: LiveCall | None = None

    def lose(self) -> None:
        """Everything the registry held of the call is gone (the record object stays: the calls share the dict)."""
        self.ticket, self.input_ms, self.ended_reason, self.bound, self.live = None, 0, None, False, None

    def is_empty(self) -> bool:
        return self.ticket is None and self.ended_reason is None and not self.bound and self.live is None


@dataclass(slots=True)
class _EngineServer:
    """The engine server a seed's calls share: room for ``capacity`` sessions at once (``resource_exhausted``
    past it), and every session it opened, with the call that opened it."""

    capacity: int
    sessions: dict[str, tuple[str, LocalSessionCore]] = field(default_factory=dict)
    """session id → (the call that opened it, its core)."""
    orphaned: set[str] = field(default_factory=set)
    """Sessions no bridge can name any more (the registry lost their ticket): the engine's disconnect grace ends
    them (or, one a half-open stream still serves, that socket's keepalive), not the bridge."""

    def in_use(self) -> int:
        return sum(core.state is not SessionState.CLOSED for _, core in self.sessions.values())

    def open_unowned(self) -> list[str]:
        """Sessions still open that some bridge should have closed (not those left to the grace by a loss)."""
        open_ = [sid for sid, (_, core) in self.sessions.items() if core.state is not SessionState.CLOSED]
        return [sid for sid in open_ if sid not in self.orphaned]

    def has_room(self) -> bool:
        return self.in_use() < self.capacity


class _Silent:
    """The simulator's log (``StepLog``): it says nothing; a violation says what went wrong."""

    def info(self, event: str, **kw: Any) -> None:
        pass

    def warning(self, event: str, **kw: Any) -> None:
        pass


@dataclass(slots=True)
class _Wake:
    """What the executor waits for in the simulation (``sleep_until``): the virtual clock reaching ``at_ms``."""

    at_ms: int

    def __await__(self) -> Generator[_Wake, None, None]:
        yield self


@dataclass(slots=True)
class _Binding:
    """A stream's binding steps (a coroutine of the executor) and the lifecycle they are of; ``at_ms``: when a
    waiting one goes on."""

    life: CallLifecycle
    steps: Coroutine[_Wake, None, None]
    at_ms: int | None = None


class _ModelEffects:
    """The lifecycle's effects in the simulation (``bridge/lifecycle_steps.py``'s ``LifecycleEffects``): the call's
    registry record, the engine server and the stream are the simulated call's models; where the server does a
    step against Redis and the engine, this does it against them, and checks what it sees there."""

    log = _Silent()

    def __init__(self, sim: SimulatedCall) -> None:
        self.sim = sim

    def now_ms(self) -> int:
        return self.sim.now_ms

    async def token_is_ours(self) -> bool:
        self.sim._violation("a token check: the simulated carrier's streams are admitted by their address")

    async def ended_reason(self) -> str | None:
        return self.sim.registry.ended_reason

    async def claim_ticket(self) -> tuple[ResumeTicket | None, int]:
        registry = self.sim.registry
        ticket, registry.ticket = registry.ticket, None
        return ticket, registry.input_ms

    async def read_record(self) -> RecordSeen:
        sim, registry = self.sim, self.sim.registry
        if registry.bound and sim.crashed_at_ms is None and sim._half_open is None:  # the last ended unparked
            sim._violation("the registry says a stream holds the session; the last one ended without parking it")
        holder = registry.live.holder if registry.live is not None else None
        return RecordSeen(bound=registry.bound, ended=registry.ended_reason is not None, live_holder=holder)

    async def claim_live(self, holder: str) -> LiveCall | None:
        registry = self.sim.registry
        live = registry.live if registry.live is not None and registry.live.holder == holder else None
        if live is not None:
            registry.live, registry.bound = None, False
        return live

    async def nudge_old_stream(self) -> None:
        self.sim._supersede_half_open()  # a half-open stream detaches; a dead process answers nothing

    async def sleep_until(self, at_ms: int) -> None:
        await _Wake(at_ms)

    async def take_answer_session(self) -> LocalSessionCore | None:
        return self.sim.engine if self.sim.streams == 1 else None  # opened at the answer, taken by the first stream

    async def resume(self, ticket: ResumeTicket) -> LocalSessionCore:
        sim = self.sim
        owner = sim.server.sessions.get(ticket.session_id, ("nobody",))[0]
        if owner != sim.call_id:
            sim._violation(f"a stream of {sim.call_id} was given the session of {owner} ({ticket.session_id})")
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
        if beside and sim._unnamed_session != sim.engine.session_id:
            sim._violation(f"a second engine session while the call's first is still {sim.engine.state.value}")
        if sim.close_requested:
            sim._violation("a new engine session for a call whose live one the bridge closed: the conversation restarts")
        if not sim.server.has_room():  # the other calls' sessions (or the one the registry lost) fill the server
            raise EngineError("resource_exhausted")
        if beside:  # the registry lost the first: its grace ends it. A half-open stream still serving it finds the
            # call held by this stream at its next checkpoint and stops writing; it ends quietly past its limits
            sim.server.orphaned.add(sim.engine.session_id)  # (not followed further)
            sim._unnamed_session, sim._orphaned_since_bind, sim._half_open = None, True, None
        sim.sessions += 1
        sim.engine = sim._new_engine(f"duplex-sim-{sim.call_id[-4:]}-{sim.sessions}")
        sim.server.sessions[sim.engine.session_id] = (sim.call_id, sim.engine)
        sim.closes_sent, sim.session_lost = 0, False
        sim.close_requested = False
        return sim.engine

    async def refuse(self, reason: str, *, no_engine: bool) -> None:
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
        self.sim._violation("a reconnect window: the simulated carrier names none")

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
        server: _EngineServer | None = None,
        registry: dict[str, _RegistryModel] | None = None,
        in_fleet: bool = False,
    ) -> None:
        """One call. With ``server`` and ``registry``: one of several calls sharing them (``SimulatedCalls``); the
        call is answered now (a busy refusal when the server has no room, or is dead already)."""
        self.seed = seed
        self.plan = plan or plan_for(seed)
        self.call_id = call_id
        self.now_ms = 0
        self._in_fleet = in_fleet
        self._ids = random.Random(f"{seed}:{call_id}")
        self.server = server or _EngineServer(capacity=1)
        self.registry = (registry if registry is not None else {}).setdefault(call_id, _RegistryModel())
        self.sessions = 1
        self.outcome: str | None = None
        dead_at_answer = self.plan.engine_dies_at_ms is not None and self.plan.engine_dies_at_ms <= 0
        self.engine = self._new_engine(f"duplex-sim-{call_id[-4:]}-1")
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
        self.carrier: _Carrier | None = None
        self._to_bridge: list[tuple[int, int, str | bytes]] = []
        """(deliver at, order, message) from the carrier to the bridge."""
        self._order = 0
        self._held_echo: tuple[str | bytes, int] | None = None
        """A mark echo held back (``reordered_echoes``), and since when."""
        self._next_stream_at_ms: int | None = 0 if self.outcome is None else None
        self._stream_started_at_ms = 0
        self._end_ms = self.plan.hangup_at_ms + 15_000 + self._stalled_ms(0, self.plan.hangup_at_ms + 15_000)
        self._ran_again = False
        """The process stall (``process_stall``) is over and its late timers have run."""
        self.crashed_at_ms: int | None = None
        self.drained = False
        self._resuming_moved = False  # the last stream moved off a draining process: the next resumes its session
        self._half_open: tuple[CallSession, CallLifecycle] | None = None
        """A dropped stream the bridge still serves (``half_open_drops``), and its lifecycle, until superseded."""
        self._resuming_half_open = False  # the next stream resumes the session the superseded one parks
        self._dead_holder: str | None = None  # the live ticket's holder when the bridge crashed
        self.registry_lost = False
        self._orphaned_since_bind = False
        self._unnamed_session: str | None = None
        """The session the registry lost all trace of (a parked ticket, or a live ticket not yet written anew):
        until a checkpoint writes it again, the next stream cannot find it and opens a new one beside it."""
        self._taking_over = False
        """A stream after the crash is binding: it must resume the session from the live ticket."""
        self._binding: _Binding | None = None
        """A binding that waits (``WaitUntil``): its steps, when they go on, and the lifecycle they are of."""
        self._journal: list[EngineEvent] = []
        """The engine's replay after the live ticket: events the stream took since the ticket was last written."""
        self._replay: list[EngineEvent] = []
        self._checkpoint_at_ms: int | None = None
        self.effects = _ModelEffects(self)
        """What the lifecycle's steps do here (the executor's effects, against the models)."""

    def _new_engine(self, session_id: str) -> LocalSessionCore:
        options = LocalEngineOptions(agent="echo", chunk_ms=500, generation_speed=self.plan.generation_speed,
                                     disconnect_grace_ms=_GRACE_MS)  # fmt: skip
        ids = self._ids
        engine = LocalSessionCore(session_id, SessionConfig(), AGENTS["echo"](), options, self.now_ms,
                                  scorer=_LoudnessScorer(), token_hex=lambda n: ids.randbytes(n).hex())  # fmt: skip
        engine.events_to_send()  # session.created
        return engine

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
                self._violation(f"the call never ended (state {self.call.state if self.call else None})")
            self._step()
            self._check()
            self.now_ms += FRAME_MS // 2
            if self.outcome is None:
                return True
        self._check_end()
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
        if self._half_open is not None:
            self._serve_half_open(*self._half_open)
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
            self._checkpoint_if_due(call)
        if now % FRAME_MS == 0:
            self._carrier_tick(call, carrier)
        self._deliver_to_bridge(call)
        if self.call is None:
            return
        if not self.engine_dead:
            self._tick_engine()
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
        deadline = call.next_deadline_ms()
        if deadline is not None and deadline <= now:
            call.tick(now)
        self._drain(call, carrier)

    def _step_stalled(self) -> None:
        """A step while the bridge process does not run: the world goes on (the engine server, its death, the
        registry's loss), the carrier plays what it was sent and sends on; nothing of the bridge runs."""
        self._world_goes_on()
        call, carrier = self.call, self.carrier
        if call is not None and carrier is not None and self.now_ms % FRAME_MS == 0:
            self._carrier_tick(call, carrier, stalled=True)
        if not self.engine_dead:
            self._tick_engine()  # its events wait for the bridge to read them

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
        half_open = self._half_open[0] if self._half_open is not None else None
        for call in (self.call, half_open):
            deadline = None if call is None else call.next_deadline_ms()
            if call is not None and deadline is not None and deadline <= self.now_ms:
                call.tick(self.now_ms)
        if self.call is not None and self.carrier is not None:
            self._drain(self.call, self.carrier)

    def _stalled_ms(self, start_ms: int, end_ms: int) -> int:
        """How long the bridge process did not run (``process_stall``) between ``start_ms`` and ``end_ms``: a bound
        on what it does in that time is that much later."""
        stall = self.plan.process_stall
        if stall is None or stall[0] >= end_ms or stall[0] + stall[1] <= start_ms:
            return 0
        return stall[1]

    def _carrier_tick(self, call: CallSession, carrier: _Carrier, *, stalled: bool = False) -> None:
        now, plan = self.now_ms, self.plan
        if now >= plan.hangup_at_ms and call.state is not CallState.ENDED:
            self._send(self.far_end.stop(_stream_id(call)), 0)
            return
        if any(now == at for at in plan.drops_at_ms) and call.state is CallState.LIVE and not stalled:
            self._drop(call)
            return
        for mark in carrier.play(now):
            self._echo(call, mark)
        self._release_held_echo()
        speaking = any(start <= now < start + length for start, length in plan.utterances)
        frame = _SPEECH[now // FRAME_MS % len(_SPEECH)] if speaking else _SILENCE
        self._send(self.far_end.media(_stream_id(call), frame, now - self._stream_started_at_ms), 0)

    def _echo(self, call: CallSession, mark: str) -> None:
        message = self.far_end.mark_echo(_stream_id(call), mark)
        delay = self.plan.echo_delay_ms
        if self.plan.reordered_echoes:
            if self._held_echo is None:
                self._held_echo = (message, self.now_ms)  # sent after the next one, or alone once it is late
                return
            (held, _), self._held_echo = self._held_echo, None
            self._send(message, delay)
            self._send(held, delay)
        else:
            self._send(message, delay)
        if self.plan.repeated_echoes:
            self._send(message, delay + FRAME_MS)

    def _release_held_echo(self) -> None:
        if self._held_echo is not None and self.now_ms >= self._held_echo[1] + _HELD_ECHO_MS:
            (held, _), self._held_echo = self._held_echo, None
            self._send(held, self.plan.echo_delay_ms)

    def _send(self, message: str | bytes, delay_ms: int) -> None:
        at = self.now_ms + delay_ms
        stall = self.plan.read_stall
        if stall is not None and stall[0] <= at < stall[0] + stall[1]:
            at = stall[0] + stall[1]  # read late, in a burst, in order
        self._order += 1
        self._to_bridge.append((at, self._order, message))

    def _deliver_to_bridge(self, call: CallSession) -> None:
        due = sorted(m for m in self._to_bridge if m[0] <= self.now_ms)
        if not due:
            return
        self._to_bridge = [m for m in self._to_bridge if m[0] > self.now_ms]
        for _, _, message in due:
            if self.call is not call or call.state in (CallState.ENDED, CallState.DETACHED):
                return
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
        self.carrier = _Carrier()
        self._stream_started_at_ms = self.now_ms
        for message in self.far_end.opening(self.streams, self.call_id):
            call.receive_message(message, self.now_ms)
        self.life = life = CallLifecycle(check_token=False, answer_sessions=True)
        life.stream_started()
        live = self.registry.live
        self._taking_over = live is not None and live.holder == self._dead_holder  # its holder's process died
        self._go_on_binding(_Binding(life, self._bind_steps(life)))

    def _go_on_binding(self, binding: _Binding) -> None:
        """The stream's binding steps (``bridge/lifecycle_steps.py``'s executor, against the models) until they are
        done — bound, refused — or wait (``WaitUntil``: then again once the clock gets there)."""
        try:
            wait = binding.steps.send(None)
        except StopIteration:
            return
        binding.at_ms = wait.at_ms
        self._binding = binding

    async def _bind_steps(self, life: CallLifecycle) -> None:
        await do_steps(life, self.effects, Held(None))
        if life.bound is not None:
            self._bind(life)

    def _bind(self, life: CallLifecycle) -> None:
        """The session in hand: bound to the stream as ``MediaStreamDriver._bind`` binds it."""
        call, registry = self.call, self.registry
        assert call is not None and self.carrier is not None
        bind = life.stream_state_at_bind(call.facts())
        assert bind is not None
        # the session to resume was lost by the registry: a new one beside it is no violation
        unnamed, self._orphaned_since_bind = self._orphaned_since_bind, False
        if self._taking_over:  # the crashed bridge's call: resumed from its live ticket, at once, unless its server died
            self._taking_over = False
            if not self.session_lost and not unnamed and bind.source is not BindSource.TAKEN_OVER:
                self._violation(f"the call of a crashed bridge was bound {bind.detail}, not resumed from its live ticket")
            if self.now_ms - self._stream_started_at_ms > TAKEOVER_BOUND_MS:
                self._violation(f"the call of a crashed bridge waited {self.now_ms - self._stream_started_at_ms} ms for its session")
        if self._resuming_half_open:  # the superseded stream parked its session: this one resumes it
            self._resuming_half_open = False
            resumable = not self.session_lost and not self.engine_dead and self.crashed_at_ms is None and not unnamed
            if resumable and bind.source is not BindSource.RESUMED:
                self._violation(f"the call of a half-open stream was bound {bind.detail}, not resumed from what it parked")
        if self._resuming_moved:  # a drained process's call: the same session, unless its server died
            self._resuming_moved = False
            if not self.session_lost and not self.engine_dead and not unnamed and bind.source is not BindSource.RESUMED:
                self._violation(f"the call moved off a draining bridge was bound {bind.detail}, not resumed")
        registry.bound = True
        call.engine_bound(EngineBinding.of(bind, self.engine.capabilities), self.now_ms)
        self._write_live_ticket(call)  # the replay after it: what this stream takes from now on
        replay, self._replay = (self._replay, []) if bind.source is BindSource.TAKEN_OVER else ([], [])
        for event in replay:  # the engine's replay after the live ticket comes first on the resumed socket
            call.receive_engine_event(event, self.now_ms)
            self._journal.append(event)
        self._after_input(call)

    def _write_live_ticket(self, call: CallSession) -> None:
        """The stream's live ticket into the registry (at its bind, then every ``CHECKPOINT_MS``): what the engine
        replays after it is what the stream takes from now on."""
        ticket = ResumeTicket(self.engine.session_id, self.engine.lease_generation, heard_ms=call.heard_so_far(self.now_ms),
                              told_ms=call.told_so_far)  # fmt: skip
        self.registry.live = LiveCall(f"bridge:{call.codec.stream_id}", ticket, call.facts().input_ms)
        self._named_again()
        self._journal = []
        self._checkpoint_at_ms = self.now_ms + CHECKPOINT_MS

    def _crash(self) -> None:
        """The bridge process dies (SIGKILL): nothing it had not sent goes out, nothing is parked; its sockets close
        with it (the engine keeps the session for its grace); the carrier reconnects after its delay."""
        self.crashed_at_ms = self.now_ms
        self._dead_holder = self.registry.live.holder if self.registry.live is not None else None
        self._half_open = None  # its process died with it
        if not self.engine_dead:
            self.engine.detach(self.now_ms)
        self._replay, self._journal = self._journal, []
        self.life = self.call = self.carrier = None
        self._checkpoint_at_ms = None
        self._to_bridge.clear()
        self._held_echo = None
        self._next_stream_at_ms = self.now_ms + self.plan.redirect_delay_ms

    def _drop(self, call: CallSession) -> None:
        """The media socket drops (no stop): what was heard goes to the engine, then the stream's lifecycle parks
        the session with a ticket, as ``MediaStreamDriver._finish`` does; the carrier opens the next stream after
        its delay."""
        if self.plan.half_open_drops and self.life is not None and call.state is CallState.LIVE:
            self._half_open, self.life = (call, self.life), None  # the bridge does not know: it serves on
            self._gone_until_next_stream()
            self._resuming_half_open = True
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
            self._tick_engine()
            self._engine_events(call)  # not the current stream's: its outputs go nowhere
        deadline = call.next_deadline_ms()
        if deadline is not None and deadline <= now:
            call.tick(now)
        if call.state is CallState.LIVE:
            self._checkpoint_if_due(call)
        self._submit_all([o.command for o in call.outputs() if isinstance(o, ToEngine)])  # the rest goes into the void
        if call.state in (CallState.ENDED, CallState.DETACHED):  # past its limits
            self._half_open = None
            self._end_stream_of(call, life)

    def _supersede_half_open(self) -> None:
        """The carrier's new stream tells the bridge the old one is superseded (``LiveStream.superseded``): it ends
        as a drop — what was heard to the engine, its session parked for the new stream."""
        if self._half_open is None:
            return  # nobody holds the call any more, or its process is dead: nobody answers
        call, life = self._half_open
        call.superseded(self.now_ms)
        self._submit_all([o.command for o in call.outputs() if isinstance(o, ToEngine)])
        if call.state is CallState.LIVE:  # it did not take the hint: served on, half-open
            return
        self._half_open = None
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
        self._resuming_moved = True

    def _gone_until_next_stream(self) -> None:
        self.call = self.carrier = None
        self._to_bridge.clear()
        self._held_echo = None
        self._next_stream_at_ms = self.now_ms + self.plan.redirect_delay_ms

    def _end_stream(self, call: CallSession) -> None:
        """The stream is over: do its lifecycle's ending steps (park, close, mark ended)."""
        life = self.life
        if life is None:
            return
        self.life = None
        self._end_stream_of(call, life)

    def _end_stream_of(self, call: CallSession, life: CallLifecycle) -> None:
        self._check_carrier_not_blamed(call)
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
        self._violation("a stream's ending steps waited")

    def _after_input(self, call: CallSession) -> None:
        carrier = self.carrier
        assert carrier is not None
        self._drain(call, carrier)
        self._engine_events(call)

    def _tick_engine(self) -> None:
        deadline = self.engine.next_deadline_ms()
        if deadline is not None and deadline <= self.now_ms:
            self.engine.tick(self.now_ms)

    def _checkpoint_if_due(self, call: CallSession) -> None:
        """The driver's poll of the live ticket, written once due."""
        if self._checkpoint_at_ms is not None and self.now_ms % CHECKPOINT_POLL_MS == 0 and self.now_ms >= self._checkpoint_at_ms:
            self._checkpoint(call)

    def _checkpoint(self, call: CallSession) -> None:
        """One write of the stream's live ticket (due, or at a barge-in), as ``CallRegistry.checkpoint`` writes it:
        only while this stream holds the call (else the keeper stops: released); a record the registry lost, anew."""
        registry, holder = self.registry, f"bridge:{call.codec.stream_id}"
        if self._registry_stalled():  # timed out: tried again an interval on; the replay keeps what follows the last
            self._checkpoint_at_ms = self.now_ms + CHECKPOINT_MS
            return
        if registry.is_empty():
            registry.bound = True  # written anew (``_write_live_ticket``): a takeover finds it again
        elif not registry.bound or registry.live is None or registry.live.holder != holder:
            self._checkpoint_at_ms = None  # not this stream's to write any more
            return
        self._write_live_ticket(call)

    def _registry_stalled(self) -> bool:
        stall = self.plan.registry_stall
        return stall is not None and stall[0] <= self.now_ms < stall[0] + stall[1]

    def _named_again(self) -> None:
        """The registry holds a ticket of the call's session again (a live ticket written, a ticket parked)."""
        if self._unnamed_session == self.engine.session_id:
            self._unnamed_session = None

    def _lose_registry(self) -> None:
        """The registry loses the call's record. A parked session (its ticket) or a live one (until a checkpoint
        writes it anew) can no longer be found by a stream of the call: one opened beside it is no violation,
        and the engine's grace ends the first."""
        self.registry_lost = True
        registry = self.registry
        if registry.ended_reason is not None:
            return  # the call is known over: losing that changes nothing the caller hears
        if registry.ticket is not None or registry.live is not None:
            self._unnamed_session = self.engine.session_id
        registry.lose()

    def _engine_events(self, call: CallSession) -> None:
        """The engine's events to ``call``, its outputs to the carrier after each batch while it is the current
        stream (a half-open one's carrier is gone: its caller takes the outputs)."""
        if self.engine_dead or call.state is CallState.STARTING:  # not bound yet: the engine keeps them for the stream
            return
        while events := self.engine.events_to_send():
            for event in events:
                self._on_engine_event(event)
                if call.state is CallState.LIVE:
                    call.receive_engine_event(event, self.now_ms)
                    self._journal.append(event)
            if call is self.call and self.carrier is not None:
                self._drain(call, self.carrier)

    def _on_engine_event(self, event: EngineEvent) -> None:
        if isinstance(event, AudioDelta):
            self.generated_bytes[event.response_id] = self.generated_bytes.get(event.response_id, 0) + len(event.pcm)

    def _drain(self, call: CallSession, carrier: _Carrier) -> None:
        """The call's outputs, in its order, as the driver does them: to the carrier, to the engine."""
        for output in call.outputs():
            if isinstance(output, ToCarrier):
                read = self.far_end.read(_stream_id(call), output.message)
                if isinstance(read, str):
                    self._violation(f"the carrier refused a message from the bridge: {read}")
                for mark in carrier.receive(read):
                    self._echo(call, mark)
            elif isinstance(output, ToEngine):
                self._submit_all([output.command])
            elif isinstance(output, BargeInFlushed) and call.state is CallState.LIVE and self._checkpoint_at_ms is not None:
                self._checkpoint(call)  # as the driver: before what the engine is told of the cut reply
        if call.state is CallState.ENDED and self.outcome is None:
            failed = call.failures_by_engine is not None and call.end_reason != "caller_hung_up"
            no_engine = (call.end_reason or "").startswith(EndReason.ENGINE_UNAVAILABLE)
            self.outcome = "failure_tone_and_hang_up" if failed else "no_engine_tone_and_hang_up" if no_engine else call.end_reason or "ended"
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

    # ----------------------------------------------------------- invariants

    def _check_command(self, command: EngineCommand) -> None:
        if isinstance(command, CloseSession):
            self.closes_sent += 1
            if self.closes_sent > 1:
                self._violation("a second session.close for the same session")
            if self.engine_lost_reported:
                self._violation("session.close to a session lost with its server")
            return
        if isinstance(command, AckPlayback):
            response_id, heard = command.response_id, command.played_ms
        elif isinstance(command, TruncateItem):
            response_id, heard = command.item_id.removeprefix("item_"), command.audio_end_ms
        else:
            return
        told = self.heard_told.get(response_id)
        if told is not None and heard < told:
            self._violation(f"heard position of {response_id} went back from {told} to {heard} ms")
        generated = self.generated_bytes.get(response_id, 0) * 1000 // (2 * OUTPUT_RATE_HZ)
        if heard > generated:
            self._violation(f"heard {heard} ms of {response_id}, which has only {generated} ms")
        self.heard_told[response_id] = max(heard, told or 0)

    def _check(self) -> None:
        """Dead air after an engine death: by ``TONE_BOUND_MS`` after it, a live call plays the failure tone. A live
        call the registry lost is resumable from it again within ``RESTORE_BOUND_MS`` (its next checkpoint). No
        stream is ended by a carrier limit: the carrier here is never silent on a live stream."""
        call, restore_by = self.call, self._restored_by_ms()
        if call is not None:
            self._check_carrier_not_blamed(call)
        if (
            restore_by is not None and self.now_ms > restore_by and self._unnamed_session == self.engine.session_id
            and call is not None and call.state is CallState.LIVE
        ):  # fmt: skip
            lost_at = self.plan.registry_lost_at_ms
            self._violation(f"the registry lost the call at {lost_at} ms; its live stream has not written it again")
        died, carrier = self.plan.engine_dies_at_ms, self.carrier
        if died is None or self.outcome is not None or call is None:
            return
        if self.now_ms <= died + TONE_BOUND_MS + self._stalled_ms(died, died + TONE_BOUND_MS):
            return
        if call.state is CallState.LIVE:
            self._violation(f"engine died at {died} ms; the caller still hears nothing of it (dead air)")
        if call.state is CallState.ENDING and (carrier is None or carrier.first_played_at_ms is None):
            self._violation(f"engine died at {died} ms; no failure tone has played")

    def _check_carrier_not_blamed(self, call: CallSession) -> None:
        """The carrier here is never silent on a live stream and never floods it: a stream ended by a carrier limit
        or taken for a flood is the bridge blaming it (for a stall of its own)."""
        if call.limit_reached is not None:
            self._violation(f"the stream was ended by a limit the carrier gave no cause for: {call.limit_reached}")
        if call.failure is not None and call.failure.reason is ProtocolErrorReason.FLOOD:
            self._violation("the carrier's messages were taken for a flood")

    def _restored_by_ms(self) -> int | None:
        """When a live call the registry lost must be written there again: a checkpoint after the loss, or after
        the end of a stall that keeps that checkpoint from going through. None: no loss in this plan."""
        lost_at, stall = self.plan.registry_lost_at_ms, self.plan.registry_stall
        if lost_at is None:
            return None
        if stall is not None and stall[0] < lost_at + RESTORE_BOUND_MS and sum(stall) > lost_at:
            lost_at = sum(stall)
        return lost_at + RESTORE_BOUND_MS + self._stalled_ms(lost_at, lost_at + RESTORE_BOUND_MS)

    def _check_end(self) -> None:
        call, outcome = self.call, self.outcome
        unnamed = self._unnamed_session == self.engine.session_id  # the registry lost it; no stream found it again
        if unnamed and self.engine.state is not SessionState.CLOSED:
            self.server.orphaned.add(self.engine.session_id)  # left to the grace
        if outcome == "busy":
            if self.streams or self.engine.session_id in self.server.sessions:
                self._violation("refused busy at the answer, yet a stream or a session was had")
            return
        if outcome in ("failure_tone_and_hang_up", "no_engine_tone_and_hang_up"):  # mid-call, or at the next stream
            carrier = self.carrier
            if call is None or call.hangup is None:
                self._violation("the engine failed the call, which was never hung up")
            hung_up_first = self.failed_at_ms is not None and self.plan.hangup_at_ms <= self.failed_at_ms  # the
            if (carrier is None or carrier.first_played_at_ms is None) and not hung_up_first:  # stop not read yet
                self._violation("the engine failed the call; the caller heard no failure tone")
            if outcome == "no_engine_tone_and_hang_up" and self.registry.ended_reason is None:
                self._violation("no engine took the call's next stream; the registry does not know the call is over")
            return
        if outcome != "caller_hung_up":
            self._violation(f"the call ended as {outcome!r}: not an outcome the caller hears as such")
        if call is None or call.state is not CallState.ENDED:
            self._violation("the caller hung up; the stream did not end")
        if not self.engine_dead:
            self.engine.events_to_send()
            # a session the registry lost is left to the engine's grace, or (a half-open stream still serving it,
            # which no stream of the call could find to supersede) to that socket's keepalive
            left_to = {SessionState.DETACHED, SessionState.LIVE} if self._half_open is not None else {SessionState.DETACHED}
            if self.engine.state is not SessionState.CLOSED and not (unnamed and self.engine.state in left_to):
                self._violation(f"the call is over; its engine session is left {self.engine.state.value}")
        lost = self.engine_lost_reported or self.session_lost or unnamed  # a close sent before the loss was known
        if self.closes_sent > 1 or (not lost and self.closes_sent != 1):  # is fine; one after it is caught as sent
            self._violation(f"{self.closes_sent} session.close for one session")
        if self.registry.ended_reason is None or self.registry.ticket is not None or self.registry.live is not None:
            self._violation("the call is over; the registry does not know it (or still holds a ticket)")

    def _violation(self, what: str) -> NoReturn:
        raise Violation(self.seed, self.now_ms, f"{self.call_id}: {what}" if self._in_fleet else what, calls=self._in_fleet)


def run_seed(seed: int) -> SimulatedCall:
    """Run seed ``seed``; raises ``Violation`` at the first invariant that fails."""
    return SimulatedCall(seed).run()


# ------------------------------------------------------------------ several calls


@dataclass(frozen=True, slots=True)
class CallsPlan:
    """Several calls on one engine server: when each is answered (ms from the seed's start), what each does
    (its own ``FaultPlan``, its times from its answer), how many sessions the server takes at once, and when the
    server dies (for every call on it)."""

    starts_at_ms: tuple[int, ...]
    plans: tuple[FaultPlan, ...]
    capacity: int
    engine_dies_at_ms: int | None


def calls_plan_for(seed: int) -> CallsPlan:
    """The calls seed ``seed`` stands for (``--calls``), the same on every machine."""
    rng = random.Random(f"calls:{seed}")
    count = rng.randint(2, 4)
    capacity = rng.randint(max(1, count - 1), count)  # one short, at times: a call finds the server full
    dies = rng.randrange(300, 8000, 20) if rng.random() < 0.3 else None
    starts = tuple(sorted(rng.randrange(0, 4000, 20) for _ in range(count)))
    plans = tuple(
        replace(plan_for(rng.randrange(2**31)), engine_dies_at_ms=None if dies is None else dies - start) for start in starts
    )
    return CallsPlan(starts, plans, capacity, dies)


class SimulatedCalls:
    """Several calls at once on one virtual clock, one engine server (its room, its death) and one registry
    (a record per call). Besides each call's invariants: the server never holds more sessions than it has room
    for; a stream is only ever given a session its own call opened; a call is refused busy only when the server
    is full or dead at its answer; and once every call is over, the server (if it lives) holds no open session."""

    def __init__(self, seed: int, plan: CallsPlan | None = None) -> None:
        self.seed = seed
        self.plan = plan or calls_plan_for(seed)
        self.server = _EngineServer(self.plan.capacity)
        self.registry: dict[str, _RegistryModel] = {}
        self.calls: list[SimulatedCall] = []
        self.now_ms = 0

    def run(self) -> SimulatedCalls:
        plan = self.plan
        waiting = list(enumerate(zip(plan.starts_at_ms, plan.plans, strict=True)))
        running: list[SimulatedCall] = []
        while waiting or running:
            while waiting and waiting[0][1][0] <= self.now_ms:
                index, (_, call_plan) = waiting.pop(0)
                call = SimulatedCall(self.seed, call_plan, call_id=f"CA{index + 1:032x}", server=self.server,
                                     registry=self.registry, in_fleet=True)  # fmt: skip
                self.calls.append(call)
                running.append(call)
            running = [call for call in running if call.advance()]
            if self.server.in_use() > plan.capacity:
                raise Violation(self.seed, self.now_ms, f"{self.server.in_use()} sessions on a server with room for {plan.capacity}", calls=True)
            self.now_ms += FRAME_MS // 2
        dead = plan.engine_dies_at_ms is not None
        left = self.server.open_unowned()
        if left and not dead:
            raise Violation(self.seed, self.now_ms, f"every call is over; the server still holds {left}", calls=True)
        return self

    @property
    def outcomes(self) -> list[str]:
        return [call.outcome or "?" for call in self.calls]


def run_calls_seed(seed: int) -> SimulatedCalls:
    """Run the several calls of seed ``seed``; raises ``Violation`` at the first invariant that fails."""
    return SimulatedCalls(seed).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m callbridge.sim.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1000, help="run seeds 0..N-1 (default 1000)")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay one seed, printing its plan and outcome")
    parser.add_argument("--calls", action="store_true", help="seeds of several calls on one engine server (2-4 calls)")
    args = parser.parse_args(argv)
    if args.seed is not None:
        print(calls_plan_for(args.seed) if args.calls else plan_for(args.seed))
        try:
            if args.calls:
                calls = run_calls_seed(args.seed)
                print(f"outcomes: {calls.outcomes}; streams {[call.streams for call in calls.calls]}")
            else:
                call = run_seed(args.seed)
                print(f"outcome: {call.outcome}; streams {call.streams}; heard told {call.heard_told}")
        except Violation as exc:
            print(exc)
            return 1
        return 0
    outcomes: dict[str, int] = {}
    failed = 0
    for seed in range(args.first, args.first + args.seeds):
        try:
            ended = run_calls_seed(seed).outcomes if args.calls else [run_seed(seed).outcome or "?"]
        except Violation as exc:
            failed += 1
            print(exc)
            continue
        for outcome in ended:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    kind = "seeds of several calls" if args.calls else "seeds"
    print(f"{args.seeds} {kind}: {failed} failed; outcomes {dict(sorted(outcomes.items()))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
