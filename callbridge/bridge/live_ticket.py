"""A bound stream's live ticket kept current in the registry (``CallRegistry.checkpoint``), off the per-frame path:
what another process resumes the call from should this one die (a crash: no detach, no ticket).

One write at a time (a newer never lands before an older), and the engine acknowledged no further than the ticket
written: its replay must cover what a process that takes the call over needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from structlog.stdlib import BoundLogger

from callbridge.bridge.pacing import monotonic_ms
from callbridge.bridge.registry import CallRegistry, LiveCall, RegistryUnavailable
from callbridge.engine.port import DuplexSession

__all__ = ["BOUND_KEPT_MS", "CHECKPOINT_POLL_S", "LiveTicketKeeper"]

BOUND_KEPT_MS = 4 * 3600 * 1000
"""How long a stream's "bound" mark outlives a process that died without detaching."""
CHECKPOINT_POLL_S = 0.25
"""How often a live call's ticket is compared with what the registry holds (written only when it changed, a rotated
token at once, the rest every ``registry.checkpoint_interval_s``)."""


class LiveTicketKeeper:
    """The live ticket of one bound stream as the registry holds it (see the module docstring)."""

    def __init__(
        self, registry: CallRegistry, call_id: str, session: DuplexSession, live_now: Callable[[], LiveCall], written: LiveCall,
        log: BoundLogger,
    ) -> None:  # fmt: skip
        """``live_now``: the stream's live ticket as it is now; ``written``: the one its bind wrote."""
        self.registry, self.call_id, self.session, self.live_now, self.log = registry, call_id, session, live_now, log
        self.written, self.tried_at_ms = written, monotonic_ms()
        """The ticket the registry holds, and when it was last written or tried (the poll waits an interval on)."""
        self.released = False
        """This stream no longer holds the call in the registry (taken over, detached, ended): nothing more written."""
        self._lock = asyncio.Lock()
        self._failing = False

    async def keep(self, interval_ms: int, stream_done: Callable[[], bool]) -> None:
        """Keep the ticket current: a rotated resume token within ``CHECKPOINT_POLL_S``, the rest every
        ``interval_ms`` (a barge-in's: at once, ``write``). Stops once the stream no longer holds the call there
        (taken over, detached, ended)."""
        while not stream_done() and not self.session.closed:
            await asyncio.sleep(CHECKPOINT_POLL_S)
            if stream_done():
                return
            live = self.live_now()
            rotated = live.ticket.resume_token != self.written.ticket.resume_token
            if live == self.written or (not rotated and monotonic_ms() - self.tried_at_ms < interval_ms):
                continue
            if not await self.write():
                self.log.info("live_ticket_released")  # taken over, or this stream is detaching: not ours to write
                return

    async def write(self) -> bool:
        """Write the stream's live ticket as it is now; False once released."""
        async with self._lock:
            if self.released:
                return False
            live = self.live_now()
            try:
                held = await self.registry.checkpoint(self.call_id, live, BOUND_KEPT_MS)
            except RegistryUnavailable as exc:
                if not self._failing:  # once per outage: tried again an interval on (a rotated token: at once)
                    self.log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
                self._failing = True
                self.tried_at_ms = monotonic_ms()
                self.session.limit_acks(None)  # no ticket resumes from there meanwhile: the replay need not wait
                return True
            self._failing = False
            if not held:
                self.released = True
                return False
            self.written, self.tried_at_ms = live, monotonic_ms()
            self.session.limit_acks(live.ticket.last_event_seq)
            return True
