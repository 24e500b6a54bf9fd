"""Exotel's side of the bridge: the Voicebot applet's media websocket and who may open it
(telephony-protocols.md §3.3, §7).

Exotel has no answer webhook to mint a per-call token in: the Voicebot applet
of an App Bazaar flow holds a fixed URL, ``wss://API_KEY:API_TOKEN@host/exotel/media``
(optionally ``?sample-rate=16000`` and up to three custom parameters, which
reach ``start.custom_parameters``). Exotel turns the credentials into
``Authorization: Basic …`` on the upgrade. So a stream is admitted before the
upgrade is accepted, by

- those credentials, compared in constant time with ``exotel.api_key`` /
  ``exotel.api_token`` (unless ``exotel.validate_credentials = false``);
- the peer address, when ``exotel.allowed_sources`` lists CIDRs;
- capacity: ``services.desk.stream_refusal`` with no call id yet (the call id arrives in
  ``start``, after the upgrade), so a process that is draining or full refuses
  every new stream, even one that would resume a call it holds.

A refused upgrade is closed before it is accepted: the handshake is answered
403 (Exotel retries a failed handshake once, then its flow moves on).

Hanging up is closing the socket (``HangUpMode.CLOSE``): the flow goes on to
its next applet, normally Hangup; there is no REST client. If the socket drops,
a flow that routes back into the Voicebot applet opens a new stream with the
same ``call_sid``, which resumes the same engine session through the registry
within ``engine.disconnect_grace_s``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from fastapi import APIRouter, WebSocket

from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.exotel.settings import ExotelSettings
from callbridge.carriers.exotel.wire import ExotelCodec
from callbridge.carriers.spec import UpgradeCheck, UpgradeProof
from callbridge.carriers.webhooks import BasicCredentials
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.sources import Network, source_allowed

__all__ = ["CARRIER", "MEDIA_PATH", "ExotelAdmission", "exotel_router"]

log = get_logger(__name__)

MEDIA_PATH: Final = "/exotel/media"
_POLICY_VIOLATION: Final = 1008

IPNetwork = Network


@dataclass(frozen=True, slots=True)
class ExotelAdmission:
    """Who may open an Exotel media stream: Basic credentials and source networks (see the module docstring)."""

    validate_credentials: bool
    credentials: BasicCredentials
    """``api_key:api_token``; when not configured every checked upgrade fails."""
    allowed_sources: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_settings(cls, config: ExotelSettings) -> ExotelAdmission:
        """Raises ``ValueError`` for an ``allowed_sources`` entry that is not an address or a CIDR."""
        credentials = BasicCredentials(config.api_key, config.api_token)
        return cls(config.validate_credentials, credentials, _networks(config.allowed_sources))

    def refusal(self, authorization: str | None, peer: str | None) -> str | None:
        """Why this upgrade is refused, or None when it is admitted."""
        if self.allowed_sources and not source_allowed(peer, self.allowed_sources):
            return "source_not_allowed"
        if self.validate_credentials and not self.credentials.valid(authorization):
            return "bad_credentials"
        return None


def _networks(entries: Sequence[str]) -> tuple[IPNetwork, ...]:
    networks: list[IPNetwork] = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise ValueError(f"exotel.allowed_sources: {entry!r} is not an address or a CIDR: {exc}") from None
    return tuple(networks)


def exotel_router(services: CarrierServices) -> APIRouter:
    """The Voicebot applet's media websocket."""
    settings = services.settings
    config = settings.exotel
    admission = ExotelAdmission.from_settings(config)
    if admission.validate_credentials and not admission.credentials.configured:
        log.info("carrier_not_configured", provider="exotel", detail="no exotel.api_key/api_token: every Exotel stream gets 403")
    elif not admission.validate_credentials and not admission.allowed_sources:
        log.warning("exotel_unauthenticated", detail="exotel.validate_credentials is off and allowed_sources is empty")
    router = APIRouter()

    @router.websocket(MEDIA_PATH)
    async def media(websocket: WebSocket) -> None:
        peer = websocket.client.host if websocket.client else None
        reason = admission.refusal(websocket.headers.get("authorization"), peer)
        if reason is None:  # no call id before ``start``: capacity only
            reason = await services.desk.stream_refusal("")
        if reason is not None:
            services.metrics.stream_refused.labels("exotel", reason).inc()
            log.warning("stream_refused", provider="exotel", reason=reason, peer=peer)
            await websocket.close(code=_POLICY_VIOLATION)  # before accept: the upgrade is answered 403
            return
        await websocket.accept()
        codec = ExotelCodec(min_chunk_bytes=config.min_chunk_bytes, lead_ms=settings.audio.playout_lead_ms)
        await MediaStreamDriver(websocket, codec, services, check_token=False).run()

    return router


def exotel_upgrade(settings: Settings) -> UpgradeCheck:
    """At the generic ``/media`` URL: ``Authorization: Basic`` is checked as Exotel's (``exotel.*``); credentials
    that pass admit the stream without our token, as on Exotel's own URL (Exotel's applet URL is fixed)."""
    admission = ExotelAdmission.from_settings(settings.exotel)

    def check(url: str, headers: Mapping[str, str], peer: str | None) -> UpgradeProof | None:
        authorization = headers.get("authorization")
        if authorization is None or not authorization.lower().startswith("basic "):
            return None
        refusal = admission.refusal(authorization, peer)
        return UpgradeProof(refusal) if refusal is not None else UpgradeProof(token_needed=False)

    return check


CARRIER: Final = Carrier(name="exotel", router=exotel_router, generic_upgrade=exotel_upgrade)
