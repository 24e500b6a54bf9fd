"""``[exotel]``: the Exotel section of the settings (``CALLBRIDGE_EXOTEL__…``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr

from callbridge.config_types import Network, Section

__all__ = ["ExotelSettings"]


class ExotelSettings(Section):
    account_sid: str | None = None
    """For reference (logs); the bridge makes no Exotel REST call: closing the socket ends the bot segment."""
    api_key: str | None = None
    """The user part of the Voicebot URL ``wss://API_KEY:API_TOKEN@host/exotel/media`` (sent as Basic auth)."""
    api_token: SecretStr | None = None
    validate_credentials: bool = True
    """Refuse a media upgrade whose ``Authorization: Basic`` is not ``api_key:api_token``."""
    allowed_sources: list[Network] = Field(default_factory=list)
    """CIDRs (or addresses) Exotel connects from; empty: any. The peer address as the server sees it."""
    min_chunk_bytes: Annotated[int, Field(ge=320, le=99840, multiple_of=320)] = 3200
    """The smallest outbound media chunk (Exotel: 3.2 kB, a multiple of 320); frames are also ≥ 100 ms."""
