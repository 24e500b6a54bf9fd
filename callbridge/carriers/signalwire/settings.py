"""``[signalwire]``: the SignalWire section of the settings (``CALLBRIDGE_SIGNALWIRE__…``)."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr

from callbridge.config_types import HttpUrl, Section

__all__ = ["SignalWireSettings"]


class SignalWireSettings(Section):
    project_id: str | None = None
    api_token: SecretStr | None = None
    signing_key: SecretStr | None = None
    space_url: str | None = None
    """``example.signalwire.com``: the REST API is ``https://<space_url>/api/laml``."""
    validate_signatures: bool = True
    codec: Literal["PCMU", "L16@24000h"] = "PCMU"
    """The ``<Stream codec>``: μ-law 8 kHz, or PCM16 24 kHz both ways."""
    api_base_url: HttpUrl | None = None
    """Overrides the REST base derived from ``space_url`` (tests point it at a simulated SignalWire)."""
