"""``[telnyx]``: the Telnyx section of the settings (``CALLBRIDGE_TELNYX__…``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr

from callbridge.config_types import HttpUrl, Section

__all__ = ["TelnyxSettings"]


class TelnyxSettings(Section):
    api_key: SecretStr | None = None
    """Call Control REST (answer, streaming_start, hangup): ``Authorization: Bearer <api_key>``."""
    public_key: Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$")] | None = None
    """The account's ed25519 public key (base64 of the 32 raw bytes, as the portal shows it) for webhook signatures."""
    validate_signatures: bool = True
    """Check ``telnyx-signature-ed25519`` on the webhooks. Switch off only for local development."""
    api_base_url: HttpUrl = "https://api.telnyx.com"
    """Where the Call Control API is (``/v2/calls/…``); a simulated Telnyx in tests."""
    connection_id: str | None = None
    """The Call Control application (connection) a call the agent places goes out on (``POST /v2/calls``)."""
    codec: Literal["PCMU", "PCMA"] = "PCMU"
    """The stream codec both ways (``stream_codec`` and ``stream_bidirectional_codec``): G.711 μ-law or A-law."""
