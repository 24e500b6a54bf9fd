"""What a crashed bridge costs its caller (#40: "the caller's next answer came 553 ms beyond the carrier's reconnect",
against a goal of 500 ms): SIGKILL of the bridge serving a Twilio call in the middle of the agent's reply; the
simulated carrier's ``<Redirect>`` reaches the other bridge, which takes the call's engine session over.

The fleet of ``tests/bridge/test_fleet.py`` (real processes: ``redis-server``, ``callbridge engine-server`` with the
echo agent, bridges A and B on the shipped settings but Redis; the simulated Twilio over loopback), one call a try,
the roles of A and B swapped each try (the killed one started again). For each try:

- ``bound``: from the new stream's start to its engine session in hand (the other bridge's ``call_bridged``
  ``bound_after_ms``);
- ``silence``: the silence the caller hears across the reconnect, in the middle of the reply: from the last agent
  audio before the new stream started (on the caller's clock) to the first after it — the rest of the reply the
  crash cut, played from the other bridge (what the carrier still had queued plays meanwhile: this is what is left).

Run: ``python bench/crash_resume.py [--tries 10]``; prints each try's figures, then their medians and p95s (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sim.carrier import CallerScript  # noqa: E402
from callbridge.sim.redis_server import running_redis  # noqa: E402
from tests.bridge.test_fleet import Fleet, Process, _first_then, _stream_started_at, running_fleet  # noqa: E402
from tests.bridge.twilio_e2e import short_speech, until  # noqa: E402

_SAMPLES_PER_MS = 8
"""What the simulated caller hears: PCM16 at 8 kHz."""
_KILL_AT_S = 2.2
"""After the first stream started: the echo agent's reply to the caller's first words (0.3–1.5 s) is playing."""


async def _try(fleet: Fleet, first: Process, then: Process) -> tuple[int, int]:
    fleet.twilio.route = _first_then(first.url, then.url)
    speech = short_speech(1200)
    call = asyncio.create_task(fleet.twilio.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=6000)))
    await until(lambda: bool(first.events("call_bridged")), timeout_s=10)
    await asyncio.sleep(_KILL_AT_S)
    first.process.kill()
    result = await call
    at = _stream_started_at(result, 1) * _SAMPLES_PER_MS
    loud = np.flatnonzero(np.abs(np.frombuffer(bytes(result.heard), dtype="<i2")) > 0)
    before, after = loud[loud < at], loud[loud >= at]
    (bridged,) = then.events("call_bridged", call_id=result.call_sid)
    if not len(before) or not len(after) or bridged["engine"] != "taken_over":
        raise SystemExit(f"not taken over, or not heard across it: {bridged}\n{result.render()}")
    return int(bridged["bound_after_ms"]), int(after[0] - before[-1]) // _SAMPLES_PER_MS


async def _run(redis_url: str, tries: int) -> list[tuple[int, int]]:
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        async with running_fleet(redis_url, Path(tmp)) as fleet:
            bridges = [fleet.a, fleet.b]
            for index in range(tries):
                first, then = bridges[index % 2], bridges[1 - index % 2]
                figures.append(await _try(fleet, first, then))
                print(f"try {index + 1}: bound {figures[-1][0]} ms, silence {figures[-1][1]} ms across the reconnect", flush=True)
                port = int(first.url.rsplit(":", 1)[1])
                bridges[index % 2] = await asyncio.to_thread(fleet.spawn, f"{first.name}-{index}", ["serve"], port, "/readyz")
    return figures


def _p95(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    args = parser.parse_args()
    with running_redis() as redis_url:
        figures = asyncio.run(_run(redis_url, args.tries))
    for name, values in (("bound", [b for b, _ in figures]), ("silence", [h for _, h in figures])):
        print(f"{name}: median {statistics.median(values):.0f} ms, p95 {_p95(values)} ms ({len(values)} tries)")


if __name__ == "__main__":
    main()
