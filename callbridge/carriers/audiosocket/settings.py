"""``[audiosocket]``: the Asterisk AudioSocket section of the settings (``CALLBRIDGE_AUDIOSOCKET__…``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from callbridge.config_types import Network, Port, Section

__all__ = ["AudioSocketSettings"]


class AudioSocketSettings(Section):
    """Asterisk AudioSocket: a TCP listener Asterisk connects to (``AudioSocket(<uuid>,host:port)``)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: Port = 9092
    allowed_sources: list[Network] = Field(default_factory=lambda: ["127.0.0.1/32", "::1/128"])
    """CIDRs Asterisk may connect from; other peers are closed at once (AudioSocket has no credentials)."""
    first_frame_timeout_s: Annotated[float, Field(gt=0, le=60)] = 5.0
    """How long a new connection may take to send its uuid frame, and then its first audio frame."""
    idle_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """A connection that sends nothing for this long counts as dropped (Asterisk sends a frame every 20 ms). Time
    this process itself did not run (stopped, its VM frozen) is not taken for Asterisk's silence: the verdict waits
    until what came meanwhile is read."""
