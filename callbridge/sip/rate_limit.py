"""How much SIP one source may send (issue #15): token buckets, per source address and for the listener as a whole,
sans-I/O (a millisecond clock from outside).

Signalling and media share one event loop, and SIP over UDP has no handshake: anyone can send a thousand OPTIONS a
second, each parsed and answered, and every live call's RTP waits behind them. So before a datagram is parsed it
takes a token from its source's bucket and one from the listener's; with none left it is dropped unread (over
UDP an answer would only feed the flood: the peer's retransmission timer copes with a real request lost), and
counted. A source's budget (``sip.source_requests_per_s``, twice that as the burst) is far above what a trunk
sends for its calls; the listener's (``sip.requests_per_s``) bounds a flood from many sources, or from forged
ones. A source's bucket is forgotten once it has been idle long enough to be full again, and at most
``MAX_SOURCES`` are held (the oldest goes first: a forgotten source starts full, which only helps it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["MAX_SOURCES", "Budget", "SourceBudgets"]

MAX_SOURCES: Final = 4096
_REFILL_MS: Final = 2000
"""How long an empty source bucket takes to be full again (its burst is twice its rate a second): one idle that
long is the same as a new one, and is forgotten."""


@dataclass(slots=True)
class Budget:
    """One token bucket: ``rate_per_s`` tokens a second, at most ``burst`` held; starts full."""

    rate_per_s: float
    burst: float
    at_ms: int = 0
    tokens: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, now_ms: int) -> bool:
        """One token if there is one (False: none left, nothing taken)."""
        elapsed_ms = now_ms - self.at_ms
        if elapsed_ms > 0:
            self.tokens = min(self.burst, self.tokens + elapsed_ms * self.rate_per_s / 1000)
            self.at_ms = now_ms
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class SourceBudgets:
    """A budget per source address and one for all of them; ``take`` for each datagram before it is read."""

    def __init__(self, source_rate_per_s: float, total_rate_per_s: float, *, max_sources: int = MAX_SOURCES) -> None:
        self._source_rate = source_rate_per_s
        self._total = Budget(total_rate_per_s, 2 * total_rate_per_s)
        self._sources: dict[str, Budget] = {}
        self._max_sources = max_sources
        self._pruned_at_ms = 0

    def take(self, source: str, now_ms: int) -> str | None:
        """None when the datagram may be read; else why not (``source_rate`` or ``total_rate``)."""
        budget = self._sources.get(source)
        if budget is None:
            self._prune(now_ms)
            budget = self._sources[source] = Budget(self._source_rate, 2 * self._source_rate, at_ms=now_ms)
        if not budget.take(now_ms):
            return "source_rate"
        if not self._total.take(now_ms):
            return "total_rate"
        return None

    @property
    def source_count(self) -> int:
        return len(self._sources)

    def _prune(self, now_ms: int) -> None:
        """Before a new source is added: every ``_REFILL_MS``, drop the buckets idle that long (full again); at
        ``max_sources``, the oldest."""
        if now_ms - self._pruned_at_ms >= _REFILL_MS:
            self._pruned_at_ms = now_ms
            for source in [s for s, b in self._sources.items() if now_ms - b.at_ms >= _REFILL_MS]:
                del self._sources[source]
        while len(self._sources) >= self._max_sources:
            del self._sources[next(iter(self._sources))]
