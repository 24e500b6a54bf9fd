"""Putting numbered arrivals back in order, once, for RTP's jitter buffer (``sip/rtp.py``, 16-bit numbers that
wrap) and the media streams of carriers that do not guarantee order (a carrier's ``sequence_number``).

An item ahead of the next number expected is held until the numbers before it arrive, or until an item ``reach``
or more numbers past the missing one has arrived: the missing numbers are then given up (``Missing``, a run of
them at once however long: the caller conceals or counts them) and the items after them go on. So no item waits
longer than ``reach`` items' time. An item whose number was released or given up already is *behind*; one whose
number is held already, a *duplicate*; neither is taken. Sans-I/O and clockless: only arrivals move it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Missing", "Placed", "Reorder"]

T = TypeVar("T")


class Placed(enum.Enum):
    TAKEN = "taken"
    """The next number expected: released at once (with what it unblocks)."""
    AHEAD = "ahead"
    """Ahead of the next number expected: held until the numbers before it come or are given up."""
    DUPLICATE = "duplicate"
    """Its number is held already."""
    BEHIND = "behind"
    """Its number was released or given up already."""


@dataclass(frozen=True, slots=True)
class Missing:
    """Numbers given up, ``count`` of them from ``sequence`` on: nothing arrived for them in time."""

    sequence: int
    count: int = 1


class Reorder(Generic[T]):
    def __init__(self, reach: int, *, modulus: int | None = None) -> None:
        if reach < 0:
            raise ValueError("reach must be >= 0")
        self.reach = reach
        self.modulus = modulus
        """Numbers wrap at this (RTP: 65536); None: they only grow."""
        self.next: int | None = None
        """The number the next released item should have (None: not known yet; the first arrival sets it)."""
        self.held: dict[int, T] = {}

    def distance(self, sequence: int) -> int:
        """How far ``sequence`` is ahead of the next number (negative: behind); with a modulus, the shorter way
        round (in [-modulus/2, modulus/2))."""
        if self.next is None:
            return 0
        if self.modulus is None:
            return sequence - self.next
        half = self.modulus // 2
        return (sequence - self.next + half) % self.modulus - half

    def push(self, sequence: int, item: T) -> tuple[Placed, list[T | Missing]]:
        """Take ``item`` numbered ``sequence``; return how, and what is now due, in order."""
        if self.next is None:
            self.next = sequence
        ahead = self.distance(sequence)
        if ahead < 0:
            return Placed.BEHIND, []
        if sequence in self.held:
            return Placed.DUPLICATE, []
        if ahead == 0 and not self.held:  # in order, nothing held: the common case, no bookkeeping
            self.next = self._after(sequence)
            return Placed.TAKEN, [item]
        self.held[sequence] = item
        return (Placed.AHEAD if ahead else Placed.TAKEN), self._due()

    def flush(self) -> list[T]:
        """Everything held, in order, the gaps left out (the stream ended or restarts); the next number expected is
        then the one after the newest."""
        if not self.held:
            return []
        order = sorted(self.held, key=self.distance)
        self.next = self._after(order[-1])
        out = [self.held[sequence] for sequence in order]
        self.held.clear()
        return out

    def restart(self, sequence: int) -> None:
        """The numbering starts again at ``sequence`` (a new RTP source, a jump); flush what is held first."""
        self.next = sequence

    def _due(self) -> list[T | Missing]:
        out: list[T | Missing] = []
        while self.held:
            assert self.next is not None
            if self.next in self.held:
                out.append(self.held.pop(self.next))
                self.next = self._after(self.next)
                continue
            distances = [self.distance(sequence) for sequence in self.held]
            newest = max(distances)
            if newest < self.reach:
                break
            count = min(min(distances), newest - self.reach + 1)  # up to the first held, or back within reach
            out.append(Missing(self.next, count))
            self.next = self._after(self.next, count)
        return out

    def _after(self, sequence: int, count: int = 1) -> int:
        return sequence + count if self.modulus is None else (sequence + count) % self.modulus
