"""SignalWire's Compatibility API (cXML): Twilio's TwiML and Media Streams under SignalWire's names
(telephony-protocols.md §3.4).

Differences from Twilio: the signature header is ``X-SignalWire-Signature``
(Twilio's HMAC over the URL and parameters, keyed with the space's signing
key); ``<Stream codec="L16@24000h">`` switches both directions to 16-bit PCM
at 24 kHz (``signalwire.codec``); the REST API lives at
``https://<space>/api/laml`` with the project id and API token as basic auth — the same create-call request places a
call (``POST …/Accounts/<project id>/Calls.json``), its progress to ``/signalwire/call-status``.

The media websocket's upgrade: SignalWire documents ``X-SignalWire-Signature`` on its HTTP webhooks only
(signalwire.com/docs/server-sdks/reference/python/core/security), and its REST ``Create a Stream`` offers an
``AuthorizationBearerToken`` for the websocket server instead; nothing documents a signed upgrade. So an
unsigned upgrade is accepted, and the stream must carry the single-use token our answer minted (a signature
that is there is still checked).
"""

from __future__ import annotations

from typing import Final

from callbridge.bridge.carrier_plugin import Carrier
from callbridge.carriers.signalwire.wire import signalwire_codec
from callbridge.carriers.twilio.http import TwilioDialect, TwilioRest, signature_upgrade, twilio_compatible_router
from callbridge.config import Settings

__all__ = ["CARRIER", "signalwire_dialect"]

def signalwire_dialect(settings: Settings) -> TwilioDialect:
    config = settings.signalwire
    return TwilioDialect(
        name="signalwire",
        signature_header="x-signalwire-signature",
        signing_key=config.signing_key,
        validate_signatures=config.validate_signatures,
        codec=signalwire_codec,
        stream_attributes={"codec": config.codec} if config.codec != "PCMU" else {},
        upgrade_signed=False,
    )


def signalwire_rest(settings: Settings) -> TwilioRest:
    config = settings.signalwire
    base = config.api_base_url or (f"https://{config.space_url}/api/laml" if config.space_url else "https://invalid.signalwire.example/api/laml")
    return TwilioRest(base, config.api_token, username=config.project_id, account=config.project_id, dialect="signalwire")


CARRIER: Final = Carrier(
    name="signalwire",
    router=lambda services: twilio_compatible_router(services, signalwire_dialect(services.settings)),
    rest=signalwire_rest,
    generic_upgrade=lambda settings: signature_upgrade(signalwire_dialect(settings)),
)
