"""The browser phone's page in a real browser: Debian's Chromium, headless, driven by Selenium through Debian's
chromedriver, with a WAV file as its microphone. It places a call from ``/talk``, hears the agent (WebRTC's own
counters and the page's analyser on the remote track), talks over the agent's reply (a barge-in), hangs up, and the
application has the call's report.

Selenium blocks: each of its calls runs in a thread, so the bridge (in this test's event loop) runs meanwhile.
``CALLBRIDGE_SCREENSHOTS=<dir>``: the page is photographed there while connected (``docs/talk.png`` came so)."""

from __future__ import annotations

import asyncio
import os
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from callbridge.application.events import CallReport
from callbridge.codecs import ResamplerQuality, StreamResampler
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav
from tests.bridge import agent_app
from tests.bridge.twilio_e2e import engine, settings, until
from tests.conftest import peer_binary

webdriver = pytest.importorskip("selenium.webdriver")

CHROMIUM, CHROMEDRIVER = peer_binary("chromium"), peer_binary("chromedriver")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None, reason="Chromium (Debian packages chromium, chromium-driver) is not installed"),
    pytest.mark.processes,  # a browser's processes carrying a call at real time: one of the run's few slots for such (tests/cpu_share.py)
]


def microphone(path: Path) -> Path:
    """The caller: the bundled utterance (3.7 s), 1.5 s of silence — the agent starts echoing it — the utterance again
    over the agent's reply, then silence to stay on the line. 48 kHz mono, as Chromium's fake capture takes it."""
    speech = load_wav_8k(sample_caller_wav())
    pcm_8k = speech + bytes(16000 * 3 // 2) + speech + bytes(16000 * 8)
    resampler = StreamResampler(8000, 48000, ResamplerQuality.HQ)
    pcm = resampler.process(pcm_8k) + resampler.flush()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(48000)
        out.writeframes(pcm)
    return path


def chromium(microphone_wav: Path) -> Any:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone_wav}%noloop", "--autoplay-policy=no-user-gesture-required",
    ):  # fmt: skip
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


async def in_thread(call: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(call, *args)


async def page_until(driver: Any, script: str, timeout_s: float) -> Any:
    """Poll the page's ``script`` (a JavaScript expression) until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await in_thread(driver.execute_script, f"return {script}")):
        if asyncio.get_running_loop().time() > deadline:
            state = await in_thread(driver.execute_script, "return [window.talk.state, window.talk.error]")
            raise AssertionError(f"{script} not reached in {timeout_s} s (the page: {state})")
        await asyncio.sleep(0.1)
    return value


async def received(driver: Any, *, packets: int, timeout_s: float) -> dict[str, Any]:
    """The page's WebRTC counters of the agent's audio (``talk.stats()``), once ``packets`` have come."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        stats: dict[str, Any] = await in_thread(driver.execute_async_script, "window.talk.stats().then(arguments[arguments.length - 1])")
        if stats["packetsReceived"] >= packets:
            return stats
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{packets} packets not received in {timeout_s} s: {stats}")
        await asyncio.sleep(0.2)


@pytest.fixture(autouse=True)
def _fresh_app() -> None:
    agent_app.Greeter.calls.clear()
    agent_app.Recorder.events.clear()


async def test_chromium_on_the_talk_page_hears_the_agent_interrupts_it_and_hangs_up(tmp_path: Path) -> None:
    app = {"module": "tests.bridge.agent_app:Recorder", "context_parameters": ["customer"]}
    async with running_bridge(settings(app=app), engine()) as bridge:
        driver = await in_thread(chromium, microphone(tmp_path / "microphone.wav"))
        try:
            await in_thread(driver.get, f"{bridge.base_url}/talk?customer=42")
            call = await in_thread(driver.find_element, webdriver.common.by.By.ID, "call")
            await in_thread(call.click)
            await page_until(driver, "window.talk.state === 'connected'", 20)
            await page_until(driver, "window.talk.agentPeak > 0.02", 20)  # the agent's voice, on the page's analyser
            if directory := os.environ.get("CALLBRIDGE_SCREENSHOTS"):
                await in_thread(driver.save_screenshot, str(Path(directory) / "talk.png"))
            # the caller talks over the agent (its greeting, or its echo of the first utterance): the agent stops
            await until(lambda: any(e.type == "barge-in" for e in agent_app.Recorder.events), timeout_s=30)
            stats = await received(driver, packets=50, timeout_s=20)  # 20 ms packets: a second of the agent and more
            assert stats["packetsLost"] == 0, stats
            await page_until(driver, "document.querySelectorAll('#transcript li').length > 0", 10)  # the engine's words, live
            hang_up = await in_thread(driver.find_element, webdriver.common.by.By.ID, "hangup")
            await in_thread(hang_up.click)
            await page_until(driver, "window.talk.state === 'ended'", 10)
            call_id = await in_thread(driver.execute_script, "return window.talk.callId")
        finally:
            await in_thread(driver.quit)
        await until(lambda: any(e.type == "call.ended" for e in agent_app.Recorder.events), timeout_s=10)
    (asked,) = agent_app.Greeter.calls
    assert (asked.carrier, asked.call_id, asked.parameters) == ("webrtc", call_id, {"customer": "42"})
    (ended,) = [e for e in agent_app.Recorder.events if e.type == "call.ended"]
    report = CallReport.model_validate(ended.data["report"])
    assert report.barge_ins >= 1 and report.ended_by == "caller", report
    assert report.first_agent_audio_ms is not None

