"""Calls the agent places through Telnyx (#42), end to end: ``POST /calls`` on the real server, the simulated
Telnyx's dial command (checked as Call Control checks it: the API key, the connection, E.164 numbers, the timeout,
the webhook URL), its signed webhooks carrying the dial's ``client_state``, the stream the bridge starts on
``call.answered`` (``streaming_start``), the callee's media — and what the application hears."""

from __future__ import annotations

import time

import pytest

from callbridge.carriers.telnyx.sim import SimulatedTelnyx
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


async def test_a_call_placed_through_telnyx_reaches_a_person() -> None:
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider="telnyx") as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTelnyx)
        carrier.callees[CALLEE] = Callee(ring_ms=300, script=CallerScript(utterances=((1500, short_speech(800)),), hangup_at_ms=4500))
        response = await post_call(bridge, {"carrier": "telnyx", "to": CALLEE, "from": OURS, "metadata": {"crm_id": 5}})
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
    assert kinds[0] == "call.dialing" and "call.answered" in kinds and kinds[-1] == "call.ended", kinds
    assert "call.failed" not in kinds and "call.ringing" not in kinds, kinds  # Call Control says nothing while it rings
    assert [action for call, action, _ in carrier.commands if call == call_uuid][0] == "streaming_start"
    for call, event in agent_app.CallsOut.events:
        assert (call.dial_id, call.metadata, call.direction, call.call_id) == (dial_id, {"crm_id": 5}, "outbound", call_uuid), event.type
    (asked,) = agent_app.CallsOut.asked
    assert (asked.called_number, asked.caller_number) == (CALLEE, OURS)
    assert result.agent_runs_ms, result.render()  # the person heard the agent
    assert result.warnings == [], result.warnings


@pytest.mark.parametrize(("outcome", "cause", "reason"), [("busy", "user_busy", "busy"), ("fails", "unspecified", "failed"), ("no_answer", "timeout", "no_answer")])
async def test_a_call_nobody_answers_fails_with_the_disconnect_cause(outcome: str, cause: str, reason: str) -> None:
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider="telnyx") as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTelnyx)
        carrier.callees[CALLEE] = Callee(outcome=outcome, ring_ms=200)  # type: ignore[arg-type]
        started = time.monotonic()
        response = await post_call(bridge, {"carrier": "telnyx", "to": CALLEE, "from": OURS, "ring_timeout_s": 5})
        dial_id = response.json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=10)
        failed_after_s = time.monotonic() - started
    assert events_of(dial_id) == ["call.dialing", "call.failed"]
    failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == reason and failed.data["detail"].startswith(cause), failed.data
    if outcome == "no_answer":
        assert 5.0 <= failed_after_s < 7.0, failed_after_s  # Telnyx's timeout_secs: the request's ring timeout
    assert recorder.opened == [] and agent_app.CallsOut.asked == []


async def test_the_application_cancels_a_ringing_telnyx_call() -> None:
    async with running_bridge(outbound_settings(), engine(), provider="telnyx") as bridge:
        carrier = bridge.carrier
        assert isinstance(carrier, SimulatedTelnyx)
        carrier.callees[CALLEE] = Callee(outcome="no_answer")
        dial_id = (await post_call(bridge, {"carrier": "telnyx", "to": CALLEE, "from": OURS, "ring_timeout_s": 60})).json()["dial_id"]
        await until(lambda: "call.dialing" in events_of(dial_id))
        asked_at = time.monotonic()
        canceling = await delete_call(bridge, dial_id)
        assert (canceling.status_code, canceling.json()["status"]) == (202, "canceling")
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=5)
        assert time.monotonic() - asked_at < 2.0
    failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == "canceled"


async def test_telnyx_refuses_a_dial_it_cannot_place() -> None:
    """Call Control says no (the connection is not the account's): ``call.failed`` ``failed`` with Telnyx's error."""
    async with running_bridge(outbound_settings(), engine(), provider="telnyx") as bridge:
        assert isinstance(bridge.carrier, SimulatedTelnyx)
        bridge.carrier.connection_id = "another-connection"
        dial_id = (await post_call(bridge, {"carrier": "telnyx", "to": CALLEE, "from": OURS})).json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id))
    failed = next(event for call, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == "failed" and "422" in failed.data["detail"] and "connection_id" in failed.data["detail"], failed.data
