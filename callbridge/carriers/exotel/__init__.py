"""Exotel's Voicebot applet: a websocket Exotel opens, Basic credentials on the upgrade."""

from callbridge.carriers.exotel.settings import ExotelSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "ExotelSettings"]

SPEC = CarrierSpec(
    name="exotel",
    transport="websocket",
    capabilities=Capabilities(marks=True, flush=True, reconnect=True, dtmf_out=False, transfer=False),
    section="exotel",
    secret="api_token",
    carrier="http:CARRIER",
    codec="wire:ExotelCodec",
    simulator="sim:SimulatedExotel",
    recognises="wire:recognises",
)
