"""The agent's transfer and DTMF are offered by what each carrier's spec says it can do (``Capabilities``), not by
which REST clients happen to have a ``perform``: a carrier whose spec says no gets ``unsupported`` without its
client being asked."""

from __future__ import annotations

import pytest

from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf, TransferCall
from callbridge.carriers import CARRIERS
from callbridge.carriers.spec import CarrierSpec
from tests.bridge.test_unknown_event_count import services

pytestmark = pytest.mark.core


class Performer:
    def __init__(self) -> None:
        self.asked: list[CarrierCallAction] = []

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        self.asked.append(action)
        return ActionResult.done()


@pytest.mark.parametrize("spec", CARRIERS, ids=lambda spec: spec.name)
async def test_each_carrier_performs_only_what_its_spec_says(spec: CarrierSpec) -> None:
    bridge, _ = services()
    bridge.carrier_capabilities = {s.name: s.capabilities for s in CARRIERS}
    performer = Performer()
    bridge.action_performers[spec.name] = performer
    dtmf = await bridge.perform_action(spec.name, "call-1", None, SendDtmf("12"))
    transfer = await bridge.perform_action(spec.name, "call-1", None, TransferCall("+15550100"))
    assert dtmf.ok is spec.capabilities.dtmf_out and transfer.ok is spec.capabilities.transfer
    assert (dtmf.error == "unsupported") is not spec.capabilities.dtmf_out
    assert len(performer.asked) == spec.capabilities.dtmf_out + spec.capabilities.transfer


async def test_a_carrier_with_no_performer_or_unknown_is_unsupported() -> None:
    bridge, _ = services()
    bridge.carrier_capabilities = {s.name: s.capabilities for s in CARRIERS}
    assert (await bridge.perform_action("plivo", "c", None, TransferCall("+15550100"))).error == "unsupported"
    bridge.action_performers["nobody"] = Performer()
    assert (await bridge.perform_action("nobody", "c", None, SendDtmf("1"))).error == "unsupported"
