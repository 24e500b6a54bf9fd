"""``[plivo]``: the Plivo section of the settings (``CALLBRIDGE_PLIVO__…``)."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr

from callbridge.config_types import HttpUrl, Section

__all__ = ["PlivoSettings"]


class PlivoSettings(Section):
    auth_id: str | None = None
    auth_token: SecretStr | None = None
    """REST hang-up (basic auth with ``auth_id``) and the key of X-Plivo-Signature-V3."""
    validate_signatures: bool = True
    """Check X-Plivo-Signature-V3 on the webhooks. Switch off only for local development."""
    api_base_url: HttpUrl = "https://api.plivo.com"
    """Where the REST API (hang-up) is; a simulated Plivo in tests."""
    content_type: Literal["audio/x-mulaw;rate=8000", "audio/x-l16;rate=8000", "audio/x-l16;rate=16000"] = (
        "audio/x-mulaw;rate=8000"
    )
    """The ``<Stream contentType>``: the audio format of both directions."""
