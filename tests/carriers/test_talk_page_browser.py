"""The browser phone's page in a real browser: Debian's Chromium, headless, driven by Selenium through Debian's
chromedriver, with a WAV file as its microphone. It places a call from ``/talk``, hears the agent (WebRTC's own
counters and the page's analyser on the remote track), talks over the agent's reply (a barge-in), hangs up, and the
application has the call's report; meanwhile ``/console``, in another window, lists the call live, then shows its
timeline and recording.

Selenium blocks: each of its calls runs in a thread, so the bridge (in this test's event loop) runs meanwhile.
``CALLBRIDGE_SCREENSHOTS=<dir>``: the pages are photographed there (``docs/talk.png`` and ``docs/console.png`` came so)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from callbridge.application.events import CallReport
from callbridge.carriers.webrtc.chromium import fake_microphone, start_chromium
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
    over the agent's reply, then silence to stay on the line."""
    speech = load_wav_8k(sample_caller_wav())
    return fake_microphone(speech + bytes(16000 * 3 // 2) + speech + bytes(16000 * 8), path)


def chromium(microphone_wav: Path) -> Any:
    return start_chromium(microphone_wav, binary=CHROMIUM, driver=CHROMEDRIVER)


async def in_thread(call: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(call, *args)


async def page_until(driver: Any, script: str, timeout_s: float) -> Any:
    """Poll the page's ``script`` (a JavaScript expression) until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await in_thread(driver.execute_script, f"return {script}")):
        if asyncio.get_running_loop().time() > deadline:
            state = await in_thread(driver.execute_script, "return window.talk ? [window.talk.state, window.talk.error] : document.title")
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


CONSOLE_TOKEN = "console-token-0123456789"


async def console_window(driver: Any, base_url: str) -> str:
    """``/console`` in the browser's first window, its requests carrying the console's token (as a proxy in front of
    it, or the browser's own basic-auth prompt, would); its handle."""
    await in_thread(driver.execute_cdp_cmd, "Network.enable", {})
    await in_thread(driver.execute_cdp_cmd, "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {CONSOLE_TOKEN}"}})
    await in_thread(driver.get, f"{base_url}/console")
    return str(driver.current_window_handle)


async def test_chromium_on_the_talk_page_hears_the_agent_interrupts_it_and_hangs_up_and_the_console_shows_the_call(tmp_path: Path) -> None:
    """The browser phone and the console, both in Chromium: the console (its own window) lists the browser call
    within a second of its answer, while it is up; after the hang-up it finds it among the finished calls, with its
    timeline (the barge-in in it) and its recording drawn, both channels."""
    app = {"module": "tests.bridge.agent_app:Recorder", "context_parameters": ["customer"]}
    config = settings(app=app, console={"token": CONSOLE_TOKEN}, recording={"enabled": True, "directory": str(tmp_path / "recordings")})
    screenshots = os.environ.get("CALLBRIDGE_SCREENSHOTS")
    async with running_bridge(config, engine()) as bridge:
        driver = await in_thread(chromium, microphone(tmp_path / "microphone.wav"))
        try:
            console = await console_window(driver, bridge.base_url)
            await page_until(driver, "document.getElementById('status').textContent.startsWith('Live')", 10)
            await in_thread(driver.switch_to.new_window, "window")
            phone = str(driver.current_window_handle)
            await in_thread(driver.get, f"{bridge.base_url}/talk?customer=42")
            call = await in_thread(driver.find_element, webdriver.common.by.By.ID, "call")
            await in_thread(call.click)
            await page_until(driver, "window.talk.state === 'connected'", 20)
            call_id = await in_thread(driver.execute_script, "return window.talk.callId")
            await in_thread(driver.switch_to.window, console)
            listed = await page_until(driver, f"window.consoleView.live.find((c) => c.call_id === {call_id!r} && c.answered_at)", 10)
            seen_ms = await in_thread(driver.execute_script, f"return window.consoleView.seen[{call_id!r}]")
            assert listed["carrier"] == "webrtc" and listed["state"] == "up", listed
            assert seen_ms / 1000 - listed["answered_at"] < 1.0, "the console lists the call within a second of its answer"
            await in_thread(driver.switch_to.window, phone)
            await page_until(driver, "window.talk.agentPeak > 0.02", 20)  # the agent's voice, on the page's analyser
            if screenshots:
                await in_thread(driver.save_screenshot, str(Path(screenshots) / "talk.png"))
            # the caller talks over the agent (its greeting, or its echo of the first utterance): the agent stops
            await until(lambda: any(e.type == "barge-in" for e in agent_app.Recorder.events), timeout_s=30)
            stats = await received(driver, packets=50, timeout_s=20)  # 20 ms packets: a second of the agent and more
            assert stats["packetsLost"] == 0, stats
            await page_until(driver, "document.querySelectorAll('#transcript li').length > 0", 10)  # the engine's words, live
            hang_up = await in_thread(driver.find_element, webdriver.common.by.By.ID, "hangup")
            await in_thread(hang_up.click)
            await page_until(driver, "window.talk.state === 'ended'", 10)
            await in_thread(driver.switch_to.window, console)
            row = f"#finished tr[data-call-id={call_id!r}]"
            await page_until(driver, f"document.querySelector({row!r})", 10)
            await in_thread(driver.execute_script, f"document.querySelector({row!r}).click()")
            wave = await page_until(driver, "window.consoleView.wave", 10)
            assert wave["seconds"] > 1 and len(wave["peaks"]) == 2 and min(wave["peaks"]) > 300, wave  # the caller and the agent, both heard
            kinds = await in_thread(driver.execute_script, "return window.consoleView.detail.timeline.map((e) => e.type)")
            assert kinds[:2] == ["call.started", "call.answered"] and "barge-in" in kinds and kinds[-1] == "call.ended", kinds
            if screenshots:
                await in_thread(driver.set_window_size, 1280, 1500)
                await in_thread(driver.save_screenshot, str(Path(screenshots) / "console.png"))
        finally:
            await in_thread(driver.quit)
        await until(lambda: any(e.type == "call.ended" for e in agent_app.Recorder.events), timeout_s=10)
    (asked,) = agent_app.Greeter.calls
    assert (asked.carrier, asked.call_id, asked.parameters) == ("webrtc", call_id, {"customer": "42"})
    (ended,) = [e for e in agent_app.Recorder.events if e.type == "call.ended"]
    report = CallReport.model_validate(ended.data["report"])
    assert report.barge_ins >= 1 and report.ended_by == "caller", report
    assert report.first_agent_audio_ms is not None
