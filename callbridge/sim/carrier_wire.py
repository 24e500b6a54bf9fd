"""The simulated carrier's messages on their way to the bridge, on the simulation's virtual clock: each is
delivered at the time it is due, in the order it was sent; a read stall (``read_stall``) holds them and lets them
go in one burst, in order; mark echoes may come late (``echo_delay_ms``), reordered (``reordered_echoes``: one held
back until the next, or alone once ``_HELD_ECHO_MS`` late) or twice (``repeated_echoes``). The caller's speech frames
not read by the bridge yet are known, so a silence acted on with speech unread is caught."""

from __future__ import annotations

from typing import Final

from callbridge.sim.fault_plan import FRAME_MS, FaultPlan

__all__ = ["CarrierWire"]

_HELD_ECHO_MS: Final = 250
"""An echo held back for reordering goes alone after this long (two markers are 100 ms of audio apart)."""


class CarrierWire:
    """One call's messages from the carrier to the bridge (see the module docstring)."""

    def __init__(self, plan: FaultPlan) -> None:
        self._plan = plan
        self._to_bridge: list[tuple[int, int, str | bytes]] = []
        """(deliver at, order, message) from the carrier to the bridge."""
        self._speech_unread: set[int] = set()
        """The orders of the caller's speech frames sent to the bridge and not read by it yet."""
        self._order = 0
        self._held_echo: tuple[str | bytes, int] | None = None
        """A mark echo held back (``reordered_echoes``), and since when."""

    def send(self, message: str | bytes, now_ms: int, delay_ms: int, *, speech: bool = False) -> None:
        at = now_ms + delay_ms
        stall = self._plan.read_stall
        if stall is not None and stall[0] <= at < stall[0] + stall[1]:
            at = stall[0] + stall[1]  # read late, in a burst, in order
        self._order += 1
        self._to_bridge.append((at, self._order, message))
        if speech:
            self._speech_unread.add(self._order)

    def echo(self, message: str | bytes, now_ms: int) -> None:
        """A mark echo, as the plan has the carrier send them."""
        plan = self._plan
        delay = plan.echo_delay_ms
        if plan.reordered_echoes:
            if self._held_echo is None:
                self._held_echo = (message, now_ms)  # sent after the next one, or alone once it is late
                return
            (held, _), self._held_echo = self._held_echo, None
            self.send(message, now_ms, delay)
            self.send(held, now_ms, delay)
        else:
            self.send(message, now_ms, delay)
        if plan.repeated_echoes:
            self.send(message, now_ms, delay + FRAME_MS)

    def release_held_echo(self, now_ms: int) -> None:
        if self._held_echo is not None and now_ms >= self._held_echo[1] + _HELD_ECHO_MS:
            (held, _), self._held_echo = self._held_echo, None
            self.send(held, now_ms, self._plan.echo_delay_ms)

    def due(self, now_ms: int) -> list[tuple[int, str | bytes]]:
        """The messages due by ``now_ms``, in the order sent, taken off the wire: (order, message)."""
        due = sorted(m for m in self._to_bridge if m[0] <= now_ms)
        if due:
            self._to_bridge = [m for m in self._to_bridge if m[0] > now_ms]
        return [(order, message) for _, order, message in due]

    def read(self, order: int) -> None:
        """The bridge read message ``order``."""
        self._speech_unread.discard(order)

    def speech_waiting(self, now_ms: int) -> bool:
        """Speech the caller sent that the bridge could read by now and has not (it did not run meanwhile)."""
        return any(order in self._speech_unread for at, order, _ in self._to_bridge if at <= now_ms)

    def cut(self) -> None:
        """The connection is gone: nothing on its way arrives."""
        self._to_bridge.clear()
        self._speech_unread.clear()
        self._held_echo = None
