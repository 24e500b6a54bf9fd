"""jambonz's HTTP side: the call webhook (a ``listen`` verb), the ``listen``'s action hook, the call-status
webhook, ``Jambonz-Signature`` checks, and the media websocket (``docs/carriers/jambonz.md``).

    call webhook            ──▶  [listen: wss://…/jambonz/media, bidirectional streaming L16, passDtmf, the
                                  call's single-use token in metadata, actionHook → /jambonz/action]
    listen's actionHook     ──▶  the listen ended: the call is over for the bridge (its hang-up's ``disconnect``)
                                  → [hangup]; its socket dropped while the call is up → a new listen (a new
                                  token; the same engine session resumes)
    call-status webhook     ──▶  ``completed`` / ``failed`` …: the call is over (jambonz says nothing on the
                                  socket when the caller hangs up)

Every webhook must carry a valid ``Jambonz-Signature`` (``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">``,
keyed with the account's webhook secret), at most 5 minutes old, and is taken once (replay). The media upgrade
carries Basic auth when ``jambonz.ws_username`` is set (the verb's ``wsAuth``); the stream is bridged only with
the token the answer minted.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson
from fastapi import APIRouter, Request, Response, WebSocket

from callbridge.application.context import call_context
from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.jambonz.rest import ANSWER_PATH, STATUS_PATH, jambonz_rest, placed_call_progress
from callbridge.carriers.jambonz.settings import JambonzSettings
from callbridge.carriers.jambonz.wire import SUBPROTOCOL, TOKEN_KEY, JambonzCodec
from callbridge.carriers.spec import UpgradeCheck, UpgradeProof
from callbridge.carriers.webhooks import BasicCredentials, answer_url_parameters, public_base, ws_url
from callbridge.config import Settings
from callbridge.logging import get_logger

__all__ = [
    "ACTION_PATH",
    "ANSWER_PATH",
    "CARRIER",
    "MEDIA_PATH",
    "SIGNATURE_TOLERANCE_S",
    "STATUS_PATH",
    "accept_listen",
    "jambonz_router",
    "jambonz_signature",
    "listen_verbs",
    "upgrade_credentials",
    "valid_signature",
]

log = get_logger(__name__)

ACTION_PATH: Final = "/jambonz/action"
MEDIA_PATH: Final = "/jambonz/media"
SIGNATURE_HEADER: Final = "jambonz-signature"
SIGNATURE_TOLERANCE_S: Final = 300
"""How old (or how far ahead) a signature's timestamp may be."""
_ENDED_STATUSES: Final = frozenset({"completed", "failed", "busy", "no-answer"})
_HANGUP: Final = '[{"verb":"hangup"}]'
_FORBIDDEN = 403
_POLICY_VIOLATION = 1008


def jambonz_signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Jambonz-Signature`` header for ``body`` sent at ``timestamp``, as jambonz computes it."""
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def valid_signature(secret: str, header: str | None, body: bytes, now_s: float) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` and a timestamp within ``SIGNATURE_TOLERANCE_S``."""
    if not header:
        return False
    fields = dict(part.strip().partition("=")[::2] for part in header.split(","))
    try:
        timestamp = int(fields.get("t", ""))
    except ValueError:
        return False
    if abs(now_s - timestamp) > SIGNATURE_TOLERANCE_S:
        return False
    expected = jambonz_signature(secret, timestamp, body).rpartition("v1=")[2]
    return hmac.compare_digest(expected.encode(), fields.get("v1", "").encode())


def upgrade_credentials(config: JambonzSettings) -> BasicCredentials:
    """The media upgrade's Basic credentials: the ``listen`` verb's ``wsAuth`` (not configured: none asked for)."""
    return BasicCredentials(config.ws_username, config.ws_password)


async def accept_listen(websocket: WebSocket) -> None:
    """Accept a media upgrade, with jambonz's subprotocol when the peer asks for it (jambonz does)."""
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)


def dial_verbs(target: str) -> bytes:
    """The call sent on: jambonz's ``dial`` verb to the number or the SIP URI."""
    dialled = {"type": "sip", "sipUri": target} if target.startswith(("sip:", "sips:")) else {"type": "phone", "number": target}
    return orjson.dumps([{"verb": "dial", "target": [dialled]}])


def listen_verbs(base: str, token: str, config: JambonzSettings) -> bytes:
    """The call's verbs: one bidirectional, streaming ``listen`` carrying the token in its metadata."""
    listen: dict[str, Any] = {
        "verb": "listen",
        "url": ws_url(base) + MEDIA_PATH,
        "mixType": "mono",
        "sampleRate": config.sample_rate_hz,
        "passDtmf": True,
        "bidirectionalAudio": {"enabled": True, "streaming": True, "sampleRate": config.sample_rate_hz},
        "metadata": {TOKEN_KEY: token},
        "actionHook": base + ACTION_PATH,
    }
    if upgrade_credentials(config).configured:
        assert config.ws_username is not None and config.ws_password is not None
        listen["wsAuth"] = {"username": config.ws_username, "password": config.ws_password.get_secret_value()}
    return orjson.dumps([listen])


class _JambonzWebhooks:
    """jambonz's webhooks and media socket, a method a route (``jambonz_router`` mounts them)."""

    def __init__(self, services: CarrierServices) -> None:
        self.services, self.settings = services, services.settings
        self.config = config = self.settings.jambonz
        self.secret = config.webhook_secret.get_secret_value() if config.webhook_secret else None
        if config.validate_signatures and self.secret is None:
            log.info("carrier_not_configured", provider="jambonz", detail="no jambonz.webhook_secret: every jambonz webhook gets 403")
        self.upgrade = upgrade_credentials(config)

    async def _checked(self, request: Request, path: str) -> dict[str, Any] | None:
        """The webhook's JSON, when its signature holds and it was not seen before; else None (403)."""
        body = await request.body()
        header = request.headers.get(SIGNATURE_HEADER)
        if self.config.validate_signatures:
            if self.secret is None or not valid_signature(self.secret, header, body, time.time()):
                log.warning("signature_invalid", provider="jambonz", path=path)
                return None
            assert header is not None
            if not await self.services.replays.first_sight(request, "jambonz", header, keep_s=2 * SIGNATURE_TOLERANCE_S):
                return None
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return {}
        return payload if isinstance(payload, dict) else {}

    async def _listen(self, request: Request, path: str) -> Response:
        payload = await self._checked(request, path)
        if payload is None:
            return Response(status_code=_FORBIDDEN)
        call_id = payload.get("call_sid", payload.get("callSid"))
        if not isinstance(call_id, str) or not call_id:
            return Response("call_sid missing", status_code=400)
        sip = payload.get("sip")
        headers = sip.get("headers") if isinstance(sip, dict) else None
        context = call_context(
            call_id=call_id, carrier="jambonz", caller=payload.get("from"), called=payload.get("to"),
            caller_name=payload.get("caller_name", payload.get("callerName")),
            account_id=payload.get("account_sid", payload.get("accountSid")),
            carrier_call_id=payload.get("call_id", payload.get("callId")),
            outbound=payload.get("direction") == "outbound",
            parameters=[*answer_url_parameters(request), *_sip_headers(headers)],
            allowed=self.settings.app.context_parameters,
        )  # fmt: skip
        dial_id = request.query_params.get("dial") if path == ANSWER_PATH else None
        decision = await self.services.desk.decide_answer(call_id, "jambonz", retries=False, context=context, dial_id=dial_id)
        if decision.kind is AnswerKind.TRANSFER and decision.target is not None:
            return Response(dial_verbs(decision.target), media_type="application/json")
        if decision.kind is not AnswerKind.ANSWER or decision.token is None:
            return Response(_HANGUP, media_type="application/json")
        if path == ANSWER_PATH:
            log.info("call_answered", call_id=call_id, provider="jambonz", caller=payload.get("from"))
        else:
            log.info("stream_restarted", provider="jambonz", call_id=call_id)
        base = public_base(self.settings, str(request.base_url))
        return Response(listen_verbs(base, decision.token, self.config), media_type="application/json")

    async def call(self, request: Request) -> Response:
        return await self._listen(request, ANSWER_PATH)

    async def action(self, request: Request) -> Response:
        """The ``listen`` ended: over for the bridge (it disconnected to hang up, or the call is gone) → hang up;
        its socket dropped while the call is up → a new ``listen`` on the same engine session."""
        return await self._listen(request, ACTION_PATH)

    async def status(self, request: Request) -> Response:
        payload = await self._checked(request, STATUS_PATH)
        if payload is None:
            return Response(status_code=_FORBIDDEN)
        call_id = payload.get("call_sid", payload.get("callSid"))
        call_status = payload.get("call_status", payload.get("callStatus"))
        if self.services.dialer is not None and isinstance(call_id, str) and call_id and payload.get("direction") == "outbound":
            progress = placed_call_progress(str(call_status), payload.get("sip_status", payload.get("sipStatus")))
            if progress is not None:  # a call the agent placed (or another outbound call: the dialer knows which)
                self.services.dialer.progress("jambonz", call_id, progress, f"{call_status} {payload.get('sip_status', '')}".strip())
        if isinstance(call_id, str) and call_id and call_status in _ENDED_STATUSES:
            log.info("call_hangup_event", provider="jambonz", call_id=call_id, status=call_status)
            await self.services.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP, call_status))
        return Response(status_code=204)

    async def media(self, websocket: WebSocket) -> None:
        if self.upgrade.configured and not self.upgrade.valid(websocket.headers.get("authorization")):
            log.warning("credentials_invalid", provider="jambonz", path=MEDIA_PATH)
            await websocket.close(code=_POLICY_VIOLATION)  # before accept: the upgrade is answered 403
            return
        await accept_listen(websocket)
        await MediaStreamDriver(websocket, JambonzCodec(), self.services).run()


def jambonz_router(services: CarrierServices) -> APIRouter:
    """jambonz's call webhook, listen action hook, call-status webhook and media websocket."""
    routes = _JambonzWebhooks(services)
    router = APIRouter()
    router.add_api_route(ANSWER_PATH, routes.call, methods=["POST"])
    router.add_api_route(ACTION_PATH, routes.action, methods=["POST"])
    router.add_api_route(STATUS_PATH, routes.status, methods=["POST"])
    router.add_api_websocket_route(MEDIA_PATH, routes.media)
    return router


def jambonz_upgrade(settings: Settings) -> UpgradeCheck:
    """At the generic ``/media`` URL: the ``listen`` verb's ``wsAuth``, when configured and sent, admits the
    upgrade (its stream still needs our token)."""
    credentials = upgrade_credentials(settings.jambonz)

    def check(url: str, headers: Mapping[str, str], peer: str | None) -> UpgradeProof | None:
        return UpgradeProof() if credentials.valid(headers.get("authorization")) else None

    return check


CARRIER: Final = Carrier(name="jambonz", router=jambonz_router, rest=jambonz_rest, generic_upgrade=jambonz_upgrade, subprotocol=SUBPROTOCOL)


def _sip_headers(headers: object) -> list[tuple[str, str]]:
    """The SIP headers jambonz passes on (``sip.headers``), those with a text value."""
    return [(key, value) for key, value in headers.items() if isinstance(value, str)] if isinstance(headers, dict) else []
