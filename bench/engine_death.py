"""What the caller hears when the engine server dies mid-call, with the shipped defaults.

A bridge in this process (``create_app`` on uvicorn, ``engine.kind = "realtime"``, every other setting its
default: ``engine.disconnect_grace_s`` 30 s) over a ``callbridge engine-server`` child process, and a simulated
Twilio call: the caller speaks, the agent answers, and 3 s into the call the server dies one way or another.
Reported per way: when the caller first hears the reorder tone and when the call is hung up, from the death;
and, for a caller who hangs up 0.5 s after the death, how long the bridge takes to end the call after the
``stop`` (``callbridge_calls_total{end="caller_hung_up"}`` counted).

    python bench/engine_death.py [--ways SIGKILL,SIGTERM,SIGSTOP,accept_then_close] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
from websockets.asyncio.server import ServerConnection, serve

from callbridge.config import Settings
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import RunningBridge, free_port, load_wav_8k, running_bridge, sample_caller_wav

WAYS = ("SIGKILL", "SIGTERM", "SIGSTOP", "accept_then_close")


def start_engine(port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    args = [sys.executable, "-m", "callbridge", "engine-server", "--port", str(port), "--set", "local_engine.chunk_ms=500"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).is_success:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("engine-server did not start")


def ended_by_caller(bridge: RunningBridge) -> float:
    labels = {"provider": "twilio", "end": "caller_hung_up"}
    return bridge.app.state.bridge.registry.get_sample_value("callbridge_calls_total", labels) or 0.0


async def close_at_once(ws: ServerConnection) -> None:
    await ws.close(1011)


async def one(way: str, *, caller_hangs_up: bool) -> dict[str, float | None]:
    port = free_port()
    engine = start_engine(port)
    settings = Settings.model_validate({"engine": {"kind": "realtime", "urls": [f"ws://127.0.0.1:{port}"]}})
    speech = load_wav_8k(sample_caller_wav())[: 1500 * 16]
    hangup_at_ms = 3500 if caller_hangs_up else 40_000
    try:
        async with running_bridge(settings) as bridge:
            placed = time.monotonic()
            call = asyncio.create_task(bridge.carrier.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=hangup_at_ms)))
            await asyncio.sleep(3.0)
            died_ms = (time.monotonic() - placed) * 1000
            if way == "accept_then_close":
                engine.kill()
                engine.wait()
                async with serve(close_at_once, "127.0.0.1", port):
                    result = await call
            else:
                os.kill(engine.pid, getattr(signal, way))
                result = await call
            stopped = time.monotonic()
            stop_to_end_ms: float | None = None
            if caller_hangs_up:
                while ended_by_caller(bridge) < 1 and time.monotonic() < stopped + 40:
                    await asyncio.sleep(0.005)
                stop_to_end_ms = (time.monotonic() - stopped) * 1000
    finally:
        if engine.poll() is None:
            os.kill(engine.pid, signal.SIGCONT)
            engine.kill()
            engine.wait()
    tone = result.failure_tone_at_ms()
    ended_by_bridge = result.hung_up_by == "bridge"  # its REST hang-up, or <Hangup/> to the <Redirect>
    return {
        "tone_after_death_ms": None if tone is None else tone - died_ms,
        "hang_up_after_death_ms": result.timeline[-1].at_ms - died_ms if ended_by_bridge else None,
        "stop_to_call_ended_ms": stop_to_end_ms,
    }


def shown(value: float | None) -> str:
    return "never" if value is None else f"{value:,.0f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    print("| how the server dies | tone heard after the death, ms | hung up after the death, ms | caller's stop → call ended, ms |")
    print("|---|---|---|---|")
    for way in args.ways.split(","):
        for _ in range(args.runs):
            dying = await one(way, caller_hangs_up=False)
            hanging_up = await one(way, caller_hangs_up=True)
            print(f"| {way} | {shown(dying['tone_after_death_ms'])} | {shown(dying['hang_up_after_death_ms'])} | "
                  f"{shown(hanging_up['stop_to_call_ended_ms'])} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
