"""Calls the agent places through the SIP trunk (#42), end to end against real SIPp (Debian ``sip-tester``) as the
called party on loopback: ``POST /calls`` with ``carrier: sip`` on the real server, our INVITE, the callee's answer
(``scenarios/callee_*.xml``), its media and its BYE — or its refusal, its ringing until our CANCEL, its digest
challenge — and what the application hears of each."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from callbridge.carriers.sip.listener import SipListener
from callbridge.engine.commands import AckPlayback
from callbridge.sim.ports import RTP_PORTS, free_port
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge import agent_app
from tests.bridge.test_outbound_e2e import TOKEN, delete_call, post_call
from tests.bridge.twilio_e2e import caller_audio_ms, engine, settings, until

pytestmark = pytest.mark.skipif(shutil.which("sipp") is None, reason="SIPp (Debian package sip-tester) is not installed")

SCENARIOS = Path(__file__).parent / "scenarios"
PCAPS = Path("/usr/share/sip-tester")
CALLEE = "+15005550123"
OURS = "+15005550006"


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.CallsOut.asked.clear()
    agent_app.CallsOut.events.clear()


def dial_settings(callee_port: int, **outbound: Any) -> Any:
    sip = {"enabled": True, "port": free_port(), **RTP_PORTS, "outbound": {"trunk": f"sip:127.0.0.1:{callee_port}", **outbound}}
    return settings(sip=sip, app={"module": "tests.bridge.agent_app:CallsOut"}, outbound={"api_token": TOKEN})


def listener(bridge: RunningBridge) -> SipListener:
    found = bridge.app.state.bridge.services.carrier_state["sip"]
    assert isinstance(found, SipListener)
    return found


class Callee:
    """SIPp as the called party: a UAS scenario on its own port, one call, then it exits (0: the scenario ran
    whole)."""

    def __init__(self, scenario: str, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        if not (workdir / "pcap").exists():
            (workdir / "pcap").symlink_to(PCAPS)
        self.args = [
            "-sf", str(workdir / scenario if (workdir / scenario).exists() else SCENARIOS / scenario), "-i", "127.0.0.1", "-p", str(self.port), "-mp", str(free_port()), "-m", "1",
            "-nostdin", "-timeout", "60s", "-timeout_error", "-trace_err", *extra,
        ]  # fmt: skip
        self.workdir = workdir
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Callee:
        self.proc = await asyncio.create_subprocess_exec(
            "sipp", *self.args, cwd=self.workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        await asyncio.sleep(0.3)  # its socket bound before the INVITE comes
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def done(self, timeout_s: float = 30) -> tuple[int, str]:
        assert self.proc is not None
        out, _ = await asyncio.wait_for(self.proc.communicate(), timeout_s)
        errors = "".join(p.read_text(errors="replace") for p in self.workdir.glob("*_errors.log"))
        return self.proc.returncode or 0, out.decode(errors="replace")[-2000:] + errors[-3000:]


def events_of(dial_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(event.type, event.data) for call, event in agent_app.CallsOut.events if call.dial_id == dial_id]


async def place(bridge: RunningBridge, **request: Any) -> str:
    response = await post_call(bridge, {"carrier": "sip", "to": CALLEE, "from": OURS, **request})
    assert response.status_code == 202, response.text
    dial_id: str = response.json()["dial_id"]
    return dial_id


async def test_a_placed_call_reaches_the_callee_talks_and_ends_with_its_bye(tmp_path: Path) -> None:
    """The callee rings, answers with PCMA, talks for 7 s and hangs up: the application is asked for the assistant
    (direction outbound), hears dialing, ringing, answered and ended with the dial id and metadata; the callee's
    speech reaches the engine and the agent's reply is sent to it."""
    recorder = engine()
    async with Callee("callee_answers.xml", tmp_path) as callee, running_bridge(dial_settings(callee.port), recorder, provider="twilio") as bridge:
        dial_id = await place(bridge, metadata={"crm_id": 7})
        rc, output = await callee.done()
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        await until(lambda: "call.ended" in [kind for kind, _ in events_of(dial_id)])
        _call_id, codec, transport = sip.finished[0]
    assert rc == 0, output
    kinds = [kind for kind, _ in events_of(dial_id)]
    assert kinds[:2] == ["call.dialing", "call.ringing"] and "call.answered" in kinds and kinds[-1] == "call.ended", kinds
    (asked,) = agent_app.CallsOut.asked
    assert asked.direction == "outbound" and asked.dial_id == dial_id and asked.metadata == {"crm_id": 7}
    assert asked.called_number == CALLEE and asked.caller_number == OURS
    assert codec.choice.encoding.value == "pcma" and codec.choice.dtmf_payload_type == 101
    (session_id,) = recorder.opened
    assert 6500 <= caller_audio_ms(recorder.commands[session_id]) <= 7500  # g711a.pcap: 7 s of the callee's speech
    played = [c.played_ms for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert played and max(played) > 0  # the agent's audio was sent, and what of it was heard reported
    assert transport.send_errors == 0 and codec.jitter.late == 0 and codec.malformed == 0
    for call, event in agent_app.CallsOut.events:  # every event names the placed call
        assert (call.dial_id, call.metadata, call.direction) == (dial_id, {"crm_id": 7}, "outbound"), event.type
    assert asked.ring_ms is not None and asked.ring_ms >= 250  # it rang 300 ms (a lower bound: load only lengthens it)
    ((_, ended),) = [(kind, data) for kind, data in events_of(dial_id) if kind == "call.ended"]
    media = ended["report"]["media"]  # the line, as the report gives it the application (#43); the pcap: 7 s, 30 ms a packet
    assert (media["codec"], media["encryption"], media["packets_lost"], media["loss_percent"]) == ("PCMA", "none", 0, 0.0), media
    assert 220 <= media["packets_expected"] <= 250 and media["jitter_ms"] < 20 and media["mos"] >= 4.2, media


@pytest.mark.parametrize(("status", "reason"), [(486, "busy"), (600, "busy"), (603, "declined"), (480, "no_answer"), (404, "failed")])
async def test_a_refusal_is_call_failed_with_its_reason(tmp_path: Path, status: int, reason: str) -> None:
    """The callee's final refusal ends the dial when it comes (its ``detail`` is the response's, not a timer's:
    ``until``'s wait is far under Timer B's 32 s and the ring timeout's 60 s), and is ACKed."""
    (tmp_path / "refusal.xml").write_text((SCENARIOS / "callee_busy.xml").read_text().replace("[status]", str(status)))
    async with Callee("refusal.xml", tmp_path) as callee, running_bridge(
        dial_settings(callee.port), engine(), provider="twilio"
    ) as bridge:
        dial_id = await place(bridge)
        await until(lambda: "call.failed" in [kind for kind, _ in events_of(dial_id)])
        rc, output = await callee.done()
        services = bridge.app.state.bridge.services
        assert not services.admission.bridged  # the slot held while it rang is given back
    assert rc == 0, output  # the refusal was ACKed
    (failed,) = [data for kind, data in events_of(dial_id) if kind == "call.failed"]
    assert failed["reason"] == reason and failed["detail"].startswith(f"SIP {status}")


async def test_the_ring_timeout_cancels_the_call(tmp_path: Path) -> None:
    async with Callee("callee_rings.xml", tmp_path) as callee, running_bridge(dial_settings(callee.port), engine(), provider="twilio") as bridge:
        started = time.monotonic()
        dial_id = await place(bridge, ring_timeout_s=5)
        rc, output = await callee.done()
        await until(lambda: "call.failed" in [kind for kind, _ in events_of(dial_id)])
        elapsed_s = time.monotonic() - started
    assert rc == 0, output  # the CANCEL came, its 200 and the 487 were sent, the 487 ACKed
    kinds = [kind for kind, _ in events_of(dial_id)]
    assert kinds == ["call.dialing", "call.ringing", "call.failed"], kinds
    assert events_of(dial_id)[-1][1]["reason"] == "no_answer"
    assert 5.0 <= elapsed_s < 30.0, elapsed_s  # at the ring timeout (a lower bound: load only delays it), not SIPp's 60 s


async def test_the_application_cancels_a_ringing_call(tmp_path: Path) -> None:
    async with Callee("callee_rings.xml", tmp_path) as callee, running_bridge(dial_settings(callee.port), engine(), provider="twilio") as bridge:
        dial_id = await place(bridge)
        await until(lambda: "call.ringing" in [kind for kind, _ in events_of(dial_id)])
        response = await delete_call(bridge, dial_id)
        assert response.status_code == 202, response.text
        rc, output = await callee.done()
        await until(lambda: "call.failed" in [kind for kind, _ in events_of(dial_id)])
    assert rc == 0, output
    assert events_of(dial_id)[-1][1]["reason"] == "canceled"


async def test_the_trunk_challenges_and_the_credentials_are_taken(tmp_path: Path) -> None:
    async with Callee("callee_challenges.xml", tmp_path) as callee, running_bridge(
        dial_settings(callee.port, username="trunkuser", password="s3cret"), engine(), provider="twilio"
    ) as bridge:
        dial_id = await place(bridge)
        rc, output = await callee.done()
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
    assert rc == 0, output
    assert "call.answered" in [kind for kind, _ in events_of(dial_id)]


async def test_wrong_credentials_fail_the_call(tmp_path: Path) -> None:
    async with Callee("callee_challenges.xml", tmp_path) as callee, running_bridge(
        dial_settings(callee.port, username="trunkuser", password="wrong"), engine(), provider="twilio"
    ) as bridge:
        dial_id = await place(bridge)
        await until(lambda: "call.failed" in [kind for kind, _ in events_of(dial_id)])
    (failed,) = [data for kind, data in events_of(dial_id) if kind == "call.failed"]
    assert failed["reason"] == "failed" and failed["detail"].startswith("SIP 403"), failed


async def test_without_a_trunk_the_sip_listener_refuses_to_dial() -> None:
    sip = {"enabled": True, "port": free_port(), **RTP_PORTS}
    async with running_bridge(settings(sip=sip, outbound={"api_token": TOKEN}), engine(), provider="twilio") as bridge:
        response = await post_call(bridge, {"carrier": "sip", "to": CALLEE, "from": OURS})
    assert response.status_code == 400 and response.json()["error"] == "carrier_not_configured", response.text
