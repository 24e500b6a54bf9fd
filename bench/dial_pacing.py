"""When the bridge's dials leave it and when they reach the carrier (#42): ``outbound.calls_per_second`` 10, 20 calls
placed at once through the simulated carrier's dial API (each callee busy), the bridge's requests timed as its REST
client sends them and the carrier's as it takes them. A carrier counts by its own clock: two dials closer than the
interval there are over its rate, however the bridge paced them.

    python bench/dial_pacing.py [--provider vonage] [--calls 20]
    python bench/dial_pacing.py --fleet [--provider twilio] [--calls 20]

``--fleet``: two bridge processes' apps (one event loop) sharing a real Redis registry (``redis-server`` on ``PATH``),
each asked for half the calls at once: the carrier's arrival gaps are the fleet's (``CallRegistry.reserve_dial``),
where each process's pacer alone would let two dials go at once.

Printed: the gaps between sends, between arrivals (ms), and each dial's send → arrival delay. Machine: the one it runs
on.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sim.callee import Callee  # noqa: E402
from callbridge.sim.runner import running_bridge  # noqa: E402
from tests.bridge.test_outbound_e2e import OURS, outbound_settings, post_call  # noqa: E402
from tests.bridge.twilio_e2e import engine  # noqa: E402


async def measure(provider: str, calls: int) -> tuple[list[float], list[float]]:
    sent: list[float] = []
    settings = outbound_settings(outbound={"calls_per_second": 10.0, "max_concurrent": 100, "max_queued": 100})
    async with running_bridge(settings, engine(max_sessions=100), provider=provider) as bridge:
        carrier = bridge.carrier
        client = bridge.app.state.bridge.services.carrier_rests[provider]._client
        post = client.post

        async def timed(*args: Any, **kwargs: Any) -> Any:
            sent.append(time.monotonic())
            return await post(*args, **kwargs)

        client.post = timed
        numbers = [f"+1500555{n:04d}" for n in range(calls)]
        for number in numbers:
            carrier.callees[number] = Callee(outcome="busy", ring_ms=50)
        for number in numbers:
            await post_call(bridge, {"carrier": provider, "to": number, "from": OURS})
        await asyncio.sleep(calls / 10 + 1)
        return sent, list(carrier.dialled_at)


async def measure_fleet(provider: str, calls: int) -> list[float]:
    from callbridge.bridge.app import create_app
    from callbridge.sim.ports import bound_socket
    from callbridge.sim.redis_server import start_redis
    from callbridge.sim.runner import free_port, serving, with_overrides

    port = free_port()
    redis = start_redis(port)
    try:
        registry = {"backend": "redis", "redis_url": f"redis://127.0.0.1:{port}/0"}
        outbound = {"calls_per_second": 10.0, "max_concurrent": 100, "max_queued": 100}
        async with running_bridge(outbound_settings(registry=registry, outbound=outbound), engine(max_sessions=100), provider=provider) as a:
            carrier = a.carrier
            listener = bound_socket()
            b_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
            b_settings = with_overrides(a.settings, {"server": {"port": listener.getsockname()[1], "public_url": b_url}})
            async with serving(create_app(b_settings, engine(max_sessions=100)), listener):
                numbers = [f"+1500555{n:04d}" for n in range(calls)]
                for number in numbers:
                    carrier.callees[number] = Callee(outcome="busy", ring_ms=50)
                b = dataclasses.replace(a, base_url=b_url)  # POST /calls at B's address
                await asyncio.gather(*(post_call(a if n % 2 == 0 else b, {"carrier": provider, "to": number, "from": OURS}) for n, number in enumerate(numbers)))
                await asyncio.sleep(calls / 10 + 1)
                return list(carrier.dialled_at)
    finally:
        redis.terminate()
        redis.wait()


def gaps(times: list[float]) -> list[int]:
    return [round((b - a) * 1000) for a, b in zip(times, times[1:], strict=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="vonage")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--fleet", action="store_true", help="two processes sharing a Redis registry")
    args = parser.parse_args()
    if args.fleet:
        arrived = asyncio.run(measure_fleet(args.provider, args.calls))
        print(f"{args.provider}, two processes: {len(arrived)} dials taken by the carrier")
        print("arrival gaps (ms):", gaps(arrived), f"closest {min(gaps(arrived))}")
        return
    sent, arrived = asyncio.run(measure(args.provider, args.calls))
    print(f"{args.provider}: {len(sent)} dials sent, {len(arrived)} taken by the carrier")
    print("sent gaps (ms):", gaps(sent))
    print("arrival gaps (ms):", gaps(arrived), f"closest {min(gaps(arrived))}")
    print("send → arrival (ms):", [round((b - a) * 1000) for a, b in zip(sent, arrived, strict=False)])


if __name__ == "__main__":
    main()
