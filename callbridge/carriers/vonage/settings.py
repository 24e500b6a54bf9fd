"""``[vonage]``: the Vonage section of the settings (``CALLBRIDGE_VONAGE__…``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, SecretStr

from callbridge.config_types import HttpUrl, Section, rsa_private_key_file, whole_number

__all__ = ["VonageSettings"]


class VonageSettings(Section):
    application_id: str | None = None
    """The Vonage application: claim of the REST hang-up JWT, and checked against signed webhooks' claim."""
    private_key_path: Annotated[Path, AfterValidator(rsa_private_key_file)] | None = None
    """The application's private key (PEM) that signs the REST hang-up JWT (RS256); read and parsed at load."""
    signature_secret: SecretStr | None = None
    """The account's signature secret: signed webhooks are HS256 JWTs over the body's SHA-256."""
    audio_rate_hz: Annotated[Literal[8000, 16000], BeforeValidator(whole_number)] = 16000
    """The L16 rate of the websocket (``content-type: audio/l16;rate=…``), both directions."""
    validate_signatures: bool = True
    """Check the signed-webhook JWT on the answer and event webhooks. Switch off only for local development."""
    api_base_url: HttpUrl = "https://api.nexmo.com"
    """Where the Voice REST API (hang-up) is; a regional host, or a simulated Vonage in tests."""
