"""Every carrier's simulator, found through the carrier registry (``CarrierSpec.simulator``): what ``simulate``,
``loadtest`` and the tests place calls with. Apart from ``sim/carrier.py``, which every carrier's ``sim.py`` builds
on, so that no carrier's simulator reaches the registry (and through it every other carrier).
"""

from __future__ import annotations

from callbridge.carriers import CARRIERS
from callbridge.carriers.spec import CarrierSpec
from callbridge.sim.carrier import SimulatedCarrier

__all__ = ["simulated", "simulator_class"]


def simulator_class(spec: CarrierSpec) -> type[SimulatedCarrier]:
    """The ``SimulatedCarrier`` ``spec`` names (``CarrierSpec.simulator``), imported now."""
    if spec.simulator is None:
        raise LookupError(f"{spec.name} has no simulator")
    simulated: type[SimulatedCarrier] = spec.load(spec.simulator)
    return simulated


def simulated() -> dict[str, type[SimulatedCarrier]]:
    """Every simulated carrier, by its carrier's name."""
    return {spec.name: simulator_class(spec) for spec in CARRIERS if spec.simulator is not None}
