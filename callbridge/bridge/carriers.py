"""The carriers a bridge process serves. Adding one means a codec in ``providers/``, one module here with its
HTTP side (``Carrier``), one line in ``carriers()``, and a simulated carrier in ``callbridge.sim``.

A ``Carrier`` brings what is its own and nothing else: routes (the answer
webhook, the media websocket, status callbacks), the REST client that hangs
a call up, and optionally a listener of its own (AudioSocket's TCP server),
entered for the life of the app. The call logic is shared (``CallSession``,
``MediaStreamDriver``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fastapi import APIRouter

from callbridge.config import Settings

if TYPE_CHECKING:
    from callbridge.bridge.services import BridgeServices

__all__ = ["Carrier", "CarrierRest", "carriers", "ws_url"]


class CarrierRest(Protocol):
    """A carrier's REST API, as far as the bridge uses it."""

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call; one that has already ended counts as done. Raises on failure."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Carrier:
    name: str
    router: Callable[[BridgeServices], APIRouter] | None = None
    rest: Callable[[Settings], CarrierRest] | None = None
    listener: Callable[[BridgeServices], AbstractAsyncContextManager[object]] | None = None


def ws_url(http_url: str) -> str:
    """``https://…`` → ``wss://…`` (``http`` → ``ws``), for media URLs derived from the public base URL."""
    if http_url.startswith("https://"):
        return "wss://" + http_url.removeprefix("https://")
    if http_url.startswith("http://"):
        return "ws://" + http_url.removeprefix("http://")
    return http_url


def carriers() -> tuple[Carrier, ...]:
    """Every carrier this bridge speaks, in the order their routes are mounted."""
    from callbridge.bridge import (
        audiosocket,
        exotel,
        generic,
        plivo,
        signalwire,
        telnyx,
        twilio,
        vonage,
    )
    from callbridge.sip import server as sip

    return (twilio.CARRIER, signalwire.CARRIER, exotel.CARRIER, telnyx.CARRIER, plivo.CARRIER, vonage.CARRIER, audiosocket.CARRIER, sip.CARRIER, generic.CARRIER)
