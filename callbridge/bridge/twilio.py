"""Twilio's HTTP side: the answer webhook (TwiML), the media websocket upgrade, the stream status callback,
signature validation and the REST hang-up (telephony-protocols.md §1.1, §1.6, §1.7, §7).

The answer webhook mints a single-use token for the call and answers
``<Connect><Stream>`` with it as a ``<Parameter>``, then ``<Redirect>`` back to
itself: if the stream drops, Twilio runs the redirect and the call gets a new
stream, which resumes the same engine session. ``X-Twilio-Signature`` is
checked with Twilio's own ``RequestValidator`` against the configured public
URL — ``wss://`` and no parameters for the upgrade — never against a URL
rebuilt from proxied headers. A failed check is a 403 and nothing else.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import quoteattr

import httpx
from fastapi import APIRouter, Request, Response, WebSocket
from twilio.request_validator import RequestValidator

from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.providers.twilio import TwilioCodec
from callbridge.bridge.services import BridgeServices
from callbridge.config import Settings
from callbridge.logging import get_logger

__all__ = ["TwilioRest", "public_base", "twilio_router", "twiml_connect"]

log = get_logger(__name__)

VOICE_PATH = "/twilio/voice"
MEDIA_PATH = "/twilio/media"
STATUS_PATH = "/twilio/stream-status"
_FORBIDDEN = 403


def public_base(settings: Settings, request_base: str) -> str:
    """The bridge's public https URL (``server.public_url``), or what the request came to (development)."""
    return (settings.server.public_url or request_base).rstrip("/")


def _ws_url(base: str) -> str:
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://")
    if base.startswith("http://"):
        return "ws://" + base.removeprefix("http://")
    return base


def twiml_connect(base: str, token: str) -> str:
    """``<Connect><Stream>`` with the call's token, then ``<Redirect>`` here for a new stream if it drops."""
    stream_url = quoteattr(_ws_url(base) + MEDIA_PATH)
    status_url = quoteattr(base + STATUS_PATH)
    voice_url = base + VOICE_PATH
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        "<Response><Connect>"
        f'<Stream url={stream_url} statusCallback={status_url} statusCallbackMethod="POST">'
        f'<Parameter name="token" value={quoteattr(token)}/>'
        "</Stream></Connect>"
        f'<Redirect method="POST">{voice_url}</Redirect>'
        "</Response>"
    )


_HANGUP = '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup/></Response>'
_BUSY = '<?xml version="1.0" encoding="UTF-8"?><Response><Reject reason="busy"/></Response>'


class _Signatures:
    def __init__(self, settings: Settings) -> None:
        token = settings.twilio.auth_token
        self.enabled = settings.twilio.validate_signatures
        self._validator = RequestValidator(token.get_secret_value()) if token else None

    def valid(self, url: str, params: dict[str, Any], signature: str | None) -> bool:
        if not self.enabled:
            return True
        if self._validator is None or not signature:
            return False
        return bool(self._validator.validate(url, params, signature))


def twilio_router(services: BridgeServices) -> APIRouter:
    """The Twilio endpoints of one bridge process."""
    settings = services.settings
    signatures = _Signatures(settings)
    if signatures.enabled and settings.twilio.auth_token is None:
        log.error("twilio_auth_token_missing", detail="twilio.auth_token is unset: every Twilio request gets 403")
    router = APIRouter()

    @router.post(VOICE_PATH)
    async def voice(request: Request) -> Response:
        form = {key: str(value) for key, value in (await request.form()).items()}
        base = public_base(settings, str(request.base_url))
        url = base + VOICE_PATH + (f"?{request.url.query}" if request.url.query else "")
        if not signatures.valid(url, form, request.headers.get("x-twilio-signature")):
            log.warning("twilio_signature_invalid", path=VOICE_PATH, call_id=form.get("CallSid"))
            return Response(status_code=_FORBIDDEN)
        call_id = form.get("CallSid")
        if not call_id:
            return Response("CallSid missing", status_code=400)
        if services.registry.ended_reason(call_id) is not None:
            return Response(_HANGUP, media_type="application/xml")
        known = call_id in services.active_calls or services.registry.get(call_id) is not None
        if services.draining or (not known and len(services.active_calls) >= settings.server.max_calls):
            log.warning("call_refused", call_id=call_id, reason="draining" if services.draining else "capacity")
            return Response(_BUSY, media_type="application/xml")
        token = services.tokens.mint(call_id)
        log.info("call_answered", call_id=call_id, provider="twilio", caller=form.get("From"))
        return Response(twiml_connect(base, token), media_type="application/xml")

    @router.websocket(MEDIA_PATH)
    async def media(websocket: WebSocket) -> None:
        base = public_base(settings, str(websocket.base_url).replace("ws", "http", 1))
        if not signatures.valid(_ws_url(base) + MEDIA_PATH, {}, websocket.headers.get("x-twilio-signature")):
            log.warning("twilio_signature_invalid", path=MEDIA_PATH)
            await websocket.close(code=1008)  # before accept: the upgrade is answered 403
            return
        await websocket.accept()
        await MediaStreamDriver(websocket, TwilioCodec(), services).run()

    @router.post(STATUS_PATH)
    async def stream_status(request: Request) -> Response:
        form = {key: str(value) for key, value in (await request.form()).items()}
        base = public_base(settings, str(request.base_url))
        if not signatures.valid(base + STATUS_PATH, form, request.headers.get("x-twilio-signature")):
            return Response(status_code=_FORBIDDEN)
        event = form.get("StreamEvent", "unknown")
        services.metrics.stream_status.labels("twilio", event).inc()
        log_fn = log.warning if event == "stream-error" else log.info
        log_fn("twilio_stream_status", call_id=form.get("CallSid"), stream_id=form.get("StreamSid"), stream_event=event, error=form.get("StreamError"))
        return Response(status_code=204)

    return router


class TwilioRest:
    """The one REST call the bridge makes: end a call (``Status=completed``)."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        self._base = settings.twilio.api_base_url.rstrip("/")
        token = settings.twilio.auth_token
        self._token = token.get_secret_value() if token else None
        self._client = client or httpx.AsyncClient(timeout=10.0)

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """Complete the call; a call that has already ended counts as done. Raises ``httpx.HTTPError``."""
        if not account_id or not self._token:
            raise RuntimeError("hang-up needs the call's AccountSid and twilio.auth_token")
        response = await self._client.post(
            f"{self._base}/2010-04-01/Accounts/{account_id}/Calls/{call_id}.json",
            data={"Status": "completed"},
            auth=(account_id, self._token),
        )
        if response.status_code in (404, 409) or (response.status_code == 400 and "not in-progress" in response.text):
            return  # already over
        response.raise_for_status()

    async def aclose(self) -> None:
        await self._client.aclose()
