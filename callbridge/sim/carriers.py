"""Every simulated carrier, by the name of the bridge's carrier it talks to (``callbridge.bridge.carriers``)."""

from __future__ import annotations

from callbridge.sim.audiosocket import SimulatedAudioSocket
from callbridge.sim.carrier import SimulatedCarrier
from callbridge.sim.exotel import SimulatedExotel
from callbridge.sim.plivo import SimulatedPlivo
from callbridge.sim.sip import SimulatedSip
from callbridge.sim.telnyx import SimulatedTelnyx
from callbridge.sim.twilio import SimulatedSignalWire, SimulatedTwilio
from callbridge.sim.vonage import SimulatedVonage

__all__ = ["SIMULATED"]

SIMULATED: dict[str, type[SimulatedCarrier]] = {
    "twilio": SimulatedTwilio,
    "signalwire": SimulatedSignalWire,
    "exotel": SimulatedExotel,
    "plivo": SimulatedPlivo,
    "telnyx": SimulatedTelnyx,
    "vonage": SimulatedVonage,
    "audiosocket": SimulatedAudioSocket,
    "sip": SimulatedSip,
}
