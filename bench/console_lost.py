"""Issue #44's console: how long after a bridge dies (SIGKILL) its live call is shown ``lost`` on another bridge's
console. Two ``callbridge serve`` processes on their shipped defaults share a ``redis-server`` registry, the console
on (a token); a simulated Twilio call is answered by A; once B's ``/console/api/calls?live=1`` lists it, A is killed,
and B's live list is read every 0.1 s until the call's card says ``lost`` (the design: A's journal writer announces
itself every 5 s, an announcement lapses 15 s after the last, so 10–15 s).

    python bench/console_lost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import signal
import subprocess
import sys
import time

from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript
from callbridge.sim.loadtest import bridge_process_env
from callbridge.sim.redis_server import start_redis
from callbridge.sim.runner import free_port, load_wav_8k, sample_caller_wav, wait_http_up

SECRET = "probe-secret-0123456789abcdef"
TOKEN = secrets.token_hex(16)


def _bridge(redis_url: str, rest_port: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = bridge_process_env("twilio", SECRET, f"http://127.0.0.1:{rest_port}")
    env |= {"CALLBRIDGE_REGISTRY__BACKEND": "redis", "CALLBRIDGE_REGISTRY__REDIS_URL": redis_url, "CALLBRIDGE_CONSOLE__TOKEN": TOKEN}
    command = [sys.executable, "-m", "callbridge", "serve", "--port", str(port), "--log-level", "warning"]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), f"http://127.0.0.1:{port}"


async def _round(redis_url: str) -> tuple[float, float]:
    """One kill: (seconds from the kill to ``lost`` on B's console, seconds from the kill to B's fleet no longer
    listing A)."""
    rest_port = free_port()
    (a, a_url), (b, b_url) = _bridge(redis_url, rest_port), _bridge(redis_url, rest_port)
    try:
        for url in (a_url, b_url):
            await asyncio.to_thread(wait_http_up, f"{url}/readyz", 60)
        twilio = SimulatedTwilio(a_url, SECRET)
        await twilio.start_rest(rest_port)
        speech = load_wav_8k(sample_caller_wav())[: 1000 * 16]
        placed = asyncio.create_task(twilio.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=60_000)))
        async with http_client(timeout=5.0) as http:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            live: list[dict[str, object]] = []
            while not live:
                live = (await http.get(f"{b_url}/console/api/calls", params={"live": 1}, headers=headers)).json()["calls"]
                await asyncio.sleep(0.1)
            (card,) = live
            a.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            lost_after = fleet_after = None
            while lost_after is None or fleet_after is None:
                now = time.monotonic() - killed
                if lost_after is None:
                    cards = (await http.get(f"{b_url}/console/api/calls", params={"live": 1}, headers=headers)).json()["calls"]
                    if any(c["call_id"] == card["call_id"] and c["state"] == "lost" for c in cards):
                        lost_after = now
                if fleet_after is None:
                    bridges = (await http.get(f"{b_url}/console/api/fleet", headers=headers)).json()["bridges"]
                    if len(bridges) == 1:
                        fleet_after = now
                assert now < 60, "not lost within 60 s"
                await asyncio.sleep(0.1)
        placed.cancel()
        await twilio.aclose()
        return lost_after, fleet_after
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.terminate()
                process.wait(10)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    redis = start_redis(port)
    try:
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        print("| round | killed → `lost` on the other console (s) | killed → gone from its fleet list (s) |")
        print("|---|---|---|")
        for round_ in range(1, args.rounds + 1):
            lost, gone = await _round(f"redis://127.0.0.1:{port}/{round_}")
            print(f"| {round_} | {lost:.1f} | {gone:.1f} |", flush=True)
    finally:
        redis.terminate()
        redis.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
