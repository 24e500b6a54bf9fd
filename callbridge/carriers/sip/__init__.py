"""SIP trunks: the UAS listener over UDP/TCP with G.711 RTP (the protocol itself is ``callbridge.sip``)."""

from callbridge.carriers.sip.settings import SipSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "SipSettings"]

SPEC = CarrierSpec(
    name="sip",
    transport="sip",
    capabilities=Capabilities(marks=False, flush=False, reconnect=False, dtmf_out=True, transfer=True),
    section="sip",
    secret="password",
    carrier="listener:CARRIER",
    codec=None,
    simulator="sim:SimulatedSip",
    sockets=("udp", "tcp"),
)
