"""How fast the agent may dial out through one carrier or trunk (#42), sans-I/O: nothing floods a carrier.

A carrier bounds the calls an account starts a second (commonly 1 by default, more on request) and refuses, or
silently delays, what comes faster; a trunk bounds its channels. ``OutboundPacer`` holds one carrier's bounds:

- **rate**: dials ``1 / calls_per_second`` apart (the schedule rounded up to the ms) — a burst is spread out, never
  sent at once, so no window of any length holds more than the rate allows (a carrier that counts over a second,
  or over ten, is never over);
- **concurrency**: at most ``max_concurrent`` outbound calls dialled and not yet over (ringing or talking);
- **queue**: a call over either bound waits, first come first served, while fewer than ``max_queued`` wait; past
  that it is refused (``queue_full``); one that has waited ``max_wait_ms`` is refused (``waited_too_long``: the
  callee was wanted then, not minutes later).

The driver asks (``request``), dials what it is told to (``Dial``, now or from ``tick``), tells it when a dialled
call is over (``ended``), and wakes at ``next_deadline_ms``. Times are the driver's (ms); nothing here reads a clock.
Retries and campaigns are the application's: a refusal says why, and the application decides what next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["Dial", "OutboundPacer", "PacingSettings", "Queued", "Refused"]


@dataclass(frozen=True, slots=True)
class PacingSettings:
    calls_per_second: float = 1.0
    """Dials a second at most (the usual default for a carrier account)."""
    max_concurrent: int = 50
    """Outbound calls dialled and not over, at most."""
    max_queued: int = 100
    """Calls waiting for the rate or a slot, at most; past it a request is refused."""
    max_wait_ms: int = 60_000
    """A call waits this long at most; then it is refused."""
    margin_ms: float = 0.0
    """Added to each interval: a dial's request can take a few ms longer on its way than the one before (the event
    loop, the connection), and a carrier counts by its own clock."""

    def __post_init__(self) -> None:
        if not (self.calls_per_second > 0 and self.max_concurrent > 0 and self.max_queued >= 0 and self.max_wait_ms > 0 and self.margin_ms >= 0):
            raise ValueError("pacing: calls_per_second, max_concurrent and max_wait_ms must be positive, max_queued not negative")


@dataclass(frozen=True, slots=True)
class Dial:
    """Dial ``call_id`` now."""

    call_id: str
    waited_ms: int


@dataclass(frozen=True, slots=True)
class Queued:
    """``call_id`` waits its turn: ``ahead`` calls before it."""

    call_id: str
    ahead: int


@dataclass(frozen=True, slots=True)
class Refused:
    """``call_id`` will not be dialled: why."""

    call_id: str
    reason: Literal["queue_full", "waited_too_long", "duplicate"]


class OutboundPacer:
    """One carrier's (or trunk's) outbound pacing. See the module docstring."""

    def __init__(self, settings: PacingSettings | None = None) -> None:
        self.settings = s = settings or PacingSettings()
        self.interval_ms = 1000 / s.calls_per_second + s.margin_ms
        """The least time between two dials."""
        self._next_dial_at = -math.inf
        """When (ms) the rate allows the next dial."""
        self._waiting: dict[str, int] = {}
        """Call id: when it was asked for, first come first (a dict keeps its order)."""
        self._active: set[str] = set()
        """Calls dialled and not yet over."""

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def request(self, call_id: str, now_ms: int) -> Dial | Queued | Refused:
        """A call to place: dial it now, or it waits (then ``tick`` says when), or it is refused."""
        if call_id in self._active or call_id in self._waiting:
            return Refused(call_id, "duplicate")
        if not self._waiting and self._may_dial(now_ms):
            return self._dial(call_id, now_ms, now_ms)
        if len(self._waiting) >= self.settings.max_queued:
            return Refused(call_id, "queue_full")
        self._waiting[call_id] = now_ms
        return Queued(call_id, len(self._waiting) - 1)

    def ended(self, call_id: str) -> None:
        """A dialled call is over (answered and hung up, busy, unanswered, failed): its slot is free. A call still
        waiting is taken out of the queue (the application gave up on it)."""
        self._active.discard(call_id)
        self._waiting.pop(call_id, None)

    def tick(self, now_ms: int) -> list[Dial | Refused]:
        """What is due at ``now_ms``: waiting calls refused for their wait, then those that may be dialled, in order."""
        due: list[Dial | Refused] = []
        waiting = self._waiting
        for call_id, asked_at in list(waiting.items()):  # asked in this order, so waited longest first
            if now_ms - asked_at < self.settings.max_wait_ms:
                break
            del waiting[call_id]
            due.append(Refused(call_id, "waited_too_long"))
        while waiting and self._may_dial(now_ms):
            call_id = next(iter(waiting))
            due.append(self._dial(call_id, waiting.pop(call_id), now_ms))
        return due

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has something to do (None: nothing waits, or only a slot can free it — ``ended``)."""
        if not self._waiting:
            return None
        expiry = next(iter(self._waiting.values())) + self.settings.max_wait_ms
        if len(self._active) >= self.settings.max_concurrent:
            return expiry
        return min(expiry, self._rate_free_at())

    def _may_dial(self, now_ms: int) -> bool:
        return len(self._active) < self.settings.max_concurrent and now_ms >= self._rate_free_at()

    def _rate_free_at(self) -> int:
        """The first time (ms) the rate allows another dial."""
        return -(2**62) if self._next_dial_at == -math.inf else math.ceil(self._next_dial_at)

    def _dial(self, call_id: str, asked_at_ms: int, now_ms: int) -> Dial:
        # on schedule (the rate's own time, rounded up to the ms): the next from the schedule, so that rounding
        # never slows the rate down; later: from now
        on_schedule = now_ms - self._next_dial_at < 1
        self._next_dial_at = (self._next_dial_at if on_schedule else now_ms) + self.interval_ms
        self._active.add(call_id)
        return Dial(call_id, now_ms - asked_at_ms)
