"""The browser phone against a phone call: from the end of the caller's words to the first agent audio they hear, on
the same bridge and the same engine, calls alternating.

    python bench/talk_latency.py [--calls 20]

One in-process bridge with the embedded engine as shipped (``[local_engine]``: the echo agent; its end-of-turn
silence, 500 ms, is in both). Each round places a simulated Twilio call (real loopback sockets, the signed answer
webhook, the media stream, playout at real time) and a browser call (``carriers/webrtc/sim.py``: an aiortc peer
posting its offer to ``/talk/offer``; ICE, DTLS-SRTP and Opus over loopback). Both callers say the first 1.2 s of the
bundled utterance and wait. Measured at the caller: the end of its words → the first 20 ms frame of agent audio it
hears (the phone: at its playout tick; the browser: as aiortc hands the decoded frame over — a real browser's jitter
buffer adds its own 20–60 ms, which no bridge setting changes). #44 asks the browser's p95 ≤ the phone's + 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.carriers.webrtc.sim import BrowserCall  # noqa: E402
from callbridge.config import Settings  # noqa: E402
from callbridge.logging import configure_logging  # noqa: E402
from callbridge.sim.carrier import CallerScript  # noqa: E402
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav  # noqa: E402

SPEECH_MS = 1200
STARTS_AT_MS = 500
"""The phone caller's words start this long after the call is placed (the stream is up by then)."""


async def phone_call(bridge: object, speech: bytes) -> float:
    script = CallerScript(utterances=((STARTS_AT_MS, speech),), hangup_at_ms=STARTS_AT_MS + SPEECH_MS + 3000)
    result = await bridge.carrier.place_call(script)  # type: ignore[attr-defined]
    first = next((e.at_ms for e in result.timeline if e.who == "agent" and e.what.startswith("starts speaking")), None)
    if first is None:
        raise RuntimeError(f"the phone caller heard no agent:\n{result.render()}")
    return float(first - STARTS_AT_MS - SPEECH_MS)


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
            if (heard := browser.heard.first_loud_at(after=words_end)) is not None:
                return (heard - 0.020 - words_end) * 1000  # the frame's start, as the phone's tick counts it
        raise RuntimeError("the browser heard no agent")
    finally:
        await browser.hang_up()


async def measure(calls: int, jitter_frames: int | None, client_jitter_frames: int) -> tuple[list[float], list[float]]:
    speech = load_wav_8k(sample_caller_wav())[: SPEECH_MS * 16]
    phone: list[float] = []
    browser: list[float] = []
    settings = Settings() if jitter_frames is None else Settings.model_validate({"webrtc": {"jitter_frames": jitter_frames}})
    async with running_bridge(settings) as bridge:
        for _ in range(calls):
            phone.append(await phone_call(bridge, speech))
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
    args = parser.parse_args()
    configure_logging(Settings().log.model_copy(update={"level": "error"}))
    phone, browser = asyncio.run(measure(args.calls, args.jitter_frames, args.client_jitter_frames))
    shipped = Settings().webrtc.jitter_frames
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, {args.calls} calls each; "
          f"webrtc.jitter_frames {shipped if args.jitter_frames is None else args.jitter_frames}, the browser's {args.client_jitter_frames}\n")
    print("| caller | median ms | p95 ms | max ms |")
    print("|---|---|---|---|")
    for name, samples in (("phone (Twilio, simulated)", phone), ("browser (/talk, aiortc)", browser)):
        print(f"| {name} | {statistics.median(samples):.0f} | {p95(samples):.0f} | {max(samples):.0f} |")
    print(f"\nbrowser p95 − phone p95: {p95(browser) - p95(phone):+.0f} ms (#44: at most +100)")


if __name__ == "__main__":
    main()
