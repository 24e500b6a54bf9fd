"""Issue #15's SIP row: an OPTIONS flood against ``callbridge serve``'s SIP listener (shipped defaults, the embedded
engine) with one healthy SIP call up throughout, measured by the gaps between the RTP packets the bridge sends it
(it keeps a 20 ms cadence, silence included), quiet and under the flood; and a second call placed mid-flood,
which must be answered. The bridge serves a short call first (the first call of a process loads the embedded
engine's VAD model), as a process in service has.

The flood comes from 127.0.0.2 (another source than the trunk's 127.0.0.1), from a process of its own.

    python bench/sip_flood.py [--rate 1000] [--seconds 5] [--no-budget] [--source DIR]

``--source``: run the bridge from another checkout's source tree (``git worktree add /tmp/old <rev>``), to
compare with the same client and the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time

from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.sim.carrier import CallerScript, CallResult
from callbridge.sim.loadtest import bridge_process_env
from callbridge.sim.runner import free_port, load_wav_8k, sample_caller_wav, wait_http_up

SECRET = "probe-secret-0123456789abcdef"
_FLOOD = "import sys; from callbridge.sim.hostile import options_flood; print(*options_flood(('127.0.0.1', {port}), {rate}, {seconds}))"


class RtpArrivals:
    """When each RTP packet reached the caller (its ``on_message``: SIP text is a str, RTP bytes)."""

    def __init__(self) -> None:
        self.at_s: list[float] = []

    def __call__(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.at_s.append(time.monotonic())

    def gaps_ms(self, start_s: float, end_s: float) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.at_s, self.at_s[1:], strict=False) if start_s <= a and b <= end_s]


def _summary(gaps: list[float]) -> str:
    if len(gaps) < 2:
        return "no packets"
    cuts = statistics.quantiles(gaps, n=100)
    return f"{len(gaps)} gaps: p50 {statistics.median(gaps):.1f} ms, p99 {cuts[98]:.1f} ms, max {max(gaps):.1f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="OPTIONS a second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--source", help="run the bridge from this source tree")
    parser.add_argument("--no-budget", action="store_true", help="the SIP flood budgets out of reach (1e9 a second)")
    args = parser.parse_args()
    bridge_port, rest_port = free_port(), free_port()
    env = bridge_process_env("sip", SECRET, f"http://127.0.0.1:{rest_port}")
    sip_port = int(env["CALLBRIDGE_SIP__PORT"])
    if args.no_budget:
        env["CALLBRIDGE_SIP__SOURCE_REQUESTS_PER_S"] = env["CALLBRIDGE_SIP__REQUESTS_PER_S"] = "1e9"
    if args.source:
        env["PYTHONPATH"] = args.source
    command = [sys.executable, "-m", "callbridge", "serve", "--port", str(bridge_port), "--log-level", "warning"]
    bridge = subprocess.Popen(command, env=env, cwd=args.source or None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_up(f"http://127.0.0.1:{bridge_port}/readyz")
        trunk, late_trunk = (SimulatedSip(f"http://127.0.0.1:{bridge_port}", SECRET) for _ in range(2))
        for sim in (trunk, late_trunk):
            sim.port = sip_port
        speech = load_wav_8k(sample_caller_wav())[: 1500 * 16]
        await trunk.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=3000))  # a warm process, as in service
        arrivals = RtpArrivals()
        trunk.on_message = arrivals
        script = CallerScript(utterances=((300, speech), (5000, speech), (9500, speech)), hangup_at_ms=14_000)
        call = asyncio.create_task(trunk.place_call(script))
        await asyncio.sleep(3.0)
        flood_from = time.monotonic()
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FLOOD.format(port=sip_port, rate=args.rate, seconds=args.seconds),
            env={**os.environ, "PYTHONPATH": os.getcwd()}, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.sleep(args.seconds / 2)
        late: CallResult = await late_trunk.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=4000))
        out, _ = await flood.communicate()
        flood_to = time.monotonic()
        result = await call
        sent, answered = (int(n) for n in out.split())
        for sim in (trunk, late_trunk):
            await sim.aclose()
    finally:
        bridge.kill()
        bridge.wait()
    first = arrivals.at_s[0] if arrivals.at_s else flood_from
    budget = "out of reach" if args.no_budget else "shipped"
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}; bridge from {args.source or 'this tree'}, SIP budgets {budget}")
    print(f"flood: {sent} OPTIONS from 127.0.0.2 in {args.seconds:g} s ({args.rate}/s), {answered} answered")
    print(f"healthy call RTP, quiet (before the flood): {_summary(arrivals.gaps_ms(first, flood_from))}")
    print(f"healthy call RTP, during the flood:        {_summary(arrivals.gaps_ms(flood_from, flood_to))}")
    print(f"healthy call: agent speech {result.agent_speech_ms} ms, hung up by {result.hung_up_by}")
    print(f"call placed mid-flood: {'answered' if late.streams else 'NOT answered'}, agent speech {late.agent_speech_ms} ms, hung up by {late.hung_up_by}")


if __name__ == "__main__":
    asyncio.run(main())
