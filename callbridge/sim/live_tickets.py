"""The bridge's live ticket of a simulated call in the registry model, kept as ``bridge/live_ticket.py``'s
``LiveTicketKeeper`` keeps it on the server: written at the stream's bind, then once due (every ``CHECKPOINT_MS``,
polled every ``CHECKPOINT_POLL_MS``) and at a barge-in, as ``CallRegistry.checkpoint`` writes it — only while the
stream holds the call (else it stops: released), a record the registry lost written anew, a write in a registry
stall timed out and tried again an interval on. What the engine replays after the ticket is what the stream took
since it was written (``journal``)."""

from __future__ import annotations

from callbridge.bridge.call import CallSession, CallState
from callbridge.bridge.registry import LiveCall
from callbridge.engine.events import EngineEvent
from callbridge.engine.local.core import LocalSessionCore
from callbridge.engine.port import ResumeTicket
from callbridge.sim.fault_models import RegistryModel
from callbridge.sim.fault_plan import CHECKPOINT_MS, CHECKPOINT_POLL_MS, FaultPlan

__all__ = ["LiveTickets"]


class LiveTickets:
    """One call's live ticket in its registry record (see the module docstring)."""

    def __init__(self, registry: RegistryModel, plan: FaultPlan) -> None:
        self._registry, self._plan = registry, plan
        self.due_at_ms: int | None = None
        """When the bound stream writes its ticket next (None: no stream writes it)."""
        self.journal: list[EngineEvent] = []
        """The engine's replay after the live ticket: events the stream took since the ticket was last written."""

    def write(self, call: CallSession, engine: LocalSessionCore, now_ms: int) -> None:
        """The stream's live ticket into the registry (at its bind, then every ``CHECKPOINT_MS``): what the engine
        replays after it is what the stream takes from now on."""
        heard = call.speech.heard_so_far(now_ms, live=call.state is CallState.LIVE)
        ticket = ResumeTicket(engine.session_id, engine.lease_generation, heard_ms=heard, told_ms=call.told_so_far)
        self._registry.live = LiveCall(f"bridge:{call.codec.stream_id}", ticket, call.facts().input_ms)
        self.journal = []
        self.due_at_ms = now_ms + CHECKPOINT_MS

    def due(self, now_ms: int) -> bool:
        """The driver's poll: the ticket is due a write."""
        return self.due_at_ms is not None and now_ms % CHECKPOINT_POLL_MS == 0 and now_ms >= self.due_at_ms

    def checkpoint(self, call: CallSession, engine: LocalSessionCore, now_ms: int) -> bool:
        """One write of the stream's live ticket (due, or at a barge-in); False where nothing was written."""
        registry, holder = self._registry, f"bridge:{call.codec.stream_id}"
        stall = self._plan.registry_stall
        if stall is not None and stall[0] <= now_ms < stall[0] + stall[1]:  # timed out: tried again an interval on;
            self.due_at_ms = now_ms + CHECKPOINT_MS  # the replay keeps what follows the last
            return False
        if registry.is_empty():
            registry.bound = True  # written anew: a takeover finds it again
        elif not registry.bound or registry.live is None or registry.live.holder != holder:
            self.due_at_ms = None  # not this stream's to write any more
            return False
        self.write(call, engine, now_ms)
        return True
