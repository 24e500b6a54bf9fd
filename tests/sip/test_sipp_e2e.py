"""SIP trunk ingress end to end against real SIPp (Debian ``sip-tester``) on loopback: a bridge on uvicorn with its
SIP listener, the embedded engine, real UDP sockets. Scenarios: SIPp's built-in ``uac`` and ``uac_pcap`` (PCMA,
30 ms packets, an RFC 4733 digit), and ours in ``scenarios/`` (CANCEL, OPTIONS, hold/resume, BYE from us)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from callbridge.carriers.sip.listener import SipListener
from callbridge.config import CallActionsSettings
from callbridge.engine.commands import (
    AckPlayback,
    AppendAudio,
    CloseSession,
    CreateTextItem,
    FunctionCallOutput,
)
from callbridge.sim.ports import RTP_PORTS, free_port
from callbridge.sim.runner import RunningBridge, running_bridge
from callbridge.sip.message import SipResponse, parse_message
from callbridge.sip.rtp import build_rtp
from tests.bridge.twilio_e2e import caller_audio_ms, engine, settings, until

pytestmark = pytest.mark.skipif(shutil.which("sipp") is None, reason="SIPp (Debian package sip-tester) is not installed")

SCENARIOS = Path(__file__).parent / "scenarios"
PCAPS = Path("/usr/share/sip-tester")
CONCURRENT = 50


def sip_settings(**sip: Any) -> Any:
    # RTP ports below Linux's ephemeral range (32768+), where free_port() picks SIPp's ports: no collision
    base = {"enabled": True, "port": free_port(), **RTP_PORTS}
    base.update(sip)
    return settings(sip=base, server={"max_calls": 50})


def listener(bridge: RunningBridge) -> SipListener:
    found = bridge.app.state.bridge.services.carrier_state["sip"]
    assert isinstance(found, SipListener)
    return found


async def sipp(bridge: RunningBridge, scenario: str, workdir: Path, *extra: str, timeout_s: float = 60) -> tuple[int, str]:
    """Run SIPp against the bridge's SIP port; its exit status (0: every call succeeded) and output."""
    if not (workdir / "pcap").exists():
        (workdir / "pcap").symlink_to(PCAPS)
    chosen = ["-sf", str(SCENARIOS / scenario)] if scenario.endswith(".xml") else ["-sn", scenario]
    args = [
        f"127.0.0.1:{bridge.settings.sip.port}", *chosen, "-i", "127.0.0.1", "-p", str(free_port()), "-mp", str(free_port()),
        "-nostdin", "-timeout", f"{int(timeout_s)}s", "-timeout_error", "-trace_err", *extra,
    ]
    proc = await asyncio.create_subprocess_exec("sipp", *args, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s + 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    errors = "".join(p.read_text(errors="replace") for p in workdir.glob("*_errors.log"))
    return proc.returncode or 0, out.decode(errors="replace")[-3000:] + errors[-3000:]


async def test_uac_pcap_audio_and_digit_reach_the_engine_and_the_agent_answers(tmp_path: Path) -> None:
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "uac_pcap", tmp_path, "-m", "1")
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _call_id, codec, transport = sip.finished[0]
    assert rc == 0, output
    assert codec.choice.payload_type == 8 and codec.choice.encoding.value == "pcma"  # SIPp offers PCMA only
    (session_id,) = recorder.opened
    heard_ms = caller_audio_ms(recorder.commands[session_id])
    assert 6500 <= heard_ms <= 7500, heard_ms  # g711a.pcap: 236 packets of 30 ms
    assert CreateTextItem("DTMF 1") in recorder.commands[session_id]
    played = [c.played_ms for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert played and max(played) > 0  # the echo agent's audio was sent, and its heard position reported
    assert codec.media_packets_sent >= max(played) // 20
    assert transport.send_errors == 0  # SIPp's media port took every packet we sent
    assert codec.jitter.late == 0 and codec.malformed == 0
    assert transport.rtcp.sent >= 2  # at least one SR (every 5 s ± 50 %) and the BYE


async def test_a_digit_just_before_the_bye_reaches_the_engine_though_both_waited_out_a_stall(tmp_path: Path) -> None:
    """The bridge's loop stalls (1.5 s, ``time.sleep`` in the loop itself: the process descheduled, a long garbage
    collection) while SIPp sends a digit and, 300 ms after it began, the BYE. When the loop wakes both wait in the
    kernel; asyncio reads one datagram per turn from the RTP socket and the BYE from the SIP socket in the first: the
    code before read the digit's first packet and ended the stream, its end packet unread (``CreateTextItem`` never
    sent, 3 of 3 runs). Now the BYE reads what waits on the RTP socket first."""
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        sip = listener(bridge)
        phone = asyncio.create_task(sipp(bridge, "dtmf_then_bye.xml", tmp_path, "-m", "1"))
        await until(lambda: any(call.transport.codec.started for call in sip.calls.values()), timeout_s=10)
        await asyncio.sleep(0.3)
        time.sleep(1.5)  # the stall: SIPp's digit (0.8 to 0.94 s after its ACK) and BYE (1.1 s) come meanwhile
        rc, output = await phone
        await until(lambda: len(sip.finished) == 1)
        _, codec, transport = sip.finished[0]
    assert rc == 0, output
    (session_id,) = recorder.opened
    assert recorder.commands[session_id].count(CreateTextItem("DTMF 1")) == 1, (codec.dtmf.malformed, transport.overflow)
    assert codec.stopped and transport.latch.unexpected_source == 0


async def test_uac_pcap_over_tcp(tmp_path: Path) -> None:
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "uac_pcap", tmp_path, "-m", "1", "-t", "t1")
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _, codec, _ = sip.finished[0]
    assert rc == 0, output
    (session_id,) = recorder.opened
    assert CreateTextItem("DTMF 1") in recorder.commands[session_id]
    assert len([c for c in recorder.commands[session_id] if isinstance(c, AppendAudio)]) >= 200
    assert codec.choice.payload_type == 8 and sip.dropped.get("tcp_connection_gone") is None


async def test_concurrent_calls_all_complete(tmp_path: Path) -> None:
    recorder = engine(max_sessions=CONCURRENT)
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        n = str(CONCURRENT)
        rc, output = await sipp(bridge, "uac", tmp_path, "-m", n, "-l", n, "-r", n, "-d", "2000")
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == CONCURRENT, timeout_s=10)
    assert rc == 0, output  # SIPp exits 0 only when no call failed
    assert len(recorder.opened) == CONCURRENT
    assert len({call_id for call_id, _, _ in sip.finished}) == CONCURRENT
    assert all(codec.jitter.late == 0 for _, codec, _ in sip.finished)


async def test_concurrent_media_calls_each_reach_their_own_session(tmp_path: Path) -> None:
    recorder = engine(max_sessions=CONCURRENT)
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "uac_pcap", tmp_path, "-m", "10", "-l", "10", "-r", "10")
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 10, timeout_s=10)
    assert rc == 0, output
    assert len(recorder.opened) == 10
    heard_ms = []
    for session_id in recorder.opened:
        commands = recorder.commands[session_id]
        heard_ms.append(caller_audio_ms(commands))
        assert commands.count(CreateTextItem("DTMF 1")) == 1, [(c.jitter.received, c.dtmf.malformed, t.overflow) for _, c, t in sip.finished]
    # each call's audio, once, in its own session: no session heard two calls' (SIPp plays 7 s each), and every
    # RTP packet the bridge took reached an engine (a starved SIPp may end its pcap early: not the bridge's loss)
    assert all(3000 <= ms <= 7500 for ms in heard_ms), heard_ms
    taken_ms = sum(  # G.711: 8 bytes a ms
        (c.jitter.received - c.jitter.late - c.jitter.duplicates + c.jitter.concealed) * c.jitter.last_size // 8 for _, c, _ in sip.finished
    )
    assert abs(sum(heard_ms) - taken_ms) <= 10 * 40, (heard_ms, taken_ms)
    assert all(transport.latch.unexpected_source == 0 and codec.jitter.late == 0 for _, codec, transport in sip.finished)


async def test_cancel_while_ringing(tmp_path: Path) -> None:
    recorder = engine()
    async with running_bridge(sip_settings(answer_delay_ms=3000), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "cancel.xml", tmp_path, "-m", "1")
        sip = listener(bridge)
    assert rc == 0, output
    assert recorder.opened == [] and sip.calls == {} and len(sip.finished) == 0


async def test_options_probe(tmp_path: Path) -> None:
    async with running_bridge(sip_settings(), engine(), provider="twilio") as bridge:
        rc, output = await sipp(bridge, "options.xml", tmp_path, "-m", "3")
    assert rc == 0, output


async def test_hold_and_resume(tmp_path: Path) -> None:
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "hold.xml", tmp_path, "-m", "1")
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _, codec, _ = sip.finished[0]
    assert rc == 0, output
    assert codec.choice.direction.value == "sendrecv" and len(recorder.opened) == 1
    assert codec.suppressed_on_hold > 10  # ~500 ms on hold: the 20 ms silence cadence stopped


async def test_bridge_hangs_up_with_bye(tmp_path: Path) -> None:
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        call = asyncio.create_task(sipp(bridge, "bye_from_bridge.xml", tmp_path, "-m", "1"))
        await until(lambda: recorder.session_count == 1, timeout_s=10)
        await asyncio.sleep(0.3)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        rc, output = await call
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
    assert rc == 0, output
    assert sip.uas.dialogs[sip.finished[0][0]].state.value == "ended"


async def test_garbage_and_strangers_do_not_disturb_a_call(tmp_path: Path) -> None:
    """Garbage UDP and malformed SIP on the SIP port, RTP from an unexpected source on the call's port, during a
    real SIPp call: each is answered per the RFC or dropped and counted, and the call completes."""
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        call = asyncio.create_task(sipp(bridge, "uac_pcap", tmp_path, "-m", "1"))
        sip = listener(bridge)
        await until(lambda: len(sip.calls) == 1, timeout_s=10)
        (rtp_port,) = [c.transport.transport.get_extra_info("sockname")[1] for c in sip.calls.values() if c.transport.transport]
        port = bridge.settings.sip.port
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            stranger.settimeout(2)
            stranger.bind(("127.0.0.1", 0))
            await asyncio.sleep(1.0)  # SIPp's RTP has latched by now
            for _ in range(20):
                stranger.sendto(build_rtp(8, 1, 0, 99, b"\x00" * 160), ("127.0.0.1", rtp_port))
            stranger.sendto(b"\x00garbage\xff" * 10, ("127.0.0.1", port))
            stranger.sendto(b"FOO sip:x SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1;branch=z9hG4bKg;rport\r\nFrom: <sip:a@b>;tag=1\r\n"
                            b"To: <sip:c@d>\r\nCall-ID: g1\r\nCSeq: 1 FOO\r\nContent-Length: 0\r\n\r\n", ("127.0.0.1", port))
            answer = await asyncio.get_running_loop().run_in_executor(None, stranger.recv, 65535)
            stranger.sendto(b"OPTIONS sip:x SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1;branch=z9hG4bKh;rport\r\nFrom: <sip:a@b>;tag=1\r\n"
                            b"To: <sip:c@d>\r\nCall-ID: g2\r\nCSeq: 1 OPTIONS\r\nContent-Length: 99\r\n\r\n", ("127.0.0.1", port))
            bad_length = await asyncio.get_running_loop().run_in_executor(None, stranger.recv, 65535)
        rc, output = await call
        await until(lambda: len(sip.finished) == 1)
        dropped = dict(sip.dropped)
    assert rc == 0, output
    unknown = parse_message(answer)
    assert isinstance(unknown, SipResponse) and unknown.status == 501
    truncated = parse_message(bad_length)
    assert isinstance(truncated, SipResponse) and truncated.status == 400
    assert dropped.get("rtp_unexpected_source") == 20
    assert dropped.get("malformed:no_headers_end") == 1 and dropped.get("malformed:truncated_body") == 1
    assert CreateTextItem("DTMF 1") in [c for cs in recorder.commands.values() for c in cs]



async def test_a_silent_trunk_is_hung_up(tmp_path: Path) -> None:
    """No RTP for ``sip.rtp_timeout_s``: the trunk is gone without a BYE; the bridge ends the call with one."""
    recorder = engine()
    async with running_bridge(sip_settings(rtp_timeout_s=1.0), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "bye_from_bridge.xml", tmp_path, "-m", "1")  # sends no RTP, awaits our BYE
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _, codec, transport = sip.finished[0]
    assert rc == 0, output
    assert transport.timed_out and codec.stopped and len(recorder.opened) == 1


async def test_the_agent_sends_rfc4733_digits_and_transfers_with_refer(tmp_path: Path) -> None:
    """The ``actions`` agent on a SIPp call: the caller's 0 makes it send 123 as RFC 4733 events on our RTP (SIPp
    echoes them: each comes back as exactly one digit, so each event had its own timestamp and its end packets);
    the caller's * makes it transfer: REFER, 202, NOTIFY with a 200 sipfrag, then our BYE. The model hears both
    results."""
    recorder = engine("actions")
    bridge_settings = sip_settings().model_copy(
        update={"call_actions": CallActionsSettings(enabled=True, transfer_targets=["sip:desk@pbx.example.com"])}
    )
    async with running_bridge(bridge_settings, recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "agent_actions.xml", tmp_path, "-m", "1", "-rtp_echo", timeout_s=30)
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        call_id, codec, _ = sip.finished[0]
    assert rc == 0, output
    (session_id,) = recorder.opened
    digits = [c.text for c in recorder.commands[session_id] if isinstance(c, CreateTextItem)]
    assert digits == ["DTMF 0", "DTMF 1", "DTMF 2", "DTMF 3", "DTMF *"]
    outputs = [json.loads(c.output) for c in recorder.commands[session_id] if isinstance(c, FunctionCallOutput)]
    assert outputs == [{"ok": True}, {"ok": True, "detail": "200 OK"}]
    assert CloseSession("transferred") in recorder.commands[session_id]
    assert codec.dtmf.malformed == 0
    assert sip.uas.dialogs[call_id].state.value == "ended"


async def test_delayed_offer_is_answered_in_the_ack(tmp_path: Path) -> None:
    """RFC 3261 §13.2.1: an INVITE without SDP gets our offer in the 200; SIPp answers PCMA in the ACK, then its
    audio and an RFC 4733 digit reach the engine on that codec."""
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "delayed_offer.xml", tmp_path, "-m", "1")
        assert rc == 0, output
        sip = listener(bridge)
        await until(lambda: len(sip.finished) == 1)
        _, codec, transport = sip.finished[0]
    assert rc == 0, output
    assert codec.choice.payload_type == 8 and codec.choice.dtmf_payload_type == 101
    (session_id,) = recorder.opened
    appended = [c for c in recorder.commands[session_id] if isinstance(c, AppendAudio)]
    assert sum(len(c.pcm) for c in appended) * 1000 // (2 * appended[0].rate_hz) >= 2000
    assert CreateTextItem("DTMF 1") in recorder.commands[session_id]
    assert codec.malformed == 0 and transport.latch.latched is not None


async def test_delayed_offer_without_an_answer_is_hung_up(tmp_path: Path) -> None:
    """An ACK without the answer to our offer: nothing to send or decode, so the bridge ends the call (BYE)
    before any engine session."""
    recorder = engine()
    async with running_bridge(sip_settings(), recorder, provider="twilio") as bridge:
        rc, output = await sipp(bridge, "delayed_offer_no_answer.xml", tmp_path, "-m", "1")
        sip = listener(bridge)
        await until(lambda: not sip.calls)
    assert rc == 0, output
    assert recorder.opened == [] and len(sip.finished) == 0
