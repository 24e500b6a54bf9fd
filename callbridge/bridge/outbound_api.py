"""``POST /calls``: the agent places a call (#42); ``DELETE /calls/{dial_id}`` gives up on one not answered yet
(200 ``canceled``: never dialled; 202 ``canceling``: the carrier stops its ringing and reports it; 409 answered;
404). ``Authorization: Bearer <outbound.api_token>`` is checked before
the body is read (none configured: every request is refused, 403); the body is a ``DialRequest`` as JSON, at most
``MAX_REQUEST_BYTES``. Taken: ``202 {"dial_id", "status": "dialing" | "queued", "queued_behind"}`` at once, the
call's progress following as events. Refused: ``{"error": reason, "detail"}`` with 400 (a bad request, a carrier
that cannot dial), 401 (no or a wrong token), 413, 429 (over the carrier's queue) or 503 (draining)."""

from __future__ import annotations

import hmac
from typing import Final

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from callbridge.bridge.dialer import Dialer
from callbridge.bridge.http_limits import read_body
from callbridge.carriers.webhooks import public_base
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound.request import DialAccepted, DialRequest

__all__ = ["MAX_REQUEST_BYTES", "outbound_router"]

log = get_logger(__name__)

MAX_REQUEST_BYTES: Final = 16 * 1024
"""A call request's body at most: numbers, an assistant's instructions and tools, metadata."""


def _refused(status: int, reason: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": reason, "detail": detail}, status_code=status)


def outbound_router(settings: Settings, dialer: Dialer) -> APIRouter:
    """``POST /calls`` over ``dialer``."""
    token = settings.outbound.api_token
    expected = f"Bearer {token.get_secret_value()}".encode() if token is not None else None
    if expected is None:
        log.info("outbound_not_configured", detail="no outbound.api_token: every POST /calls gets 403")
    router = APIRouter()

    def unauthorized(request: Request) -> JSONResponse | None:
        """The refusal of a request without the token (none configured: 403; none or another sent: 401), or None."""
        if expected is None:
            return _refused(403, "not_configured", "outbound calls are off here: set outbound.api_token")
        authorization = request.headers.get("authorization")
        if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
            log.warning("outbound_unauthorized", peer=request.client.host if request.client else None)
            return JSONResponse({"error": "unauthorized", "detail": "Authorization: Bearer <outbound.api_token>"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return None

    @router.post("/calls")
    async def place_call(request: Request) -> JSONResponse:
        refused = unauthorized(request)
        if refused is not None:
            return refused
        body = await read_body(request, MAX_REQUEST_BYTES)
        if body is None:
            return _refused(413, "too_large", f"a call request is at most {MAX_REQUEST_BYTES} bytes")
        try:
            dial = DialRequest.model_validate(orjson.loads(body))
        except orjson.JSONDecodeError:
            return _refused(400, "invalid_request", "the body is not JSON")
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)[:5])
            return _refused(400, "invalid_request", problems)
        placed = dialer.place(dial, public_base(settings, str(request.base_url)))
        if not isinstance(placed, DialAccepted):
            log.info("call_refused_to_place", carrier=dial.carrier, reason=placed.reason)
            return _refused(placed.status, placed.reason, placed.detail)
        status = "queued" if placed.queued_behind else "dialing"
        return JSONResponse({"dial_id": placed.dial_id, "status": status, "queued_behind": placed.queued_behind}, status_code=202)

    @router.delete("/calls/{dial_id}")
    async def cancel_call(dial_id: str, request: Request) -> JSONResponse:
        refused = unauthorized(request)
        if refused is not None:
            return refused
        match dialer.cancel(dial_id):
            case "canceled":
                return JSONResponse({"dial_id": dial_id, "status": "canceled"})
            case "canceling":
                return JSONResponse({"dial_id": dial_id, "status": "canceling"}, status_code=202)
            case "answered":
                return _refused(409, "answered", "the call was answered: it ends as any call does")
        return _refused(404, "not_found", "no call placed here and not over has this dial id")

    return router
