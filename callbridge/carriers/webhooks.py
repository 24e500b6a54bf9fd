"""What every carrier's HTTP side shares: the public URL it answers with, the parameters a user put on the answer
URL, the pause before a drained call's webhook is tried again, and HTTP Basic credentials checked in constant time."""

from __future__ import annotations

import binascii
import hmac
from typing import Final

from pydantic import SecretStr
from starlette.requests import Request

from callbridge.config import Settings

__all__ = ["DRAIN_RETRY_PAUSE_S", "BasicCredentials", "answer_url_parameters", "public_base", "ws_url"]

DRAIN_RETRY_PAUSE_S: Final = 1
"""How long a call whose reconnect reached a draining process waits before its webhook is tried again (TwiML's
``<Pause>`` counts whole seconds)."""


def public_base(settings: Settings, request_base: str) -> str:
    """The bridge's public https URL (``server.public_url``), or what the request came to (development)."""
    return (settings.server.public_url or request_base).rstrip("/")


_OWN_QUERY: Final = frozenset({"redirect", "dial"})
"""Query parameters the bridge puts on URLs it gives carriers (a TwiML ``<Redirect>``'s nonce, a placed call's dial
id): never the caller's."""


def answer_url_parameters(request: Request) -> list[tuple[str, str]]:
    """The query parameters of the URL a carrier's answer webhook came to — those a user set on the number's answer
    URL (``…/voice?customer_id=42``; a carrier signs the URL with its query where it signs at all) — but the
    bridge's own. They join the carrier's own parameters in ``CallContext.parameters``, first, so that the
    carrier's field wins a name both have; ``app.context_parameters`` lets through what the application sees."""
    return [(name, value) for name, value in request.query_params.multi_items() if name not in _OWN_QUERY]


def ws_url(http_url: str) -> str:
    """``https://…`` → ``wss://…`` (``http`` → ``ws``), for media URLs derived from the public base URL."""
    if http_url.startswith("https://"):
        return "wss://" + http_url.removeprefix("https://")
    if http_url.startswith("http://"):
        return "ws://" + http_url.removeprefix("http://")
    return http_url


class BasicCredentials:
    """A user name and password a carrier sends as ``Authorization: Basic`` (on a media upgrade, on
    callbacks); ``configured`` False when either is unset."""

    def __init__(self, user: str | None, password: SecretStr | None) -> None:
        self._pair: tuple[bytes, bytes] | None = None
        if user and password is not None and password.get_secret_value():
            self._pair = (user.encode(), password.get_secret_value().encode())

    @property
    def configured(self) -> bool:
        return self._pair is not None

    def valid(self, authorization: str | None) -> bool:
        """Whether ``authorization`` holds these credentials (False when none are configured)."""
        if self._pair is None or not authorization:
            return False
        scheme, _, encoded = authorization.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = binascii.a2b_base64(encoded.strip(), strict_mode=True)
        except ValueError:  # binascii.Error, or a header that is not ASCII (starlette decodes latin-1)
            return False
        user, sep, password = decoded.partition(b":")
        # both compared, always: the time taken says nothing about which part was wrong
        user_ok = hmac.compare_digest(user, self._pair[0])
        password_ok = hmac.compare_digest(password, self._pair[1])
        return bool(sep) and user_ok and password_ok
