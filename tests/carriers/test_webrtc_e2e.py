"""The browser phone end to end: an aiortc peer posts its offer to ``/talk/offer`` as the page does
(``carriers/webrtc/sim.py``) on a real server, over real ICE, DTLS-SRTP and Opus on loopback, to the embedded engine.
The page itself, in Chromium, is ``test_talk_page_browser.py``'s."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection

from callbridge.application.events import CallReport
from callbridge.carriers.webrtc import jitter
from callbridge.carriers.webrtc.phones import BrowserPhones
from callbridge.carriers.webrtc.sim import BrowserCall
from callbridge.carriers.webrtc.transport import AgentTrack
from callbridge.carriers.webrtc.wire import FRAME_BYTES, RATE_HZ
from callbridge.engine.commands import CreateTextItem
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge import agent_app
from tests.bridge.twilio_e2e import engine, settings, short_speech, until

TOKEN = "talk-token-0123456789"
GREETING_MS = 3500
"""The greeting's stand-in chime lasts at most 3 s (the embedded engine has no voice)."""


def phones(bridge: RunningBridge) -> BrowserPhones:
    found = bridge.app.state.bridge.services.carrier_state["webrtc"]
    assert isinstance(found, BrowserPhones)
    return found


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.Greeter.calls.clear()
    agent_app.Recorder.events.clear()


@pytest.mark.long
async def test_a_browser_call_reaches_the_application_hears_the_agent_and_hangs_up(tmp_path: Path) -> None:
    """The page's query string reaches the application's ``CallContext`` (allow-listed), the caller's "hello" comes
    back from the echo agent after the greeting, the transcripts of both reach the page as they play (the greeting's,
    said before the page's data channel is up, too), the browser's hang-up
    ends the call, and its report says webrtc; the call is recorded, in stereo at 48 kHz."""
    app = {"module": "tests.bridge.agent_app:Recorder", "context_parameters": ["customer"]}
    recording = {"enabled": True, "directory": str(tmp_path)}
    async with running_bridge(settings(app=app, recording=recording), engine()) as bridge:
        speech = bytes(16 * GREETING_MS) + short_speech(1200) + bytes(16000 * 4)  # the greeting heard out, then hello
        browser = BrowserCall(bridge.base_url, speech, parameters={"customer": "42", "other": "x"})
        try:
            response = await browser.offer()
            assert response.status_code == 200, response.text
            assert "opus/48000/2" in response.json()["sdp"]
            await until(lambda: browser.microphone.spoke_at is not None, timeout_s=15)
            assert browser.microphone.spoke_at is not None
            spoke_until = browser.microphone.spoke_at + (GREETING_MS + 1200) / 1000
            await until(lambda: browser.heard.first_loud_at(after=spoke_until) is not None, timeout_s=15)  # the echo
            said = lambda: " ".join(m["text"] or "" for m in browser.transcript)  # noqa: E731
            await until(lambda: agent_app.GREETING in said() and "echo of" in said(), timeout_s=10)  # shown as it came
        finally:
            await browser.hang_up()
        await until(lambda: any(e.type == "call.ended" for e in agent_app.Recorder.events), timeout_s=10)
        assert not phones(bridge).calls
        turns = bridge.app.state.bridge.registry.get_sample_value("callbridge_turn_latency_seconds_count", {"provider": "webrtc"})
        assert turns is not None and turns >= 1  # the echo's turn, in the metrics
    (asked,) = agent_app.Greeter.calls
    assert (asked.carrier, asked.call_id, asked.parameters) == ("webrtc", browser.call_id, {"customer": "42"})
    (ended,) = [e for e in agent_app.Recorder.events if e.type == "call.ended"]
    report = CallReport.model_validate(ended.data["report"])
    assert report.call.carrier == "webrtc" and report.first_agent_audio_ms is not None
    assert report.recording is not None
    with wave.open(str(tmp_path / f"{browser.call_id}.wav")) as wav:
        assert (wav.getnchannels(), wav.getframerate()) == (2, RATE_HZ)
        stereo = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2)
    assert np.abs(stereo[:, 0]).max() > 3000 and np.abs(stereo[:, 1]).max() > 3000  # the caller, and the agent


async def test_the_query_string_stays_out_of_the_context_when_configured_so() -> None:
    app = {"module": "tests.bridge.agent_app:Recorder", "context_parameters": ["customer"]}
    async with running_bridge(settings(app=app, webrtc={"context_parameters_from_query": False}), engine()) as bridge:
        browser = BrowserCall(bridge.base_url, bytes(16000 * 2), parameters={"customer": "42"})
        try:
            assert (await browser.offer()).status_code == 200
            await until(lambda: bool(agent_app.Greeter.calls), timeout_s=15)
        finally:
            await browser.hang_up()
    (asked,) = agent_app.Greeter.calls
    assert (asked.carrier, asked.parameters) == ("webrtc", {})


async def test_every_talk_route_refuses_without_the_token_and_a_bad_offer_costs_no_call() -> None:
    async with running_bridge(settings(), engine()) as bridge, httpx.AsyncClient(base_url=bridge.base_url) as http:
        # no token configured: a browser on this machine may call; through a proxy, or from elsewhere, nobody
        assert (await http.get("/talk")).status_code == 200
        forwarded = await http.get("/talk", headers={"X-Forwarded-For": "203.0.113.9"})
        assert forwarded.status_code == 403 and forwarded.json()["error"] == "not_configured"
        assert (await http.post("/talk/offer", json={}, headers={"Forwarded": "for=203.0.113.9"})).status_code == 403
    with_token = settings(webrtc={"token": TOKEN})
    async with running_bridge(with_token, engine()) as bridge, httpx.AsyncClient(base_url=bridge.base_url) as http:
        for refused in (
            await http.get("/talk"), await http.get("/talk", params={"token": "wrong-token-0123456789"}),
            await http.post("/talk/offer", json={"type": "offer", "sdp": "v=0"}),
            await http.post("/talk/offer", json={"type": "offer", "sdp": "v=0"}, headers={"Authorization": "Bearer nope"}),
        ):  # fmt: skip
            assert refused.status_code == 401 and refused.json()["error"] == "unauthorized", refused.text
        page = await http.get("/talk", params={"token": TOKEN})
        assert page.status_code == 200 and "RTCPeerConnection" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (await http.post("/talk/offer", content=b"{", headers=auth)).status_code == 400
        assert (await http.post("/talk/offer", json={"type": "answer", "sdp": "v=0"}, headers=auth)).status_code == 400
        assert (await http.post("/talk/offer", content=b" " * 40_000, headers=auth)).status_code == 413
        bad = await http.post("/talk/offer", json={"type": "offer", "sdp": "v=0\r\nnonsense"}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"] == "bad_offer", bad.text
        assert not phones(bridge).calls
    async with running_bridge(settings(webrtc={"enabled": False}), engine()) as bridge, httpx.AsyncClient(base_url=bridge.base_url) as http:
        assert (await http.get("/talk")).status_code == 404
        assert (await http.post("/talk/offer", json={})).status_code == 404


async def test_the_keypad_reaches_the_engine_and_what_else_the_data_channel_carries_costs_the_call_nothing() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        browser = BrowserCall(bridge.base_url, bytes(16000 * 4))
        try:
            assert (await browser.offer()).status_code == 200
            await until(lambda: browser.channel.readyState == "open" and bool(recorder.opened), timeout_s=15)
            for message in ("dtmf:x", "dtmf:55", "x" * 5000, "start", "dtmf:5"):
                browser.send(message)
            await until(lambda: [c.text for c in recorder.of(CreateTextItem)] == ["DTMF 5"], timeout_s=10)
            assert phones(bridge).calls[browser.call_id or ""].control_dropped == 4
        finally:
            await browser.hang_up()
        await until(lambda: not phones(bridge).calls, timeout_s=10)


async def test_browser_calls_past_webrtc_max_calls_are_refused_before_anything_is_set_up() -> None:
    """Two offers at once for the last place: one is answered, the other refused (503 busy), none set up past it."""
    async with running_bridge(settings(webrtc={"max_calls": 1}), engine()) as bridge:
        browsers = [BrowserCall(bridge.base_url, bytes(16000 * 3)) for _ in range(2)]
        try:
            responses = await asyncio.gather(*(browser.offer() for browser in browsers))
            assert sorted(r.status_code for r in responses) == [200, 503], [r.text for r in responses]
            (refused,) = [r for r in responses if r.status_code == 503]
            assert refused.json()["error"] == "busy"
            assert len(phones(bridge).calls) == 1
            (answered,) = [b for b, r in zip(browsers, responses, strict=True) if r.status_code == 200]
            await until(lambda: answered.channel.readyState == "open", timeout_s=15)  # connected: its bye will be heard
        finally:
            for browser in browsers:
                await browser.hang_up()
        await until(lambda: not phones(bridge).calls, timeout_s=10)


@pytest.mark.long
async def test_a_browser_that_never_connects_ends_at_the_connect_deadline_and_frees_its_place() -> None:
    """Its offer answered, the browser goes away before ICE: at ``webrtc.connect_timeout_s`` (10 s as shipped) the call
    ends without an engine session, its place and admission given back."""
    recorder = engine()
    async with running_bridge(settings(webrtc={"max_calls": 1}), recorder) as bridge:
        browser = BrowserCall(bridge.base_url, bytes(16000))
        browser.connection.addTrack(browser.microphone)
        await browser.connection.setLocalDescription(await browser.connection.createOffer())
        sdp = browser.connection.localDescription.sdp
        await browser.close()  # gone: nothing will answer the bridge's checks
        async with httpx.AsyncClient(base_url=bridge.base_url) as http:
            answered = await http.post("/talk/offer", json={"type": "offer", "sdp": sdp})
        assert answered.status_code == 200, answered.text
        started = time.monotonic()
        await until(lambda: not phones(bridge).calls, timeout_s=20)
        assert 9.0 < time.monotonic() - started < 15.0  # at the deadline, not before (and not long after)
        assert recorder.opened == []
        again = BrowserCall(bridge.base_url, bytes(16000))
        try:
            assert (await again.offer()).status_code == 200  # its place is free again
        finally:
            await again.close()


@pytest.mark.long
async def test_a_browser_that_stops_sending_audio_is_hung_up_at_the_idle_deadline() -> None:
    """Connected, then its microphone's packets stop (a tab frozen, the network gone one way): at
    ``webrtc.idle_timeout_s`` (10 s as shipped) after the last of them the call ends, its place is free again and the
    application has its report."""
    async with running_bridge(settings(app={"module": "tests.bridge.agent_app:Recorder"}), engine()) as bridge:
        browser = BrowserCall(bridge.base_url, bytes(16000 * 30))
        frozen = asyncio.Event()
        speaking = browser.microphone.recv

        async def stops_when_frozen() -> Any:
            if frozen.is_set():
                await asyncio.Future()  # never: aiortc sends nothing more
            return await speaking()

        browser.microphone.recv = stops_when_frozen  # type: ignore[method-assign]
        try:
            assert (await browser.offer()).status_code == 200
            await until(lambda: any(e.type == "call.answered" for e in agent_app.Recorder.events), timeout_s=15)
            frozen.set()
            stopped = time.monotonic()
            await until(lambda: any(e.type == "call.ended" for e in agent_app.Recorder.events), timeout_s=25)
            assert 9.0 < time.monotonic() - stopped < 15.0  # at the deadline, not before (and not long after)
            await until(lambda: not phones(bridge).calls, timeout_s=5)
        finally:
            await browser.close()


async def test_the_track_plays_what_it_holds_then_silence_and_never_holds_more_than_200_ms() -> None:
    track = AgentTrack()
    track.play(b"\x01\x00" * 960 + b"\x02\x00" * 100)  # a frame and a short one, padded
    assert len(track.held) == 2
    first = await track.recv()
    assert (first.sample_rate, first.samples, first.pts) == (RATE_HZ, 960, 0)
    assert bytes(first.planes[0])[:4] == b"\x01\x00\x01\x00"
    second = await track.recv()
    assert bytes(second.planes[0])[198:202] == b"\x02\x00\x00\x00" and second.pts == 960
    assert bytes((await track.recv()).planes[0]) == bytes(FRAME_BYTES)  # nothing held: silence
    track.play(bytes(FRAME_BYTES) * 15)
    assert len(track.held) == 10 and track.dropped == 5
    track.stop()
    await asyncio.sleep(0)


async def test_the_audio_jitter_buffer_is_ours_to_replace_on_this_aiortc() -> None:
    """``jitter.install`` reaches into aiortc's receiver (a private attribute): on an aiortc that keeps it elsewhere
    the bridge logs that aiortc's own stays; this says so before a user hears it."""
    connection = RTCPeerConnection()
    connection.addTransceiver("audio")
    try:
        assert jitter.install(connection, 1)
        (transceiver,) = connection.getTransceivers()
        assert isinstance(getattr(transceiver.receiver, "_RTCRtpReceiver__jitter_buffer"), jitter.AudioJitterBuffer)
    finally:
        await connection.close()


def test_a_bridge_that_takes_no_browser_call_never_loads_aiortc() -> None:
    """aiortc and PyAV cost a process 0.6 s and 34 MB: the app, its routes and the browser phone's listener leave
    them unloaded until the first offer."""
    script = (
        "import sys, asyncio\n"
        "from callbridge.bridge.app import create_app\n"
        "from callbridge.carriers.webrtc.http import browser_phones\n"
        "from callbridge.config import Settings\n"
        "app = create_app(Settings())\n"
        "async def enter():\n"
        "    async with browser_phones(app.state.bridge.services):\n"
        "        pass\n"
        "asyncio.run(enter())\n"
        "print(sorted(m for m in ('aiortc', 'av') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
