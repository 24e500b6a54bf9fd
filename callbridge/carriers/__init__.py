"""Every carrier callbridge speaks, each in a package of its own: ``wire.py`` (the sans-I/O codec), ``http.py`` or
``listener.py`` (answer documents, signatures, REST calls, reconnect), ``sim.py`` (its simulator), and its
``CarrierSpec`` in ``__init__.py``. ``CARRIERS`` below is the one list: the app mounts it, the generic ``/media``
URL detects among it, the CLI offers it, the load tester and the simulators read it. Adding a carrier is one
package and its lines here: its import, its ``SPEC`` in ``CARRIERS``, and its settings section in
``CarrierSections``.

Shared by them: ``base.py`` (typed carrier events and actions, ``RemoteProtocolError``, ``CarrierProfile``) and
``json_wire.py``.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel

from callbridge.carriers import (
    audiosocket,
    bandwidth,
    exotel,
    generic,
    jambonz,
    plivo,
    signalwire,
    sip,
    telnyx,
    twilio,
    vonage,
    webrtc,
)
from callbridge.carriers.audiosocket import AudioSocketSettings
from callbridge.carriers.bandwidth import BandwidthSettings
from callbridge.carriers.exotel import ExotelSettings
from callbridge.carriers.jambonz import JambonzSettings
from callbridge.carriers.plivo import PlivoSettings
from callbridge.carriers.signalwire import SignalWireSettings
from callbridge.carriers.sip import SipSettings
from callbridge.carriers.spec import CarrierSpec
from callbridge.carriers.telnyx import TelnyxSettings
from callbridge.carriers.twilio import TwilioSettings
from callbridge.carriers.vonage import VonageSettings
from callbridge.carriers.webrtc import WebRtcSettings

__all__ = ["CARRIERS", "DEFAULT_SIMULATED", "CarrierSections", "carrier_spec", "direct_names", "simulated_names"]

CARRIERS: Final[tuple[CarrierSpec, ...]] = (
    twilio.SPEC,
    signalwire.SPEC,
    exotel.SPEC,
    telnyx.SPEC,
    plivo.SPEC,
    vonage.SPEC,
    bandwidth.SPEC,
    jambonz.SPEC,
    audiosocket.SPEC,
    sip.SPEC,
    webrtc.SPEC,
    generic.SPEC,
)
"""In the order their routes are mounted (the generic ``/media`` last)."""


DEFAULT_SIMULATED: Final = next(spec.name for spec in CARRIERS if spec.simulator is not None)
"""The carrier ``simulate`` and ``loadtest`` place calls on unless told: the first simulated one of the list."""


class CarrierSections(BaseModel):
    """Every carrier's section of the settings (``[twilio]``, ``CALLBRIDGE_TWILIO__…``), by its spec's ``section``:
    ``callbridge.config.Settings`` has these beside its own."""

    twilio: TwilioSettings = TwilioSettings()
    signalwire: SignalWireSettings = SignalWireSettings()
    telnyx: TelnyxSettings = TelnyxSettings()
    plivo: PlivoSettings = PlivoSettings()
    exotel: ExotelSettings = ExotelSettings()
    vonage: VonageSettings = VonageSettings()
    bandwidth: BandwidthSettings = BandwidthSettings()
    jambonz: JambonzSettings = JambonzSettings()
    audiosocket: AudioSocketSettings = AudioSocketSettings()
    sip: SipSettings = SipSettings()
    webrtc: WebRtcSettings = WebRtcSettings()


def carrier_spec(name: str) -> CarrierSpec:
    for spec in CARRIERS:
        if spec.name == name:
            return spec
    raise LookupError(f"no carrier named {name!r}")


def simulated_names() -> tuple[str, ...]:
    """The carriers with a simulator (``simulate --provider``, ``loadtest --provider``), without importing one."""
    return tuple(spec.name for spec in CARRIERS if spec.simulator is not None)


def direct_names() -> tuple[str, ...]:
    """The carriers whose simulator can call a media websocket straight (``loadtest --ws-url``)."""
    return tuple(spec.name for spec in CARRIERS if spec.direct_protocol is not None)

