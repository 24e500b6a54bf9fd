"""Vonage's HTTP side: the answer webhook (NCCO), the media websocket, the event webhook (reconnects and the
end of the call), signed-webhook checks and the REST hang-up (telephony-protocols.md §2, §7).

The answer webhook mints a single-use token for the call and answers a
``connect`` to our websocket with ``eventType: "synchronous"``; the
endpoint's ``headers`` carry the call's uuid and the token (Vonage flattens
them into ``websocket:connected``). The call's uuid — the inbound leg, the
one the REST hang-up ends — is the call id: the websocket is a leg of its
own whose uuid changes with every socket.

Vonage has no stop message. The event webhook tells us the rest:

- ``disconnected`` for the websocket leg: the socket dropped and we did not
  end the call (our own end is the REST hang-up, which fires no
  ``disconnected``). Unless the call has ended, the answer is a new NCCO:
  another ``connect`` with a fresh token and the same ``call_uuid``, and the
  new socket resumes the engine session (at most ``_MAX_RECONNECTS`` per
  call, so a socket that dies at once cannot loop forever).
- ``completed`` for the websocket leg (Vonage closed it: the call is ending):
  that socket — named by the token in the echoed ``headers`` — ends as a
  caller hang-up (``StreamStopped``: the engine session is closed, not kept).
- ``completed`` for the call: it is over. The registry records it (a late
  ``disconnected`` then gets no reconnect); a socket of the call that is
  still open ends as a caller hang-up, and an engine session already
  detached by a drop is closed rather than left to expire.

Vonage closes the socket before or after it posts those events, so a closed
socket waits a moment for its verdict (``VonageTransport``).

Several bridge processes: the event webhook may reach a process other than
the one holding the socket. Each event is applied where it lands when the
socket is there, and otherwise sent to the other processes as a
``CallSignal`` (``disconnected``: ``STREAM_DROPPED``; ``completed`` of the
websocket leg: ``STREAM_ENDED``; of the call: ``CALL_ENDED``, through
``CarrierServices.call_ended_by_carrier``), which the socket's process applies
the same way. The reconnect count is a registry counter. The end of the call
is also in the call's record, so a socket whose signal was lost still ends
right when Vonage closes it (its verdict wait runs out, and the stream, finding
the call ended, closes the engine session). Only the conversation → call
fallback for a ``disconnected`` without ``headers`` is process-local.

Webhooks may be signed: ``Authorization: Bearer <JWT>``, HS256 with the
account's signature secret, ``payload_hash`` the hex SHA-256 of the body. A
failed check is a 403 and nothing else. Whether the websocket upgrade is
signed too is UNSURE (§2.1): the media socket is admitted by the token alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import httpx
import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect
from pydantic import SecretStr

from callbridge.application.context import call_context
from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf
from callbridge.bridge.answer_policy import AnswerKind
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.carrier_transport import WebSocketTransport
from callbridge.bridge.dialer import DialLeg, DialProgress, DialRejected
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.registry import CallSignal, SignalKind, counters_kept_ms
from callbridge.carriers.vonage.wire import VonageCodec, content_type
from callbridge.carriers.webhooks import public_base, ws_url
from callbridge.config import Settings
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client, response_object

__all__ = [
    "ANSWER_PATH",
    "CARRIER",
    "EVENTS_PATH",
    "MEDIA_PATH",
    "VonageRest",
    "VonageSignatures",
    "VonageTransport",
    "ncco_connect",
    "vonage_router",
]

log = get_logger(__name__)

ANSWER_PATH: Final = "/vonage/answer"
MEDIA_PATH: Final = "/vonage/media"
EVENTS_PATH: Final = "/vonage/events"
_PLACED_PROGRESS: Final[dict[str, DialProgress]] = {
    "ringing": "ringing", "answered": "answered", "busy": "busy", "timeout": "no_answer", "unanswered": "no_answer",
    "rejected": "declined", "failed": "failed", "cancelled": "canceled", "completed": "completed",
}  # fmt: skip
"""A placed call's event ``status``, as the dialer follows it."""

_FORBIDDEN: Final = 403
_MAX_RECONNECTS: Final = 10
_RECONNECTS: Final = "vonage_reconnects"
"""The registry counter of a call's reconnects (new NCCOs after a ``disconnected``)."""
_MAX_HEADERS_BYTES: Final = 512
"""The archived docs cap the endpoint's ``headers`` at 512 bytes (a 2026 source says 2000: UNSURE)."""
_CALL_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_KNOWN_CALLS: Final = 10_000
"""Calls remembered (uuid ↔ conversation) until their ``completed``; the oldest go first."""
_TRANSPORT_QUEUE: Final = 64
_STATUSES: Final = frozenset(
    {"started", "ringing", "answered", "busy", "cancelled", "unanswered", "disconnected", "rejected", "failed",
     "human", "machine", "timeout", "completed"}
)  # fmt: skip
"""Call and leg statuses Vonage reports (metric labels; anything else counts as ``other``)."""


def ncco_connect(base: str, call_id: str, token: str, rate_hz: int, caller: str | None = None) -> list[dict[str, Any]]:
    """The NCCO that connects the call to our media websocket, with the call's uuid and token as headers."""
    headers = {"call_uuid": call_id, "token": token}
    if len(orjson.dumps(headers)) >= _MAX_HEADERS_BYTES:
        raise ValueError("websocket headers over Vonage's 512-byte limit")
    connect: dict[str, Any] = {
        "action": "connect",
        "eventType": "synchronous",
        "eventUrl": [base + EVENTS_PATH],
        "endpoint": [{"type": "websocket", "uri": ws_url(base) + MEDIA_PATH, "content-type": content_type(rate_hz), "headers": headers}],
    }
    if caller:
        connect["from"] = caller
    return [connect]


class VonageSignatures:
    """Vonage's signed webhooks: a HS256 JWT in ``Authorization: Bearer``, over the body's SHA-256.

    Claims checked: the signature (and ``exp``/``nbf`` where present), ``payload_hash`` against the raw body
    when there is a body, ``iat`` no older than ``max_age_s`` (replay), ``application_id`` where both sides
    have one. A GET's query string is not covered by Vonage's signature: only the sender is proved.
    """

    def __init__(
        self, secret: SecretStr | None, *, enabled: bool = True, application_id: str | None = None, max_age_s: float = 300.0
    ) -> None:
        self.enabled = enabled
        self._secret = secret.get_secret_value() if secret else None
        self._application_id = application_id
        self._max_age_s = max_age_s

    def valid(self, authorization: str | None, body: bytes) -> bool:
        return not self.enabled or self.claims(authorization, body) is not None

    def claims(self, authorization: str | None, body: bytes) -> dict[str, Any] | None:
        """The JWT's claims when the request is signed as above, else None."""
        if not self._secret or not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        try:
            claims: dict[str, Any] = jwt.decode(token.strip(), self._secret, algorithms=["HS256"], leeway=60)
        except jwt.PyJWTError:
            return None
        payload_hash = claims.get("payload_hash")
        if body or payload_hash is not None:
            expected = hashlib.sha256(body).hexdigest()
            if not isinstance(payload_hash, str) or not hmac.compare_digest(payload_hash.lower(), expected):
                return None
        issued = claims.get("iat")
        if isinstance(issued, int | float) and time.time() - issued > self._max_age_s:
            return None
        app = claims.get("application_id")
        return None if self._application_id and isinstance(app, str) and app != self._application_id else claims

    def replay_proof(self, claims: dict[str, Any], authorization: str) -> tuple[str, float | None]:
        """What a signed request is known again by, and how long it stays signed: its ``jti`` (else the token
        itself), for ``max_age_s`` past its ``iat`` and the minute's leeway (no ``iat``: no end, None)."""
        jti = claims.get("jti")
        proof = f"jti:{jti}" if isinstance(jti, str) and jti else f"jwt:{authorization.partition(' ')[2].strip()}"
        issued = claims.get("iat")
        return proof, (self._max_age_s + 60 if isinstance(issued, int | float) else None)


class VonageTransport:
    """The media websocket as a ``CarrierTransport`` that waits for Vonage's verdict when the socket closes.

    Vonage closes the socket both when the caller hangs up and when the connection drops; only the event
    webhook tells the two apart (``completed`` / ``disconnected``), and it may come before or after the close.
    So a close is held back up to ``verdict_wait_s`` for it: ``completed`` ends the stream through the shared
    ``CarrierServices.call_ended_by_carrier`` (as a ``stop`` would: the engine session is closed now, and the
    driver's ``close`` releases the held reader), ``dropped()`` turns it into a lost transport (the session is
    detached for the reconnect); no word in time, a lost transport. Meanwhile what the driver sends goes
    nowhere. One reader task moves websocket messages into a small queue (backpressure intact).
    """

    verdict_wait_s: float = 2.0

    def __init__(self, websocket: WebSocket, codec: VonageCodec) -> None:
        self.codec = codec
        self._inner = WebSocketTransport(websocket)
        self._queue: asyncio.Queue[str | bytes | None] = asyncio.Queue(_TRANSPORT_QUEUE)
        self._reader: asyncio.Task[None] | None = None
        self._verdict = asyncio.Event()
        self._peer_gone = False
        self._lost = False

    @property
    def call_id(self) -> str | None:
        return self.codec.call_id

    @property
    def token(self) -> str | None:
        """The stream token this socket came with: it names the socket in Vonage's events (``headers``)."""
        return self.codec.parameters.get("token")

    def dropped(self) -> None:
        """Vonage says the socket dropped (``disconnected``), or the driver closed it: ``receive`` reports it gone."""
        self._lost = True
        self._verdict.set()
        with suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)  # wakes a receive() waiting on an empty queue

    @property
    def refused_too_large(self) -> bool:
        return self._inner.refused_too_large

    async def authenticated(self, max_message_bytes: int) -> None:
        await self._inner.authenticated(max_message_bytes)

    async def receive(self) -> str | bytes | None:
        if self._lost:
            return None
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        return await self._queue.get()

    async def _read(self) -> None:
        while True:
            message = await self._inner.receive()
            if message is None:
                self._peer_gone = True
                with suppress(TimeoutError):  # a message refused for its size ends the stream: no verdict to wait for
                    await asyncio.wait_for(self._verdict.wait(), 0 if self.refused_too_large else self.verdict_wait_s)
                self._lost = True
                await self._queue.put(None)
                return
            await self._queue.put(message)

    async def send(self, message: str | bytes) -> None:
        await self.send_many((message,))

    async def send_many(self, messages: Sequence[str | bytes]) -> None:
        if self._peer_gone:
            return
        try:
            await self._inner.send_many(messages)
        except (WebSocketDisconnect, RuntimeError, OSError):  # the peer has gone: the reader sees it, awaits the verdict
            self._peer_gone = True

    async def close(self, code: int) -> None:
        self.dropped()  # the stream is over: a reader held for the verdict need not wait
        if not self._peer_gone:
            await self._inner.close(code)

    async def aclose(self) -> None:
        """Stop the reader (the driver has finished with the socket)."""
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._reader


class _Calls:
    """What the event webhook needs to know about the calls this process answered, the conversation each
    belongs to, and the media sockets open here now."""

    def __init__(self) -> None:
        self.conversations: dict[str, str] = {}
        """conversation uuid → call uuid."""
        self.known: OrderedDict[str, str | None] = OrderedDict()
        """call uuid → its conversation, oldest first."""
        self.live: set[VonageTransport] = set()

    def answered(self, call_id: str, conversation: str | None) -> None:
        if call_id in self.known:
            return
        self.known[call_id] = conversation
        if conversation:
            self.conversations[conversation] = call_id
        while len(self.known) > _KNOWN_CALLS:
            self.forget(next(iter(self.known)))

    def is_ours(self, call_id: str) -> bool:
        return call_id in self.known or any(t.call_id == call_id for t in self.live)

    def sockets(self, call_id: str, token: object) -> list[VonageTransport]:
        """The call's sockets here: the one ``token`` names, or every one when Vonage did not echo a token."""
        return [t for t in self.live if t.call_id == call_id and (not isinstance(token, str) or t.token == token)]

    def forget(self, call_id: str) -> None:
        conversation = self.known.pop(call_id, None)
        if conversation is not None and self.conversations.get(conversation) == call_id:
            del self.conversations[conversation]


async def _params(request: Request, body: bytes) -> dict[str, Any] | None:
    """A webhook's fields: the query string, and a JSON object body over it. None: a body that is not one."""
    params: dict[str, Any] = dict(request.query_params)
    if body.strip():
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        params.update(parsed)
    return params


def connect_ncco(target: str) -> list[dict[str, Any]]:
    """An NCCO that connects the call to ``target``: a phone number (Vonage's, without the ``+``) or a SIP URI."""
    endpoint = {"type": "sip", "uri": target} if target.startswith(("sip:", "sips:")) else {"type": "phone", "number": target.lstrip("+")}
    return [{"action": "connect", "endpoint": [endpoint]}]


def _ncco(body: list[dict[str, Any]]) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


class _VonageWebhooks:
    """Vonage's webhooks and media socket, a method a route (``vonage_router`` mounts them)."""

    def __init__(self, services: CarrierServices) -> None:
        self.services, self.settings = services, services.settings
        self.config = config = self.settings.vonage
        self.signatures = VonageSignatures(config.signature_secret, enabled=config.validate_signatures, application_id=config.application_id)
        if self.signatures.enabled and config.signature_secret is None:
            log.info("carrier_not_configured", provider="vonage", detail="no vonage.signature_secret: every vonage webhook gets 403")
        self.calls = _Calls()
        self.kept_ms = counters_kept_ms(self.settings.server.max_call_duration_s)  # a reconnect count outlives the call
        services.on_signal(SignalKind.STREAM_DROPPED, self.dropped_elsewhere)
        services.on_signal(SignalKind.STREAM_ENDED, self.ended_elsewhere)

    async def dropped_elsewhere(self, signal: CallSignal) -> None:
        """Another process got the ``disconnected`` of a socket that is here."""
        for transport in self.calls.sockets(signal.call_id, signal.detail or None):
            transport.dropped()

    async def ended_elsewhere(self, signal: CallSignal) -> None:
        """Another process got the ``completed`` of a socket that is here: the call ends as on a stop."""
        if self.calls.sockets(signal.call_id, signal.detail):
            await self.services.call_ended_by_carrier(signal.call_id, EndCause(EndReason.CALLER_HUNG_UP))

    async def checked(self, request: Request) -> tuple[dict[str, Any] | None, Response | None]:
        body = await request.body()
        authorization = request.headers.get("authorization")
        claims = self.signatures.claims(authorization, body) if self.signatures.enabled else None
        if self.signatures.enabled and claims is None:
            log.warning("signature_invalid", provider="vonage", path=request.url.path)
            return None, Response(status_code=_FORBIDDEN)
        if claims is not None and authorization is not None:
            proof, keep_s = self.signatures.replay_proof(claims, authorization)
            if not await self.services.replays.first_sight(request, "vonage", proof, keep_s):
                return None, Response(status_code=_FORBIDDEN)
        params = await _params(request, body)
        if params is None:
            return None, Response("body is not a JSON object", status_code=400)
        return params, None

    async def answer(self, request: Request) -> Response:
        params, refused = await self.checked(request)
        if refused is not None or params is None:
            return refused or Response(status_code=400)
        call_id = params.get("uuid")
        if not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
            return Response("uuid missing or invalid", status_code=400)
        context = call_context(
            call_id=call_id, carrier="vonage", caller=params.get("from"), called=params.get("to"),
            carrier_call_id=params.get("conversation_uuid"), plus_implied=True,
            parameters=[(key, str(value)) for key, value in params.items() if isinstance(value, str | int | float)],
            allowed=self.settings.app.context_parameters,
        )  # fmt: skip; SIP headers are SipHeader_X-… fields
        decision = await self.services.desk.decide_answer(call_id, "vonage", retries=False, context=context, dial_id=request.query_params.get("dial"))
        if decision.kind is AnswerKind.TRANSFER and decision.target is not None:
            return _ncco(connect_ncco(decision.target))
        if decision.kind is not AnswerKind.ANSWER or decision.token is None:
            return _ncco([])  # an empty NCCO: the call ends (over already, or refused)
        conversation = params.get("conversation_uuid")
        self.calls.answered(call_id, conversation if isinstance(conversation, str) else None)
        caller = params.get("from")
        base = public_base(self.settings, str(request.base_url))
        log.info("call_answered", call_id=call_id, provider="vonage", caller=caller)
        return _ncco(ncco_connect(base, call_id, decision.token, self.config.audio_rate_hz, caller if isinstance(caller, str) else None))

    async def media(self, websocket: WebSocket) -> None:
        await websocket.accept()
        codec = VonageCodec()
        transport = VonageTransport(websocket, codec)
        self.calls.live.add(transport)
        try:
            await MediaStreamDriver(transport, codec, self.services).run()
        finally:
            await transport.aclose()
            self.calls.live.discard(transport)

    async def events(self, request: Request) -> Response:
        params, refused = await self.checked(request)
        if refused is not None or params is None:
            return refused or Response(status_code=400)
        status = params.get("status")
        leg = params.get("uuid")
        headers = params.get("headers")
        header_call = headers.get("call_uuid") if isinstance(headers, dict) else None
        conversation = params.get("conversation_uuid")
        self.services.metrics.stream_status.labels("vonage", status if status in _STATUSES else "other").inc()
        token = headers.get("token") if isinstance(headers, dict) else None
        placed_progress = _PLACED_PROGRESS.get(str(status))
        if placed_progress is not None and header_call is None and isinstance(leg, str) and params.get("direction") == "outbound":
            if self.services.dialer is not None:  # a call the agent placed (not our websocket leg: that one has headers)
                self.services.dialer.progress("vonage", leg, placed_progress, str(status))
        if status == "disconnected":
            call_id = header_call if isinstance(header_call, str) else self.calls.conversations.get(str(conversation))
            return await self.reconnect(request, call_id, token, leg)
        if status in ("failed", "unanswered", "rejected", "timeout") and header_call is not None:
            log.warning("stream_status", provider="vonage", call_id=header_call, leg=leg, stream_event=status)
        elif status == "completed":
            if isinstance(token, str):  # the websocket leg is over: its socket ends as the call's end
                here = {t.call_id for t in self.calls.live if t.token == token and t.call_id is not None}
                for call_id in here:
                    await self.services.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP))
                if not here and isinstance(header_call, str) and _CALL_ID.fullmatch(header_call):
                    await self.services.send_signal(header_call, SignalKind.STREAM_ENDED, token)  # the socket may be elsewhere
            if isinstance(leg, str) and (self.calls.is_ours(leg) or await self.services.registry.get(leg) is not None):
                await self.completed(leg)  # the call itself
        return Response(status_code=204)

    async def reconnect(self, request: Request, call_id: str | None, token: object, leg: object) -> Response:
        """A new ``connect`` for a call whose socket dropped (204: none, the call goes on to its end)."""
        if call_id is None or not _CALL_ID.fullmatch(call_id):
            log.warning("stream_status", provider="vonage", leg=leg, stream_event="disconnected", detail="no call_uuid")
            return Response(status_code=204)
        # The socket that dropped (named by its token when Vonage echoes the headers, else every one of the call)
        # hears the verdict here, or on the process that has it. It detaches its session there; the new stream
        # waits for that detach itself (its ``CallLifecycle``), so this answer does not.
        stale = self.calls.sockets(call_id, token)
        for transport in stale:
            transport.dropped()
        if not stale:
            await self.services.send_signal(call_id, SignalKind.STREAM_DROPPED, token if isinstance(token, str) else "")
        ended = await self.services.registry.ended_reason(call_id)
        # draining, a call another process can resume still gets its new socket: it goes to the public URL
        if ended is not None or not await self.services.desk.takes_reconnect(call_id):
            log.info("stream_not_reconnected", provider="vonage", call_id=call_id, ended=ended)
            return Response(status_code=204)
        count = await self.services.registry.count(call_id, _RECONNECTS, self.kept_ms)
        if count > _MAX_RECONNECTS:
            log.info("stream_not_reconnected", provider="vonage", call_id=call_id, reconnects=count - 1)
            return Response(status_code=204)
        fresh = await self.services.tokens.mint(call_id)
        base = public_base(self.settings, str(request.base_url))
        log.info("stream_reconnecting", provider="vonage", call_id=call_id, leg=leg, reconnects=count)
        return _ncco(ncco_connect(base, call_id, fresh, self.config.audio_rate_hz))

    async def completed(self, call_id: str) -> None:
        """The call is over: record it, end its open socket as a hang-up, close a detached engine session."""
        self.calls.forget(call_id)
        if await self.services.registry.ended_reason(call_id) is not None:
            return  # we ended it (REST hang-up, engine end): nothing more to do
        log.info("call_completed", provider="vonage", call_id=call_id)
        # in the background, so the webhook is answered at once: a detached engine session is resumed to be closed
        self.services.spawn(self.services.call_ended_by_carrier(call_id, EndCause(EndReason.CALLER_HUNG_UP)))


def vonage_router(services: CarrierServices) -> APIRouter:
    """The answer webhook, media websocket and event webhook."""
    routes = _VonageWebhooks(services)
    router = APIRouter()
    router.add_api_route(ANSWER_PATH, routes.answer, methods=["GET", "POST"])
    router.add_api_websocket_route(MEDIA_PATH, routes.media)
    router.add_api_route(EVENTS_PATH, routes.events, methods=["GET", "POST"])
    return router


class VonageRest:
    """The Voice API calls the bridge makes, authorised by a RS256 JWT signed with the application's private key:
    ``PUT /v1/calls/{uuid}`` (hang up, DTMF, transfer), and ``POST /v1/calls`` (a call the agent places)."""

    def __init__(
        self,
        base_url: str,
        application_id: str | None,
        private_key_path: Path | None,
        *,
        client: httpx.AsyncClient | None = None,
        token_ttl_s: int = 300,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._application_id = application_id
        self._key_path = private_key_path
        self._key: PrivateKeyTypes | None = None
        self._ttl_s = token_ttl_s
        self._client = client or http_client(timeout=10.0)

    def token(self) -> str:
        """A fresh application JWT (``application_id``, ``iat``, ``exp``, ``jti``). Raises if unconfigured."""
        if not self._application_id or self._key_path is None:
            raise RuntimeError("hang-up needs vonage.application_id and vonage.private_key_path")
        if self._key is None:
            self._key = load_pem_private_key(self._key_path.read_bytes(), password=None)
        now = int(time.time())
        claims = {"application_id": self._application_id, "iat": now, "exp": now + self._ttl_s, "jti": str(uuid.uuid4())}
        return jwt.encode(claims, self._key, algorithm="RS256")  # type: ignore[arg-type]

    async def hang_up(self, call_id: str, account_id: str | None) -> None:
        """End the call; one that is already over counts as done. Raises ``httpx.HTTPError``."""
        response = await self._client.put(
            f"{self._base}/v1/calls/{call_id}",
            json={"action": "hangup"},
            headers={"Authorization": f"Bearer {self.token()}"},
        )
        if response.status_code == 404:
            return  # unknown or long gone
        if response.status_code in (400, 409) and "complete" in response.text.lower():
            return  # already completed
        response.raise_for_status()

    @property
    def can_dial(self) -> bool:
        return bool(self._application_id) and self._key_path is not None

    async def dial(self, leg: DialLeg) -> str:
        """Create the call (``POST /v1/calls``): Vonage rings ``leg.to`` for the ring timeout (``ringing_timer``),
        GETs the answer URL (naming the dial) when it is answered, and POSTs the call's events (``started``,
        ``ringing``, ``answered`` … or ``busy``, ``timeout``, ``rejected``, ``failed``, ``cancelled``) to the event
        URL. Its ``uuid``; raises ``DialRejected`` with Vonage's error."""
        if not self.can_dial:
            raise DialRejected("not_configured", "dialling needs vonage.application_id and vonage.private_key_path")
        body = {
            "to": [{"type": "phone", "number": leg.to.removeprefix("+")}], "from": {"type": "phone", "number": leg.from_.removeprefix("+")},
            "answer_url": [f"{leg.base_url}{ANSWER_PATH}?dial={leg.dial_id}"], "answer_method": "GET",
            "event_url": [f"{leg.base_url}{EVENTS_PATH}"], "event_method": "POST", "ringing_timer": leg.ring_timeout_s,
        }  # fmt: skip; Vonage's numbers: E.164 without the +
        try:
            response = await self._client.post(f"{self._base}/v1/calls", json=body, headers={"Authorization": f"Bearer {self.token()}"})
        except (httpx.HTTPError, OSError, ValueError) as exc:
            raise DialRejected("unreachable", repr(exc)) from exc
        answer = response_object(response)
        call_id = answer.get("uuid")
        if response.status_code != 201 or not isinstance(call_id, str) or not call_id:
            title, detail = (answer.get("title"), answer.get("detail"))
            raise DialRejected("refused", f"HTTP {response.status_code} {title or ''} {detail or response.text[:200]}".strip())
        return call_id

    async def prepare(self) -> None:
        """The application's private key read and parsed (tens of ms the first dial would otherwise spend)."""
        self.token()

    async def cancel(self, call_id: str) -> bool:
        """End a call the application created while it rings (Vonage reports it ``cancelled``); False where it is
        not live any more or the request was not taken."""
        try:
            response = await self._client.put(f"{self._base}/v1/calls/{call_id}", json={"action": "hangup"}, headers={"Authorization": f"Bearer {self.token()}"})
        except (httpx.HTTPError, OSError, ValueError, RuntimeError):
            return False
        return response.status_code < 300

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """The agent's actions on the Voice API: ``PUT /v1/calls/{uuid}/dtmf`` ``{"digits"}``, or a transfer of the
        call to an inline NCCO that connects the target (a phone number, or a SIP URI); the caller then leaves
        the conversation with our websocket."""
        body: dict[str, Any]
        if isinstance(action, SendDtmf):
            url, body = f"{self._base}/v1/calls/{call_id}/dtmf", {"digits": action.digits}
        else:
            ncco = connect_ncco(action.target)
            url, body = f"{self._base}/v1/calls/{call_id}", {"action": "transfer", "destination": {"type": "ncco", "ncco": ncco}}
        response = await self._client.put(url, json=body, headers={"Authorization": f"Bearer {self.token()}"})
        if response.status_code == 404 or (response.status_code in (400, 409) and "complete" in response.text.lower()):
            return ActionResult.failed("call_ended", f"HTTP {response.status_code}")
        if response.status_code >= 300:
            return ActionResult.failed("carrier_error", f"HTTP {response.status_code}")
        return ActionResult.done(call_left=not isinstance(action, SendDtmf))

    async def aclose(self) -> None:
        await self._client.aclose()


def vonage_rest(settings: Settings) -> VonageRest:
    config = settings.vonage
    return VonageRest(config.api_base_url, config.application_id, config.private_key_path)


CARRIER: Final = Carrier(name="vonage", router=vonage_router, rest=vonage_rest)
