"""The browser phone: ``/talk``, a page that calls the agent over WebRTC (aiortc), through the same call core as a
phone call."""

from callbridge.carriers.spec import Capabilities, CarrierSpec
from callbridge.carriers.webrtc.settings import WebRtcSettings

__all__ = ["SPEC", "WebRtcSettings"]

SPEC = CarrierSpec(
    name="webrtc",
    transport="webrtc",
    capabilities=Capabilities(marks=False, flush=False, reconnect=False, dtmf_out=False, transfer=False),
    section="webrtc",
    secret=None,
    carrier="http:CARRIER",
    codec=None,
    simulator=None,
)
