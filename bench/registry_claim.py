"""What the resume path's registry round trips cost, against a real ``redis-server`` on loopback, on the shipped client
(``registry_redis.redis_registry``): #39's one claim (``CallRegistry.claim_call``, one Lua script answering the
ended reason, the ticket taken, else the record's holder) against the separate round trips it replaced, in one run.

Each path is the registry work a new stream of a call does before its engine session is resumed, each operation
awaited before the next:

- ``resume``: a dropped stream's call (its ticket parked). Now (``bridge/lifecycle.py``): the token consumed, then
  ``claim_call``. Before (``resume_before``): the token, ``ended_reason``, ``claim_ticket``.
- ``takeover``: a dead process's call (no ticket, a live ticket): the first look and the claim, not the wait between
  them (``TAKEOVER_AFTER_MS``, polled every ``DETACH_POLL_MS``, now with ``claim_call``, before with
  ``claim_ticket`` + ``get``). Now: the token, ``claim_call`` (nothing parked; the holder), ``claim_live``. Before
  (``takeover_before``): the token, ``ended_reason``, ``claim_ticket``, ``get``, ``claim_live``.
- ``one_round_trip``: a ``PING``: what one round trip costs.

The token stays a round trip of its own: it is the stream's authentication, and nothing of the call is read or
taken for a stream before its token is found ours.

Run: ``python bench/registry_claim.py [--calls 2000]``; prints each path's median and p95 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import SecretStr  # noqa: E402

from callbridge.bridge.registry import LiveCall  # noqa: E402
from callbridge.bridge.registry_redis import redis_registry  # noqa: E402
from callbridge.config import RegistrySettings, Settings  # noqa: E402
from callbridge.engine.port import ResumeTicket  # noqa: E402
from callbridge.sim.redis_server import running_redis  # noqa: E402

_GRACE_MS = 30_000


async def _timed(calls: int, prepare: Callable[[str], Awaitable[str]], path: Callable[[str, str], Awaitable[None]]) -> list[float]:
    times: list[float] = []
    for i in range(calls):
        call_id = f"CA{i:032d}"
        token = await prepare(call_id)
        started = time.perf_counter()
        await path(call_id, token)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def _run(url: str, calls: int) -> dict[str, list[float]]:
    settings = Settings(registry=RegistrySettings(backend="redis", redis_url=SecretStr(url)))
    registry, tokens = redis_registry(settings)  # the shipped client: its timeouts, its retry
    client = registry._redis  # a PING on the same connection pool
    ticket = ResumeTicket("duplex-1", 1, heard_ms=(("resp-1", 1200),), told_ms=(("resp-1", 1200),))

    async def parked(call_id: str) -> str:
        await registry.detach(call_id, ticket, 4_000, _GRACE_MS)
        return await tokens.mint(call_id)

    async def held_by_the_dead(call_id: str) -> str:
        await registry.mark_bound(call_id, _GRACE_MS, LiveCall("dead:MZ1", ticket, 4_000))
        return await tokens.mint(call_id)

    async def resume(call_id: str, token: str) -> None:
        assert await tokens.consume(token, call_id)
        assert (await registry.claim_call(call_id, unless_ended=True)).ticket is not None

    async def takeover(call_id: str, token: str) -> None:
        assert await tokens.consume(token, call_id)
        claim = await registry.claim_call(call_id, unless_ended=True)
        assert claim.ticket is None and claim.live_holder is not None
        assert await registry.claim_live(call_id, claim.live_holder, "alive:MZ2") is not None

    async def resume_before(call_id: str, token: str) -> None:
        assert await tokens.consume(token, call_id)
        assert await registry.ended_reason(call_id) is None
        found, _ = await registry.claim_ticket(call_id)
        assert found is not None

    async def takeover_before(call_id: str, token: str) -> None:
        assert await tokens.consume(token, call_id)
        assert await registry.ended_reason(call_id) is None
        found, _ = await registry.claim_ticket(call_id)
        assert found is None
        record = await registry.get(call_id)
        assert record is not None and record.live is not None
        assert await registry.claim_live(call_id, record.live.holder, "alive:MZ2") is not None

    async def nothing(call_id: str) -> str:
        return ""

    async def ping(call_id: str, token: str) -> None:
        await client.ping()

    try:
        await _timed(200, nothing, ping)  # the connection pool and the server warm
        return {
            "one_round_trip": await _timed(calls, nothing, ping),
            "resume": await _timed(calls, parked, resume),
            "resume_before": await _timed(calls, parked, resume_before),
            "takeover": await _timed(calls, held_by_the_dead, takeover),
            "takeover_before": await _timed(calls, held_by_the_dead, takeover_before),
        }
    finally:
        await registry.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    with running_redis() as redis_url:
        results = asyncio.run(_run(redis_url, args.calls))
    for name, times in results.items():
        ordered = sorted(times)
        p95 = ordered[int(len(ordered) * 0.95)]
        print(f"{name:15s} median {statistics.median(times):6.3f} ms  p95 {p95:6.3f} ms  ({len(times)} calls)")


if __name__ == "__main__":
    main()
