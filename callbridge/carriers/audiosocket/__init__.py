"""Asterisk AudioSocket: a TCP listener, admission by source address."""

from callbridge.carriers.audiosocket.settings import AudioSocketSettings
from callbridge.carriers.spec import Capabilities, CarrierSpec

__all__ = ["SPEC", "AudioSocketSettings"]

SPEC = CarrierSpec(
    name="audiosocket",
    transport="tcp",
    capabilities=Capabilities(marks=False, flush=False, reconnect=True, dtmf_out=False, transfer=False),
    section="audiosocket",
    secret=None,
    carrier="listener:CARRIER",
    codec=None,
    simulator="sim:SimulatedAudioSocket",
    sockets=("tcp",),
)
