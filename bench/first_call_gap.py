"""The first call of a fresh ``callbridge serve`` (SIP on, shipped defaults, the embedded engine): the longest gap
between the RTP packets the bridge sends it. The bridge keeps a 20 ms cadence, silence included, so a gap over
20 ms is the event loop busy elsewhere; before the engine's warm-up at start, the first session loaded Silero
on the loop, inside this call.

    python bench/first_call_gap.py [--runs 5] [--source DIR]

Each run is a new bridge process and one call (the caller speaks at 0.3 s, hangs up at 4 s). ``--source``:
also run the bridge from another checkout's source tree (``git worktree add /tmp/old <rev>``), alternating with
this one, so that both are measured in the same session on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys

from sip_flood import RtpArrivals

from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.sim.carrier import CallerScript
from callbridge.sim.loadtest import bridge_process_env
from callbridge.sim.runner import free_port, load_wav_8k, sample_caller_wav, wait_http_up

SECRET = "probe-secret-0123456789abcdef"


async def first_call_gaps(source: str | None) -> list[float]:
    """The gaps (ms) between the RTP packets of a fresh bridge's first call, its bridge from ``source``."""
    bridge_port, rest_port = free_port(), free_port()
    env = bridge_process_env("sip", SECRET, f"http://127.0.0.1:{rest_port}")
    if source:
        env["PYTHONPATH"] = source
    command = [sys.executable, "-m", "callbridge", "serve", "--port", str(bridge_port), "--log-level", "warning"]
    bridge = subprocess.Popen(command, env=env, cwd=source or None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_up(f"http://127.0.0.1:{bridge_port}/readyz")
        trunk = SimulatedSip(f"http://127.0.0.1:{bridge_port}", SECRET)
        trunk.port = int(env["CALLBRIDGE_SIP__PORT"])
        arrivals = RtpArrivals()
        trunk.on_message = arrivals
        speech = load_wav_8k(sample_caller_wav())[: 1500 * 16]
        await trunk.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=4000))
        await trunk.aclose()
    finally:
        bridge.kill()
        bridge.wait()
    return arrivals.gaps_ms(arrivals.at_s[0], arrivals.at_s[-1])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--source", help="also run the bridge from this source tree")
    args = parser.parse_args()
    sources: list[str | None] = [None] + ([args.source] if args.source else [])
    longest: dict[str | None, list[float]] = {source: [] for source in sources}
    for _ in range(args.runs):
        for source in sources:
            longest[source].append(max(await first_call_gaps(source)))
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}; {args.runs} runs each")
    for source, maxima in longest.items():
        runs = ", ".join(f"{gap:.0f}" for gap in maxima)
        print(f"{source or 'this tree'}: longest RTP gap of the first call, median {statistics.median(maxima):.1f} ms (runs: {runs} ms)")


if __name__ == "__main__":
    asyncio.run(main())
