"""``[bandwidth]``: Bandwidth Programmable Voice (``CALLBRIDGE_BANDWIDTH__…``)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import SecretStr

from callbridge.config_types import HttpUrl, Section

__all__ = ["BandwidthSettings"]

_PCM_RATES_HZ: Final = {"pcm8k": 8000, "pcm16k": 16000, "pcm24k": 24000}


class BandwidthSettings(Section):
    account_id: str | None = None
    """The Bandwidth account whose Voice API the REST calls use (hang-up, stream restart)."""
    application_id: str | None = None
    """The Voice application a call the agent places belongs to (``POST …/calls``): needed only to dial."""
    client_id: str | None = None
    """OAuth 2.0 client credentials for the Voice API (Bandwidth's identity provider issues a bearer token)."""
    client_secret: SecretStr | None = None
    callback_username: str | None = None
    """The Voice application's callback credentials: Bandwidth sends them as ``Authorization: Basic`` on every
    webhook, which is refused without them."""
    callback_password: SecretStr | None = None
    validate_credentials: bool = True
    """Refuse a webhook without the callback credentials. Switch off only for local development."""
    api_base_url: HttpUrl = "https://voice.bandwidth.com/api/v2"
    """The Voice API (``…/accounts/{account}/calls/{call}``); a simulated Bandwidth in tests."""
    token_url: HttpUrl = "https://api.bandwidth.com/api/v1/oauth2/token"
    """Where the OAuth 2.0 ``client_credentials`` token comes from."""
    playback: Literal["pcmu", "pcm8k", "pcm16k", "pcm24k"] = "pcmu"
    """What the agent's audio goes to Bandwidth in (``playAudio``): μ-law at 8 kHz, or 16-bit PCM at 8, 16 or
    24 kHz (less lossy; wideband where the caller's leg carries it). The caller's audio comes as μ-law either way."""

    @property
    def pcm_out_rate_hz(self) -> int | None:
        return _PCM_RATES_HZ.get(self.playback)
