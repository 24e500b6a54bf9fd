"""Which engine endpoint takes the next session: the sans-I/O core of the engine pool (``pool.py``).

Inputs are what the pool saw — an open reserved, succeeded or failed with a
code, a session released or lost, a health probe's answer, an operator's
drain — each with ``now_ms`` (monotonic) where time matters; outputs are the
order to try endpoints in (``candidates``), the probes due now
(``due_probes``) and when to look again (``next_deadline_ms``). No sockets,
no clocks.

Plan:
- Load is the sessions *this process* holds on an endpoint, counted from the
  moment an open is reserved (two calls opening at once do not both pick the
  emptiest server) until the session is closed, detached or its open failed.
  Other bridge processes' sessions are invisible here; the server's own
  ``resource_exhausted`` is the real limit, and the pool moves on when it
  comes. An endpoint that answered ``resource_exhausted`` is tried last for
  ``probe_interval_ms``, or until one of our sessions on it ends.
- Ties go to the endpoint picked least recently (round robin), the configured
  order first. An endpoint whose last word was a failure (a refused connect,
  a probe unanswered) is tried after the others until an open or a probe
  passes there: a server that swallows packets costs one call its connect
  timeout, not every call until it is ejected.
- Health: an endpoint is healthy or ejected. ``eject_after_failures``
  consecutive failures (a connect refused or timed out, a broken handshake,
  a failed health probe) eject it; a session lost past its resume window
  (``connection_failed``) ejects it at once, since the server was unreachable
  all that time. Any successful open or resume resets the count.
- Probes: every endpoint is probed every ``probe_interval_ms``, first as the
  pool starts serving (``probe_all_now``) (an ejected one
  first ``probe_interval_ms`` after its ejection, then with the interval
  doubling up to ``probe_backoff_max_ms``); a probe that passes brings an
  ejected endpoint back. A passing probe does not clear a healthy endpoint's
  failure count: a server that answers ``/health`` but not the duplex socket
  must still be ejected.
- Drain is the operator's, apart from health: a draining endpoint gets no new
  session; its sessions run on and may resume there (they live on that
  server). Health is still probed.
- When no healthy endpoint is left to try, the ejected ones (not draining)
  are tried anyway, least recently picked first: an ejection may be stale, and
  a refused call costs more than a failed connect. A success brings it back.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from callbridge.engine.errors import ErrorCode

__all__ = ["EndpointHealth", "EndpointSet", "EndpointStatus", "OpenOutcome"]


class EndpointHealth(enum.Enum):
    HEALTHY = "healthy"
    EJECTED = "ejected"


class OpenOutcome(enum.Enum):
    """What a failed open at one endpoint means for the next try."""

    BUSY = "busy"
    """The server is full (``resource_exhausted``, ``engine_backpressure``): try the next one."""
    FAILED = "failed"
    """The endpoint failed (unreachable, timed out, broken): counted toward ejection; try the next one."""


_BUSY_CODES: Final = frozenset({ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.ENGINE_BACKPRESSURE})


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """One endpoint as the operator sees it (``GET /admin/engines``, metrics)."""

    url: str
    health: EndpointHealth
    draining: bool
    sessions: int
    """Sessions this process holds there (opens in progress included)."""
    failures_in_a_row: int
    ejections: int
    server_sessions: int | None
    """What the server's last ``/health`` said it holds, all clients together (``engine-server``); None when it
    does not say (vllm-omni)."""

    @property
    def state(self) -> str:
        """``draining`` (the operator's) over ``healthy`` / ``ejected``."""
        return "draining" if self.draining else self.health.value


@dataclass(slots=True)
class _Endpoint:
    url: str
    last_pick: int
    health: EndpointHealth = EndpointHealth.HEALTHY
    draining: bool = False
    sessions: int = 0
    failures_in_a_row: int = 0
    ejections: int = 0
    busy_until_ms: int = 0
    next_probe_ms: int = 0
    probe_backoff_ms: int = 0
    probing: bool = False
    suspect: bool = False
    """Its last open or probe failed: tried after the others."""
    server_sessions: int | None = None

    def status(self) -> EndpointStatus:
        return EndpointStatus(
            self.url, self.health, self.draining, self.sessions, self.failures_in_a_row, self.ejections,
            self.server_sessions,
        )  # fmt: skip


class EndpointSet:
    """The endpoints of one pool and what is known of each. Every method is synchronous and pure."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        eject_after_failures: int = 3,
        probe_interval_ms: int = 5000,
        probe_backoff_max_ms: int = 60_000,
        now_ms: int = 0,
    ) -> None:
        ordered = list(dict.fromkeys(urls))
        if not ordered:
            raise ValueError("an engine pool needs at least one endpoint")
        self.eject_after_failures = max(1, eject_after_failures)
        self.probe_interval_ms = probe_interval_ms
        self.probe_backoff_max_ms = max(probe_backoff_max_ms, probe_interval_ms)
        self._endpoints = {
            url: _Endpoint(url, last_pick=index - len(ordered), next_probe_ms=now_ms + probe_interval_ms)
            for index, url in enumerate(ordered)
        }
        self._picks = 0
        self.failovers: dict[tuple[str, str], int] = {}
        """(endpoint, reason) → opens that endpoint refused or failed, so the next one was tried."""

    @property
    def urls(self) -> list[str]:
        return list(self._endpoints)

    def __contains__(self, url: object) -> bool:
        return url in self._endpoints

    def status(self, url: str | None = None) -> list[EndpointStatus]:
        """Every endpoint in configured order, or just ``url``'s. Raises ``KeyError`` for an unknown url."""
        if url is not None:
            return [self._endpoints[url].status()]
        return [endpoint.status() for endpoint in self._endpoints.values()]

    # ------------------------------------------------------------- choosing

    def candidates(self, now_ms: int) -> list[str]:
        """The endpoints to try for a new session, best first: healthy and not draining; then not recently
        full, not failing, fewest sessions, least recently picked. None healthy: the ejected ones that are not
        draining, in the same order."""
        open_ = [e for e in self._endpoints.values() if not e.draining]
        healthy = [e for e in open_ if e.health is EndpointHealth.HEALTHY]
        pool = healthy or open_
        pool.sort(key=lambda e: (e.busy_until_ms > now_ms, e.suspect, e.sessions, e.last_pick))
        return [e.url for e in pool]

    def reserve(self, url: str) -> None:
        """An open (or resume) starts at ``url``: it counts as a session from now on. Follow with ``opened``
        or ``open_failed`` (or ``release``, if it was abandoned)."""
        endpoint = self._endpoints[url]
        endpoint.sessions += 1
        self._picks += 1
        endpoint.last_pick = self._picks

    def opened(self, url: str) -> bool:
        """The reserved open (or resume) succeeded: the endpoint works. True if that brought it back."""
        endpoint = self._endpoints[url]
        endpoint.failures_in_a_row = 0
        endpoint.suspect = False
        if endpoint.health is EndpointHealth.EJECTED:
            self._restore(endpoint)
            return True
        return False

    def open_failed(self, url: str, code: str, now_ms: int) -> OpenOutcome:
        """The reserved open at ``url`` failed with ``code``: release it, count the failover, and say why."""
        endpoint = self._endpoints[url]
        endpoint.sessions -= 1
        key = (url, code)
        self.failovers[key] = self.failovers.get(key, 0) + 1
        if code in _BUSY_CODES:
            endpoint.busy_until_ms = now_ms + self.probe_interval_ms
            return OpenOutcome.BUSY
        self.failed(url, now_ms)
        return OpenOutcome.FAILED

    def resume_failed(self, url: str, code: str, now_ms: int) -> None:
        """A reserved resume at ``url`` failed: release it; an unreachable server counts as a failure (a
        refused ticket does not: the server answered)."""
        endpoint = self._endpoints[url]
        endpoint.sessions -= 1
        if code in (ErrorCode.CONNECTION_FAILED, ErrorCode.TIMEOUT):
            self.failed(url, now_ms)

    def release(self, url: str) -> None:
        """A session at ``url`` ended here (closed, detached, or its open abandoned): a slot is free."""
        endpoint = self._endpoints[url]
        endpoint.sessions = max(0, endpoint.sessions - 1)
        endpoint.busy_until_ms = 0

    # --------------------------------------------------------------- health

    def failed(self, url: str, now_ms: int) -> bool:
        """One more consecutive failure at ``url``; True if that ejected it."""
        endpoint = self._endpoints[url]
        endpoint.failures_in_a_row += 1
        endpoint.suspect = True
        if endpoint.health is EndpointHealth.HEALTHY and endpoint.failures_in_a_row >= self.eject_after_failures:
            self._eject(endpoint, now_ms)
            return True
        return False

    def lost(self, url: str, now_ms: int) -> bool:
        """A live session at ``url`` was lost past its resume window: eject at once. True if that ejected it."""
        endpoint = self._endpoints[url]
        endpoint.failures_in_a_row = max(endpoint.failures_in_a_row, self.eject_after_failures)
        endpoint.suspect = True
        if endpoint.health is EndpointHealth.HEALTHY:
            self._eject(endpoint, now_ms)
            return True
        return False

    def probe_all_now(self, now_ms: int) -> None:
        """Probe every endpoint now, then on its routine (the pool starts serving and knows nothing of them yet:
        a server nobody listens for is then found dead ``eject_after_failures - 1`` intervals from the start)."""
        for endpoint in self._endpoints.values():
            endpoint.next_probe_ms = min(endpoint.next_probe_ms, now_ms)

    def due_probes(self, now_ms: int) -> list[str]:
        """The endpoints to probe now; each is marked in flight until ``probe_done``."""
        due = [e for e in self._endpoints.values() if not e.probing and e.next_probe_ms <= now_ms]
        for endpoint in due:
            endpoint.probing = True
        return [e.url for e in due]

    def probe_done(self, url: str, ok: bool, now_ms: int, server_sessions: int | None = None) -> bool:
        """A probe of ``url`` answered (``ok``) or not. True if that brought an ejected endpoint back."""
        endpoint = self._endpoints[url]
        endpoint.probing = False
        endpoint.server_sessions = server_sessions if ok else None
        endpoint.suspect = not ok
        if endpoint.health is EndpointHealth.EJECTED:
            if ok:
                self._restore(endpoint)
                endpoint.next_probe_ms = now_ms + self.probe_interval_ms
                return True
            endpoint.probe_backoff_ms = min(endpoint.probe_backoff_ms * 2, self.probe_backoff_max_ms)
            endpoint.next_probe_ms = now_ms + endpoint.probe_backoff_ms
            return False
        endpoint.next_probe_ms = now_ms + self.probe_interval_ms
        if not ok:
            self.failed(url, now_ms)
        return False

    def next_deadline_ms(self) -> int | None:
        """When the next probe is due (None while every endpoint's probe is in flight)."""
        waiting = [e.next_probe_ms for e in self._endpoints.values() if not e.probing]
        return min(waiting) if waiting else None

    def _eject(self, endpoint: _Endpoint, now_ms: int) -> None:
        endpoint.health = EndpointHealth.EJECTED
        endpoint.ejections += 1
        endpoint.probe_backoff_ms = self.probe_interval_ms
        if not endpoint.probing:
            endpoint.next_probe_ms = now_ms + self.probe_interval_ms

    def _restore(self, endpoint: _Endpoint) -> None:
        endpoint.health = EndpointHealth.HEALTHY
        endpoint.failures_in_a_row = 0
        endpoint.probe_backoff_ms = 0

    # ---------------------------------------------------------------- drain

    def drain(self, url: str) -> None:
        """No new session goes to ``url``; its sessions run on. Raises ``KeyError`` for an unknown url."""
        self._endpoints[url].draining = True

    def undrain(self, url: str) -> None:
        """``url`` takes new sessions again. Raises ``KeyError`` for an unknown url."""
        self._endpoints[url].draining = False
