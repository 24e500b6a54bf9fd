"""Twilio's answer webhook against ``callbridge serve`` with a Redis registry: how long the answer takes with the
engine session opened and parked at the answer (``engine.open_at_answer`` auto) and without (off).

    python bench/answer_latency.py [--answers 30]

Starts its own ``redis-server`` (as the tests do) and an in-process bridge with the embedded engine; posts signed
answers for new calls (no stream follows) and prints the median per mode, alternating off / auto twice. Each
request goes out in one write on a fresh connection: a client that writes the headers and the body apart (httpx
does) waits ~40 ms on loopback for the server's delayed ACK (Nagle), which would swamp what is measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

from twilio.request_validator import RequestValidator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sim.runner import running_bridge  # noqa: E402
from tests.bridge.twilio_e2e import engine, settings  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402


async def median_answer_ms(redis_url: str, mode: str, answers: int) -> float:
    config = settings(registry={"backend": "redis", "redis_url": redis_url}, engine={"open_at_answer": mode})
    async with running_bridge(config, engine(max_sessions=answers + 1)) as bridge:
        auth_token = bridge.settings.twilio.auth_token
        assert auth_token is not None
        validator = RequestValidator(auth_token.get_secret_value())
        url = bridge.base_url + "/twilio/voice"
        host, port = bridge.base_url.removeprefix("http://").split(":")
        took = []
        for _ in range(answers):
            params = {"CallSid": "CA" + secrets.token_hex(16), "AccountSid": bridge.carrier.account_sid, "From": "+1", "To": "+2"}
            body = urllib.parse.urlencode(params).encode()
            head = (
                f"POST /twilio/voice HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                f"X-Twilio-Signature: {validator.compute_signature(url, params)}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            started = time.perf_counter()
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(head.encode() + body)
            response = await reader.read()
            took.append((time.perf_counter() - started) * 1000)
            writer.close()
            assert b"<Connect>" in response, response[:300]
        return statistics.median(took)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=30)
    args = parser.parse_args()
    with redis_server() as (url, _):
        for mode in ("off", "auto", "off", "auto"):
            print(f"open_at_answer={mode}: median {await median_answer_ms(url, mode, args.answers):.1f} ms over {args.answers} answers")


if __name__ == "__main__":
    asyncio.run(main())
