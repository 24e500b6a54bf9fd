"""What ``engine-server`` spends rendering one reply chunk as vllm-omni 0.30 does, in µs (issue #13 item 7).

    python bench/engine_projection.py [--chunks 20000] [--chunk-ms 20]

The embedded engine's loopback agent answers every 20 ms of input with one ``AudioDelta`` and, as vllm-omni
does, one ``TranscriptDelta``; ``WireProjection`` turns each pair into the real server's
``response.output_audio.delta`` + ``response.output_audio_transcript.delta``, and ``orjson`` serializes them.
This is the engine server's cost (a GPU server's, in production), not the bridge's: the bridge parses what
vllm-omni sends, which these events already were. Median of ``--repeats`` runs, garbage collection off.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time

import orjson

from callbridge.engine.events import AudioDelta, ResponseCreated, TranscriptDelta
from callbridge.engine.projection import WireProjection


def per_chunk_us(chunks: int, chunk_ms: int) -> float:
    projection = WireProjection("duplex-bench")
    projection.project(ResponseCreated("resp-1", 0))
    pcm = bytes(24000 * 2 * chunk_ms // 1000)
    delta, transcript = AudioDelta(pcm, 24000, "resp-1", "item_resp-1", 0), TranscriptDelta("resp-1", "")
    gc.disable()
    try:
        started = time.perf_counter_ns()
        for _ in range(chunks):
            for event in (delta, transcript):
                for payload in projection.project(event):
                    orjson.dumps(payload)
        return (time.perf_counter_ns() - started) / chunks / 1000
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--chunk-ms", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = [per_chunk_us(args.chunks, args.chunk_ms) for _ in range(args.repeats)]
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"one {args.chunk_ms} ms reply chunk (audio + transcript delta) rendered and serialized: "
          f"median {statistics.median(runs):.2f} µs over {args.repeats} runs of {args.chunks} chunks")  # fmt: skip


if __name__ == "__main__":
    main()
