"""``[jambonz]``: jambonz's ``listen`` verb with bidirectional streaming (``CALLBRIDGE_JAMBONZ__…``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, SecretStr

from callbridge.config_types import HttpUrl, Section, whole_number

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
    api_base_url: HttpUrl = "https://jambonz.cloud/api"
    """The jambonz REST API (``…/v1/Accounts/{account_sid}/Calls``): jambonz.cloud's, or your own api-server's."""
    account_sid: str | None = None
    """The account a call the agent places is made from (``POST /calls`` with ``"carrier": "jambonz"``)."""
    api_key: SecretStr | None = None
    """The account's API key (``Authorization: Bearer``) for the REST API."""
