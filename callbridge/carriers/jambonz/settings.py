"""``[jambonz]``: jambonz's ``listen`` verb with bidirectional streaming (``CALLBRIDGE_JAMBONZ__…``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, SecretStr

from callbridge.config_types import Section, whole_number

__all__ = ["JambonzSettings"]


class JambonzSettings(Section):
    webhook_secret: SecretStr | None = None
    """The jambonz account's webhook secret: every webhook's ``Jambonz-Signature`` is checked with it."""
    validate_signatures: bool = True
    """Refuse a webhook whose ``Jambonz-Signature`` does not hold. Switch off only for local development."""
    ws_username: str | None = None
    """Credentials the ``listen`` verb gives jambonz (``wsAuth``) for the media websocket, sent as Basic auth on the
    upgrade; with them unset the upgrade is admitted by the stream's single-use token alone."""
    ws_password: SecretStr | None = None
    sample_rate_hz: Annotated[Literal[8000, 16000], BeforeValidator(whole_number)] = 16000
    """L16 both ways at this rate (``listen`` ``sampleRate`` and ``bidirectionalAudio.sampleRate``)."""
