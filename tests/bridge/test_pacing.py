"""The process's one pacing timer: each slot wakes once per deadline, in deadline order, from one loop timer."""

from __future__ import annotations

import asyncio

import pytest

from callbridge.bridge.pacing import PacingClock, PacingSlot, monotonic_ms

pytestmark = pytest.mark.core


async def _wake_order(slots: dict[str, PacingSlot]) -> list[str]:
    order: list[str] = []

    async def waiter(name: str, slot: PacingSlot) -> None:
        await slot.wait()
        order.append(name)

    await asyncio.wait_for(asyncio.gather(*(waiter(name, slot) for name, slot in slots.items())), 2)
    return order


async def test_slots_wake_in_deadline_order_from_one_timer() -> None:
    clock = PacingClock()
    now = monotonic_ms()
    slots = {name: clock.slot() for name in "abcd"}
    for name, offset in zip("abcd", (40, 10, 25, 10), strict=True):
        slots[name].schedule(now + offset)
    assert await _wake_order(slots) == ["b", "d", "c", "a"]
    assert clock.fired <= 3  # b and d share a deadline: one timer callback
    assert all(slot.deadline_ms is None for slot in slots.values())


async def test_a_moved_deadline_wakes_once_at_its_new_time() -> None:
    clock = PacingClock()
    early, late = clock.slot(), clock.slot()
    now = monotonic_ms()
    early.schedule(now + 60)
    late.schedule(now + 30)
    early.schedule(now + 10)  # moved earlier: the stale entry at +60 must not wake it again
    late.schedule(now + 80)  # moved later
    assert await _wake_order({"early": early, "late": late}) == ["early", "late"]
    woken_again = asyncio.ensure_future(early.wait())
    await asyncio.sleep(0.1)
    assert not woken_again.done()
    woken_again.cancel()
    assert clock.pending == 0


async def test_same_deadline_again_is_not_pushed_twice() -> None:
    clock = PacingClock()
    slot = clock.slot()
    deadline = monotonic_ms() + 20
    for _ in range(50):  # every inbound frame re-announces an unchanged deadline
        slot.schedule(deadline)
    assert clock.pending == 1
    await asyncio.wait_for(slot.wait(), 1)


async def test_a_deadline_that_came_while_nobody_waited_is_not_lost() -> None:
    clock = PacingClock()
    slot = clock.slot()
    slot.schedule(monotonic_ms())
    await asyncio.sleep(0.02)  # fired while the pacer was busy elsewhere
    await asyncio.wait_for(slot.wait(), 0.5)


async def test_closed_and_cleared_slots_never_wake() -> None:
    clock = PacingClock()
    closed, cleared, live = clock.slot(), clock.slot(), clock.slot()
    now = monotonic_ms()
    closed.schedule(now + 5)
    cleared.schedule(now + 5)
    live.schedule(now + 30)
    closed.close()
    cleared.schedule(None)
    waits = [asyncio.ensure_future(slot.wait()) for slot in (closed, cleared)]
    await asyncio.wait_for(live.wait(), 1)
    assert not any(wait.done() for wait in waits)
    for wait in waits:
        wait.cancel()
