"""Every carrier callbridge speaks, each in a package of its own: ``wire.py`` (the sans-I/O codec), ``http.py`` or
``listener.py`` (answer documents, signatures, REST calls, reconnect), ``sim.py`` (its simulator), and its
``CarrierSpec`` in ``__init__.py``. ``CARRIERS`` below is the one list: the app mounts it, the generic ``/media``
URL detects among it, the CLI offers it, the load tester and the simulators read it. Adding a carrier is one
package and one line here.

Shared by them: ``base.py`` (typed carrier events and actions, ``RemoteProtocolError``, ``CarrierProfile``) and
``json_wire.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

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
)
from callbridge.carriers.spec import CarrierSpec

if TYPE_CHECKING:
    from callbridge.sim.carrier import SimulatedCarrier

__all__ = ["CARRIERS", "carrier_spec", "simulated", "simulated_names"]

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
    generic.SPEC,
)
"""In the order their routes are mounted (the generic ``/media`` last)."""


def carrier_spec(name: str) -> CarrierSpec:
    for spec in CARRIERS:
        if spec.name == name:
            return spec
    raise LookupError(f"no carrier named {name!r}")


def simulated_names() -> tuple[str, ...]:
    """The carriers with a simulator (``simulate --provider``, ``loadtest --provider``), without importing one."""
    return tuple(spec.name for spec in CARRIERS if spec.simulator is not None)


def simulated() -> dict[str, type[SimulatedCarrier]]:
    """Every simulated carrier, by its carrier's name."""
    return {spec.name: spec.simulator_class() for spec in CARRIERS if spec.simulator is not None}
