"""``[twilio]``: the Twilio section of the settings (``CALLBRIDGE_TWILIO__…``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from callbridge.config_types import HttpUrl, Section

__all__ = ["TwilioSettings"]


class TwilioSettings(Section):
    auth_token: SecretStr | None = None
    account_sid: str | None = Field(default=None, pattern=r"^AC[0-9a-f]{32}$")
    """The account outbound calls are placed from (``POST /calls``); unset, Twilio cannot dial."""
    validate_signatures: bool = True
    """Check X-Twilio-Signature on the webhooks and the media upgrade. Switch off only for local development."""
    unsigned_upgrades: bool = False
    """Admit a media websocket whose upgrade carries no X-Twilio-Signature when its stream shows a token (one
    callbridge's answer minted, or one your application minted with ``server.stream_token_secret``), as a dialect's
    are: for Twilio-protocol senders that do not sign upgrades (a SIP-to-websocket bridge). A signature that is sent
    is still checked. Twilio itself signs them: leave it off for Twilio."""
    api_base_url: HttpUrl = "https://api.twilio.com"
    """Where the REST API (hang-up) is; a regional host, or a simulated Twilio in tests."""
