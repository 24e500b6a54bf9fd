"""Per-frame cost of the codec paths, in µs per 20 ms frame.

    python bench/codecs.py [--frames 20000]

Inbound: a Twilio media payload (base64 μ-law 8 kHz) → PCM16 16 kHz for the engine.
Outbound: engine PCM16 24 kHz → μ-law 8 kHz → base64 for the carrier.
Each frame is timed alone (perf_counter_ns around the whole path); the table
gives the median, mean and p99 over all frames, for our low-delay FIR (LD) and every soxr quality (soxr
works in blocks, so most frames are cheap and a few carry a block: the mean is
the cost per frame that capacity planning needs). Then how much audio each
resampler holds back when fed 20 ms chunks: the latency it adds.
Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import binascii
import gc
import platform
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version

import numpy as np

from callbridge.codecs import (
    ResamplerQuality,
    StreamResampler,
    pcm16_to_ulaw,
    ulaw_to_pcm16,
)
from callbridge.codecs.lowdelay import LowDelayResampler


def speechlike(rate_hz: int, seconds: float, seed: int = 1) -> np.ndarray:
    """Harmonics with a syllable-rate envelope plus noise: busier than silence, like voice."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    voice = sum(np.sin(2 * np.pi * f0 * t) / k for k, f0 in enumerate((140, 280, 420, 1100, 2300), start=1))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    signal = voice * envelope * 6000 + rng.standard_normal(len(t)) * 300
    return np.clip(signal, -32768, 32767).astype(np.int16)


def time_frames(step: Callable[[int], object], frames: int) -> list[float]:
    """µs of ``step(i)`` for each frame i, garbage collection off while timing."""
    samples_us: list[float] = []
    gc.disable()
    try:
        for i in range(frames):
            start = time.perf_counter_ns()
            step(i)
            samples_us.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return samples_us


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def bench_inbound(quality: ResamplerQuality, frames: int) -> list[float]:
    ulaw = pcm16_to_ulaw(speechlike(8000, frames / 50).tobytes())
    payloads = [binascii.b2a_base64(ulaw[i * 160 : (i + 1) * 160], newline=False) for i in range(frames)]
    resampler = StreamResampler(8000, 16000, quality)

    def step(i: int) -> bytes:
        return resampler.process(ulaw_to_pcm16(binascii.a2b_base64(payloads[i])))

    return time_frames(step, frames)


def bench_outbound(quality: ResamplerQuality, frames: int) -> list[float]:
    pcm = speechlike(24000, frames / 50).tobytes()
    chunks = [pcm[i * 960 : (i + 1) * 960] for i in range(frames)]
    resampler = StreamResampler(24000, 8000, quality)

    def step(i: int) -> bytes:
        return binascii.b2a_base64(pcm16_to_ulaw(resampler.process(chunks[i])), newline=False)

    return time_frames(step, frames)


def held_ms(in_rate: int, out_rate: int, quality: ResamplerQuality) -> tuple[float, float]:
    """Audio (ms) a resampler owes after each of a steady stream of 20 ms chunks — the delay
    it adds — as (mean, max) over 200 chunks after the first 20."""
    resampler = StreamResampler(in_rate, out_rate, quality)
    chunk = np.zeros(in_rate // 50, dtype=np.int16).tobytes()
    held: list[float] = []
    for i in range(220):
        resampler.process(chunk)
        if i >= 20:
            held.append(resampler.held_samples / out_rate * 1000)
    return statistics.fmean(held), max(held)


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import os

    return (
        f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, numpy {version('numpy')}, soxr {version('soxr')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=20_000, help="frames timed per path and quality (≥ 10,000)")
    args = parser.parse_args()

    print(f"Machine: {machine()}\n")
    print(f"Frames timed per cell: {args.frames}\n")
    print("| quality | inbound median µs | mean | p99 | outbound median µs | mean | p99 |")
    print("|---|---|---|---|---|---|---|")
    for quality in ResamplerQuality:
        inbound = bench_inbound(quality, args.frames)
        outbound = bench_outbound(quality, args.frames)
        print(
            f"| {quality.value} | {statistics.median(inbound):.1f} | {statistics.fmean(inbound):.1f} "
            f"| {p99(inbound):.1f} | {statistics.median(outbound):.1f} | {statistics.fmean(outbound):.1f} "
            f"| {p99(outbound):.1f} |"
        )
    pairs = [(8000, 16000), (16000, 8000), (24000, 8000), (24000, 16000), (16000, 24000), (22050, 8000)]
    print("\nAudio held back by the stream resampler, fed 20 ms chunks, mean / max ms (the delay it adds):\n")
    print("| quality | " + " | ".join(f"{a // 1000 if a % 1000 == 0 else a / 1000}k→{b // 1000}k" for a, b in pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    for quality in ResamplerQuality:
        print(f"| {quality.value} | " + " | ".join("{:.1f} / {:.1f}".format(*held_ms(a, b, quality)) for a, b in pairs) + " |")
    print("\nLD holds nothing back; its only delay is its filter's group delay (ms):\n")
    print("| " + " | ".join(f"{a / 1000:g}k→{b // 1000}k" for a, b in pairs) + " |")
    print("|" + "---|" * len(pairs))
    print("| " + " | ".join(f"{LowDelayResampler(a, b).delay_ms:.2f}" for a, b in pairs) + " |")


if __name__ == "__main__":
    main()
