"""One media URL for every websocket carrier, ``/media``: the carrier is recognised from its first messages
(``generic.wire``), for deployments that point several carriers at one URL.

Who may open it, decided at the upgrade by what the request carries, as each carrier of the registry checks its
own proof (``Carrier.generic_upgrade``: a signature header, ``Authorization: Basic`` credentials): refused when
a proof it carries is wrong and none is right. The stream must then carry a single-use token our answer webhook
minted for its call, as on the carrier's own media URL (a signature over a URL without parameters is the same
for every call, and most carriers sign nothing on the upgrade) — unless the proof that admitted it is the
carrier's own admission (configured credentials on a fixed URL), or ``server.generic_media_requires_token`` is
off. A subprotocol a carrier asks for (``Carrier.subprotocol``) is accepted.
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, WebSocket

from callbridge.bridge.carrier_plugin import Carrier, load_carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.generic.wire import DetectingCodec
from callbridge.carriers.spec import UpgradeCheck, UpgradeProof
from callbridge.carriers.webhooks import public_base, ws_url
from callbridge.config import Settings
from callbridge.logging import get_logger

__all__ = ["CARRIER", "MEDIA_PATH", "generic_router", "judge", "upgrade_checks", "websocket_carriers"]

log = get_logger(__name__)

MEDIA_PATH: Final = "/media"
_POLICY_VIOLATION: Final = 1008


def websocket_carriers() -> list[Carrier]:
    """Every carrier of the registry whose media may come to the generic URL."""
    from callbridge.carriers import CARRIERS

    return [load_carrier(spec) for spec in CARRIERS if spec.transport == "websocket" and spec.codec is not None]


def upgrade_checks(settings: Settings, carriers: list[Carrier]) -> list[UpgradeCheck]:
    """Each carrier's check of its own proof on an upgrade, with these settings."""
    return [carrier.generic_upgrade(settings) for carrier in carriers if carrier.generic_upgrade is not None]


def generic_router(services: CarrierServices) -> APIRouter:
    settings = services.settings
    carriers = websocket_carriers()
    checks = upgrade_checks(settings, carriers)
    subprotocols = {carrier.subprotocol for carrier in carriers if carrier.subprotocol is not None}
    router = APIRouter()

    @router.websocket(MEDIA_PATH)
    async def media(websocket: WebSocket) -> None:
        url = ws_url(public_base(settings, str(websocket.base_url).replace("ws", "http", 1))) + MEDIA_PATH
        peer = websocket.client.host if websocket.client else None
        proofs = [proof for check in checks if (proof := check(url, websocket.headers, peer)) is not None]
        refusal, check_token = judge(proofs, requires_token=settings.server.generic_media_requires_token)
        if refusal is None:
            refusal = await services.desk.stream_refusal("")
        if refusal is not None:
            services.metrics.stream_refused.labels("unknown", refusal).inc()
            log.warning("stream_refused", path=MEDIA_PATH, reason=refusal, peer=peer)
            await websocket.close(code=_POLICY_VIOLATION)  # before accept: the upgrade is answered 403
            return
        offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
        await websocket.accept(subprotocol=next((p for p in offered if p in subprotocols), None))
        await MediaStreamDriver(websocket, DetectingCodec(), services, check_token=check_token).run()

    return router


def judge(proofs: list[UpgradeProof], *, requires_token: bool) -> tuple[str | None, bool]:
    """The carriers' proofs on one upgrade → (why it is refused, or None; whether its stream needs our token).
    A wrong proof refuses unless another is right (two carriers read one ``Authorization`` header)."""
    admitting = [proof for proof in proofs if proof.refusal is None]
    if not admitting:
        refused = [proof.refusal for proof in proofs if proof.refusal is not None]
        if refused:
            return refused[0], True
    return None, requires_token and all(proof.token_needed for proof in admitting)


CARRIER: Final = Carrier(name="generic", router=generic_router)
