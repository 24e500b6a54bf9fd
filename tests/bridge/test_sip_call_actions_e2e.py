"""The agent acts on a SIP call end to end, as the simulated trunk sees it: a bridge with its SIP listener, the
simulated trunk (``callbridge.carriers.sip.sim``) over loopback UDP, and the embedded engine's ``actions`` agent, which
calls the telephony tools when the caller presses keys (``0``: send DTMF 123, ``*``: transfer, ``#``: hang up)."""

from __future__ import annotations

import json
from typing import Any

from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.engine.commands import CloseSession, FunctionCallOutput
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, settings

TARGET = "+15550100"


def actions_settings() -> Any:
    return settings(call_actions={"enabled": True, "transfer_targets": [TARGET]})


async def test_the_agents_digits_reach_the_trunk_as_rfc_4733_events() -> None:
    recorder = engine("actions")
    async with running_bridge(actions_settings(), recorder, provider="sip") as bridge:
        sim = bridge.carrier
        assert isinstance(sim, SimulatedSip)
        result = await sim.place_call(CallerScript(dtmf=((300, "0"),), hangup_at_ms=2500))
    stream = sim.streams[result.call_sid]
    assert stream.agent_digits == ["1", "2", "3"], result.render()
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()  # the media clock checks held
    assert [json.loads(o.output) for o in recorder.of(FunctionCallOutput)] == [{"ok": True}]


async def test_the_agent_transfers_a_sip_call_with_refer() -> None:
    recorder = engine("actions")
    async with running_bridge(actions_settings(), recorder, provider="sip") as bridge:
        sim = bridge.carrier
        assert isinstance(sim, SimulatedSip)
        result = await sim.place_call(CallerScript(dtmf=((300, "*"),), hangup_at_ms=5000))
    stream = sim.streams[result.call_sid]
    assert len(stream.transfers) == 1 and stream.transfers[0].startswith(f"sip:{TARGET}@"), stream.transfers
    assert ("NOTIFY", 200) in stream.responses  # the bridge answered both NOTIFYs of the implicit subscription
    assert [json.loads(o.output)["ok"] for o in recorder.of(FunctionCallOutput)] == [True]
    assert recorder.of(CloseSession) == [CloseSession("transferred")]
    assert result.warnings == [] and result.hung_up_by == "bridge", result.render()  # our BYE after the transfer


async def test_a_transfer_the_target_refuses_leaves_the_call_up() -> None:
    recorder = engine("actions")
    async with running_bridge(actions_settings(), recorder, provider="sip") as bridge:
        sim = SimulatedSip(bridge.base_url, bridge.carrier.secret, transfer_status=486)
        sim.configure(bridge.settings)
        result = await sim.place_call(CallerScript(dtmf=((300, "*"),), hangup_at_ms=3000))
    stream = sim.streams[result.call_sid]
    assert len(stream.transfers) == 1
    assert [json.loads(o.output) for o in recorder.of(FunctionCallOutput)] == [{"error": "transfer_failed", "detail": "486 Busy Here"}]
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
