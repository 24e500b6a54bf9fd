"""What the bridge adds on a Twilio call, measured end to end over loopback with the embedded engine.

    python bench/bridge_latency.py [--calls 10]

Each call: the simulated caller speaks, the echo agent answers, and the caller
talks over the reply 400–1500 ms into it (a barge-in). Everything runs in one
process on one clock, with hooks in the simulated Twilio and the engine:

- inbound: the simulated Twilio sends a ``media`` frame holding a click →
  the engine receives the ``AppendAudio`` holding it (websocket, parse,
  μ-law decode, the stream resampler's delay, submit); one call of clicks
  every 300 ms;
- outbound: the engine yields an ``AudioDelta`` → the simulated Twilio
  receives the first ``media`` frame of it;
- barge-in: the engine yields its interruption signal → the simulated Twilio
  receives ``clear``;
- heard-position error: the heard ms the bridge truncates the model's turn to,
  minus the ms the simulated Twilio actually played before the ``clear``.

The inbound figure includes the audio the soxr stream resampler holds back
(bench/codecs.py: its delay depends on the quality; ``audio.resampler_quality``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator

import numpy as np

from callbridge.config import Settings
from callbridge.engine.commands import AppendAudio, EngineCommand, TruncateItem
from callbridge.engine.events import (
    AudioDelta,
    EngineEvent,
    OutputAudioCleared,
    OverlapDecision,
    ResponseDone,
)
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalEngine, LocalSession
from callbridge.engine.port import SessionConfig
from callbridge.logging import configure_logging
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav


def now() -> float:
    return time.perf_counter()


class Probe:
    def __init__(self) -> None:
        self.measuring_clicks = True
        self.clicks_sent: list[float] = []
        self.click_latency_ms: list[float] = []
        self.responses: set[str] = set()
        self.last_delta_at = 0.0
        self.awaiting_first_frame = False
        self.first_frame_ms: list[float] = []
        self.signal_at: float | None = None
        self.clear_ms: list[float] = []
        self.truncates: list[int] = []

    def media_sent(self, payload: bytes) -> None:
        if self.measuring_clicks and max(np.abs(np.frombuffer(payload, dtype="<i2"))) > 10000:
            self.clicks_sent.append(now())

    def appended(self, pcm: bytes) -> None:
        if self.measuring_clicks and self.clicks_sent and max(np.abs(np.frombuffer(pcm, dtype="<i2")), default=0) > 5000:
            self.click_latency_ms.append((now() - self.clicks_sent.pop(0)) * 1000)


PROBE = Probe()


class ProbedEngine(LocalEngine):
    async def open(self, config: SessionConfig) -> LocalSession:
        session = await super().open(config)
        submit, events = session.submit, session.events

        async def probed_submit(command: EngineCommand) -> None:
            if isinstance(command, AppendAudio):
                PROBE.appended(command.pcm)
            elif isinstance(command, TruncateItem):
                PROBE.truncates.append(command.audio_end_ms)
            await submit(command)

        async def probed_events() -> AsyncIterator[EngineEvent]:
            async for event in events():
                if isinstance(event, AudioDelta) and event.response_id not in PROBE.responses:
                    PROBE.responses.add(event.response_id)
                    PROBE.last_delta_at = now()
                    PROBE.awaiting_first_frame = True
                if isinstance(event, OverlapDecision | OutputAudioCleared) or (isinstance(event, ResponseDone) and event.status == "cancelled"):
                    PROBE.signal_at = PROBE.signal_at or now()
                yield event

        session.submit = probed_submit  # type: ignore[method-assign]
        session.events = probed_events  # type: ignore[method-assign]
        return session


def on_message(raw: str | bytes) -> None:
    t = now()
    if isinstance(raw, bytes):
        return
    if '"event":"media"' in raw and PROBE.awaiting_first_frame:
        PROBE.awaiting_first_frame = False
        PROBE.first_frame_ms.append((t - PROBE.last_delta_at) * 1000)
    elif '"event":"clear"' in raw and PROBE.signal_at is not None:
        PROBE.clear_ms.append((t - PROBE.signal_at) * 1000)
        PROBE.signal_at = None


def quantiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered):.2f} ms, p99 {p99:.2f} ms, max {ordered[-1]:.2f} ms (n={len(ordered)})"


async def run(calls: int) -> None:
    configure_logging(Settings().log.model_copy(update={"level": "error"}))
    speech = load_wav_8k(sample_caller_wav())[: 1500 * 16]
    engine = ProbedEngine(LocalEngineOptions(agent="echo", chunk_ms=1000, generation_speed=4.0))
    errors: list[int] = []
    rng = random.Random(7)
    async with running_bridge(Settings(), engine) as bridge:
        bridge.carrier.on_media_sent = PROBE.media_sent
        bridge.carrier.on_message = on_message
        clicks = np.zeros(8000 * 6, dtype="<i2")
        for start in range(2400, len(clicks) - 160, 2400):  # a 20 ms burst every 300 ms
            clicks[start : start + 160] = 20000
        await bridge.carrier.place_call(CallerScript(utterances=((200, clicks.tobytes()),), hangup_at_ms=6400))
        PROBE.measuring_clicks = False
        for _ in range(calls):
            interrupt = rng.randrange(400, 1500, 20)
            before = len(PROBE.truncates)
            result = await bridge.carrier.place_call(
                CallerScript(utterances=((300, speech),), interrupt_after_agent_ms=interrupt, hangup_at_ms=4500)
            )
            if result.played_ms_at_clear and len(PROBE.truncates) > before:
                errors.append(PROBE.truncates[before] - result.played_ms_at_clear[0])
    print(f"calls: {calls}, each with one barge-in")
    print(f"inbound, a click sent by Twilio → in an engine append: {quantiles(PROBE.click_latency_ms)}")
    print(f"outbound, engine audio delta → first media frame at Twilio: {quantiles(PROBE.first_frame_ms)}")
    print(f"barge-in, engine signal → clear at Twilio: {quantiles(PROBE.clear_ms)}")
    print(f"heard-position error, truncated-to minus played (ms): {sorted(errors)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=10)
    asyncio.run(run(parser.parse_args().calls))


if __name__ == "__main__":
    main()
