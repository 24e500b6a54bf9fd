"""The agent acts on a Twilio call end to end: a bridge on uvicorn, a simulated Twilio over loopback sockets,
and the embedded engine's ``actions`` agent, which calls the telephony tools when the caller presses keys."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.engine.commands import CloseSession, FunctionCallOutput
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, settings

TARGET = "+15550100"


def actions_settings() -> object:
    return settings(call_actions={"enabled": True, "transfer_targets": [TARGET, "sip:desk@pbx.example.com"]})


async def test_the_agent_transfers_a_twilio_call_with_dial() -> None:
    recorder = engine("actions")
    async with running_bridge(actions_settings(), recorder) as bridge:  # type: ignore[arg-type]
        sim = bridge.carrier
        assert isinstance(sim, SimulatedTwilio)
        result = await sim.place_call(CallerScript(dtmf=((400, "*"),), hangup_at_ms=5000))
    assert [call_id for call_id, _ in sim.call_updates] == [result.call_sid]
    dial = ET.fromstring(sim.call_updates[0][1]).find("Dial")
    assert dial is not None and dial.text == TARGET  # the first allowed target, never another number
    assert [json.loads(o.output) for o in recorder.of(FunctionCallOutput)] == [{"ok": True}]
    assert recorder.of(CloseSession) == [CloseSession("transferred")]
    assert result.hung_up_by == "bridge"  # the stream ended with the TwiML update, before the caller's hang-up
    metrics = bridge.app.state.bridge.registry
    assert metrics.get_sample_value("callbridge_call_actions_total", {"provider": "twilio", "action": "TransferCall", "result": "ok"}) == 1
    assert metrics.get_sample_value("callbridge_hangups_total", {"provider": "twilio", "result": "ok"}) is None  # not hung up


async def test_the_agent_hangs_up_a_twilio_call_and_dtmf_is_refused() -> None:
    recorder = engine("actions")
    async with running_bridge(actions_settings(), recorder) as bridge:  # type: ignore[arg-type]
        result = await bridge.carrier.place_call(CallerScript(dtmf=((300, "0"), (700, "#")), hangup_at_ms=6000))
    outputs = [json.loads(o.output) for o in recorder.of(FunctionCallOutput)]
    assert outputs[0]["error"] == "unsupported"  # send_dtmf: Twilio has no in-stream DTMF
    assert outputs[1] == {"ok": True}  # end_call
    assert recorder.of(CloseSession) == [CloseSession("agent_hung_up")]
    assert result.hung_up_by == "bridge"  # REST Status=completed
    assert bridge.carrier.call_updates == []  # type: ignore[attr-defined]


async def test_with_actions_disabled_no_tools_are_declared() -> None:
    recorder = engine("actions")
    async with running_bridge(settings(), recorder) as bridge:
        result = await bridge.carrier.place_call(CallerScript(dtmf=((300, "#"),), hangup_at_ms=1200))
    assert recorder.of(FunctionCallOutput) == [] and result.hung_up_by == "caller"
