"""The simulated SIP trunk as the called side (#42, ``carriers/sip/sim_callee.py``): the calls the bridge places through
``sip.outbound.trunk`` reach its user-agent server, which rings the callee the Request-URI names and answers, refuses
or rings out as a REST carrier's simulator does — so ``callbridge simulate --outbound --provider sip`` and the load
test's outbound calls run over SIP too. End to end over real UDP on loopback, the application hearing it all."""

from __future__ import annotations

import pytest

from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.carriers.sip.sim_wire import SdpAnswer, parse_sdp_offer
from callbridge.codecs import AudioEncoding
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from callbridge.sip.sdp import offer
from tests.bridge import agent_app
from tests.bridge.test_outbound_e2e import CALLEE, OURS, events_of, outbound_settings, post_call
from tests.bridge.twilio_e2e import engine, short_speech, until
from tests.sip.test_sipp_e2e import listener


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


@pytest.mark.parametrize(
    ("sip", "codec"), [({}, "PCMU"), ({"codecs": ["G722", "PCMU"], "media_encryption": "required"}, "G722")], ids=["pcmu", "g722-srtp"]
)
async def test_a_call_placed_through_the_trunk_reaches_a_person_who_hears_the_agent(sip: dict[str, object], codec: str) -> None:
    """100, 180, then 200 with the callee's answer (G.722 in ``RTP/SAVP`` where the bridge offers it with SRTP
    required), the bridge's ACK on the call's own socket; the person's hello reaches the engine and the agent is
    heard; the application hears the call go, outbound; no protocol warning either side."""
    recorder = engine()
    async with running_bridge(outbound_settings(sip=sip), recorder, provider="sip") as bridge:
        trunk = bridge.carrier
        assert isinstance(trunk, SimulatedSip)
        trunk.callees[CALLEE] = Callee(ring_ms=300, script=CallerScript(utterances=((500, short_speech(800)),), hangup_at_ms=4500))
        response = await post_call(bridge, {"carrier": "sip", "to": CALLEE, "from": OURS})
        assert response.status_code == 202, response.text
        dial_id = response.json()["dial_id"]
        await until(lambda: len(trunk.dialled) == 1)
        ((call_id, ringing),) = trunk.dialled.items()
        result = await ringing
        assert result is not None
        await until(lambda: "call.ended" in events_of(dial_id), timeout_s=5)
        sip_listener = listener(bridge)
        await until(lambda: len(sip_listener.finished) == 1)
        _, rtp_codec, transport = sip_listener.finished[0]
    assert [status for sid, status in trunk.status_reports if sid == call_id] == ["100 Trying", "180 Ringing", "200 OK"]
    assert not result.warnings and not trunk.callee.warnings, (result.warnings, trunk.callee.warnings)
    assert result.agent_runs_ms and result.hung_up_by == "caller", result.render()
    kinds = events_of(dial_id)
    assert kinds[:4] == ["call.dialing", "call.ringing", "call.started", "call.answered"] and kinds[-1] == "call.ended", kinds
    assert rtp_codec.choice.encoding.name == codec and (transport.srtp is not None) == bool(sip) and not sip_listener.dropped
    (session_id,) = recorder.opened
    assert recorder.commands[session_id], "the person's audio reached the engine"


@pytest.mark.parametrize(("outcome", "status", "reason"), [("busy", "486 Busy Here", "busy"), ("fails", "503 Service Unavailable", "failed")])
async def test_a_refusal_from_the_trunk_fails_the_call_with_its_reason(outcome: str, status: str, reason: str) -> None:
    recorder = engine()
    async with running_bridge(outbound_settings(), recorder, provider="sip") as bridge:
        trunk = bridge.carrier
        assert isinstance(trunk, SimulatedSip)
        trunk.callees[CALLEE] = Callee(outcome=outcome, ring_ms=200)  # type: ignore[arg-type]
        dial_id = (await post_call(bridge, {"carrier": "sip", "to": CALLEE, "from": OURS})).json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=5)
    assert [status for _, status in trunk.status_reports] == ["100 Trying", "180 Ringing", status]
    failed = next(event for _, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == reason and recorder.opened == [] and not trunk.callee.warnings, failed.data


@pytest.mark.long
async def test_a_call_that_rings_out_is_canceled_at_the_ring_timeout() -> None:
    """Nobody picks up: the bridge CANCELs at the shipped ring timeout (``outbound.ring_timeout_s``, 30 s); the trunk
    answers the CANCEL and ends the INVITE with 487; ``call.failed`` says no answer."""
    async with running_bridge(outbound_settings(), engine(), provider="sip") as bridge:
        trunk = bridge.carrier
        assert isinstance(trunk, SimulatedSip)
        trunk.callees[CALLEE] = Callee(outcome="no_answer")
        dial_id = (await post_call(bridge, {"carrier": "sip", "to": CALLEE, "from": OURS})).json()["dial_id"]
        await until(lambda: "call.failed" in events_of(dial_id), timeout_s=40)
    assert [status for _, status in trunk.status_reports] == ["100 Trying", "180 Ringing", "487 Request Terminated"]
    failed = next(event for _, event in agent_app.CallsOut.events if event.type == "call.failed")
    assert failed.data["reason"] == "no_answer" and not trunk.callee.warnings, failed.data


@pytest.mark.core
def test_the_callee_reads_the_bridges_offer_strictly() -> None:
    plain = offer(host="127.0.0.1", port=20000, session_id=1, version=1).encode()
    taken = parse_sdp_offer(plain, (0, 8, 9), b"k" * 30)
    assert taken == SdpAnswer("127.0.0.1", 20000, 0, 101)
    wideband = offer(host="127.0.0.1", port=20000, session_id=1, version=1, codecs=(AudioEncoding.G722, AudioEncoding.PCMU), srtp_key=b"b" * 30)
    answer = parse_sdp_offer(wideband.encode(), (0, 8, 9), b"k" * 30)
    assert isinstance(answer, SdpAnswer) and answer.payload_type == 9 and answer.srtp is not None
    assert (answer.srtp.remote_key, answer.srtp.local_key) == (b"b" * 30, b"k" * 30)
    assert parse_sdp_offer(plain, (111,), b"k" * 30) == "no codec of [111] offered ([0, 8, 9, 101])"
    assert "CRLF" in str(parse_sdp_offer(plain.replace(b"\r\n", b"\n"), (0,), b"k" * 30))
    savp_without_key = plain.replace(b"RTP/AVP", b"RTP/SAVP")
    assert parse_sdp_offer(savp_without_key, (0,), b"k" * 30) == "an RTP/SAVP offer with no crypto line we can take"
