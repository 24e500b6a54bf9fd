"""Issue #15's first and third rows, measured against a ``callbridge serve`` process on its shipped defaults (the
embedded engine), with one healthy Twilio call up throughout: unauthenticated websockets each announcing a 15 MiB
message on ``/telnyx/media`` (``--attack websocket``), or unsigned 100 MiB POSTs to ``/telnyx/events``, half with
their length declared, half chunked (``--attack webhook``). Reports the server's RSS (before, peak during, 20 s
after) and the healthy call's largest gap between two pieces of one reply's audio, quiet and under attack.

``--attack slowloris``: ``--sockets`` connections from 127.0.0.2 that begin a request head and trickle a header
line every 2 s for 15 s; how each ends (its status, when), with ``--nofile N`` the bridge's file descriptor limit;
and a new call placed while they are open (its signed answer webhook must be answered). ``--attack idle``: as
slowloris, but each connection is a websocket upgraded on ``/telnyx/media`` (taken before any token) that then
sends nothing.

    python bench/hostile.py [--attack websocket|webhook|slowloris|idle] [--sockets 20] [--rounds 3] [--nofile N] [--source DIR]

``--source``: run the bridge from another checkout's source tree (``git worktree add /tmp/old <rev>``), to
compare with the same client and the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Coroutine

from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.sim.carrier import CallerScript, CallResult
from callbridge.sim.hostile import (
    MediaArrivals,
    how_they_end,
    oversized_body,
    oversized_message,
    rss_bytes,
    slow_head,
    upgrade,
)
from callbridge.sim.loadtest import bridge_process_env
from callbridge.sim.runner import free_port, load_wav_8k, sample_caller_wav, wait_http_up

SECRET = "probe-secret-0123456789abcdef"
MIB = 1024 * 1024


async def call_with(twilio: SimulatedTwilio, attack: asyncio.Future[object] | None) -> tuple[CallResult, float]:
    """A call with three replies; returns it and its largest gap."""
    speech = load_wav_8k(sample_caller_wav())[: 1500 * 16]
    arrivals = MediaArrivals()
    twilio.on_message = arrivals
    script = CallerScript(utterances=((300, speech), (4500, speech), (8700, speech)), hangup_at_ms=13_000)
    result = await twilio.place_call(script)
    if attack is not None:
        await attack
    return result, arrivals.largest_gap_ms()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attack", choices=("websocket", "webhook", "slowloris", "idle"), default="websocket")
    parser.add_argument("--nofile", type=int, help="the bridge's RLIMIT_NOFILE")
    parser.add_argument("--sockets", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=15)
    parser.add_argument("--source", help="run the bridge from this source tree")
    args = parser.parse_args()
    bridge_port, rest_port = free_port(), free_port()
    env = bridge_process_env("twilio", SECRET, f"http://127.0.0.1:{rest_port}")
    if args.source:
        env["PYTHONPATH"] = args.source
    command = [sys.executable, "-m", "callbridge", "serve", "--port", str(bridge_port), "--log-level", "warning"]
    limit = args.nofile

    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    bridge = subprocess.Popen(
        command, env=env, cwd=args.source or None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=limited
    )
    try:
        wait_http_up(f"http://127.0.0.1:{bridge_port}/readyz")
        twilio = SimulatedTwilio(f"http://127.0.0.1:{bridge_port}", SECRET)
        await twilio.start_rest(rest_port)
        quiet, quiet_gap = await call_with(twilio, None)
        baseline = rss_bytes(bridge.pid)
        peak = baseline
        codes: dict[object, int] = {}

        ends: list[tuple[int | None, float]] = []
        mid_attack: list[CallResult | str] = []
        mid_attack_s: list[float] = []
        speech = load_wav_8k(sample_caller_wav())[: 1000 * 16]

        async def slowloris() -> None:
            opened = time.monotonic()
            slow = []
            for _ in range(args.sockets):
                try:
                    if args.attack == "idle":
                        slow.append(await asyncio.to_thread(upgrade, bridge_port, "/telnyx/media", 2.0))
                    else:
                        slow.append(await asyncio.to_thread(slow_head, bridge_port))
                except OSError as exc:
                    codes[type(exc).__name__] = codes.get(type(exc).__name__, 0) + 1
            watching = asyncio.create_task(asyncio.to_thread(how_they_end, slow, opened, 20.0))
            # a carrier's signed answer webhook for a new call, while they hold their connections
            newcomer = SimulatedTwilio(f"http://127.0.0.1:{bridge_port}", SECRET)
            asked = time.monotonic()
            try:
                mid_attack.append(await newcomer.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=2500)))
            except Exception as exc:  # the webhook failed (the connection refused or reset): the call is lost
                mid_attack.append(repr(exc))
            mid_attack_s.append(time.monotonic() - asked)
            await newcomer.aclose()
            while args.attack == "slowloris" and not watching.done() and time.monotonic() - opened < 15:
                for sock in slow:
                    with contextlib.suppress(OSError):
                        sock.sendall(b"X-Slow: 1\r\n")
                await asyncio.sleep(2.0)
            ends.extend(await watching)
            for status, _ in ends:
                codes[status] = codes.get(status, 0) + 1

        async def attack() -> None:
            nonlocal peak
            if args.attack in ("slowloris", "idle"):
                await slowloris()
                return
            for _ in range(args.rounds):
                if args.attack == "websocket":
                    rounds = [asyncio.to_thread(oversized_message, bridge_port, args.size_mib * MIB, "/telnyx/media") for _ in range(args.sockets)]
                else:
                    rounds = [
                        asyncio.to_thread(oversized_body, bridge_port, "/telnyx/events", args.size_mib * MIB, chunked=i % 2 == 1)
                        for i in range(args.sockets)
                    ]
                for outcome in await asyncio.gather(*rounds, return_exceptions=True):
                    if isinstance(outcome, BaseException):
                        code: object = type(outcome).__name__
                    else:
                        code = outcome.close_code if not isinstance(outcome, tuple) else outcome[0]
                    codes[code] = codes.get(code, 0) + 1
                peak = max(peak, rss_bytes(bridge.pid))

        async def sample() -> None:
            nonlocal peak
            while bridge.poll() is None:
                peak = max(peak, rss_bytes(bridge.pid))
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        attacked = asyncio.ensure_future(_after(2.0, attack()))  # it starts as the call's first reply plays
        under, under_gap = await call_with(twilio, attacked)
        sampler.cancel()
        await asyncio.sleep(20)
        after = rss_bytes(bridge.pid)
        await twilio.aclose()
    finally:
        bridge.kill()
        bridge.wait()
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}; bridge from {args.source or 'this tree'}")
    if args.attack in ("slowloris", "idle"):
        closed = [seconds for _, seconds in ends if seconds != float("inf")]
        what = "slow request heads from 127.0.0.2" if args.attack == "slowloris" else "idle websockets on /telnyx/media"
        print(f"attack: {args.sockets} {what} (RLIMIT_NOFILE {args.nofile or 'unchanged'}); ends {codes}; "
              f"closed {len(closed)} of {len(ends)} ({sum(s < 5 for s in closed)} within 5 s), "
              f"the last {max(closed, default=0):.1f} s after they opened")  # fmt: skip
        for late, took_s in zip(mid_attack, mid_attack_s, strict=True):
            if isinstance(late, str):
                print(f"a new call mid-attack (signed answer webhook): FAILED after {took_s:.1f} s: {late}")
            else:
                print(f"a new call mid-attack (signed answer webhook): {'answered' if late.streams else 'NOT answered'}, "
                      f"agent speech {late.agent_speech_ms} ms, over in {took_s:.1f} s")  # fmt: skip
    else:
        target = "messages on /telnyx/media" if args.attack == "websocket" else "POSTs to /telnyx/events"
        print(f"attack: {args.rounds} rounds x {args.sockets} x {args.size_mib} MiB {target}; outcomes {codes}")
    print(f"RSS: before {baseline / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB (+{(peak - baseline) / MIB:.1f}), "
          f"20 s after {after / MIB:.1f} MiB (+{(after - baseline) / MIB:.1f})")  # fmt: skip
    print(f"healthy call, quiet: largest gap {quiet_gap:.1f} ms, agent speech {quiet.agent_speech_ms} ms, hung up by {quiet.hung_up_by}")
    print(f"healthy call, attacked: largest gap {under_gap:.1f} ms, agent speech {under.agent_speech_ms} ms, hung up by {under.hung_up_by}")


async def _after(delay_s: float, work: Coroutine[object, object, None]) -> None:
    await asyncio.sleep(delay_s)
    await work


if __name__ == "__main__":
    asyncio.run(main())
