"""Calls the agent places through jambonz (#42), end to end: ``POST /calls`` on the real server, the simulated
jambonz's REST create-call (checked as jambonz's API checks it: the API key, a phone target, the call hook, the
timeout), its signed call hook and call-status webhooks, the callee's media — and what the application hears."""

from __future__ import annotations

import time

import pytest

from callbridge.carriers.jambonz.sim import SimulatedJambonz
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge import agent_app
from tests.bridge.test_outbound_e2e import CALLEE, OURS, delete_call, events_of, outbound_settings, post_call
from tests.bridge.twilio_e2e import engine, short_speech, until


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


async def test_a_call_placed_through_jambonz_reaches_a_person() -> None:
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider="jambonz") as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedJambonz)
        carrier.callees[CALLEE] = Callee(ring_ms=300, script=CallerScript(utterances=((1500, short_speech(800)),), hangup_at_ms=4500))
        response = await post_call(bridge, {"carrier": "jambonz", "to": CALLEE, "from": OURS, "metadata": {"crm_id": 5}})
        assert response.status_code == 202, response.text
        dial_id = response.json()["dial_id"]
        await until(lambda: len(carrier.dialled) == 1)
        ((call_uuid, ringing),) = carrier.dialled.items()
        result = await ringing
        assert result is not None, carrier.status_reports
        await until(lambda: "call.ended" in events_of(dial_id), timeout_s=5)
        dialer = bridge.app.state.bridge.services.dialer
        await until(lambda: dialer.cancel(dial_id) == "not_found")  # its pacing slot freed
    kinds = events_of(dial_id)
    assert kinds[:2] == ["call.dialing", "call.ringing"] and "call.answered" in kinds and kinds[-1] == "call.ended", kinds
    assert "call.failed" not in kinds, kinds
    assert [status for uuid, status in carrier.status_reports if uuid == call_uuid] == ["trying", "ringing", "in-progress"]
    for call, event in agent_app.CallsOut.events:
        assert (call.dial_id, call.metadata, call.direction, call.call_id) == (dial_id, {"crm_id": 5}, "outbound", call_uuid), event.type
    (asked,) = agent_app.CallsOut.asked
    assert (asked.called_number, asked.caller_number) == (CALLEE, OURS)
    assert result.agent_runs_ms, result.render()  # the person heard the agent
    assert result.warnings == [], result.warnings


@pytest.mark.parametrize(("outcome", "cause", "reason"), [("busy", "busy", "busy"), ("fails", "failed 503", "failed"), ("no_answer", "no-answer", "no_answer")])
async def test_a_call_nobody_answers_fails_with_the_disconnect_cause(outcome: str, cause: str, reason: str) -> None:
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider="jambonz") as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedJambonz)
        carrier.callees[CALLEE] = Callee(outcome=outcome, ring_ms=200)  # type: ignore[arg-type]
        started = time.monotonic()
        response = await post_call(bridge, {"carrier": "jambonz", "to": CALLEE, "from": OURS, "ring_timeout_s": 5})
        dial_id = response.json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=10)
        failed_after_s = time.monotonic() - started
    assert events_of(dial_id) == ["call.dialing", "call.ringing", "call.failed"]
    failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == reason and failed.data["detail"].startswith(cause), failed.data
    if outcome == "no_answer":
        assert 5.0 <= failed_after_s < 7.0, failed_after_s  # jambonz's timeout: the request's ring timeout
    assert recorder.opened == [] and agent_app.CallsOut.asked == []


async def test_the_application_cancels_a_ringing_jambonz_call() -> None:
    async with running_bridge(outbound_settings(), engine(), provider="jambonz") as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedJambonz)
        carrier.callees[CALLEE] = Callee(outcome="no_answer")
        dial_id = (await post_call(bridge, {"carrier": "jambonz", "to": CALLEE, "from": OURS, "ring_timeout_s": 60})).json()["dial_id"]
        await until(lambda: "call.ringing" in events_of(dial_id))
        asked_at = time.monotonic()
        canceling = await delete_call(bridge, dial_id)
        assert (canceling.status_code, canceling.json()["status"]) == (202, "canceling")
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=5)
        assert time.monotonic() - asked_at < 2.0
    failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == "canceled"


async def test_jambonz_refuses_a_dial_it_cannot_place() -> None:
    """The REST API says no (the API key is not the account's): ``call.failed`` ``failed`` with jambonz's word."""
    async with running_bridge(outbound_settings(), engine(), provider="jambonz") as bridge:
        assert isinstance(bridge.carrier, SimulatedJambonz)
        bridge.carrier.secret = "not-what-the-bridge-has"
        dial_id = (await post_call(bridge, {"carrier": "jambonz", "to": CALLEE, "from": OURS})).json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id))
    failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == "failed" and "401" in failed.data["detail"], failed.data
