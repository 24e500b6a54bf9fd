"""SIGTERM of a ``callbridge serve`` process (shipped defaults but ``engine.kind = "realtime"``) whose engine server
died 0.3 s earlier, mid-call: how long until the bridge process exits (``server.drain_timeout_s`` is 30 s).

    python bench/drain_dead_engine.py [SIGKILL] [SIGSTOP]
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from callbridge.carriers.twilio.sim import SimulatedTwilio
from callbridge.sim.carrier import CallerScript
from callbridge.sim.loadtest import bridge_process_env
from callbridge.sim.runner import free_port, load_wav_8k, sample_caller_wav, wait_http_up

SECRET = "probe-secret-0123456789abcdef"


async def one(how: str) -> float:
    engine_port, bridge_port, rest_port = free_port(), free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    engine = subprocess.Popen([sys.executable, "-m", "callbridge", "engine-server", "--port", str(engine_port)], env=base, **quiet)
    wait_http_up(f"http://127.0.0.1:{engine_port}/health")
    env = bridge_process_env("twilio", SECRET, f"http://127.0.0.1:{rest_port}")
    env |= {
        "CALLBRIDGE_ENGINE__KIND": "realtime",
        "CALLBRIDGE_ENGINE__URLS": f'["ws://127.0.0.1:{engine_port}"]',
        "CALLBRIDGE_SERVER__PUBLIC_URL": f"http://127.0.0.1:{bridge_port}",
    }
    args = [sys.executable, "-m", "callbridge", "serve", "--port", str(bridge_port), "--log-level", "warning"]
    bridge = subprocess.Popen(args, env=env, **quiet)
    wait_http_up(f"http://127.0.0.1:{bridge_port}/healthz")
    twilio = SimulatedTwilio(f"http://127.0.0.1:{bridge_port}", SECRET)
    await twilio.start_rest(rest_port)
    speech = load_wav_8k(sample_caller_wav())[: 1500 * 16]
    call = asyncio.create_task(twilio.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=60_000)))
    try:
        await asyncio.sleep(3.0)
        os.kill(engine.pid, getattr(signal, how))
        await asyncio.sleep(0.3)
        signalled = time.monotonic()
        bridge.send_signal(signal.SIGTERM)
        while bridge.poll() is None and time.monotonic() < signalled + 60:
            await asyncio.sleep(0.01)
        return time.monotonic() - signalled
    finally:
        bridge.kill()
        os.kill(engine.pid, signal.SIGCONT)
        engine.kill()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await twilio.aclose()


async def main() -> None:
    for how in sys.argv[1:] or ["SIGKILL", "SIGSTOP"]:
        print(f"engine {how}, then SIGTERM of the bridge: exited after {await one(how):.2f} s", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
