"""When the bridge's dials leave it and when they reach the carrier (#42): ``outbound.calls_per_second`` 10, 20 calls
placed at once through the simulated carrier's dial API (each callee busy), the bridge's requests timed as its REST
client sends them and the carrier's as it takes them. A carrier counts by its own clock: two dials closer than the
interval there are over its rate, however the bridge paced them.

    python bench/dial_pacing.py [--provider vonage] [--calls 20]

Printed: the gaps between sends, between arrivals (ms), and each dial's send → arrival delay. Machine: the one it runs
on.
"""

from __future__ import annotations

import argparse
import asyncio
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


def gaps(times: list[float]) -> list[int]:
    return [round((b - a) * 1000) for a, b in zip(times, times[1:], strict=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="vonage")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    sent, arrived = asyncio.run(measure(args.provider, args.calls))
    print(f"{args.provider}: {len(sent)} dials sent, {len(arrived)} taken by the carrier")
    print("sent gaps (ms):", gaps(sent))
    print("arrival gaps (ms):", gaps(arrived), f"closest {min(gaps(arrived))}")
    print("send → arrival (ms):", [round((b - a) * 1000) for a, b in zip(sent, arrived, strict=False)])


if __name__ == "__main__":
    main()
