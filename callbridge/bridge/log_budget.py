"""How many lines refused streams may write to the log, sans-I/O: a client that reconnects at once after every
refusal (300 a second, for one call) wrote two lines an attempt, thousands a minute from one misconfigured sender
— or from anyone, since a refused stream is not yet known to be a carrier's.

``LogBudget``: the first refusal of a key (a carrier, the address a stream came from, its call id) is logged, then one every ``every_ms`` for it,
carrying how many were not logged between; across all keys at most ``per_s`` lines a second (a burst of as many),
so varying the key buys nothing. Every refusal is still counted in the metrics (``callbridge_streams_refused_total``).
The keys remembered are bounded (``max_keys``, the oldest forgotten first). Clocked from outside.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = ["LogBudget"]

EVERY_MS: Final = 10_000
PER_S: Final = 20
MAX_KEYS: Final = 4096


class LogBudget:
    """Whether a refused stream's lines go to the log (see the module docstring)."""

    def __init__(self, *, every_ms: int = EVERY_MS, per_s: int = PER_S, max_keys: int = MAX_KEYS) -> None:
        self.every_ms, self.per_s, self.max_keys = every_ms, per_s, max_keys
        self._keys: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """key → (when it was last logged, how many were not logged since)."""
        self._tokens = float(per_s)
        self._at_ms: int | None = None

    def allow(self, key: str, now_ms: int) -> int | None:
        """One refusal of ``key`` at ``now_ms``: None where it is not to be logged; else how many of ``key``'s
        were not logged since the last that was."""
        last = self._keys.get(key)
        if last is not None and now_ms - last[0] < self.every_ms:
            self._keys[key] = (last[0], last[1] + 1)
            return None
        if not self._take(now_ms):
            if last is not None:
                self._keys[key] = (last[0], last[1] + 1)
            return None
        self._keys[key] = (now_ms, 0)
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return last[1] if last is not None else 0

    def _take(self, now_ms: int) -> bool:
        if self._at_ms is not None:
            self._tokens = min(float(self.per_s), self._tokens + (now_ms - self._at_ms) * self.per_s / 1000)
        self._at_ms = now_ms
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
