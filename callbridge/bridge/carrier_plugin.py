"""The ``Carrier`` a carrier's HTTP side or listener brings to the bridge: what is its own and nothing else — routes
(the answer webhook, the media websocket, status callbacks), the REST client that hangs a call up, optionally a
listener of its own (a raw TCP server, SIP) entered for the life of the app, and how the generic ``/media`` URL
checks its proof on an upgrade. The call logic is shared (``CallSession``, ``MediaStreamDriver``). Its spec
(``callbridge.carriers.spec.CarrierSpec``) names it by reference; ``load_carrier`` imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from fastapi import APIRouter

from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.services import CarrierRest
from callbridge.carriers.spec import CarrierSpec, UpgradeCheck
from callbridge.config import Settings

__all__ = ["Carrier", "load_carrier"]


@dataclass(frozen=True, slots=True)
class Carrier:
    """A carrier's HTTP side or listener, entered by the app (``CarrierSpec.carrier`` names it)."""

    name: str
    router: Callable[[CarrierServices], APIRouter] | None = None
    rest: Callable[[Settings], CarrierRest] | None = None
    listener: Callable[[CarrierServices], AbstractAsyncContextManager[object]] | None = None
    generic_upgrade: Callable[[Settings], UpgradeCheck] | None = None
    """How the generic ``/media`` URL checks this carrier's proof on an upgrade; None: it sends none."""
    subprotocol: str | None = None
    """The websocket subprotocol its media upgrade asks for (accepted at the generic ``/media`` URL too)."""


def load_carrier(spec: CarrierSpec) -> Carrier:
    """The ``Carrier`` ``spec`` names, imported now."""
    carrier = spec.load(spec.carrier)
    if not isinstance(carrier, Carrier) or carrier.name != spec.name:
        raise TypeError(f"{spec.package}.{spec.carrier} is not {spec.name}'s Carrier")
    return carrier
