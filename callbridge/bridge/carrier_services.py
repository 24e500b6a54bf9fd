"""What a carrier's webhooks and listeners use of their process (``CarrierServices``): everything a media stream
uses (``StreamServices``: each carrier runs its streams through ``MediaStreamDriver``), and what only a carrier's
own routes need beside it — the replay guard of its signed webhooks, its per-process state, its REST client and
its actions on live calls, and the fleet's word on calls whose stream is elsewhere (a call-control webhook that
reaches this process while the socket is on another).

Carriers take this, not ``BridgeServices``: whether a call is answered or a stream taken is the answer desk's
(``services.desk``), never a carrier's; the drain, the admission book, readiness and the signals' wiring stay the
app's (``FleetPort``). ``BridgeServices`` is the one implementation.
"""

from __future__ import annotations

from typing import Protocol

from callbridge.bridge.actions import CallActionPerformer
from callbridge.bridge.dialer import Dialer
from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.fleet import SignalHandler
from callbridge.bridge.registry import SignalKind
from callbridge.bridge.replay import ReplayGuard
from callbridge.bridge.services import CarrierRest
from callbridge.bridge.stream_services import StreamServices

__all__ = ["CarrierServices"]


class CarrierServices(StreamServices, Protocol):
    """What a carrier's routes and listeners use of their process (see the module docstring)."""

    @property
    def replays(self) -> ReplayGuard:
        """Which signed webhooks were taken already: a replay is refused."""
        ...

    @property
    def carrier_state(self) -> dict[str, object]:
        """What a carrier keeps per process beside its routes (a call-control client's state), by carrier."""
        ...

    @property
    def carrier_rests(self) -> dict[str, CarrierRest]:
        """carrier → its REST client (one per process), for webhooks that call the carrier's API."""
        ...

    @property
    def dialer(self) -> Dialer | None:
        """The calls the agent places: a carrier's answer webhook finds a placed call's request here, its status
        callback reports how a dialled call goes."""
        ...

    @property
    def action_performers(self) -> dict[str, CallActionPerformer]:
        """carrier → what transfers its calls and sends DTMF on them; a carrier registers its own."""
        ...

    def on_signal(self, kind: SignalKind, handler: SignalHandler) -> None:
        """Other processes' word on calls: ``handler`` runs for each signal of ``kind`` meant for a call here."""
        ...

    async def call_ended_by_carrier(self, call_id: str, reason: EndCause) -> None:
        """The carrier says the call is over (a status webhook): end it wherever its stream is."""
        ...

    async def digit_from_carrier(self, call_id: str, digit: str) -> None:
        """A DTMF digit the carrier reported out of band (a webhook), for the call wherever its stream is."""
        ...
