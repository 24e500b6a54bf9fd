"""What the bridge remembers about a call between its streams: the engine session to resume, the call's
timeline, whether it has ended; and the single-use tokens that let a media stream in.

In memory (one process); several processes share a Redis registry (production issue). Keyed by the
call id (``CallSid``…), never the stream id. Entries expire with the engine's disconnect grace: a stream
that comes later starts a new engine session. The clock is injectable (ms, monotonic).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from callbridge.engine.port import ResumeTicket

__all__ = ["CallRecord", "CallRegistry", "StreamTokens"]


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class CallRecord:
    call_id: str
    ticket: ResumeTicket | None = None
    """The detached engine session, resumable until ``expires_at_ms``."""
    input_ms: int = 0
    """Where the call's input timeline stood when its last stream ended."""
    expires_at_ms: int = 0
    ended_reason: str | None = None
    """Set once the call is over (hung up, refused): a redirected webhook then hangs up."""


class CallRegistry:
    """call id → ``CallRecord``, expiring."""

    def __init__(self, *, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._clock = clock
        self._records: dict[str, CallRecord] = {}

    def get(self, call_id: str) -> CallRecord | None:
        record = self._records.get(call_id)
        if record is not None and record.expires_at_ms and self._clock() >= record.expires_at_ms:
            del self._records[call_id]
            return None
        return record

    def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int) -> None:
        """Keep a detached call's engine session for ``grace_ms``."""
        record = self._records.setdefault(call_id, CallRecord(call_id))
        record.ticket = ticket
        record.input_ms = input_ms
        record.expires_at_ms = self._clock() + grace_ms

    def claim_ticket(self, call_id: str) -> tuple[ResumeTicket | None, int]:
        """Take the call's resume ticket (once) and its timeline offset."""
        record = self.get(call_id)
        if record is None:
            return None, 0
        ticket, record.ticket = record.ticket, None
        return ticket, record.input_ms

    def mark_ended(self, call_id: str, reason: str, keep_ms: int = 600_000) -> None:
        record = self._records.setdefault(call_id, CallRecord(call_id))
        record.ended_reason = reason
        record.ticket = None
        record.expires_at_ms = self._clock() + keep_ms

    def ended_reason(self, call_id: str) -> str | None:
        record = self.get(call_id)
        return record.ended_reason if record else None



class StreamTokens:
    """Single-use tokens minted by the answer webhook and checked in the stream's ``start``.

    Defence in depth beside the signature check: a media socket is bridged only with a token that
    this process minted, for this call, recently, and never used before.
    """

    def __init__(self, *, ttl_ms: int = 120_000, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._tokens: dict[str, tuple[str, int]] = {}

    def mint(self, call_id: str) -> str:
        self._prune()
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (call_id, self._clock() + self._ttl_ms)
        return token

    def consume(self, token: str | None, call_id: str) -> bool:
        """True once for a token minted for ``call_id`` and not expired."""
        if not token:
            return False
        entry = self._tokens.pop(token, None)
        if entry is None:
            return False
        minted_for, expires_at = entry
        return hmac.compare_digest(minted_for, call_id) and self._clock() < expires_at

    def _prune(self) -> None:
        now = self._clock()
        for token in [t for t, (_, expires) in self._tokens.items() if expires <= now]:
            del self._tokens[token]
