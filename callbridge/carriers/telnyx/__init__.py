"""Telnyx Call Control with bidirectional media streaming."""

from callbridge.carriers.spec import Capabilities, CarrierSpec
from callbridge.carriers.telnyx.settings import TelnyxSettings

__all__ = ["SPEC", "TelnyxSettings"]

SPEC = CarrierSpec(
    name="telnyx",
    transport="websocket",
    capabilities=Capabilities(marks=True, flush=True, reconnect=True, dtmf_out=True, transfer=True),
    section="telnyx",
    secret="api_key",
    carrier="http:CARRIER",
    codec="wire:TelnyxCodec",
    simulator="sim:SimulatedTelnyx",
    recognises="wire:recognises",
)
