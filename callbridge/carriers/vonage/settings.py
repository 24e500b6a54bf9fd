"""``[vonage]``: the Vonage section of the settings (``CALLBRIDGE_VONAGE__…``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, SecretStr

from callbridge.config_types import HttpUrl, Section, whole_number

__all__ = ["VonageSettings"]


def rsa_private_key_file(path: Path) -> Path:
    """An unencrypted PEM RSA private key that can be read (a Vonage application's ``private.key``), checked at load:
    otherwise the first hang-up would be the first to find out."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the private key file: {exc.strerror}") from None
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:
        raise ValueError("the private key is encrypted: give the unencrypted PEM Vonage generated") from None
    except ValueError:
        raise ValueError("not a PEM private key (-----BEGIN PRIVATE KEY-----): give the one Vonage generated") from None
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("not an RSA private key (Vonage signs with RS256)")
    return path


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
