"""Admission under any interleaving (``python -m callbridge.sim.faults --admission``): the server's own answer desk,
admission book, fleet count and signals — ``BridgeServices`` as the app builds it, one per bridge process —
run on a virtual clock (``VirtualTimeLoop``) against one shared registry whose every round trip takes a seeded
time, so that answers, stream starts, ends and hang-ups interleave at every await the production code has.

A seed picks 1–3 processes, ``server.max_calls`` (1–3), a fleet limit or none (``server.max_calls_fleet``), and
4–12 calls, most answered in bursts (many at the same instant). Each call's answer webhook reaches one process
(``AnswerDesk.decide_answer``, as a carrier's route asks it); an answered call then does one of: its stream
arrives — at the process that answered it, or through the load balancer at another — and binds (``call_bound``,
as the media driver does), lasts a while and ends the call (``call_over``, ``call_unbound``); its stream never
comes (the answer's slot must lapse at ``engine.open_at_answer_ttl_s``); or the caller hangs up while it rings
(the carrier's status webhook, ``call_ended_by_carrier``, at any process).

Invariants, from what the simulator knows of every call (its ground truth), never from the desk's own books:

- **never over**: a process answers a call only while fewer than ``max_calls`` calls are held there throughout
  the decision (answered there and still to come, or bridged there), and the fleet only while fewer than its
  limit are held anywhere;
- **never under**: a call is answered busy for capacity only where, at some moment of its decision, ``max_calls``
  calls were held at that process or the fleet's limit in the fleet. A slot held for a call that is over, whose
  stream bound elsewhere, whose caller hung up while it rang, or whose stream never came past its time to live is
  a leak, and it turns callers away; each may lag its cause by ``SETTLE_MS`` (a signal, a release in flight);
- **nothing left**: once every call is over and the holds have lapsed, no process holds a slot and the fleet
  counts no call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, cast

import structlog
from prometheus_client import CollectorRegistry

from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.fleet import FLEET_HOLD_MS
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.registry import CallRegistry, MemoryCallRegistry, MemoryStreamTokens
from callbridge.bridge.services import BridgeServices
from callbridge.config import EngineSettings, Settings, load_settings
from callbridge.engine.port import DuplexEngine
from callbridge.sim.fault_plan import Violation
from callbridge.sim.virtual_loop import VirtualTimeLoop

__all__ = ["SETTLE_MS", "AdmissionPlan", "AdmissionSim", "admission_main", "bridge_process", "admission_plan_for", "run_admission_seed"]

SETTLE_MS: Final = 200
"""How long a slot may outlive its cause: the signal that tells the answering process its call's stream bound
elsewhere, the fleet's release after a call ends — each a registry round trip or two, spawned."""
TTL_S: Final[float] = EngineSettings.model_fields["open_at_answer_ttl_s"].default
"""``engine.open_at_answer_ttl_s`` as shipped: how long an answered call's slot waits for its stream."""
_NEVER: Final = 1 << 60
_ROUND_TRIPS_MS: Final = (0, 0, 1, 1, 2, 3, 5, 8)
"""What one registry round trip takes, picked per operation (0: the next turn of the loop)."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    answer_at_ms: int
    answered_by: int
    fate: str
    """``stream`` (it comes and binds), ``never`` (no stream), ``hang_up`` (the caller hangs up while it rings)."""
    after_ms: int
    """From the answer to the stream's start, or to the hang-up."""
    stream_at: int
    """The process the stream (or the hang-up's webhook) reaches."""
    lasts_ms: int


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    processes: int
    max_calls: int
    fleet_limit: int | None
    calls: tuple[CallPlan, ...]


def admission_plan_for(seed: int) -> AdmissionPlan:
    rng = random.Random(seed)
    processes = rng.randint(1, 3)
    max_calls = rng.randint(1, 3)
    fleet_limit = rng.choice([None, rng.randint(1, processes * max_calls)]) if processes > 1 else rng.choice([None, max_calls])
    bursts = sorted(rng.randint(0, 20_000) for _ in range(rng.randint(1, 3)))
    calls = []
    for _ in range(rng.randint(4, 12)):
        fate = rng.choices(["stream", "never", "hang_up"], weights=[6, 2, 2])[0]
        after_ms = rng.randint(20, 3000) if fate == "stream" else rng.randint(50, 14_000)
        answered_by = rng.randrange(processes)
        stream_at = answered_by if rng.random() < 0.6 else rng.randrange(processes)
        calls.append(CallPlan(rng.choice(bursts) + rng.choice([0, 0, 0, rng.randint(1, 40)]), answered_by, fate,
                              after_ms, stream_at, rng.randint(300, 12_000)))  # fmt: skip
    return AdmissionPlan(processes, max_calls, fleet_limit, tuple(sorted(calls, key=lambda c: c.answer_at_ms)))


@dataclass
class _Call:
    """One call as the simulator knows it happened (the ground truth the invariants judge by)."""

    call_id: str
    plan: CallPlan
    asked_ms: int = -1
    """When its answer webhook was asked (the decision's start); -1 not yet."""
    answered_ms: int | None = None
    """When the desk said answer (the decision's end)."""
    refused_ms: int | None = None
    bound_ms: int | None = None
    bound_at: int | None = None
    over_ms: int | None = None
    """When the call ended: its stream's end, or the caller's hang-up while it rang."""


@dataclass
class AdmissionSim:
    seed: int
    plan: AdmissionPlan = field(init=False)
    calls: list[_Call] = field(default_factory=list)
    answered: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        self.plan = admission_plan_for(self.seed)
        self.calls = [_Call(f"CA{self.seed:08x}{i:024x}", plan) for i, plan in enumerate(self.plan.calls)]

    def run(self) -> AdmissionSim:
        VirtualTimeLoop().run(self._main())
        return self

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(self.seed ^ 0x5EED)
        shared = MemoryCallRegistry(clock=lambda: round(loop.time() * 1000))
        registry = cast(CallRegistry, _SlowRegistry(shared, lambda: rng.choice(_ROUND_TRIPS_MS)))
        settings = load_settings(None, {
            "server": {"max_calls": self.plan.max_calls, "max_calls_fleet": self.plan.fleet_limit},
            "engine": {"open_at_answer": "off"},
        })  # fmt: skip
        processes = [bridge_process(settings, registry) for _ in range(self.plan.processes)]
        for services in processes:
            services.start_listening()
        try:
            await asyncio.gather(*(self._call(call, processes) for call in self.calls))
            await asyncio.sleep(max(TTL_S * 1000, FLEET_HOLD_MS) / 1000 + 1)
            self._nothing_left(processes, await registry.admit("probe", 1, 1))
        finally:
            for services in processes:
                await services.aclose_background()

    async def _call(self, call: _Call, processes: list[BridgeServices]) -> None:
        plan = call.plan
        await asyncio.sleep(plan.answer_at_ms / 1000)
        call.asked_ms = self._now()
        decision = await processes[plan.answered_by].desk.decide_answer(call.call_id, "sim")
        if decision.kind is not AnswerKind.ANSWER:
            call.refused_ms = self._now()
            self.refused += 1
            self._refusal_was_due(call)
            return
        call.answered_ms = self._now()
        self.answered += 1
        self._answer_was_due(call)
        await asyncio.sleep(plan.after_ms / 1000)
        here = processes[plan.stream_at]
        if plan.fate == "hang_up":
            call.over_ms = self._now()
            await here.call_ended_by_carrier(call.call_id, EndCause(EndReason.CALLER_HUNG_UP))
            return
        if plan.fate == "never":
            return
        call.bound_ms, call.bound_at = self._now(), plan.stream_at
        here.call_bound(call.call_id)  # as the media driver does once the stream holds its session
        await asyncio.sleep(plan.lasts_ms / 1000)
        call.over_ms = self._now()
        here.call_over(call.call_id)  # as the media driver does at the stream's end, the call over
        here.call_unbound(call.call_id)

    # ------------------------------------------------------------------ the ground truth

    def _now(self) -> int:
        return round(asyncio.get_running_loop().time() * 1000)

    def _span(self, call: _Call, process: int | None, *, upper: bool) -> tuple[int, int] | None:
        """When ``call`` held a slot at ``process`` (None: in the fleet's count), by the ground truth: from, to (ms).
        ``upper``: the longest it may have (from its answer's start; each end told by a signal or a release
        ``SETTLE_MS`` late), else the shortest (from its answer's end; each end at its cause)."""
        settle = SETTLE_MS if upper else 0
        if call.answered_ms is None:  # refused, or still being decided: its slot is taken, maybe given back
            if not upper or call.asked_ms < 0 or process not in (None, call.plan.answered_by):
                return None
            return call.asked_ms, call.refused_ms + settle if call.refused_ms is not None else _NEVER
        start = call.asked_ms if upper else call.answered_ms
        lapses = (call.answered_ms if upper else call.asked_ms) + round(TTL_S * 1000) + settle
        over = [call.over_ms + settle] if call.over_ms is not None else []
        if process is None:  # the fleet: until it is over, or its answer's hold lapses with no stream
            return start, min([*over, *([lapses] if call.bound_ms is None else [])], default=_NEVER)
        if call.bound_at == process:  # bridged here: until its stream's end (``call_unbound``, at once)
            return (start if call.plan.answered_by == process else cast(int, call.bound_ms)), call.over_ms or _NEVER
        if call.plan.answered_by != process:
            return None
        bound_elsewhere = [call.bound_ms + settle] if call.bound_ms is not None else []
        return start, min([lapses, *bound_elsewhere, *over])

    def _held(self, process: int | None, since_ms: int, until_ms: int, *, upper: bool, but: _Call) -> int:
        """How many calls (``but`` aside) held a slot at ``process`` (None: the fleet) at some moment of
        ``since_ms``–``until_ms`` (``upper``), or throughout it."""
        held = 0
        for call in self.calls:
            span = self._span(call, process, upper=upper) if call is not but else None
            if span is not None and ((span[0] <= until_ms and span[1] > since_ms) if upper else (span[0] <= since_ms and span[1] > until_ms)):
                held += 1
        return held

    def _answer_was_due(self, call: _Call) -> None:
        plan, since, until = self.plan, call.asked_ms, self._now()
        here = self._held(call.plan.answered_by, since, until, upper=False, but=call)
        if here >= plan.max_calls:
            raise self._violation(f"{call.call_id} answered at process {call.plan.answered_by} while {here} calls were held there (max_calls {plan.max_calls})")
        fleet = self._held(None, since, until, upper=False, but=call)
        if plan.fleet_limit is not None and fleet >= plan.fleet_limit:
            raise self._violation(f"{call.call_id} answered while the fleet held {fleet} calls (max_calls_fleet {plan.fleet_limit})")

    def _refusal_was_due(self, call: _Call) -> None:
        plan, since, until = self.plan, call.asked_ms, self._now()
        here = self._held(call.plan.answered_by, since, until, upper=True, but=call)
        fleet = self._held(None, since, until, upper=True, but=call)
        if here < plan.max_calls and (plan.fleet_limit is None or fleet < plan.fleet_limit):
            raise self._violation(
                f"{call.call_id} refused at process {call.plan.answered_by} with at most {here} calls held there "
                f"(max_calls {plan.max_calls}) and {fleet} in the fleet (max_calls_fleet {plan.fleet_limit})"
            )

    def _nothing_left(self, processes: list[BridgeServices], fleet_empty: bool) -> None:
        now = asyncio.get_running_loop().time()
        for index, services in enumerate(processes):
            if services.admission.held(now):
                raise self._violation(f"every call is over; process {index} still holds {services.admission.holding()}")
        if self.plan.fleet_limit is not None and not fleet_empty:
            raise self._violation("every call is over; the fleet still counts calls")

    def _violation(self, what: str) -> Violation:
        return Violation(self.seed, self._now(), what, family="--admission")


def bridge_process(settings: Settings, registry: CallRegistry) -> BridgeServices:
    """One bridge process's services, as the app builds them (no engine is asked: ``engine.open_at_answer`` off)."""
    loop = asyncio.get_running_loop()
    return BridgeServices(
        settings=settings, engine=cast(DuplexEngine, _NoEngine()), registry=registry,
        tokens=MemoryStreamTokens(clock=lambda: round(loop.time() * 1000)),
        metrics=BridgeMetrics(CollectorRegistry(), memory_registry=False, local_engine=False), hang_up=_no_hang_up,
    )  # fmt: skip


async def _no_hang_up(provider: str, call_id: str, account_id: str | None, reason: str) -> None:
    raise AssertionError(f"the admission simulation hangs nothing up ({call_id}: {reason})")


class _NoEngine:
    """Admission asks no engine here; anything that does fails the seed loudly."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the admission simulation's engine was asked for {name}")


class _SlowRegistry:
    """The shared registry, each round trip taking what ``round_trip_ms`` picks: the interleavings' source."""

    def __init__(self, inner: MemoryCallRegistry, round_trip_ms: Callable[[], int]) -> None:
        self._inner = inner
        self._round_trip_ms = round_trip_ms

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(found):
            return found

        async def round_trip(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(self._round_trip_ms() / 1000)
            return await found(*args, **kwargs)

        return round_trip


def run_admission_seed(seed: int) -> AdmissionSim:
    """Run seed ``seed``'s calls; raises ``Violation`` at the first invariant that fails."""
    return AdmissionSim(seed).run()


def admission_main(seed: int | None, first: int, seeds: int) -> int:
    """``python -m callbridge.sim.faults --admission``: replay ``seed`` (its plan and what became of each call), or
    run ``seeds`` seeds from ``first``. The desk's warnings (each refusal) are not printed."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    if seed is not None:
        sim = AdmissionSim(seed)
        print(sim.plan)
        try:
            sim.run()
        except Violation as exc:
            print(exc)
            return 1
        finally:
            for call in sim.calls:
                print(f"{call.call_id}: asked {call.asked_ms} ms, answered {call.answered_ms}, refused {call.refused_ms}, "
                      f"bound {call.bound_ms} at {call.bound_at}, over {call.over_ms}")  # fmt: skip
        return 0
    failed = answered = refused = 0
    for each in range(first, first + seeds):
        try:
            sim = run_admission_seed(each)
        except Violation as exc:
            failed += 1
            print(exc)
            continue
        answered, refused = answered + sim.answered, refused + sim.refused
    print(f"{seeds} admission seeds: {failed} failed; {answered} calls answered, {refused} refused busy")
    return 1 if failed else 0
