"""jambonz: the ``listen`` verb with bidirectional streaming audio, signed webhooks."""

from callbridge.carriers.jambonz.settings import JambonzSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "JambonzSettings"]

SPEC = CarrierSpec(
    name="jambonz",
    transport="websocket",
    capabilities=Capabilities(marks=False, flush=True, reconnect=True, dtmf_out=False, transfer=False),
    section="jambonz",
    secret="webhook_secret",
    carrier="http:CARRIER",
    codec="wire:JambonzCodec",
    simulator="sim:SimulatedJambonz",
    recognises="wire:recognises",
)
