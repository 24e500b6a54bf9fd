"""One ``/media`` URL for every websocket carrier: the carrier is recognised from its first messages."""

from callbridge.carriers.spec import Capabilities, CarrierSpec

SPEC = CarrierSpec(
    name="generic",
    transport="websocket",
    capabilities=Capabilities(marks=False, flush=False, reconnect=False, dtmf_out=False, transfer=False),
    section=None,
    secret=None,
    carrier="http:CARRIER",
    codec=None,
    simulator=None,
)
