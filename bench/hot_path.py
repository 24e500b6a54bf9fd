"""The bridge's per-frame work for one Twilio call, step by step, in µs per 20 ms frame.

    python bench/hot_path.py [--frames 20000]

Each step of a caller frame's way in and the agent's way out, timed alone with ``perf_counter_ns``
(garbage collection off), then the whole sans-I/O call (``CallSession`` with the embedded loopback engine's
session core: one inbound media message → engine → one outbound media message, paced) per frame. What a
loaded ``callbridge serve`` spends beyond the last line is the asyncio layer: the websocket server, the
tasks that move bytes, the system calls (``bench/RESULTS.md`` compares).

Steps, as the bridge takes them:
- parse: ``TwilioCodec.receive_message`` (orjson, stream checks, base64 of the payload)
- G.711 decode (μ-law → PCM16 8 kHz), resample in (8 → 16 kHz, the default low-delay FIR)
- engine: the embedded loopback engine's core takes one ``AppendAudio`` and answers with its audio
  (its own 16 → 24 kHz resampler included; in production this runs on the engine's GPU server)
- resample out (24 → 8 kHz), G.711 encode, frame (20 ms frames), pace (the playout ledger: enqueue, lead,
  markers), serialize (the outbound ``media`` JSON)
- the whole call again with its recording on: the per-frame appends, and every 500 ms the chunk's mixing
"""

from __future__ import annotations

import argparse
import base64
import gc
import platform
import statistics
import time
from collections.abc import Callable

import orjson

from callbridge.bridge.binding import AgentSetup, EngineBinding
from callbridge.bridge.call import CallOptions, CallSession
from callbridge.bridge.call_outputs import ToCarrier, ToEngine
from callbridge.bridge.playout import PlayoutLedger
from callbridge.carriers.base import SendMedia
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.codecs import AudioEncoding, FrameAssembler, StreamResampler, pcm16_to_ulaw, ulaw_to_pcm16
from callbridge.codecs.resample import ResamplerQuality
from callbridge.engine.commands import AppendAudio
from callbridge.engine.events import AudioDelta, Capabilities
from callbridge.engine.local.agents import AGENTS
from callbridge.engine.local.core import LocalEngineOptions, LocalSessionCore
from callbridge.engine.port import SessionConfig

CALLER_ULAW = pcm16_to_ulaw(bytes(range(256)) + bytes(range(64)))  # 160 bytes of varied μ-law
AGENT_24K = (bytes(range(256)) * 4)[:960]  # 20 ms of PCM16 at 24 kHz
SID = "MZ" + "1" * 32
CONNECTED = '{"event":"connected","protocol":"Call","version":"1.0.0"}'
START = orjson.dumps({"event": "start", "sequenceNumber": "1", "streamSid": SID, "start": {
    "streamSid": SID, "accountSid": "AC" + "0" * 32, "callSid": "CA" + "2" * 32, "tracks": ["inbound"], "customParameters": {},
    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}).decode()  # fmt: skip
CAPS = Capabilities(supports_barge_in=True, supports_session_resume=True, supports_audio_truncate=True, supports_playback_ack=True)


def media(payload: bytes, i: int) -> str:
    body = {"track": "inbound", "chunk": str(i), "timestamp": str(20 * i), "payload": base64.b64encode(payload).decode()}
    return orjson.dumps({"event": "media", "sequenceNumber": str(i + 2), "media": body, "streamSid": SID}).decode()


def mark_echo(sent: str) -> str:
    """Twilio's echo of a marker the bridge sent: the same message, with a sequence number."""
    message = orjson.loads(sent)
    return orjson.dumps({**message, "sequenceNumber": "9"}).decode()


def timed(step: Callable[[int], object], frames: int) -> tuple[float, float]:
    """Median and mean µs of ``step(i)`` over ``frames`` calls, after a warm-up."""
    for i in range(200):
        step(i)
    samples = []
    gc.disable()
    try:
        for i in range(200, 200 + frames):
            started = time.perf_counter_ns()
            step(i)
            samples.append(time.perf_counter_ns() - started)
    finally:
        gc.enable()
    return statistics.median(samples) / 1000, statistics.fmean(samples) / 1000


def loopback_core() -> LocalSessionCore:
    options = LocalEngineOptions(agent="loopback")
    return LocalSessionCore("bench", SessionConfig(turn_detection=None), AGENTS["loopback"](), options, 0)


def steps() -> list[tuple[str, Callable[[int], object]]]:
    messages = [media(CALLER_ULAW, i) for i in range(256)]
    codec = TwilioCodec()
    codec.receive_message(CONNECTED)
    codec.receive_message(START)
    pcm_8k = ulaw_to_pcm16(CALLER_ULAW)
    inbound = StreamResampler(8000, 16000, ResamplerQuality.LD)
    pcm_16k = inbound.process(pcm_8k)
    core = loopback_core()
    core.events_to_send()
    outbound = StreamResampler(24000, 8000, ResamplerQuality.LD)
    pcm_out = outbound.process(AGENT_24K)
    frames = FrameAssembler(8000, AudioEncoding.PCMU)
    ledger = PlayoutLedger(lead_ms=100)
    ulaw_frame = pcm16_to_ulaw(pcm_out)

    def engine(i: int) -> object:
        core.submit(AppendAudio(pcm_16k, 16000), 20 * i)
        return core.events_to_send()

    def pace(i: int) -> object:
        ledger.enqueue("r1", [ulaw_frame], 20 * i)
        ledger.tick(20 * i)
        if i % 5 == 0:
            for action in ledger.actions_to_send():
                if hasattr(action, "name"):
                    ledger.mark_echoed(action.name, 20 * i)
        return ledger.actions_to_send()

    return [
        ("parse: JSON + base64 + checks", lambda i: codec.receive_message(messages[i % 256])),
        ("G.711 μ-law decode", lambda i: ulaw_to_pcm16(CALLER_ULAW)),
        ("resample in: 8 → 16 kHz (LD)", lambda i: inbound.process(pcm_8k)),
        ("engine: loopback core, one AppendAudio (its 16 → 24 kHz resampler included)", engine),
        ("resample out: 24 → 8 kHz (LD)", lambda i: outbound.process(AGENT_24K)),
        ("G.711 μ-law encode", lambda i: pcm16_to_ulaw(pcm_out)),
        ("frame: 20 ms frames", lambda i: frames.push(ulaw_frame)),
        ("pace: ledger enqueue, lead, markers", pace),
        ("serialize: outbound media JSON", lambda i: codec.send(SendMedia(ulaw_frame))),
    ]


def whole_call(*, record: bool = False) -> Callable[[int], object]:
    """One frame through the sans-I/O call and the loopback engine core, as the asyncio layer drives it.
    ``record``: the call is recorded (``StereoRecorder``: its chunks are made, once per 500 ms, not written)."""
    call = CallSession(TwilioCodec(), CallOptions())
    call.receive_message(CONNECTED, 0)
    call.receive_message(START, 0)
    call.engine_bound(EngineBinding(CAPS, agent=AgentSetup(record=record)), 0)
    core = loopback_core()
    core.events_to_send()
    messages = [media(CALLER_ULAW, i) for i in range(1 << 16)]

    def to_engine(now_ms: int) -> list[str | bytes]:
        """Do the call's outputs: commands to the engine core; the carrier's messages returned."""
        sent: list[str | bytes] = []
        for output in call.outputs():
            if isinstance(output, ToEngine):
                core.submit(output.command, now_ms)
            elif isinstance(output, ToCarrier):
                sent.append(output.message)
        return sent

    def frame(i: int) -> object:
        now_ms = 20 * i
        call.receive_message(messages[i], now_ms)
        to_engine(now_ms)
        for event in core.events_to_send():
            call.receive_engine_event(event, now_ms)
        sent = to_engine(now_ms)  # acks of what was heard
        for event in core.events_to_send():
            if not isinstance(event, AudioDelta):
                call.receive_engine_event(event, now_ms)
        call.tick(now_ms)
        for message in to_engine(now_ms):
            if isinstance(message, str) and message.startswith('{"event":"mark"'):  # echoed once played, here at once
                call.receive_message(mark_echo(message), now_ms)
        return sent

    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=20000)
    args = parser.parse_args()
    frames = min(args.frames, (1 << 16) - 256)
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, {frames} frames per step\n")
    print("| step | median µs | mean µs |")
    print("|---|---|---|")
    total_median = total_mean = 0.0
    for name, step in steps():
        median, mean = timed(step, frames)
        total_median += median
        total_mean += mean
        print(f"| {name} | {median:.1f} | {mean:.1f} |")
    print(f"| **sum of the steps** | **{total_median:.1f}** | **{total_mean:.1f}** |")
    median, mean = timed(whole_call(), frames)
    print(f"| **whole sans-I/O call per frame, in + out (CallSession + loopback core)** | **{median:.1f}** | **{mean:.1f}** |")
    median, mean = timed(whole_call(record=True), frames)
    print(f"| **the same, the call recorded (stereo chunks made, not written)** | **{median:.1f}** | **{mean:.1f}** |")


if __name__ == "__main__":
    main()
