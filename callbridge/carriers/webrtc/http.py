"""``/talk``: the browser phone's page and its offer (``POST /talk/offer``), as the ``webrtc`` carrier's routes.

Who may call: with ``webrtc.token`` set, a request that shows it (``?token=`` on the page, ``Authorization: Bearer``
on the offer; compared in constant time); without one, only a browser on this machine (a loopback peer whose request
carries no proxy's forwarding header). Everyone else: 401 (a missing or wrong token) or 403 (no token configured), before
anything is read. The offer's body is at most ``MAX_OFFER_BYTES``: ``{"sdp", "type": "offer", "parameters"}``, the
parameters (the page's query string) at most ``MAX_PARAMETERS`` short strings. Answered: ``{"call_id", "sdp",
"type": "answer"}``; refused: ``{"error", "detail"}`` with 400, 401, 403, 413 or 503 (``phones.py``)."""

from __future__ import annotations

import hmac
import ipaddress
from contextlib import AbstractAsyncContextManager
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, cast

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.http_limits import read_body
from callbridge.carriers.webrtc.wire import PROVIDER
from callbridge.logging import get_logger

if TYPE_CHECKING:
    from callbridge.carriers.webrtc.phones import BrowserPhones

__all__ = ["CARRIER", "MAX_OFFER_BYTES", "MAX_PARAMETERS", "talk_router"]

log = get_logger(__name__)

MAX_OFFER_BYTES: Final = 32 * 1024
"""An offer's body at most: a browser's audio offer with its candidates is 3 to 8 KiB."""
MAX_PARAMETERS: Final = 16
_MAX_PARAMETER_CHARS: Final = 256
_FORWARDING_HEADERS: Final = ("forwarded", "x-forwarded-for", "x-real-ip")
_PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; media-src 'self' blob:",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def _refused(status: int, reason: str, detail: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": reason, "detail": detail}, status_code=status, headers=headers or None)


def _loopback(request: Request) -> bool:
    """The request comes from this machine, not through a proxy (which would make every browser look local)."""
    if request.client is None or any(name in request.headers for name in _FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:
        return False


def talk_router(services: CarrierServices) -> APIRouter:
    """``GET /talk`` and ``POST /talk/offer`` (see the module docstring); 404 both while ``webrtc.enabled`` is off."""
    settings = services.settings.webrtc
    router = APIRouter()
    if not settings.enabled:
        return router
    token = settings.token.get_secret_value().encode() if settings.token is not None else None
    page = resources.files("callbridge.carriers.webrtc").joinpath("talk.html").read_text(encoding="utf-8")

    def unauthorized(request: Request, shown: str | None) -> JSONResponse | None:
        peer = request.client.host if request.client else None
        if token is None:
            if _loopback(request):
                return None
            log.warning("webrtc_refused", reason="not_configured", peer=peer)
            return _refused(403, "not_configured", "set webrtc.token to take browser calls from other machines")
        if shown is None or not hmac.compare_digest(shown.encode(), token):
            log.warning("webrtc_refused", reason="unauthorized", peer=peer)
            return _refused(401, "unauthorized", "the page's ?token= (webrtc.token)", **{"WWW-Authenticate": "Bearer"})
        return None

    @router.get("/talk")
    async def talk_page(request: Request) -> Response:
        refused = unauthorized(request, request.query_params.get("token"))
        if refused is not None:
            return refused
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    @router.post("/talk/offer")
    async def talk_offer(request: Request) -> JSONResponse:
        authorization = request.headers.get("authorization", "")
        refused = unauthorized(request, authorization[7:] if authorization.startswith("Bearer ") else None)
        if refused is not None:
            return refused
        body = await read_body(request, MAX_OFFER_BYTES)
        if body is None:
            return _refused(413, "too_large", f"an offer is at most {MAX_OFFER_BYTES} bytes")
        offer = _offer(body)
        if isinstance(offer, str):
            return _refused(400, "invalid_offer", offer)
        phones = cast("BrowserPhones | None", services.carrier_state.get(PROVIDER))
        if phones is None:
            return _refused(503, "not_running", "the browser phone is not running in this process")
        sdp, parameters = offer
        if not settings.context_parameters_from_query:
            parameters = {}
        answered = await phones.answer(sdp, parameters, request.client.host if request.client else None)
        if answered.refusal is not None:
            status, reason, detail = answered.refusal
            return _refused(status, reason, detail)
        return JSONResponse({"call_id": answered.call_id, "sdp": answered.sdp, "type": "answer"})

    return router


def _offer(body: bytes) -> tuple[str, dict[str, str]] | str:
    """The offer's SDP and parameters, or what is wrong with it."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "the body is not JSON"
    if not isinstance(data, dict) or data.get("type") != "offer" or not isinstance(data.get("sdp"), str):
        return 'expected {"type": "offer", "sdp": "..."}'
    parameters = data.get("parameters", {})
    if not isinstance(parameters, dict) or len(parameters) > MAX_PARAMETERS:
        return f"parameters: an object of at most {MAX_PARAMETERS} strings"
    kept = {
        str(name)[:64]: value[:_MAX_PARAMETER_CHARS] for name, value in parameters.items() if isinstance(value, str) and name != "token"
    }
    return data["sdp"], kept


def browser_phones(services: CarrierServices) -> AbstractAsyncContextManager[object]:
    """The process's browser calls (``phones.py``; aiortc is loaded with the first offer)."""
    from callbridge.carriers.webrtc.phones import BrowserPhones  # the call core: not for reading the carrier registry

    return BrowserPhones(services)


CARRIER = Carrier(name=PROVIDER, router=talk_router, listener=browser_phones)
