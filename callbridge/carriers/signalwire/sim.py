"""A simulated SignalWire space: the simulated Twilio under SignalWire's names."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from callbridge.carriers.twilio.sim import SimulatedTwilio

__all__ = ["SimulatedSignalWire"]


class SimulatedSignalWire(SimulatedTwilio):
    """SignalWire's cXML: Twilio's wire with ``X-SignalWire-Signature``, ``/api/laml`` REST, and ``L16@24000h``."""

    provider: ClassVar[str] = "signalwire"
    signature_header: ClassVar[str] = "X-SignalWire-Signature"
    signs_upgrade: ClassVar[bool] = False
    rest_prefix: ClassVar[str] = "/api/laml"
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/api/laml/2010-04-01/Accounts/{account}/Calls.json"})
    stream_codecs: ClassVar[Mapping[str, Mapping[str, object]]] = {
        "L16@24000h": {"encoding": "audio/x-l16", "sampleRate": 24000, "channels": 1},
    }

    def __init__(self, bridge_url: str, secret: str) -> None:
        super().__init__(bridge_url, secret, account_sid=project_of(secret))

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        # the project id (made from the secret) places calls; a hang-up names the AccountSid of the call's start
        return {"signalwire": {"signing_key": secret, "api_token": secret, "api_base_url": rest_url + cls.rest_prefix, "project_id": project_of(secret)}}


def project_of(secret: str) -> str:
    """The simulated space's project id (a UUID, as SignalWire's are), made from its secret."""
    return str(uuid.UUID(hashlib.sha256(secret.encode()).hexdigest()[:32]))
