"""An asyncio event loop on a virtual clock, for simulating the bridge's own asyncio code deterministically.

``loop.time()`` is virtual: where nothing is ready to run, the loop jumps to its next timer rather than waiting
for it, so a 15 s hold takes no wall time, and with no real I/O the run is the same every time (asyncio runs
its ready callbacks first in, first out, and its timers by when they are due, ties in the order they were set).
Code that reads time as the loop's (``asyncio.get_running_loop().time()``, ``asyncio.sleep``, ``wait_for``)
runs unchanged on it; code that reads ``time.monotonic()`` itself does not see the virtual clock.

A loop with nothing left to run and no timer set would wait for I/O forever: here that is a deadlock, raised
as ``Stalled``.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["Stalled", "VirtualTimeLoop"]


class Stalled(RuntimeError):
    """Every task waits for something that nothing will do, and no timer is set."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls the loop's own wake-up pipe without blocking; where nothing is ready, moves the clock on by the wait."""

    def __init__(self, loop_clock: list[float]) -> None:
        super().__init__()
        self._clock = loop_clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Stalled("nothing left to run and no timer set: every task waits for something nothing will do")
        self._clock[0] += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``asyncio.SelectorEventLoop`` whose ``time()`` starts at 0 and moves only as its timers come due."""

    def __init__(self) -> None:
        self._clock = [0.0]
        super().__init__(_JumpingSelector(self._clock))

    def time(self) -> float:
        return self._clock[0]

    def run(self, main: Any) -> Any:
        """Run the coroutine ``main`` to its end on this loop, then close the loop; what it returned."""
        try:
            return self.run_until_complete(main)
        finally:
            self.close()
