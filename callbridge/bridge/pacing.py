"""One timer paces every call in the process.

Each call's pacer has a deadline: when its playout lead next lets a frame out, when a heard position is next
due, when a fallback tone has played. Rather than one timer (and an ``asyncio.wait_for`` with its task) per
call per frame, the deadlines live in one heap and one loop timer fires at the earliest; it wakes exactly
the calls whose deadline has come. A call's pacer wakes once per deadline: never for inbound media or engine
events, which only move its deadline (``PacingSlot.schedule``: a heap push when it changes, nothing when not).

Stale heap entries (a deadline moved or dropped) are skipped when they surface, so rescheduling is O(log n)
and nothing is ever searched for.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Final

__all__ = ["PacingClock", "PacingSlot"]

_EARLY_MS: Final = 1
"""A deadline this close is due now: the loop's timers have millisecond resolution."""


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class PacingSlot:
    """One call's place on the clock: ``schedule`` its next deadline, ``await wait()`` until it comes."""

    __slots__ = ("_clock", "_due", "_waiter", "deadline_ms")

    def __init__(self, clock: PacingClock) -> None:
        self._clock = clock
        self.deadline_ms: int | None = None
        """The deadline on the clock (None: none, or it has fired)."""
        self._waiter: asyncio.Future[None] | None = None
        self._due = False

    def schedule(self, deadline_ms: int | None) -> None:
        """Wake the waiter at ``deadline_ms`` (monotonic ms; None: not until a later ``schedule``)."""
        if deadline_ms == self.deadline_ms:
            return
        self.deadline_ms = deadline_ms
        if deadline_ms is not None:
            self._clock._add(deadline_ms, self)

    async def wait(self) -> None:
        """Return once the scheduled deadline has come (at once if it came while nobody waited)."""
        if self._due:
            self._due = False
            return
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None
            self._due = False

    def close(self) -> None:
        """Leave the clock: a pending deadline is dropped when it surfaces."""
        self.deadline_ms = None

    def _fire(self) -> None:
        self.deadline_ms = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self._due = True


class PacingClock:
    """The deadlines of every call's pacer, behind one loop timer."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, PacingSlot]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_ms: int | None = None
        self.fired = 0
        """Timer callbacks run (one per distinct deadline, not per call)."""

    def slot(self) -> PacingSlot:
        return PacingSlot(self)

    @property
    def pending(self) -> int:
        """Heap entries, stale ones included (bounded: each slot adds one per deadline change)."""
        return len(self._heap)

    def _add(self, deadline_ms: int, slot: PacingSlot) -> None:
        heapq.heappush(self._heap, (deadline_ms, next(self._order), slot))
        if self._armed_ms is None or deadline_ms < self._armed_ms:
            self._arm(deadline_ms)

    def _arm(self, deadline_ms: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_ms = deadline_ms
        delay_s = max(0, deadline_ms - monotonic_ms()) / 1000
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._armed_ms = None
        self.fired += 1
        heap = self._heap
        due_ms = monotonic_ms() + _EARLY_MS
        while heap:
            deadline_ms, _, slot = heap[0]
            if slot.deadline_ms != deadline_ms:  # moved, fired or closed since
                heapq.heappop(heap)
                continue
            if deadline_ms > due_ms:
                self._arm(deadline_ms)
                return
            heapq.heappop(heap)
            slot._fire()
