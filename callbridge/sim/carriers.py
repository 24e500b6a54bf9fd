"""Every simulated carrier, by the name of the bridge's carrier it talks to (``callbridge.bridge.carriers``)."""

from __future__ import annotations

from callbridge.sim.carrier import SimulatedCarrier
from callbridge.sim.twilio import SimulatedSignalWire, SimulatedTwilio

__all__ = ["SIMULATED"]

SIMULATED: dict[str, type[SimulatedCarrier]] = {
    "twilio": SimulatedTwilio,
    "signalwire": SimulatedSignalWire,
}
