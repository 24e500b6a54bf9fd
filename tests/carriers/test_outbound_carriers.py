"""Calls the agent places through Bandwidth, Plivo, Vonage, Telnyx and jambonz (#42), end to end: ``POST /calls`` on
the real server, each simulated carrier's own dial API (checked as the carrier's API checks it: its authentication,
numbers as it writes them, callback URLs, ring timeout), its signed progress webhooks, the callee's media — and what
the application hears. Twilio and SignalWire are ``tests/bridge/test_outbound_e2e.py``'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from callbridge.carriers.bandwidth.sim import SimulatedBandwidth
from callbridge.carriers.jambonz.sim import SimulatedJambonz
from callbridge.carriers.plivo.sim import SimulatedPlivo
from callbridge.carriers.telnyx.sim import SimulatedTelnyx
from callbridge.carriers.vonage.sim import SimulatedVonage
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import CallerScript, SimulatedCarrier
from callbridge.sim.runner import running_bridge
from tests.bridge import agent_app
from tests.bridge.test_outbound_e2e import CALLEE, OURS, delete_call, events_of, outbound_settings, post_call
from tests.bridge.twilio_e2e import engine, short_speech, until


@dataclass(frozen=True)
class Dialling:
    """What one carrier says of the calls it places, in its own words."""

    provider: str
    rings: bool
    """It reports ringing (``call.ringing``)."""
    answered_reports: tuple[str, ...]
    """Its progress reports of an answered call, up to the answer (``SimulatedCarrier.status_reports``)."""
    causes: dict[str, str]
    """A ``Callee`` outcome → how the ``call.failed`` detail begins (the carrier's word for it)."""
    breaks: Callable[[SimulatedCarrier], None]
    """Makes the carrier refuse the bridge's dial request."""
    refused: tuple[str, ...]
    """What the refusal's detail holds."""
    keeps_call_id: bool = True
    """The call's id once answered is the one the dial API gave (Plivo's dial gives a request id instead)."""


def _set(attribute: str) -> Callable[[SimulatedCarrier], None]:
    return lambda carrier: setattr(carrier, attribute, "not-what-the-bridge-has")


CARRIERS = [
    Dialling("bandwidth", False, ("answer",), {"busy": "busy", "fails": "error", "no_answer": "timeout"}, _set("application_id"), ("400", "validation")),
    Dialling("plivo", True, ("ringing",), {"busy": "busy", "fails": "failed", "no_answer": "no-answer"}, _set("auth_token"), ("401",), keeps_call_id=False),
    Dialling("vonage", True, ("started", "ringing", "answered"), {"busy": "busy", "fails": "failed", "no_answer": "timeout"}, _set("application_id"), ("401",)),
    Dialling("telnyx", False, ("answered",), {"busy": "user_busy", "fails": "unspecified", "no_answer": "timeout"}, _set("connection_id"), ("422", "connection_id")),
    Dialling("jambonz", True, ("trying", "ringing", "in-progress"), {"busy": "busy", "fails": "failed 503", "no_answer": "no-answer"}, _set("secret"), ("401",)),
]  # fmt: skip
SIMULATORS = {"bandwidth": SimulatedBandwidth, "plivo": SimulatedPlivo, "vonage": SimulatedVonage, "telnyx": SimulatedTelnyx, "jambonz": SimulatedJambonz}
REASONS = {"busy": "busy", "fails": "failed", "no_answer": "no_answer"}


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


def failure() -> dict[str, str]:
    return next(event.data for call, event in agent_app.CallsOut.events if event.type == "call.failed")


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda c: c.provider)
async def test_a_placed_call_reaches_a_person(carrier: Dialling) -> None:
    """Answered after 300 ms of ringing: the application hears dialing (ringing, where the carrier says so), the
    answer and the end, each with the dial id and metadata; the person hears the agent; the pacing slot is freed."""
    async with running_bridge(outbound_settings(), engine(), provider=carrier.provider) as bridge:
        sim = bridge.carrier
        assert isinstance(sim, SIMULATORS[carrier.provider])
        sim.callees[CALLEE] = Callee(ring_ms=300, script=CallerScript(utterances=((1500, short_speech(800)),), hangup_at_ms=4500))
        response = await post_call(bridge, {"carrier": carrier.provider, "to": CALLEE, "from": OURS, "metadata": {"crm_id": 5}})
        assert response.status_code == 202, response.text
        dial_id = response.json()["dial_id"]
        await until(lambda: len(sim.dialled) == 1)
        ((dialled_as, ringing),) = sim.dialled.items()
        result = await ringing
        assert result is not None, sim.status_reports
        await until(lambda: "call.ended" in events_of(dial_id), timeout_s=5)
        dialer = bridge.app.state.bridge.services.dialer
        await until(lambda: dialer.cancel(dial_id) == "not_found")  # its pacing slot freed
    kinds = events_of(dial_id)
    assert kinds[0] == "call.dialing" and ("call.ringing" in kinds) == carrier.rings, kinds
    assert "call.answered" in kinds and kinds[-1] == "call.ended" and "call.failed" not in kinds, kinds
    assert tuple(status for call, status in sim.status_reports if call == dialled_as) == carrier.answered_reports
    answered_ids = {call.call_id for call, event in agent_app.CallsOut.events if event.type not in ("call.dialing", "call.ringing")}
    assert len(answered_ids) == 1 and (dialled_as in answered_ids) == carrier.keeps_call_id, answered_ids
    for call, event in agent_app.CallsOut.events:
        assert (call.dial_id, call.metadata, call.direction) == (dial_id, {"crm_id": 5}, "outbound"), event.type
    (asked,) = agent_app.CallsOut.asked
    assert (asked.called_number, asked.caller_number) == (CALLEE, OURS)
    assert result.agent_runs_ms, result.render()  # the person heard the agent
    assert result.warnings == [], result.warnings


@pytest.mark.parametrize("outcome", ["busy", "fails", "no_answer"])
@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda c: c.provider)
async def test_a_call_nobody_answers_fails_with_the_carriers_reason(carrier: Dialling, outcome: str) -> None:
    """Busy, failed, or ringing out at the request's ring timeout (5 s): ``call.failed`` with the reason and the
    carrier's word for it; no engine session, the application never asked."""
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider=carrier.provider) as bridge:
        bridge.carrier.callees[CALLEE] = Callee(outcome=outcome, ring_ms=200)  # type: ignore[arg-type]
        started = time.monotonic()
        response = await post_call(bridge, {"carrier": carrier.provider, "to": CALLEE, "from": OURS, "ring_timeout_s": 5})
        dial_id = response.json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=10)
        failed_after_s = time.monotonic() - started
    assert events_of(dial_id) == ["call.dialing", *(["call.ringing"] if carrier.rings else []), "call.failed"]
    failed = failure()
    assert failed["reason"] == REASONS[outcome] and failed["detail"].startswith(carrier.causes[outcome]), failed
    if outcome == "no_answer":
        assert 5.0 <= failed_after_s < 7.0, failed_after_s  # the carrier's own ring timeout: the request's
    assert recorder.opened == [] and agent_app.CallsOut.asked == []


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda c: c.provider)
async def test_the_application_cancels_a_ringing_call(carrier: Dialling) -> None:
    async with running_bridge(outbound_settings(), engine(), provider=carrier.provider) as bridge:
        bridge.carrier.callees[CALLEE] = Callee(outcome="no_answer")
        dial_id = (await post_call(bridge, {"carrier": carrier.provider, "to": CALLEE, "from": OURS, "ring_timeout_s": 60})).json()["dial_id"]
        await until(lambda: ("call.ringing" if carrier.rings else "call.dialing") in events_of(dial_id))
        asked_at = time.monotonic()
        canceling = await delete_call(bridge, dial_id)
        assert (canceling.status_code, canceling.json()["status"]) == (202, "canceling")
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=5)
        assert time.monotonic() - asked_at < 2.0  # not its 60 s ring timeout
    assert failure()["reason"] == "canceled"


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda c: c.provider)
async def test_a_dial_the_carrier_refuses_fails_the_call_with_its_word(carrier: Dialling) -> None:
    async with running_bridge(outbound_settings(), engine(), provider=carrier.provider) as bridge:
        carrier.breaks(bridge.carrier)
        dial_id = (await post_call(bridge, {"carrier": carrier.provider, "to": CALLEE, "from": OURS})).json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id))
    failed = failure()
    assert failed["reason"] == "failed" and all(word in failed["detail"] for word in carrier.refused), failed
