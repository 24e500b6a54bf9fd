"""The browser phone against a phone call: from the end of the caller's words to the first agent audio they hear, on
the same bridge and the same engine, calls alternating.

    python bench/talk_latency.py [--calls 20] [--chromium]

One in-process bridge with the embedded engine as shipped (``[local_engine]``: the echo agent; its end-of-turn
silence, 500 ms, is in both). Each round places a simulated Twilio call (real loopback sockets, the signed answer
webhook, the media stream, playout at real time) and a browser call (``carriers/webrtc/sim.py``: an aiortc peer
posting its offer to ``/talk/offer``; ICE, DTLS-SRTP and Opus over loopback). Both callers say the first 1.2 s of the
bundled utterance and wait. Measured at the caller: the end of its words → the first loud 20 ms frame of agent audio
it hears (``LOUD_RMS``; the phone: at its playout tick; the browser: as aiortc hands the decoded frame over — a real browser's jitter
buffer adds its own 20–60 ms, which no bridge setting changes). #44 asks the browser's p95 ≤ the phone's + 100 ms.

``--chromium``: the browser is Debian's Chromium, headless, on the ``/talk`` page itself (Selenium, chromedriver), its
microphone a WAV file (1.5 s of silence while the call connects, the same 1.2 s of words, then silence). Measured by
the page's own trace (``talk.trace``: both sides' levels every 10 ms over 5.3 ms windows, after Chromium's jitter
buffer and decoder, as its speaker would play them): the caller's last loud sample before 450 ms of quiet → the
agent's first loud sample after it.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.carriers.webrtc.chromium import fake_microphone, start_chromium  # noqa: E402
from callbridge.carriers.webrtc.sim import BrowserCall  # noqa: E402
from callbridge.config import Settings  # noqa: E402
from callbridge.logging import configure_logging  # noqa: E402
from callbridge.sim.carrier import CallerScript  # noqa: E402
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav  # noqa: E402

SPEECH_MS = 1200
STARTS_AT_MS = 500
"""The phone caller's words start this long after the call is placed (the stream is up by then)."""


LOUD_RMS = 164
"""A 20 ms frame is sound at this RMS (PCM16) and above: −46 dBFS, the page's ``LOUD``. Every caller times the agent's
first audio as its first loud frame, so that the quiet lead of a reply (the echo agent's replays the caller's turn
from a little before its first word) counts the same on each."""


async def phone_call(bridge: object, speech: bytes) -> float:
    script = CallerScript(utterances=((STARTS_AT_MS, speech),), hangup_at_ms=STARTS_AT_MS + SPEECH_MS + 3000)
    result = await bridge.carrier.place_call(script)  # type: ignore[attr-defined]
    words_end = STARTS_AT_MS + SPEECH_MS
    for at in range(words_end * 16, len(result.heard) - 319, 320):  # PCM16 8 kHz from the call's start, frame by frame
        frame = np.frombuffer(bytes(result.heard[at : at + 320]), dtype="<i2").astype(np.float64)
        if np.sqrt((frame**2).mean()) >= LOUD_RMS:
            return float(at // 16 - words_end)
    raise RuntimeError(f"the phone caller heard no agent:\n{result.render()}")


async def browser_call(base_url: str, speech: bytes, client_jitter_frames: int) -> float:
    browser = BrowserCall(base_url, speech + bytes(16 * 4000), jitter_frames=client_jitter_frames)
    try:
        response = await browser.offer()
        response.raise_for_status()
        for _ in range(500):
            await asyncio.sleep(0.01)
            if browser.microphone.spoke_at is not None:
                break
        assert browser.microphone.spoke_at is not None, "the browser never connected"
        words_end = browser.microphone.spoke_at + SPEECH_MS / 1000
        for _ in range(400):
            await asyncio.sleep(0.01)
            if (heard := browser.heard.first_loud_at(floor=LOUD_RMS, after=words_end)) is not None:
                return (heard - 0.020 - words_end) * 1000  # the frame's start, as the phone's tick counts it
        raise RuntimeError("the browser heard no agent")
    finally:
        await browser.hang_up()


LOUD = 0.02
"""The page's level (RMS × 4, 0–1) above which a 10 ms sample is sound: the codecs' silence is 0, speech 0.1–1."""
QUIET_MS = 450
"""The caller's words have ended at the last loud sample this much quiet follows (the utterance's own pauses are shorter;
the engine's end of turn is 500 ms)."""
LEAD_SILENCE_MS = 1500


def page_turn_ms(trace: list[list[float]]) -> float | None:
    """From the page's trace (``[ms, side, level]``; side 0 the caller, 1 the agent): the caller's words end → the agent's
    first loud sample after; None: not both seen yet."""
    caller = [t for t, side, level in trace if side == 0 and level > LOUD]
    quiet_after = [t for t, side, _ in trace if side == 0]
    if not caller or not quiet_after:
        return None
    ends = [a for a, b in zip(caller, [*caller[1:], None], strict=True) if (b is None and quiet_after[-1] - a >= QUIET_MS) or (b is not None and b - a >= QUIET_MS)]
    if not ends:
        return None
    agent = next((t for t, side, level in trace if side == 1 and level > LOUD and t > ends[0]), None)
    return None if agent is None else agent - ends[0]


def chromium_call(base_url: str, microphone: Path) -> float:
    """One call from Chromium's /talk page (blocking: run in a thread beside the bridge's loop)."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415  # the test extra's

    driver = start_chromium(microphone)
    try:
        driver.get(f"{base_url}/talk")
        driver.find_element(By.ID, "call").click()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.25)
            turn = page_turn_ms(driver.execute_script("return window.talk.trace"))
            if turn is not None:
                driver.find_element(By.ID, "hangup").click()
                return turn
        raise RuntimeError(f"Chromium heard no agent: {driver.execute_script('return [window.talk.state, window.talk.error]')}")
    finally:
        driver.quit()


async def measure(calls: int, jitter_frames: int | None, client_jitter_frames: int, chromium: bool) -> tuple[list[float], list[float]]:
    speech = load_wav_8k(sample_caller_wav())[: SPEECH_MS * 16]
    phone: list[float] = []
    browser: list[float] = []
    settings = Settings() if jitter_frames is None else Settings.model_validate({"webrtc": {"jitter_frames": jitter_frames}})
    with tempfile.TemporaryDirectory() as scratch:
        silence_ms = bytes(16 * LEAD_SILENCE_MS), bytes(16 * 6000)
        microphone = fake_microphone(silence_ms[0] + speech + silence_ms[1], Path(scratch) / "microphone.wav") if chromium else None
        async with running_bridge(settings) as bridge:
            for _ in range(calls):
                phone.append(await phone_call(bridge, speech))
                if microphone is not None:
                    browser.append(await asyncio.to_thread(chromium_call, bridge.base_url, microphone))
                else:
                    browser.append(await browser_call(bridge.base_url, speech, client_jitter_frames))
    return phone, browser


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--jitter-frames", type=int, default=None, help="webrtc.jitter_frames (default: as shipped)")
    parser.add_argument("--client-jitter-frames", type=int, default=1, help="the browser peer's (a browser's own on a clean LAN)")
    parser.add_argument("--chromium", action="store_true", help="the browser is Chromium on the /talk page, not an aiortc peer")
    args = parser.parse_args()
    configure_logging(Settings().log.model_copy(update={"level": "error"}))
    phone, browser = asyncio.run(measure(args.calls, args.jitter_frames, args.client_jitter_frames, args.chromium))
    shipped = Settings().webrtc.jitter_frames
    browser_name = "Chromium on /talk" if args.chromium else f"aiortc peer holding {args.client_jitter_frames} frame(s)"
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, {args.calls} calls each; "
          f"webrtc.jitter_frames {shipped if args.jitter_frames is None else args.jitter_frames}; the browser: {browser_name}\n")
    print("| caller | median ms | p95 ms | max ms |")
    print("|---|---|---|---|")
    for name, samples in (("phone (Twilio, simulated)", phone), (f"browser ({browser_name})", browser)):
        print(f"| {name} | {statistics.median(samples):.0f} | {p95(samples):.0f} | {max(samples):.0f} |")
    print(f"\nbrowser p95 − phone p95: {p95(browser) - p95(phone):+.0f} ms (#44: at most +100)")


if __name__ == "__main__":
    main()
