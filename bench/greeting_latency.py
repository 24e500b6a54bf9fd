"""The agent speaks first: how long from the carrier's answer webhook to the caller hearing the greeting, with the
embedded engine — and what a caller hears when the application is 5 s slow (the shipped 1.5 s deadline).

    python bench/greeting_latency.py [--calls 20]

Each call is a simulated Twilio call (real loopback sockets, the signed answer webhook, the media stream, playout at
real time) through an in-process bridge whose application (``app.module``) answers with a greeting at once
(``fast``) or after 5 s (``slow``: the configured greeting stands in at the deadline). Measured at the simulated
caller: from the moment it POSTs the answer webhook to the first 20 ms of agent audio it hears (its playout ticks
every 20 ms: a frame is heard at the tick after it arrives). The embedded engine runs with its shipped settings
(``[local_engine]``: the echo agent, 1 s chunks generated at 4× real time); its "speech" for a text turn is a
chime: with vllm-omni, add the model's own time to first audio.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sim.carrier import CallerScript  # noqa: E402
from callbridge.sim.runner import running_bridge  # noqa: E402
from tests.bridge.twilio_e2e import settings  # noqa: E402

APPS = {"fast": "tests.bridge.agent_app:Greeter", "slow": "tests.bridge.agent_app:Slow"}


async def heard_after_ms(app: str, calls: int) -> list[int]:
    """Per call: ms from the answer webhook to the first agent audio the caller hears."""
    sections = {"app": {"module": app, "greeting": "Greet the caller."}}  # ``slow``: the fallback's greeting
    heard: list[int] = []
    async with running_bridge(settings(**sections)) as bridge:  # the embedded engine as shipped
        for _ in range(calls):
            result = await bridge.carrier.place_call(CallerScript(hangup_at_ms=2500 if app.endswith("Greeter") else 4500))
            first = next((e.at_ms for e in result.timeline if e.who == "agent" and e.what.startswith("starts speaking")), None)
            if first is None:
                raise RuntimeError(f"no greeting heard:\n{result.render()}")
            heard.append(first)
    return heard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, {args.calls} calls each\n")
    print("| application | median ms | p95 ms | max ms |")
    print("|---|---|---|---|")
    for name, app in APPS.items():
        samples = sorted(asyncio.run(heard_after_ms(app, args.calls if name == "fast" else max(3, args.calls // 4))))
        p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
        print(f"| {name} | {statistics.median(samples):.0f} | {p95} | {samples[-1]} |")


if __name__ == "__main__":
    main()
