"""Vonage Voice API websockets: NCCO answer, signed webhooks, JWT REST."""

from callbridge.carriers.spec import Capabilities, CarrierSpec
from callbridge.carriers.vonage.settings import VonageSettings

__all__ = ["SPEC", "VonageSettings"]

SPEC = CarrierSpec(
    name="vonage",
    transport="websocket",
    capabilities=Capabilities(marks=True, flush=True, reconnect=True, dtmf_out=True, transfer=True),
    section="vonage",
    secret="signature_secret",
    carrier="http:CARRIER",
    codec="wire:VonageCodec",
    simulator="sim:SimulatedVonage",
    recognises="wire:recognises",
)
