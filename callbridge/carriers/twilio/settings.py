"""``[twilio]``: the Twilio section of the settings (``CALLBRIDGE_TWILIO__…``)."""

from __future__ import annotations

from pydantic import SecretStr

from callbridge.config_types import HttpUrl, Section

__all__ = ["TwilioSettings"]


class TwilioSettings(Section):
    auth_token: SecretStr | None = None
    validate_signatures: bool = True
    """Check X-Twilio-Signature on the webhooks and the media upgrade. Switch off only for local development."""
    api_base_url: HttpUrl = "https://api.twilio.com"
    """Where the REST API (hang-up) is; a regional host, or a simulated Twilio in tests."""
