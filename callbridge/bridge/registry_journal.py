"""The calls as the operator's console reads them, kept in the registry beside what resumes them: each call's journal
(its context, then the events the bridge emitted for it, in order) and two indexes, the calls up now and the calls
finished, newest first; and the bridges' announcements of themselves (``announce``: calls, readiness, engine
endpoints), each kept a few seconds past the next. Written off the media path by ``bridge/console_journal.py`` and
``bridge/console_fleet.py``; read by ``/console``.

The journal holds what the application is told (``CallEvent``), nothing of its own: the console shows what the bridge
already produced. A call's journal keeps its newest ``JOURNAL_ENTRIES`` events; the finished index its newest
``calls_kept`` calls (``console.calls_kept``); all of it expires ``keep_ms`` after the call's last write.

This module is the in-memory backend (one process, or the workers' host); the Redis one is in ``registry_redis``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["JOURNAL_ENTRIES", "JournalPage", "MemoryJournal"]

JOURNAL_ENTRIES: Final = 1000
"""A call's journal keeps its newest this many events: a four-hour call of short turns has fewer."""


@dataclass(frozen=True, slots=True)
class JournalPage:
    """One call's journal as read: its context (JSON; None: not known, or expired), its events (JSON each), and the
    bridge process that wrote it last (None: not said)."""

    header: str | None
    entries: list[str]
    writer: str | None = None


@dataclass(slots=True)
class _Journaled:
    header: str | None = None
    writer: str | None = None
    entries: deque[str] = field(default_factory=lambda: deque(maxlen=JOURNAL_ENTRIES))
    opened_at: float = 0.0
    ended_at: float | None = None
    expires_at_ms: int = 0


class MemoryJournal:
    """The journals of one process (the ``MemoryCallRegistry``'s), on its clock (ms, monotonic)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._calls: dict[str, _Journaled] = {}
        self._bridges: dict[str, tuple[str, int]] = {}
        """Process id → its last announcement, and when it lapses (this clock)."""

    def write(
        self, call_id: str, entries: list[str], keep_ms: int, header: str | None, opened_at: float | None, ended_at: float | None,
        calls_kept: int, writer: str | None = None,
    ) -> None:  # fmt: skip
        """``CallRegistry.journal``."""
        now = self._clock()
        journaled = self._calls.get(call_id)
        if journaled is None or now >= journaled.expires_at_ms:
            journaled = self._calls[call_id] = _Journaled(opened_at=opened_at or 0.0)
        if header is not None:
            journaled.header = header
        if writer is not None:
            journaled.writer = writer
        if opened_at is not None and not journaled.opened_at:
            journaled.opened_at = opened_at
        journaled.entries.extend(entries)
        journaled.expires_at_ms = now + keep_ms
        if ended_at is not None:
            journaled.ended_at = ended_at
            self._prune(now, calls_kept)

    def _prune(self, now: int, calls_kept: int) -> None:
        """Expired journals go, and the oldest finished ones past ``calls_kept``."""
        for call_id in [c for c, j in self._calls.items() if now >= j.expires_at_ms]:
            del self._calls[call_id]
        finished = sorted((j.ended_at, c) for c, j in self._calls.items() if j.ended_at is not None)
        for _, call_id in finished[: max(0, len(finished) - calls_kept)]:
            del self._calls[call_id]

    def read(self, call_id: str) -> JournalPage:
        """``CallRegistry.journal_of``."""
        journaled = self._calls.get(call_id)
        if journaled is None or self._clock() >= journaled.expires_at_ms:
            return JournalPage(None, [])
        return JournalPage(journaled.header, list(journaled.entries), journaled.writer)

    def calls(self, live: bool, limit: int, offset: int = 0) -> list[str]:
        """``CallRegistry.journaled``."""
        now = self._clock()
        held = [(j, c) for c, j in self._calls.items() if now < j.expires_at_ms and (j.ended_at is None) == live]
        held.sort(key=lambda pair: (pair[0].opened_at if live else pair[0].ended_at) or 0.0, reverse=True)
        return [call_id for _, call_id in held[offset : offset + limit]]

    def announce(self, process_id: str, status: str, keep_ms: int) -> None:
        """``CallRegistry.announce``."""
        now = self._clock()
        for lapsed in [p for p, (_, until) in self._bridges.items() if until <= now]:
            del self._bridges[lapsed]
        self._bridges[process_id] = (status, now + keep_ms)

    def announced(self) -> list[str]:
        """``CallRegistry.announced``."""
        now = self._clock()
        return [status for _, (status, until) in sorted(self._bridges.items()) if until > now]
