"""``callbridge call --to +15551230000 --from +15559870000 --carrier NAME``: place a call through a running bridge
(``POST /calls`` with ``outbound.api_token``, at ``--bridge``, else ``server.public_url``, else the configured host
and port). Prints the bridge's answer — the dial id — or its refusal, one line, and exits 0 or 1."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import httpx
import orjson

from callbridge.config import Settings
from callbridge.outbound_http import http_client

__all__ = ["add_call"]

_EXIT_REFUSED = 1
_EXIT_NOT_CONFIGURED = 2


def add_call(commands: Any, common: argparse.ArgumentParser) -> None:
    command = commands.add_parser("call", parents=[common], help="place a call through a running bridge (POST /calls)")
    command.add_argument("--to", required=True, help="the number to call, E.164 (+15551230000)")
    command.add_argument("--from", dest="from_", required=True, metavar="FROM", help="the number to call from, E.164")
    command.add_argument("--carrier", required=True, help="the carrier to dial through, by its name in callbridge")
    command.add_argument("--ring-timeout", type=int, default=None, help="seconds it rings unanswered (default outbound.ring_timeout_s)")
    command.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE", help="echoed in the call's events; repeatable")
    command.add_argument("--bridge", default=None, help="the bridge's base URL (default server.public_url, else http://host:port)")
    command.set_defaults(handler=_call)


def _call(settings: Settings, args: argparse.Namespace) -> int:
    token = settings.outbound.api_token
    if token is None:
        print("outbound.api_token is not set (CALLBRIDGE_OUTBOUND__API_TOKEN): the bridge refuses every call", file=sys.stderr)
        return _EXIT_NOT_CONFIGURED
    body: dict[str, Any] = {"carrier": args.carrier, "to": args.to, "from": args.from_}
    if args.ring_timeout is not None:
        body["ring_timeout_s"] = args.ring_timeout
    if args.metadata:
        body["metadata"] = dict(item.partition("=")[::2] for item in args.metadata)
    base = (args.bridge or settings.server.public_url or f"http://{settings.server.host}:{settings.server.port}").rstrip("/")
    try:
        status, answer = asyncio.run(_post(f"{base}/calls", body, token.get_secret_value()))
    except httpx.HTTPError as exc:
        print(f"cannot reach the bridge at {base}: {exc!r}", file=sys.stderr)
        return _EXIT_REFUSED
    print(orjson.dumps(answer).decode())
    return 0 if status == 202 else _EXIT_REFUSED


async def _post(url: str, body: dict[str, Any], token: str) -> tuple[int, Any]:
    async with http_client(timeout=10.0) as http:
        response = await http.post(url, json=body, headers={"Authorization": f"Bearer {token}"})
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, {"error": f"HTTP {response.status_code}", "detail": response.text[:200]}
