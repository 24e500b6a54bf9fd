"""SignalWire's Compatibility API (cXML): Twilio's wire under SignalWire's names."""

from callbridge.carriers.signalwire.settings import SignalWireSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "SignalWireSettings"]

SPEC = CarrierSpec(
    name="signalwire",
    transport="websocket",
    capabilities=Capabilities(marks=True, flush=True, reconnect=True, dtmf_out=False, transfer=True),
    section="signalwire",
    secret="signing_key",
    carrier="http:CARRIER",
    codec="wire:signalwire_codec",
    simulator="sim:SimulatedSignalWire",
    builds_on="twilio",
    recognises="wire:recognises",
)
