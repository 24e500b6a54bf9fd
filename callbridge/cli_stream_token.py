"""``callbridge stream-token CALL_ID``: a stream token for one call, minted as your application would mint it with
``server.stream_token_secret`` (``bridge/stream_token.py``) — to try a TwiML of your own by hand, or from a script."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from callbridge.bridge.stream_token import DEFAULT_TTL_S, mint_stream_token
from callbridge.config import Settings

__all__ = ["add_stream_token"]

_EXIT_NOT_CONFIGURED = 2


def add_stream_token(commands: Any, common: argparse.ArgumentParser) -> None:
    command = commands.add_parser(
        "stream-token", parents=[common], help="mint a stream token for one call (server.stream_token_secret)"
    )
    command.add_argument("call_id", help="the carrier's call id, as the stream's start names it (a CallSid)")
    command.add_argument("--ttl", type=int, default=DEFAULT_TTL_S, help=f"seconds it is valid (default {DEFAULT_TTL_S})")
    command.set_defaults(handler=_stream_token)


def _stream_token(settings: Settings, args: argparse.Namespace) -> int:
    secret = settings.server.stream_token_secret
    if secret is None:
        print("server.stream_token_secret is not set (CALLBRIDGE_SERVER__STREAM_TOKEN_SECRET)", file=sys.stderr)
        return _EXIT_NOT_CONFIGURED
    print(mint_stream_token(secret.get_secret_value(), args.call_id, args.ttl))
    return 0
