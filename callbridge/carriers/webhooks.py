"""What every carrier's HTTP side shares: the public URL it answers with, and the pause before a drained call's
webhook is tried again."""

from __future__ import annotations

from typing import Final

from callbridge.config import Settings

__all__ = ["DRAIN_RETRY_PAUSE_S", "public_base", "ws_url"]

DRAIN_RETRY_PAUSE_S: Final = 1
"""How long a call whose reconnect reached a draining process waits before its webhook is tried again (TwiML's
``<Pause>`` counts whole seconds)."""


def public_base(settings: Settings, request_base: str) -> str:
    """The bridge's public https URL (``server.public_url``), or what the request came to (development)."""
    return (settings.server.public_url or request_base).rstrip("/")


def ws_url(http_url: str) -> str:
    """``https://…`` → ``wss://…`` (``http`` → ``ws``), for media URLs derived from the public base URL."""
    if http_url.startswith("https://"):
        return "wss://" + http_url.removeprefix("https://")
    if http_url.startswith("http://"):
        return "ws://" + http_url.removeprefix("http://")
    return http_url
