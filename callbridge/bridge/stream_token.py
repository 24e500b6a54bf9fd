"""Stream tokens an application mints itself, for streams that do not start at callbridge's own answer webhook.

Many teams answer calls with TwiML of their own (a ``<Connect><Stream>`` pointed at the bridge, among verbs of
theirs). Such a stream carries no token callbridge minted, and a stream without one is refused (anyone can open a
websocket and name a call). With ``server.stream_token_secret`` set, the application mints one itself — an HMAC
over the call's id and an expiry, with that shared secret — and passes it as the stream's ``token`` parameter
(``<Parameter name="token" value="…"/>``):

    from callbridge.bridge.stream_token import mint_stream_token
    token = mint_stream_token(secret, call_sid)               # cb1.<expiry>.<hmac>; or: callbridge stream-token CA…

The bridge admits such a token once, for that call, until it expires (``DEFAULT_TTL_S``, 5 minutes, from when it
was minted): it is remembered in the registry, so a token seen once is refused again on any process. A carrier's
own check (a signature on the upgrade) holds as well where the carrier sends one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Final

from pydantic import SecretStr

from callbridge.bridge.registry import CallRegistry, StreamTokens

__all__ = ["DEFAULT_TTL_S", "MIN_SECRET_CHARS", "AppMintedTokens", "mint_stream_token", "stream_token_expiry"]

_VERSION: Final = "cb1"
DEFAULT_TTL_S: Final = 300
MIN_SECRET_CHARS: Final = 32
_MAX_TTL_S: Final = 86_400
"""A token valid longer than a day is refused: minted for the call being answered, it is used within seconds."""
_MAX_TOKEN_CHARS: Final = 128


def _mac(secret: str, call_id: str, expiry: int) -> str:
    return hmac.new(secret.encode(), f"{_VERSION}.{call_id}.{expiry}".encode(), hashlib.sha256).hexdigest()


def mint_stream_token(secret: str, call_id: str, ttl_s: int = DEFAULT_TTL_S, *, now_s: float | None = None) -> str:
    """A token for one stream of ``call_id`` (the carrier's own call id, as its stream's ``start`` names it), valid ``ttl_s``."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"a stream token secret has at least {MIN_SECRET_CHARS} characters")
    expiry = int(time.time() if now_s is None else now_s) + ttl_s
    return f"{_VERSION}.{expiry}.{_mac(secret, call_id, expiry)}"


def stream_token_expiry(secret: str, token: str, call_id: str, now_s: float) -> int | None:
    """When ``token`` expires, if it is one ``secret`` minted for ``call_id`` and still valid; else None."""
    version, _, rest = token.partition(".")
    expiry_text, _, mac = rest.partition(".")
    if version != _VERSION or not expiry_text.isdigit() or len(token) > _MAX_TOKEN_CHARS:
        return None
    expiry = int(expiry_text)
    if not now_s < expiry <= now_s + _MAX_TTL_S:
        return None
    return expiry if hmac.compare_digest(mac, _mac(secret, call_id, expiry)) else None


class AppMintedTokens(StreamTokens):
    """The registry's single-use tokens (``inner``), and those the application mints with ``secret``: each
    admitted once, remembered in ``registry`` until it expires."""

    def __init__(self, inner: StreamTokens, secret: SecretStr, registry: CallRegistry, *, clock: Callable[[], float] = time.time) -> None:
        self._inner, self._secret, self._registry, self._clock = inner, secret.get_secret_value(), registry, clock

    async def mint(self, call_id: str) -> str:
        return await self._inner.mint(call_id)

    async def consume(self, token: str | None, call_id: str) -> bool:
        if not token or not token.startswith(_VERSION + "."):
            return await self._inner.consume(token, call_id)
        now_s = self._clock()
        expiry = stream_token_expiry(self._secret, token, call_id, now_s)
        if expiry is None:
            return False
        keep_ms = int((expiry - now_s) * 1000) + 1000
        return await self._registry.remember_once(f"stream-token:{token.rsplit('.', 1)[1][:32]}", keep_ms)
