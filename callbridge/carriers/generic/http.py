"""One media URL for every websocket carrier, ``/media``: the carrier is recognised from its first messages
(``providers.detect``), for deployments that point several carriers at one URL.

Who may open it, decided at the upgrade by what the request carries:
- a Twilio or SignalWire signature header: it must be valid for this URL;
- ``Authorization: Basic …``: Exotel's credentials (``exotel.*``);
- and the stream must carry a single-use token our answer webhook minted for
  its call, as on the carrier's own media URL (a carrier signature over a
  URL without parameters is the same for every call, and Telnyx, Plivo and
  Vonage sign nothing on the upgrade) — unless Exotel's credentials admitted
  it, or ``server.generic_media_requires_token`` is off.
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, WebSocket

from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.services import BridgeServices
from callbridge.carriers.exotel.http import ExotelAdmission
from callbridge.carriers.generic.wire import DetectingCodec
from callbridge.carriers.jambonz.http import accept_listen, upgrade_credentials
from callbridge.carriers.signalwire.http import signalwire_dialect
from callbridge.carriers.spec import Carrier
from callbridge.carriers.twilio.http import TwilioSignatures, twilio_dialect
from callbridge.carriers.webhooks import public_base, ws_url
from callbridge.logging import get_logger

__all__ = ["CARRIER", "MEDIA_PATH", "generic_router"]

log = get_logger(__name__)

MEDIA_PATH: Final = "/media"
_POLICY_VIOLATION: Final = 1008


def generic_router(services: BridgeServices) -> APIRouter:
    settings = services.settings
    twilio = twilio_dialect(settings)
    signalwire = signalwire_dialect(settings)
    signed_by = {
        twilio.signature_header: TwilioSignatures(twilio),
        signalwire.signature_header: TwilioSignatures(signalwire),
    }
    exotel = ExotelAdmission.from_settings(settings.exotel)
    jambonz = upgrade_credentials(settings.jambonz)  # they admit the upgrade; its stream still needs the token
    router = APIRouter()

    @router.websocket(MEDIA_PATH)
    async def media(websocket: WebSocket) -> None:
        url = ws_url(public_base(settings, str(websocket.base_url).replace("ws", "http", 1))) + MEDIA_PATH
        headers = websocket.headers
        peer = websocket.client.host if websocket.client else None
        check_token = settings.server.generic_media_requires_token
        refusal: str | None = None
        for header, signatures in signed_by.items():
            signature = headers.get(header)
            if signature is not None and not signatures.valid(url, {}, signature):
                refusal = "bad_signature"
        authorization = headers.get("authorization")
        if refusal is None and authorization is not None and authorization.lower().startswith("basic ") and not jambonz.valid(authorization):
            refusal = exotel.refusal(authorization, peer)
            check_token = check_token and refusal is not None  # Exotel's credentials admit a stream without a token
        if refusal is None and not await services.admits(""):
            refusal = "draining" if services.draining else "capacity"
        if refusal is not None:
            services.metrics.stream_refused.labels("unknown", refusal).inc()
            log.warning("stream_refused", path=MEDIA_PATH, reason=refusal, peer=peer)
            await websocket.close(code=_POLICY_VIOLATION)  # before accept: the upgrade is answered 403
            return
        await accept_listen(websocket)  # jambonz's subprotocol, when asked for
        await MediaStreamDriver(websocket, DetectingCodec(), services, check_token=check_token).run()

    return router


CARRIER: Final = Carrier(name="generic", router=generic_router)
