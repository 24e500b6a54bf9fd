"""The resume journal and credentials of the engine server (vllm-omni's ``session_attachment.py``, reference §4.4–4.5).

Every event the server sends for a session is recorded with a growing
``server_event_seq``; the client acknowledges what it has
(``session.event_ack``) and a reconnecting client asks for everything after
the last sequence it saw. Entries older than ``ttl_ms`` are pruned; once the
journal exceeds ``max_bytes`` it is marked overflowed and a resume is no
longer possible (``session.resync_required``). Pure: the clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["EventJournal", "JournalGap", "JournalOverflow", "ResumeCredential"]


class JournalGap(Exception):
    """The events after the requested sequence are no longer all retained."""


class JournalOverflow(Exception):
    """The journal exceeded its byte limit: replay is impossible for the rest of the session."""


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    recorded_ms: int
    size_bytes: int
    payload: dict[str, Any]


class EventJournal:
    """Sequenced server events of one session, kept for replay until acknowledged or stale."""

    def __init__(self, *, max_bytes: int, ttl_ms: int) -> None:
        self._max_bytes = max_bytes
        self._ttl_ms = ttl_ms
        self._entries: deque[_Entry] = deque()
        self._next_seq = 1
        self._dropped_through = 0
        self._bytes = 0
        self.overflowed = False

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def record(self, payload: dict[str, Any], now_ms: int) -> dict[str, Any]:
        """Stamp ``payload`` with the next ``server_event_seq`` and keep it; returns the stamped payload.

        Raises ``JournalOverflow`` when the journal is (or now becomes) over its byte limit.
        """
        if self.overflowed:
            raise JournalOverflow("journal already overflowed")
        self.prune(now_ms)
        stamped = {**payload, "server_event_seq": self._next_seq}
        size = len(orjson.dumps(stamped))
        if self._bytes + size > self._max_bytes:
            self.overflowed = True
            raise JournalOverflow(f"journal byte limit exceeded: {self._bytes + size} > {self._max_bytes}")
        self._entries.append(_Entry(self._next_seq, now_ms, size, stamped))
        self._bytes += size
        self._next_seq += 1
        return stamped

    def acknowledge(self, seq: int) -> None:
        """Drop entries up to ``seq``. Raises ``ValueError`` for a negative or future sequence."""
        if seq < 0 or seq > self.last_seq:
            raise ValueError(f"acknowledged sequence {seq} outside 0..{self.last_seq}")
        while self._entries and self._entries[0].seq <= seq:
            self._bytes -= self._entries.popleft().size_bytes
        self._dropped_through = max(self._dropped_through, seq)

    def prune(self, now_ms: int) -> None:
        while self._entries and self._entries[0].recorded_ms <= now_ms - self._ttl_ms:
            entry = self._entries.popleft()
            self._bytes -= entry.size_bytes
            self._dropped_through = max(self._dropped_through, entry.seq)

    def replay_after(self, seq: int, now_ms: int) -> list[dict[str, Any]]:
        """Every retained event after ``seq``, in order.

        Raises ``JournalGap`` (overflowed, or events after ``seq`` were dropped) and
        ``ValueError`` (``seq`` is negative or ahead of the journal).
        """
        if seq < 0 or seq > self.last_seq:
            raise ValueError(f"sequence {seq} outside 0..{self.last_seq}")
        self.prune(now_ms)
        if self.overflowed or seq < self._dropped_through:
            raise JournalGap(f"events after {seq} are no longer retained (kept from {self._dropped_through + 1})")
        return [entry.payload for entry in self._entries if entry.seq > seq]


class ResumeCredential:
    """A session's resume token, kept as a SHA-256 digest and rotated at every resume."""

    def __init__(self) -> None:
        self._digest = b""

    def issue(self) -> str:
        """A new token; the previous one stops working."""
        token = secrets.token_urlsafe(32)
        self._digest = hashlib.sha256(token.encode()).digest()
        return token

    def verify(self, token: str) -> bool:
        return hmac.compare_digest(self._digest, hashlib.sha256(token.encode()).digest())
