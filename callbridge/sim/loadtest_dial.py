"""A load test's placed calls (``callbridge loadtest --outbound``, #42): each call is a ``POST /calls`` to the bridge,
which dials the simulated carrier at its own pace; the carrier hands the answered call to the load test
(``SimulatedCarrier.on_answered``) instead of its own callee, and the load test runs it as any other."""

from __future__ import annotations

import asyncio
from typing import Final

from callbridge.outbound_http import http_client
from callbridge.sim.carrier import SimulatedCarrier

__all__ = ["DIAL_WAIT_S", "Dialling"]

DIAL_WAIT_S: Final = 60.0
"""How long a dialled call may take to be answered (its wait for the carrier's rate included)."""
_FROM: Final = "+15005550006"


class Dialling:
    """The load test's side of its placed calls on ``carrier`` (its bridge at ``carrier.bridge_url``)."""

    def __init__(self, carrier: SimulatedCarrier, token: str) -> None:
        self.carrier = carrier
        self.token = token
        self._answered: dict[str, asyncio.Future[str]] = {}
        """The number dialled → the carrier's call id, once the call is answered."""
        carrier.on_answered = self._on_answered

    async def dial(self, index: int) -> str:
        """Ask the bridge to call caller ``index``: the carrier's id for the call once it is answered. Raises
        ``RuntimeError`` with why not (refused, never answered, no answer from the bridge)."""
        number = f"+1500{index:07d}"
        answered = self._answered[number] = asyncio.get_running_loop().create_future()
        body = {"carrier": self.carrier.provider, "to": number, "from": _FROM}
        try:
            async with http_client(timeout=10.0) as http:
                response = await http.post(f"{self.carrier.bridge_url}/calls", json=body, headers={"Authorization": f"Bearer {self.token}"})
            if response.status_code != 202:
                raise RuntimeError(f"dial refused: HTTP {response.status_code} {response.text[:160]}")
            return await asyncio.wait_for(answered, DIAL_WAIT_S)
        except TimeoutError:
            raise RuntimeError(f"dialled, not answered in {DIAL_WAIT_S:g} s") from None
        finally:
            self._answered.pop(number, None)

    def _on_answered(self, number: str, call_id: str) -> None:
        answered = self._answered.get(number)
        if answered is not None and not answered.done():
            answered.set_result(call_id)
