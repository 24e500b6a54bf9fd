"""Bandwidth Programmable Voice: BXML answer, bidirectional media streams, OAuth 2.0 Voice API."""

from callbridge.carriers.bandwidth.settings import BandwidthSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "BandwidthSettings"]

SPEC = CarrierSpec(
    name="bandwidth",
    transport="websocket",
    capabilities=Capabilities(marks=False, flush=True, reconnect=True, dtmf_out=False, transfer=False),
    section="bandwidth",
    secret="callback_password",
    carrier="http:CARRIER",
    codec="wire:BandwidthCodec",
    simulator="sim:SimulatedBandwidth",
    recognises="wire:recognises",
)
