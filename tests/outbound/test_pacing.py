"""Outbound pacing (``callbridge/outbound/pacing.py``, #42): a carrier's rate and concurrent calls are never exceeded,
calls over them wait their turn in order, and a full queue or a long wait is refused with its reason — under any
interleaving of requests, ends and clock ticks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callbridge.outbound.pacing import Dial, OutboundPacer, PacingSettings, Queued, Refused

pytestmark = pytest.mark.core


def run_until(pacer: OutboundPacer, until_ms: int) -> list[tuple[int, Dial | Refused]]:
    """Tick at each deadline up to ``until_ms``: what came due, when."""
    due = []
    while (deadline := pacer.next_deadline_ms()) is not None and deadline <= until_ms:
        due += [(deadline, outcome) for outcome in pacer.tick(deadline)]
    return due


def test_the_default_rate_spaces_a_burst_a_second_apart() -> None:
    pacer = OutboundPacer()
    outcomes = [pacer.request(f"c{k}", 0) for k in range(5)]
    assert outcomes[0] == Dial("c0", 0) and outcomes[1:] == [Queued(f"c{k}", k - 1) for k in range(1, 5)]
    assert run_until(pacer, 10_000) == [(1000 * k, Dial(f"c{k}", 1000 * k)) for k in range(1, 5)]


def test_ten_a_second_goes_every_100_ms() -> None:
    pacer = OutboundPacer(PacingSettings(calls_per_second=10))
    for k in range(25):
        pacer.request(f"c{k}", 0)
    dials = run_until(pacer, 5000)
    assert [at for at, _ in dials] == [100 * k for k in range(1, 25)]


def test_a_margin_goes_on_every_interval() -> None:
    """``margin_ms`` 5 at 10 a second: 105 ms apart, so that a request a few ms later on its way than the one before
    still reaches the carrier 100 ms or more after it."""
    pacer = OutboundPacer(PacingSettings(calls_per_second=10, margin_ms=5))
    for k in range(4):
        pacer.request(f"c{k}", 0)
    assert [at for at, _ in run_until(pacer, 5000)] == [105, 210, 315]


def test_a_fractional_rate_rounds_each_wait_up() -> None:
    pacer = OutboundPacer(PacingSettings(calls_per_second=3))
    for k in range(4):
        pacer.request(f"c{k}", 0)
    assert [at for at, _ in run_until(pacer, 5000)] == [334, 667, 1000]


def test_a_call_over_the_concurrent_bound_waits_for_one_to_end() -> None:
    pacer = OutboundPacer(PacingSettings(calls_per_second=100, max_concurrent=2))
    assert isinstance(pacer.request("a", 0), Dial) and isinstance(pacer.request("b", 10), Dial)
    assert pacer.request("c", 20) == Queued("c", 0)
    assert pacer.next_deadline_ms() == 20 + 60_000  # only an end frees a slot: until then, its wait's limit
    pacer.ended("a")
    assert pacer.tick(500) == [Dial("c", 480)] and pacer.active == 2


def test_a_full_queue_and_a_long_wait_are_refused_with_the_reason() -> None:
    pacer = OutboundPacer(PacingSettings(max_queued=2, max_wait_ms=1500))
    assert isinstance(pacer.request("a", 0), Dial)
    assert [pacer.request(c, 0) for c in "bcd"] == [Queued("b", 0), Queued("c", 1), Refused("d", "queue_full")]
    assert run_until(pacer, 5000) == [(1000, Dial("b", 1000)), (1500, Refused("c", "waited_too_long"))]


def test_a_call_asked_twice_is_refused_and_one_given_up_leaves_the_queue() -> None:
    pacer = OutboundPacer()
    pacer.request("a", 0)
    pacer.request("b", 0)
    assert pacer.request("a", 1) == Refused("a", "duplicate") and pacer.request("b", 1) == Refused("b", "duplicate")
    pacer.ended("b")  # the application gave up on it
    assert pacer.waiting == 0 and pacer.next_deadline_ms() is None


def test_settings_out_of_range_are_refused() -> None:
    for wrong in ({"calls_per_second": 0}, {"max_concurrent": 0}, {"max_queued": -1}, {"max_wait_ms": 0}):
        with pytest.raises(ValueError):
            PacingSettings(**wrong)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    cps=st.sampled_from([0.5, 1.0, 3.0, 10.0]),
    max_concurrent=st.integers(1, 5),
    max_queued=st.integers(0, 6),
    steps=st.lists(st.tuples(st.sampled_from(["request", "end", "wait"]), st.integers(0, 3000)), max_size=60),
)
def test_no_interleaving_exceeds_the_rate_or_the_slots_or_reorders_the_queue(
    cps: float, max_concurrent: int, max_queued: int, steps: list[tuple[str, int]]
) -> None:
    pacing = PacingSettings(calls_per_second=cps, max_concurrent=max_concurrent, max_queued=max_queued, max_wait_ms=5000)
    pacer = OutboundPacer(pacing)
    now, serial, dials, queued, resolved = 0, 0, [], [], set()
    active: list[str] = []

    def took(outcome: Dial | Queued | Refused, at: int) -> None:
        if isinstance(outcome, Dial):
            dials.append((at, outcome.call_id))
            active.append(outcome.call_id)
            assert outcome.waited_ms <= pacing.max_wait_ms
        if isinstance(outcome, Queued):
            queued.append(outcome.call_id)
        else:
            resolved.add(outcome.call_id)

    for kind, value in steps:
        for deadline_outcome in run_until(pacer, now + value if kind == "wait" else now):
            took(deadline_outcome[1], deadline_outcome[0])
        if kind == "wait":
            now += value
        elif kind == "request":
            serial += 1
            took(pacer.request(f"c{serial}", now), now)
        elif active:
            pacer.ended(active.pop(value % len(active)))
        assert pacer.active == len(active) <= max_concurrent and pacer.waiting <= max_queued
    # the rate: n dials span at least n intervals (each dial on its schedule or later, rounded up to the ms),
    # whatever came when — no window of any length holds more than the rate allows
    times = [at for at, _ in dials]
    assert all(times[j] - times[i] >= (j - i) * 1000 / cps - 1 for i in range(len(times)) for j in range(i + 1, len(times)))
    # the queue: first come, first dialled
    dialled_from_queue = [call for _, call in dials if call in queued]
    assert dialled_from_queue == [call for call in queued if call in dialled_from_queue]
    # nothing is left waiting for ever: past the wait's limit every queued call is dialled or refused
    for at, outcome in run_until(pacer, now + 10 * pacing.max_wait_ms):
        took(outcome, at)
    assert pacer.waiting == 0 and set(queued) <= resolved
