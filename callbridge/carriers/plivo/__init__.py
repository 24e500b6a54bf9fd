"""Plivo Audio Streams (bidirectional), XML answer."""

from callbridge.carriers.plivo.settings import PlivoSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "PlivoSettings"]

SPEC = CarrierSpec(
    name="plivo",
    transport="websocket",
    capabilities=Capabilities(marks=True, flush=True, reconnect=True, dtmf_out=True, transfer=True),
    section="plivo",
    secret="auth_token",
    carrier="http:CARRIER",
    codec="wire:PlivoCodec",
    simulator="sim:SimulatedPlivo",
    recognises="wire:recognises",
)
