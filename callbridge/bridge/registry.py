"""What the bridge remembers about a call between its streams: the engine session to resume, the call's
timeline, whether it has ended; and the single-use tokens that let a media stream in.

Two backends behind one async interface, chosen by ``registry.backend``: in memory (one process, the
default) and Redis (``callbridge.bridge.registry_redis``: several processes or hosts behind a load balancer,
where a call's webhook, its media socket and its next stream may each reach a different process). Keyed by
the call id (``CallSid``…), never the stream id. Entries expire with the engine's disconnect grace: a stream
that comes later starts a new engine session.

Every method is a round trip to Redis in production: call them when a stream starts, ends or is answered,
never per frame.
"""

from __future__ import annotations

import abc
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from callbridge.config import Settings
from callbridge.engine.port import ResumeTicket

__all__ = [
    "ENDED_KEPT_MS",
    "TOKEN_TTL_MS",
    "CallRecord",
    "CallRegistry",
    "MemoryCallRegistry",
    "MemoryStreamTokens",
    "RegistryUnavailable",
    "StreamTokens",
    "build_registry",
]

ENDED_KEPT_MS = 600_000
"""How long an ended call is remembered, so that a late redirect or stream for it is refused."""
TOKEN_TTL_MS = 120_000
"""How long a minted stream token stays valid (the carrier opens the stream within seconds)."""


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RegistryUnavailable(Exception):
    """The shared registry could not be reached (Redis down, a timeout). The calls that needed it at that moment
    go on without it where they can (a stream is refused, a detached session closed); none is left hanging."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(f"registry {operation}: {detail}")
        self.operation = operation
        self.detail = detail


@dataclass(slots=True)
class CallRecord:
    call_id: str
    ticket: ResumeTicket | None = None
    """The detached engine session, resumable until the record expires."""
    input_ms: int = 0
    """Where the call's input timeline stood when its last stream ended."""
    ended_reason: str | None = None
    """Set once the call is over (hung up, refused): a redirected webhook then hangs up."""
    bound: bool = False
    """A stream holds the call's engine session now (``mark_bound``): a new stream that finds no ticket is
    racing that stream's detach, and waits a moment for it rather than open a second session."""


class CallRegistry(abc.ABC):
    """call id → ``CallRecord``, expiring; shared by every process that serves the call's number."""

    @abc.abstractmethod
    async def get(self, call_id: str) -> CallRecord | None:
        """The call's record, or None when unknown or expired. Every method raises ``RegistryUnavailable`` when
        the backend cannot be reached."""

    @abc.abstractmethod
    async def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int) -> None:
        """Keep a detached call's engine session for ``grace_ms`` (the record expires then)."""

    @abc.abstractmethod
    async def claim_ticket(self, call_id: str, expected: ResumeTicket | None = None) -> tuple[ResumeTicket | None, int]:
        """Take the call's resume ticket and its timeline offset, atomically: of two processes that claim at
        once, one gets the ticket. With ``expected``: only if that is still the ticket waiting."""

    @abc.abstractmethod
    async def mark_bound(self, call_id: str, keep_ms: int) -> None:
        """A stream has bound the call's engine session (until its ``detach`` or ``mark_ended``; the mark of a
        process that died lapses after ``keep_ms``)."""

    @abc.abstractmethod
    async def mark_ended(self, call_id: str, reason: str, keep_ms: int = ENDED_KEPT_MS) -> None:
        """The call is over: drop its ticket and remember why for ``keep_ms``."""

    async def ended_reason(self, call_id: str) -> str | None:
        record = await self.get(call_id)
        return record.ended_reason if record else None

    async def aclose(self) -> None:
        """Release the backend's connections (at shutdown)."""


class StreamTokens(abc.ABC):
    """Single-use tokens minted by the answer webhook and checked in the stream's ``start``.

    Defence in depth beside the signature check: a media socket is bridged only with a token that the
    bridge (any of its processes) minted, for this call, recently, and never used before.
    """

    @abc.abstractmethod
    async def mint(self, call_id: str) -> str: ...

    @abc.abstractmethod
    async def consume(self, token: str | None, call_id: str) -> bool:
        """True once for a token minted for ``call_id`` and not expired."""


# ------------------------------------------------------------------ memory


@dataclass(slots=True)
class _Entry:
    record: CallRecord
    expires_at_ms: int


class MemoryCallRegistry(CallRegistry):
    """The registry of a single process; the clock (ms, monotonic) is injectable."""

    def __init__(self, *, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def _live(self, call_id: str) -> _Entry | None:
        entry = self._entries.get(call_id)
        if entry is not None and self._clock() >= entry.expires_at_ms:
            del self._entries[call_id]
            return None
        return entry

    def _entry(self, call_id: str) -> _Entry:
        entry = self._live(call_id)
        if entry is None:
            entry = self._entries[call_id] = _Entry(CallRecord(call_id), 0)
        return entry

    async def get(self, call_id: str) -> CallRecord | None:
        entry = self._live(call_id)
        if entry is None:
            return None
        record = entry.record
        return CallRecord(record.call_id, record.ticket, record.input_ms, record.ended_reason, record.bound)

    async def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int) -> None:
        entry = self._entry(call_id)
        entry.record.bound = False
        entry.record.ticket = ticket
        entry.record.input_ms = input_ms
        entry.expires_at_ms = self._clock() + grace_ms

    async def claim_ticket(self, call_id: str, expected: ResumeTicket | None = None) -> tuple[ResumeTicket | None, int]:
        entry = self._live(call_id)
        if entry is None:
            return None, 0
        record = entry.record
        if expected is not None and record.ticket != expected:
            return None, record.input_ms
        ticket, record.ticket = record.ticket, None
        return ticket, record.input_ms

    async def mark_bound(self, call_id: str, keep_ms: int) -> None:
        entry = self._entry(call_id)
        entry.record.bound = True
        entry.expires_at_ms = max(entry.expires_at_ms, self._clock() + keep_ms)

    async def mark_ended(self, call_id: str, reason: str, keep_ms: int = ENDED_KEPT_MS) -> None:
        entry = self._entry(call_id)
        entry.record.ended_reason = reason
        entry.record.bound = False
        entry.record.ticket = None
        entry.expires_at_ms = self._clock() + keep_ms


class MemoryStreamTokens(StreamTokens):
    def __init__(self, *, ttl_ms: int = TOKEN_TTL_MS, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._tokens: dict[str, tuple[str, int]] = {}

    async def mint(self, call_id: str) -> str:
        self._prune()
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (call_id, self._clock() + self._ttl_ms)
        return token

    async def consume(self, token: str | None, call_id: str) -> bool:
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


def build_registry(settings: Settings) -> tuple[CallRegistry, StreamTokens]:
    """The registry and tokens ``registry.backend`` names. Redis needs the ``redis`` extra and
    ``registry.redis_url``; the tokens share the registry's connection pool (closed by ``registry.aclose()``)."""
    if settings.registry.backend == "redis":
        from callbridge.bridge.registry_redis import redis_registry

        return redis_registry(settings)
    return MemoryCallRegistry(), MemoryStreamTokens()
