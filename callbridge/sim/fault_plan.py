"""What a fault-simulator seed stands for (``sim/faults.py``): the call, its faults, the bounds its invariants hold
the bridge to, and the violation that names the first one broken."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Final

from callbridge.application import AssistantConfig
from callbridge.bridge.lifecycle import TAKEOVER_AFTER_MS

__all__ = [
    "CHECKPOINT_MS",
    "CHECKPOINT_POLL_MS",
    "FRAME_MS",
    "GIVE_UP_MS",
    "RESTORE_BOUND_MS",
    "KILLED_TAKEOVER_BOUND_MS",
    "TAKEOVER_BOUND_MS",
    "TONE_BOUND_MS",
    "CallsPlan",
    "FaultPlan",
    "Violation",
    "calls_plan_for",
    "plan_for",
]

FRAME_MS: Final = 20
TONE_BOUND_MS: Final = 3000
"""Engine death → the failure tone playing (issue #13: within 3 s)."""
GIVE_UP_MS: Final = (1000, 2500)
"""Engine death → the wire client gives the session up: from a refused reconnect (SIGKILL) at about 1–2 s to a
frozen server found by a missed ping and then the budget, 2.5 s at most (``engine.reconnect_budget_s`` 2 s,
``engine.liveness_*`` 1 s)."""
CHECKPOINT_MS: Final = 1000
"""How often the live ticket is written (``registry.checkpoint_interval_s``, shipped 1 s)."""
CHECKPOINT_POLL_MS: Final = 250
"""How often the driver looks whether it is due (and at a barge-in, before the engine is told of it)."""
RESTORE_BOUND_MS: Final = CHECKPOINT_MS + CHECKPOINT_POLL_MS
"""The registry lost a live call's record → its stream's checkpoint has written it anew."""
TAKEOVER_BOUND_MS: Final = TAKEOVER_AFTER_MS + 100
"""A crashed bridge's call, resumed on the next stream: from that stream's start to its session in hand."""
KILLED_TAKEOVER_BOUND_MS: Final = 100
"""The same where the crashed process's sockets closed with it (killed: it no longer listens): not waited for."""


class Violation(AssertionError):
    """An invariant failed: which, when, and the seed that replays it."""

    def __init__(self, seed: int, at_ms: int, what: str, *, calls: bool = False, family: str = "") -> None:
        """``family``: the seeds' kind on the command line (``--admission``); ``calls``: ``--calls``."""
        flag = family or ("--calls" if calls else "")
        replay = f"python -m callbridge.sim.faults {flag + ' ' if flag else ''}--seed {seed}"
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
    assistant: AssistantConfig | None = None
    """What the call's application chose for it, bound as the server binds it (``call_config.agent_setup``): a
    greeting on a new session (one the caller may not cut, at times), a recording, a silence prompt and goodbye."""

    @property
    def crash_closes_sockets(self) -> bool:
        """The crash is a process's (SIGKILL: its kernel closes its sockets, so it stops listening at once), not a
        host's that vanished (its connections open until they time out). Half of the crashes each, by their time
        (a multiple of 20 ms), so that the seeds' draws stay as they were."""
        return self.bridge_crashes_at_ms is not None and self.bridge_crashes_at_ms % 40 == 0

    def stalled_ms(self, start_ms: int, end_ms: int) -> int:
        """How long the bridge process did not run (``process_stall``) between ``start_ms`` and ``end_ms``: a bound
        on what it does in that time is that much later."""
        stall = self.process_stall
        if stall is None or stall[0] >= end_ms or stall[0] + stall[1] <= start_ms:
            return 0
        return stall[1]


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
    return replace(plan, assistant=_assistant(rng))  # drawn last, as above


def _assistant(rng: random.Random) -> AssistantConfig | None:
    """What the call's application chose, or None (the shipped defaults: no greeting, no recording, no silence)."""
    greeting = rng.random() < 0.5
    interruptible = rng.random() < 0.5
    recording = rng.random() < 0.3
    reprompt_s = rng.randrange(1000, 4000, 20) / 1000 if rng.random() < 0.3 else None
    hangup_s = rng.randrange(4000, 9000, 20) / 1000 if reprompt_s is not None and rng.random() < 0.5 else None
    if not greeting and not recording and reprompt_s is None:
        return None
    return AssistantConfig(
        greeting="Greet the caller." if greeting else None,
        greeting_interruptible=interruptible if greeting else None,
        recording=recording,
        silence_reprompt_after_s=reprompt_s,
        silence_hangup_after_s=hangup_s,
    )


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
