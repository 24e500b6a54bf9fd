"""A simulated Vonage Voice API, faithful to the websocket wire (telephony-protocols.md §2), for the tests.

It does what Vonage does for an inbound call whose answer URL is the bridge:
- GETs the signed answer webhook (``Authorization: Bearer`` HS256 JWT with the
  signature secret), reads the NCCO: a ``connect`` to a ``websocket``
  endpoint, its ``content-type`` (8 or 16 kHz L16) and ``headers`` (under 512
  bytes), ``eventType: "synchronous"`` and ``eventUrl``; an empty NCCO ends
  the call;
- opens the websocket (no signature on the upgrade: the bridge relies on the
  token in the headers), sends ``websocket:connected`` with the headers
  flattened into it, then one binary frame of PCM16 LE every 20 ms at real
  time, exactly 320/640 bytes; ``websocket:dtmf`` on key presses;
- plays what the bridge sends (``callbridge.sim.carrier``) from a buffer of at
  most 3072 frames: every binary frame must be exactly 20 ms (anything else is
  a recorded warning, as is any text that is not a ``notify`` or ``clear``
  action); a ``notify`` is answered with ``websocket:notify`` when playback
  reaches it; ``clear`` drops the queue, voids the pending notifies (UNSURE
  upstream: the bridge must not count on their echo) and answers
  ``websocket:cleared``;
- when the socket drops (a network failure, or the bridge closing it without
  hanging up), POSTs the signed ``disconnected`` event to the ``eventUrl`` and
  follows the NCCO it returns (no NCCO: the call completes);
- when the caller hangs up: closes the socket and POSTs ``completed`` for the
  websocket leg (to the ``eventUrl``, headers echoed: whenever Vonage itself
  closes the leg), then ``completed`` for the call (to the application's
  event URL, the bridge's ``/vonage/events``);
- serves the REST hang-up, ``PUT /v1/calls/{uuid}`` ``{"action":"hangup"}``,
  checking the RS256 application JWT with the public key of the key pair it
  generated for the bridge;
- creates calls (#42): ``POST /v1/calls`` with that JWT — one phone endpoint in ``to``, a phone ``from`` (digits,
  E.164 without the +), one http(s) ``answer_url``, ``ringing_timer`` 1–120 s (400 with ``invalid_parameters``
  otherwise); 201 with the ``uuid``. The call's events go to its ``event_url``, signed: ``started``, ``ringing``;
  answered, ``answered``, the answer URL is fetched and the call runs as an inbound one (``completed`` at its end);
  unanswered, ``busy``, ``timeout``, ``failed``, or ``cancelled`` after a hang-up while it rings.
"""

from __future__ import annotations

import asyncio
import audioop
import contextlib
import hashlib
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final
from urllib.parse import parse_qsl

import httpx
import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus
from websockets.protocol import State

from callbridge.config import Settings
from callbridge.sim.callee import Callee
from callbridge.sim.caller import CallResult
from callbridge.sim.carrier import (
    OpenReason,
    SimCall,
    SimStream,
    SimulatedCarrier,
    WebSocketConnection,
    webhook_client,
)
from callbridge.sim.transfer import sent_on

__all__ = ["SimulatedVonage", "VonageConnection", "VonageStream", "sign_webhook"]

_CONTENT_TYPE: Final = re.compile(r"audio/l16;rate=(8000|16000)")
_MAX_HEADERS_BYTES: Final = 512
_BUFFER_FRAMES: Final = 3072
"""Vonage buffers this many outbound frames (current docs; archived docs say 1024)."""
_VONAGE_NUMBER: Final = "447700900000"
_CALLER: Final = "447700900001"


def sign_webhook(secret: str, application_id: str, body: bytes | None = None, *, issued_at: float | None = None) -> str:
    """The ``Authorization`` value of a signed Vonage webhook: a HS256 JWT, with the body's SHA-256 if any."""
    claims: dict[str, Any] = {
        "iat": int(issued_at if issued_at is not None else time.time()),
        "jti": str(uuid.uuid4()),
        "iss": "Vonage",
        "application_id": application_id,
    }
    if body:
        claims["payload_hash"] = hashlib.sha256(body).hexdigest()
    return "Bearer " + jwt.encode(claims, secret, algorithm="HS256")


def application_id_for(secret: str) -> str:
    """The simulated account's application id (derived from its secret, so the settings and the carrier agree)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "callbridge-sim-vonage:" + secret))


@dataclass
class _Leg:
    """The call's Vonage state: its conversation, and the websocket leg the NCCO connected last."""

    conversation_uuid: str
    event_url: str | None = None
    ws_uri: str | None = None
    ws_leg: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    synchronous: bool = False


@dataclass(frozen=True, slots=True)
class _Created:
    """A call ``POST /v1/calls`` created: what it was asked."""

    call_id: str
    conversation_uuid: str
    to: str
    from_: str
    answer_url: str
    event_url: str | None
    ringing_s: int


def _create_refusal(body: object) -> str | None:
    """What Vonage's create-call API refuses in ``body`` (an invalid parameter), or None."""
    if not isinstance(body, dict):
        return "body: not a JSON object"
    to, from_ = body.get("to"), body.get("from")
    if not (isinstance(to, list) and len(to) == 1 and isinstance(to[0], dict) and to[0].get("type") == "phone"):
        return "to: one phone endpoint"
    if not (isinstance(from_, dict) and from_.get("type") == "phone"):
        return "from: a phone endpoint"
    for name, endpoint in (("to", to[0]), ("from", from_)):
        number = endpoint.get("number")
        if not (isinstance(number, str) and number.isascii() and number.isdigit() and 7 <= len(number) <= 15):
            return f"{name}.number: digits, E.164 without the +"
    for key in ("answer_url", "event_url"):
        urls = body.get(key)
        if key == "event_url" and urls is None:
            continue
        if not (isinstance(urls, list) and len(urls) == 1 and isinstance(urls[0], str) and urls[0].startswith(("http://", "https://"))):
            return f"{key}: one http or https URL"
    timer = body.get("ringing_timer", 60)
    if not isinstance(timer, int) or not 1 <= timer <= 120:
        return "ringing_timer: 1 to 120"
    return None


class VonageConnection(WebSocketConnection):
    """The websocket leg: when Vonage itself closes it (the leg is over), it reports the leg ``completed``."""

    def __init__(self, ws: ClientConnection, on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(ws)
        self._on_close: Callable[[], Awaitable[None]] | None = on_close

    async def close(self) -> None:
        ours = self.ws.state is State.OPEN
        await super().close()
        report, self._on_close = self._on_close, None
        if ours and report is not None:
            await report()


class VonageStream(SimStream):
    """One Vonage websocket: binary PCM16 LE frames of 20 ms, JSON text events."""

    marks_echoed_on_clear: ClassVar[bool] = False

    def __init__(self, conn: VonageConnection, leg_uuid: str, call: SimCall, rate_hz: int, carrier: SimulatedVonage) -> None:
        super().__init__(conn, leg_uuid, rate_hz, call)
        self.carrier = carrier
        self._up: Any = None
        self._pending = bytearray()

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.rate_hz != 8000:
            pcm_8k, self._up = audioop.ratecv(pcm_8k, 2, 1, 8000, self.rate_hz, self._up)
        await self.send_audio_at_rate(pcm_8k)

    async def send_audio_at_rate(self, pcm: bytes) -> None:
        self._pending += pcm
        while len(self._pending) >= self.frame_bytes:  # exactly 20 ms per binary frame, as Vonage sends
            frame = bytes(self._pending[: self.frame_bytes])
            del self._pending[: self.frame_bytes]
            await self.send(frame)

    async def send_dtmf(self, digit: str) -> None:
        await self.send(orjson.dumps({"event": "websocket:dtmf", "digit": digit, "duration": 260}).decode())

    async def send_stop(self) -> None:
        """The call is over: Vonage closes the websocket leg (reporting it ``completed``), then the call."""
        await self.conn.close()
        self.dropped = True
        await self.carrier.report_completed(self.call)

    def mark_message(self, name: str) -> str:
        return orjson.dumps({"event": "websocket:notify", "payload": {"name": name}}).decode()

    def cleared_message(self) -> str:
        return '{"event":"websocket:cleared"}'

    def receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            if len(message) != self.frame_bytes:
                self.warn(f"binary frame of {len(message)} bytes, not {self.frame_bytes} (20 ms at {self.rate_hz} Hz)")
                return
            if len(self.queue) >= _BUFFER_FRAMES * self.frame_bytes:
                self.warn("playback buffer full: frame dropped")
                return
            self.enqueue_audio(message)
            return
        try:
            payload = orjson.loads(message)
        except orjson.JSONDecodeError:
            self.warn(f"text that is not JSON: {message[:80]}")
            return
        action = payload.get("action") if isinstance(payload, dict) else None
        if action == "clear" and set(payload) == {"action"}:
            self.clear()
        elif action == "notify" and set(payload) == {"action", "payload"} and isinstance(payload["payload"], dict):
            name = payload["payload"].get("name")
            if isinstance(name, str):
                self.add_mark(name)
            else:
                self.warn(f"notify without a name: {message[:80]}")
        else:
            self.warn(f"unknown text message: {message[:80]}")


class SimulatedVonage(SimulatedCarrier):
    """Vonage's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str] = "vonage"
    places_calls: ClassVar[bool] = True
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/v1/calls"})

    def __init__(self, bridge_url: str, secret: str) -> None:
        super().__init__(bridge_url, secret)
        self.application_id = application_id_for(secret)
        self.legs: dict[str, _Leg] = {}
        self.hangups: list[str] = []
        """Calls the bridge hung up through the REST API."""
        self.rest_refusals: list[str] = []
        self._public_key: PublicKeyTypes | None = None
        self._key_dir: Path | None = None
        self._http = webhook_client()
        self._created: dict[str, _Created] = {}

    # --------------------------------------------------------------- setup

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        """A fresh RSA key pair: the bridge gets the private key's file, the carrier reads the public half."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        path = Path(tempfile.mkdtemp(prefix="callbridge-sim-vonage-")) / "private.key"
        path.write_bytes(pem)
        path.chmod(0o600)
        return {
            "vonage": {
                "application_id": application_id_for(secret),
                "private_key_path": str(path),
                "signature_secret": secret,
                "api_base_url": rest_url,
                "validate_signatures": True,
            }
        }

    @classmethod
    def exported_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        """The private key moves out of the directory the simulator deletes when it closes."""
        overrides = cls.bridge_settings(secret, rest_url)
        path = Path(overrides["vonage"]["private_key_path"])
        kept = Path(tempfile.mkdtemp(prefix="callbridge-loadtest-vonage-")) / "private.key"
        shutil.move(path, kept)
        shutil.rmtree(path.parent, ignore_errors=True)
        overrides["vonage"]["private_key_path"] = str(kept)
        return overrides

    def configure(self, settings: Settings) -> None:
        path = settings.vonage.private_key_path
        if path is None:
            raise ValueError("the simulated Vonage needs vonage.private_key_path")
        private = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        self._public_key = private.public_key()
        self._key_dir = Path(path).parent if Path(path).parent.name.startswith("callbridge-sim-vonage-") else None

    def new_call_id(self) -> str:
        return str(uuid.uuid4())

    async def aclose(self) -> None:
        await self._http.aclose()
        await super().aclose()
        if self._key_dir is not None:
            shutil.rmtree(self._key_dir, ignore_errors=True)

    # ---------------------------------------------------------------- REST

    def rest_routes(self) -> list[BaseRoute]:
        return [Route("/v1/calls", self._create_call, methods=["POST"]), Route("/v1/calls/{uuid}", self._rest_call, methods=["PUT"])]

    async def _create_call(self, request: Request) -> Response:
        """``POST /v1/calls``: 201 with the call's ``uuid``, then it goes as its ``Callee`` says."""
        if (unauthorised := self._unauthorised(request)) is not None:
            return unauthorised
        body = await self.json_body(request)
        refused = _create_refusal(body)
        if refused is not None:
            name, _, reason = refused.partition(": ")
            return JSONResponse({"title": "Bad Request", "detail": refused, "invalid_parameters": [{"name": name, "reason": reason}]}, status_code=400)
        assert isinstance(body, dict)
        event_urls = body.get("event_url")
        created = _Created(
            self.new_call_id(), "CON-" + str(uuid.uuid4()), "+" + body["to"][0]["number"], "+" + body["from"]["number"],
            body["answer_url"][0], event_urls[0] if event_urls else None, int(body.get("ringing_timer", 60)),
        )  # fmt: skip
        self._created[created.call_id] = created
        self.dial_taken(created.call_id, self._ring(created, self.callees.get(created.to, Callee())))
        answer = {"uuid": created.call_id, "status": "started", "direction": "outbound", "conversation_uuid": created.conversation_uuid}
        return JSONResponse(answer, status_code=201)

    async def _ring(self, created: _Created, callee: Callee) -> CallResult | None:
        """The created call rings, and is answered (then runs as an inbound call does), or not."""
        await self._created_event(created, "started")
        await self._created_event(created, "ringing")
        end = await self.ring(created.call_id, callee, created.ringing_s)
        if end != "answered":
            await self._created_event(created, {"canceled": "cancelled", "busy": "busy", "fails": "failed"}.get(end, "timeout"))
            return None
        await self._created_event(created, "answered")
        return await self.take_answered(created.call_id, created.to, callee)

    async def _created_event(self, created: _Created, status: str) -> None:
        self.status_reports.append((created.call_id, status))
        if created.event_url is None:
            return
        event = {"from": created.from_.removeprefix("+"), "to": created.to.removeprefix("+"), "uuid": created.call_id,
                 "conversation_uuid": created.conversation_uuid, "status": status, "direction": "outbound", "timestamp": _timestamp()}  # fmt: skip
        with contextlib.suppress(httpx.HTTPError):
            await self._post_event(created.event_url, event)

    def _unauthorised(self, request: Request) -> Response | None:
        """The Voice API's 401 for a request without the application's JWT (recorded), or None."""
        if self._authorised(request.headers.get("authorization")):
            return None
        self.rest_refusals.append("unauthorised")
        return JSONResponse({"type": "https://developer.nexmo.com/api-errors#unauthorized", "title": "Unauthorized"}, status_code=401)

    def _authorised(self, authorization: str | None) -> bool:
        if self._public_key is None or not authorization or not authorization.startswith("Bearer "):
            return False
        try:
            claims = jwt.decode(
                authorization.removeprefix("Bearer "),
                self._public_key,  # type: ignore[arg-type]
                algorithms=["RS256"],
                options={"require": ["application_id", "iat", "exp", "jti"]},
            )
        except jwt.PyJWTError:
            return False
        return bool(claims.get("application_id") == self.application_id)

    async def _rest_call(self, request: Request) -> Response:
        if (unauthorised := self._unauthorised(request)) is not None:
            return unauthorised
        body = await self.json_body(request)
        if not isinstance(body, dict) or body.get("action") != "hangup":
            self.rest_refusals.append(f"bad body {body!r}")
            return JSONResponse({"title": "Bad Request", "detail": "unsupported action"}, status_code=400)
        call_id = request.path_params["uuid"]
        if self.stop_ringing(call_id):  # a created call not answered yet: it stops ringing (``cancelled``)
            return Response(status_code=204)
        if not self.end_call(call_id):
            return JSONResponse({"title": "Not Found", "detail": f"call {call_id} not found"}, status_code=404)
        self.hangups.append(call_id)
        return Response(status_code=204)

    # ------------------------------------------------------------- webhooks

    @property
    def answer_url(self) -> str:
        return self.bridge_url + "/vonage/answer"

    @property
    def event_url(self) -> str:
        """The application's event URL: events about the call itself go there."""
        return self.bridge_url + "/vonage/events"

    async def _post_event(self, url: str, event: dict[str, Any]) -> httpx.Response:
        body = orjson.dumps(event)
        headers = {"Authorization": sign_webhook(self.secret, self.application_id, body), "Content-Type": "application/json"}
        return await self._http.post(url, content=body, headers=headers)

    async def report_leg_completed(self, leg: _Leg, ws_leg: str, headers: dict[str, Any]) -> None:
        """A websocket leg Vonage closed is over: ``completed`` to the NCCO's eventUrl, headers echoed."""
        if leg.event_url:
            event = {"from": _CALLER, "to": leg.ws_uri, "uuid": ws_leg, "conversation_uuid": leg.conversation_uuid,
                     "status": "completed", "direction": "outbound", "timestamp": _timestamp(), "headers": headers}  # fmt: skip
            with contextlib.suppress(httpx.HTTPError):
                await self._post_event(leg.event_url, event)

    async def report_completed(self, call: SimCall) -> None:
        """The call is over: ``completed`` for the call, to the application's event URL."""
        leg = self.legs.get(call.call_id)
        if leg is None:
            return
        now = _timestamp()
        created = self._created.get(call.call_id)
        call_event = {"from": _CALLER, "to": _VONAGE_NUMBER, "uuid": call.call_id, "conversation_uuid": leg.conversation_uuid,
                      "status": "completed", "direction": "inbound", "timestamp": now, "duration": "1"}  # fmt: skip
        if created is not None:  # a call the REST API created
            call_event |= {"from": created.from_.removeprefix("+"), "to": created.to.removeprefix("+"), "direction": "outbound"}
        with contextlib.suppress(httpx.HTTPError):
            response = await self._post_event(created.event_url if created is not None and created.event_url else self.event_url, call_event)
            if response.status_code >= 300:
                call.result.warnings.append(f"completed event answered HTTP {response.status_code}")
        del self.legs[call.call_id]

    # ----------------------------------------------------------------- call

    async def open_stream(self, call: SimCall, reason: OpenReason) -> VonageStream | None:
        """Answer the call (GET the answer URL), or report the dropped socket (``disconnected``), and follow the
        NCCO that comes back."""
        result = call.result
        created = self._created.get(call.call_id)
        if reason == "answer" and created is not None:  # a call the REST API created, answered
            leg = self.legs[call.call_id] = _Leg(created.conversation_uuid)
            url, query = created.answer_url.split("?", 1) if "?" in created.answer_url else (created.answer_url, "")
            params = {"to": created.to.removeprefix("+"), "from": created.from_.removeprefix("+"), "uuid": call.call_id,
                      "conversation_uuid": leg.conversation_uuid, "region_url": "https://api-eu-1.vonage.com"}  # fmt: skip
            response = await self._http.get(
                url, params=[*parse_qsl(query), *params.items()], headers={"Authorization": sign_webhook(self.secret, self.application_id)}
            )
        elif reason == "answer":
            leg = self.legs[call.call_id] = _Leg("CON-" + str(uuid.uuid4()))
            params = {"to": _VONAGE_NUMBER, "from": _CALLER, "uuid": call.call_id, "conversation_uuid": leg.conversation_uuid,
                      "region_url": "https://api-eu-1.vonage.com"}  # fmt: skip
            response = await self._http.get(  # what the user put on the answer URL, then Vonage's own
                self.answer_url, params=[*parse_qsl(self.answer_query), *params.items()],
                headers={"Authorization": sign_webhook(self.secret, self.application_id)},
            )
        else:
            leg = self.legs[call.call_id]
            if reason == "closed_by_bridge":
                await asyncio.sleep(0.05)  # the webhook is not instant; a REST hang-up racing the close lands first
                if call.ended.is_set():
                    result.hung_up_by = "bridge"
                    result.log(call.clock(), "bridge", "hung up the call")
                    await self.report_completed(call)
                    return None
            if not (leg.synchronous and leg.event_url):
                result.log(call.clock(), self.provider, "websocket gone, no synchronous eventUrl: the call completes")
                await self.report_completed(call)
                return None
            event = {"from": _CALLER, "to": leg.ws_uri, "uuid": leg.ws_leg, "conversation_uuid": leg.conversation_uuid,
                     "status": "disconnected", "direction": "outbound", "timestamp": _timestamp(), "headers": leg.headers}  # fmt: skip
            result.log(call.clock(), self.provider, f"websocket {leg.ws_leg} disconnected: POST eventUrl")
            response = await self._post_event(leg.event_url, event)
        if response.status_code not in (200, 204):
            result.log(call.clock(), self.provider, f"webhook answered HTTP {response.status_code}: the call completes")
            await self.report_completed(call)
            return None
        return await self._follow(call, leg, response)

    async def _follow(self, call: SimCall, leg: _Leg, response: httpx.Response) -> VonageStream | None:
        """Run the NCCO: a ``connect`` to a websocket opens it; anything else (or nothing) ends the call here."""
        result = call.result
        ncco = orjson.loads(response.content) if response.content.strip() else []
        if not isinstance(ncco, list) or not ncco:
            result.log(call.clock(), self.provider, "no NCCO: the call completes")
            await self.report_completed(call)
            return None
        action = ncco[0]
        endpoint = (action.get("endpoint") or [{}])[0] if isinstance(action, dict) else {}
        if isinstance(action, dict) and action.get("action") == "connect" and endpoint.get("type") in ("phone", "sip"):
            number = endpoint.get("number")  # Vonage's numbers are E.164 without the +
            target = endpoint.get("uri") if endpoint.get("type") == "sip" else f"+{number}" if isinstance(number, str) else None
            sent_on(result, call.clock(), self.provider, f"NCCO connect {endpoint['type']}", target)
            await self.report_completed(call)
            return None
        if not isinstance(action, dict) or action.get("action") != "connect" or endpoint.get("type") != "websocket":
            result.warnings.append(f"NCCO the simulator does not run: {response.text[:120]}")
            await self.report_completed(call)
            return None
        announced = endpoint.get("content-type")
        match = _CONTENT_TYPE.fullmatch(announced) if isinstance(announced, str) else None
        headers = endpoint.get("headers") or {}
        if match is None or not isinstance(headers, dict) or len(orjson.dumps(headers)) >= _MAX_HEADERS_BYTES:
            result.warnings.append(f"NCCO websocket endpoint Vonage rejects: {orjson.dumps(endpoint).decode()[:160]}")
            await self.report_completed(call)
            return None
        event_urls = action.get("eventUrl")
        leg.event_url = event_urls[0] if isinstance(event_urls, list) and event_urls else None
        leg.synchronous = action.get("eventType") == "synchronous"
        leg.ws_uri, leg.headers, leg.ws_leg = endpoint["uri"], headers, str(uuid.uuid4())
        try:
            ws = await connect(endpoint["uri"], compression=None)
        except (InvalidStatus, OSError) as exc:
            result.log(call.clock(), self.provider, f"websocket connect failed ({exc}): the call completes")
            await self.report_completed(call)
            return None
        rate = int(match.group(1))
        ws_leg = leg.ws_leg

        async def leg_completed() -> None:
            await self.report_leg_completed(leg, ws_leg, headers)

        stream = VonageStream(VonageConnection(ws, leg_completed), ws_leg, call, rate, self)
        await stream.send(orjson.dumps({"event": "websocket:connected", "content-type": announced, **headers}).decode())
        return stream

    # ------------------------------------------------------------ the matrix

    def unknown_event(self, stream: SimStream) -> str:
        return '{"event":"websocket:transcription","text":"hi"}'

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, VonageStream)
        leg = self.legs[stream.call.call_id]
        connected = {"event": "websocket:connected", "content-type": f"audio/l16;rate={stream.rate_hz}", **leg.headers}
        return {
            "non_json_text": ("{this is not json", "not_json"),
            "json_not_an_object": ('["websocket:dtmf"]', "not_an_object"),
            "odd_sized_audio": (bytes(stream.frame_bytes + 1), "bad_field"),
            "oversized_audio": (bytes(stream.frame_bytes * 11), "oversized"),
            "oversized_text": ('{"event":"websocket:notify","pad":"' + "x" * 20_000 + '"}', "oversized"),
            "event_outside_vonage_namespace": ('{"event":"teleport"}', "unknown_event"),
            "event_missing": ('{"digit":"5"}', "missing_field"),
            "bad_dtmf_digit": ('{"event":"websocket:dtmf","digit":"Z"}', "bad_field"),
            "notify_without_payload": ('{"event":"websocket:notify"}', "missing_field"),
            "second_connected": (orjson.dumps(connected).decode(), "out_of_order"),
        }

    async def forged_requests_refused(self) -> bool:
        call_id = self.new_call_id()
        params = {"to": _VONAGE_NUMBER, "from": _CALLER, "uuid": call_id, "conversation_uuid": "CON-" + str(uuid.uuid4())}
        forged = await self._http.get(self.answer_url, params=params, headers={"Authorization": sign_webhook("not-the-secret-" + "x" * 32, self.application_id)})
        unsigned = await self._http.get(self.answer_url, params=params)
        stale = await self._http.get(
            self.answer_url, params=params, headers={"Authorization": sign_webhook(self.secret, self.application_id, issued_at=time.time() - 3600)}
        )
        event = orjson.dumps({"uuid": call_id, "status": "disconnected", "headers": {"call_uuid": call_id}})
        tampered = await self._http.post(
            self.event_url,
            content=event.replace(b"disconnected", b"completed"),
            headers={"Authorization": sign_webhook(self.secret, self.application_id, event), "Content-Type": "application/json"},
        )
        refused = all(r.status_code == 403 for r in (forged, unsigned, stale, tampered))
        # the media socket is admitted by the single-use token our answer minted: a made-up one is refused
        media_url = self.bridge_url.replace("http", "ws", 1) + "/vonage/media"
        async with connect(media_url, compression=None) as ws:
            await ws.send(orjson.dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=16000", "call_uuid": call_id, "token": "forged"}).decode())
            with contextlib.suppress(Exception):
                async for _ in ws:
                    pass
            return refused and ws.close_code == 1008


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
