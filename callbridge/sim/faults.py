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
each stream's ``CallLifecycle`` (``bridge/lifecycle.py``), whose steps the server's own executor does
(``bridge/lifecycle_steps.py``, as ``bridge/media.py`` runs it) against a model of the call's registry record and
the engine core (``sim/simulated_call.py``'s effects), and each stream bound as the server binds it, with what the
call's application chose (``FaultPlan.assistant``: a greeting, one the caller may not cut, a recording, a silence
prompt and goodbye): the first stream takes the
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
- a caller's silence is acted on (a prompt, a goodbye) only with what they said read: never on a tick that runs,
  after a stall of the process, before the reader gets to the caller's speech of that time;
- no stream is ended by a carrier limit (idle, first message) or taken for a flood: the carrier here is never
  silent on a live stream and never floods it, so such an end is the bridge blaming it for its own stall;
- the call ends with an outcome the caller hears (the caller hung up on a conversation; a silent caller said
  goodbye to and hung up on, where the call's assistant set a silence limit; the tone, then the
  hang-up, mid-call or for a stream no engine would take), and nothing is left open: the engine session
  closed (or lost with its server, or past its grace), the stream ended, the registry knows the call is over
  and holds no ticket.

Several calls at once (``SimulatedCalls``, ``--calls``): a seed picks 2-4 calls, when each is answered, an engine
server with room for all of them or one fewer, and whether it dies (under every call on it). They share the
server and the registry (a record per call). Besides each call's invariants: the server never holds more
sessions than it has room for; a call the server cannot take at its answer is refused busy (no stream, no
session); a stream is only ever given a session its own call opened; and once every call is over, a living
server holds no open session.

Admission under any interleaving (``--admission``, ``sim/admission_sim.py``): the server's own answer desk and
fleet count, one ``BridgeServices`` per bridge process on a virtual asyncio clock, answers, streams and hang-ups
interleaved at every registry round trip; a process never answers past ``max_calls`` nor the fleet past its limit,
never refuses with room, and holds nothing once every call is over.

A failing seed prints itself; ``python -m callbridge.sim.faults --seed N`` replays it exactly (``--calls --seed
N`` one of several calls), ``--seeds 100000`` runs many.
"""


from __future__ import annotations

import argparse
import sys

from callbridge.sim.admission_sim import admission_main
from callbridge.sim.fault_models import EngineServerModel, RegistryModel
from callbridge.sim.fault_plan import FRAME_MS, CallsPlan, FaultPlan, Violation, calls_plan_for, plan_for
from callbridge.sim.simulated_call import SimulatedCall, run_seed

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


class SimulatedCalls:
    """Several calls at once on one virtual clock, one engine server (its room, its death) and one registry
    (a record per call). Besides each call's invariants: the server never holds more sessions than it has room
    for; a stream is only ever given a session its own call opened; a call is refused busy only when the server
    is full or dead at its answer; and once every call is over, the server (if it lives) holds no open session."""

    def __init__(self, seed: int, plan: CallsPlan | None = None) -> None:
        self.seed = seed
        self.plan = plan or calls_plan_for(seed)
        self.server = EngineServerModel(self.plan.capacity)
        self.registry: dict[str, RegistryModel] = {}
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
    parser.add_argument("--admission", action="store_true", help="seeds of answers, streams and hang-ups on 1-3 bridge processes' admission")
    args = parser.parse_args(argv)
    if args.admission:
        return admission_main(args.seed, args.first, args.seeds)
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
