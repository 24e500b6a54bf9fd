"""A simulated Bandwidth, faithful to the wire (``docs/carriers/bandwidth.md``), for the demo, the tests and load
tests.

What Bandwidth does for an inbound call, and what this does:
- POSTs the application's call-initiated URL (``/bandwidth/answer``) a JSON ``initiate`` event with the
  application's callback credentials (``Authorization: Basic``), and runs the BXML it gets: ``<StartGather>``
  (each key press is POSTed to its ``dtmfUrl`` as a ``dtmf`` event, with the verb's credentials),
  ``<StartStream>`` (which must be ``mode="bidirectional"``, with a ``destination``, a ``name`` and at most 12
  ``<StreamParam>``), ``<Pause>`` (the call stays up beside the stream), ``<Redirect>`` (followed: a ``redirect``
  event POSTed there) and ``<Hangup/>``; anything else is a warning;
- opens the websocket at the destination and sends ``start`` (``metadata`` with the account, call and stream
  ids, the stream's name and the inbound track's ``audio/PCMU`` 8000 Hz format; ``streamParams``), then a 20 ms
  ``media`` message every 20 ms (``track``, ``sequenceNumber``, base64 μ-law ``payload``);
- plays what the bridge sends: ``playAudio`` (its ``contentType`` ``audio/pcmu``, or
  ``audio/pcm;rate=8000|16000|24000;channels=1;bit-depth=16;endian=little;encoding=signed``, resampled to the
  caller's 8 kHz leg; one content type per stream) and ``clear``; it echoes nothing; anything else (unknown event, extra fields, bad base64, binary frame) is a warning;
- when the caller hangs up: ``stop`` on the socket, the socket closed, then ``mediaStreamStopped`` (cause
  ``closed``) to the stream's event URL and ``disconnect`` to the application's status URL; after a network drop
  (or the bridge closing the socket while the call is up): ``mediaStreamStopped`` (``connection-error``), and the
  call waits for the bridge's Voice API ``redirectUrl`` to run new BXML;
- serves the Voice API: ``POST /api/v1/oauth2/token`` (``client_credentials``, Basic client id and secret) and
  ``POST /api/v2/accounts/{account}/calls/{call}`` with the bearer token: ``{"state": "completed"}`` ends the
  call, ``{"redirectUrl": …}`` redirects it; 404 for a call that is not live, 401 without a valid token;
- creates calls (``POST /api/v2/accounts/{account}/calls``, #42): ``from``, ``to`` (E.164), ``applicationId`` (the
  account's application), ``answerUrl`` (http/https), ``callTimeout`` 1–300 s, as Bandwidth's API checks them (400
  ``validation`` otherwise); 201 with the ``callId``. The call rings its ``Callee`` (no callback while it rings:
  Bandwidth has none); answered, the ``answer`` event (``direction`` outbound) goes to the ``answerUrl`` with the
  request's callback credentials and the call runs as an inbound one; unanswered, the ``disconnect`` event goes to
  the ``disconnectUrl`` with its cause: ``timeout``, ``busy``, ``error``, or ``cancel`` (``{"state": "completed"}``
  while it rings).
"""

from __future__ import annotations

import asyncio
import audioop
import base64
import binascii
import contextlib
import hashlib
import hmac
import re
import secrets
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from callbridge.carriers.bandwidth.wire import PLAYBACK_RATES, playback_content_type
from callbridge.sim.callee import Callee
from callbridge.sim.caller import CallResult
from callbridge.sim.carrier import OpenReason, SimCall, SimStream, SimulatedCarrier, WebSocketConnection, webhook_client
from callbridge.sim.transfer import sent_on

__all__ = ["ACCOUNT_ID", "BandwidthStream", "SimulatedBandwidth"]

ACCOUNT_ID: Final = "9900001"
CLIENT_ID: Final = "callbridge-sim-client"
CALLBACK_USER: Final = "bandwidth"
APPLICATION_ID: Final = "04e88489-df02-4e34-a0ee-27a91849555f"
_REDIRECT_TIMEOUT_S: Final = 5.0
"""How long a call whose stream stopped waits for the bridge to redirect it before it is given up (hung up)."""
_MAX_STREAM_PARAMS: Final = 12
_STREAM_ATTRIBUTES: Final = frozenset({"name", "mode", "tracks", "destination", "streamEventUrl", "streamEventMethod", "username", "password"})
_PLAYBACK_RATES: Final[dict[str, int | None]] = {playback_content_type(rate): rate for rate in (None, *sorted(PLAYBACK_RATES))}
"""``playAudio`` content types → the PCM rate (None: μ-law 8 kHz)."""
_OUTBOUND_KEYS: Final = {"playAudio": {"eventType", "media"}, "clear": {"eventType"}}


_E164: Final = re.compile(r"^\+[1-9][0-9]{6,14}$")


@dataclass(frozen=True, slots=True)
class _CreatedCall:
    """A call the Voice API created: what it was asked."""

    call_id: str
    to: str
    from_: str
    answer_url: str
    disconnect_url: str | None
    timeout_s: int
    auth: dict[str, str]
    """The request's callback credentials, as its webhooks carry them."""


def _create_refusal(body: object, application_id: str) -> str | None:
    """What Bandwidth's create-call API refuses in ``body`` (its 400 ``validation`` description), or None."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    for key in ("from", "to", "applicationId", "answerUrl"):
        if not isinstance(body.get(key), str) or not body[key]:
            return f"{key} is required"
    if body["applicationId"] != application_id:
        return f"application {body['applicationId']} is not this account's"
    for key in ("from", "to"):
        if not _E164.match(body[key]):
            return f"{key} must be an E.164 number"
    for key in ("answerUrl", "disconnectUrl"):
        if key in body and not (isinstance(body[key], str) and body[key].startswith(("http://", "https://"))):
            return f"{key} must be an http or https URL"
    timeout = body.get("callTimeout", 30)
    if not isinstance(timeout, int | float) or not 1 <= timeout <= 300:
        return "callTimeout must be 1 to 300 seconds"
    return None


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class BandwidthStream(SimStream):
    """One Bandwidth media stream: ``eventType`` JSON, μ-law 8 kHz in, μ-law or 16-bit PCM out, no markers,
    ``clear``."""

    marks_echoed_on_clear: ClassVar[bool] = False

    def __init__(self, conn: WebSocketConnection, stream_id: str, call: SimCall, carrier: SimulatedBandwidth, metadata: dict[str, Any]) -> None:
        super().__init__(conn, stream_id, 8000, call)
        self.carrier = carrier
        self.metadata = metadata
        self.sequence = 0
        self.event_url: str | None = None
        self.event_auth: dict[str, str] = {}
        self.content_type: str | None = None
        """The ``playAudio`` content type the bridge sends (one per stream)."""
        self._downsample: Any = None
        """``audioop.ratecv``'s state: wideband PCM played on the caller's 8 kHz leg."""

    async def send_audio(self, pcm_8k: bytes) -> None:
        self.sequence += 1
        payload = base64.b64encode(audioop.lin2ulaw(pcm_8k, 2)).decode()
        await self.send(f'{{"eventType":"media","track":"inbound","sequenceNumber":{self.sequence},"payload":"{payload}"}}')

    async def send_dtmf(self, digit: str) -> None:
        """Bandwidth carries no digits on the socket: ``<StartGather>``'s ``dtmfUrl`` gets each one (in the
        background: a webhook's round trip never holds up the caller's audio)."""
        self.carrier.in_background(self.carrier.post_dtmf(self.call, digit))

    async def send_stop(self) -> None:
        """The call ends on Bandwidth's side: ``stop`` on the socket, closed, then the webhooks that follow."""
        await self.send(orjson.dumps({"eventType": "stop", "metadata": self.metadata}).decode())
        self.dropped = True
        await self.conn.close()
        await self.carrier.post_stream_event(self, "closed")
        await self.carrier.post_disconnect(self.call)

    def mark_message(self, name: str) -> None:
        return None

    def receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.warn("binary frame")
            return
        try:
            payload = orjson.loads(message)
        except orjson.JSONDecodeError:
            self.warn("not JSON")
            return
        event = payload.get("eventType") if isinstance(payload, dict) else None
        if event not in _OUTBOUND_KEYS or set(payload) != _OUTBOUND_KEYS[event]:
            self.warn(f"unknown or malformed message {message[:80]}")
            return
        if event == "clear":
            self.clear()
            return
        media = payload["media"]
        content_type = media.get("contentType") if isinstance(media, dict) else None
        if not isinstance(media, dict) or set(media) != {"contentType", "payload"} or content_type not in _PLAYBACK_RATES:
            self.warn(f"playAudio media {str(media)[:80]}")
            return
        if self.content_type not in (None, content_type):
            self.warn(f"playAudio changed its contentType from {self.content_type} to {content_type}")
            return
        if self.content_type is None:
            self.carrier.content_types.append(content_type)
        self.content_type = content_type
        try:
            audio = binascii.a2b_base64(media["payload"], strict_mode=True)
        except (binascii.Error, TypeError):
            self.warn("playAudio payload is not base64")
            return
        rate = _PLAYBACK_RATES[content_type]
        if rate is None:
            self.enqueue_audio(audioop.ulaw2lin(audio, 2))
            return
        if len(audio) % 2:
            self.warn("playAudio PCM payload of an odd number of bytes")
            return
        narrow, self._downsample = audioop.ratecv(audio, 2, 1, rate, 8000, self._downsample)
        self.enqueue_audio(narrow)


class SimulatedBandwidth(SimulatedCarrier):
    """Bandwidth's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str] = "bandwidth"
    places_calls: ClassVar[bool] = True
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/api/v1/oauth2/token", "/api/v2/accounts/{account}/calls"})
    can_reconnect: ClassVar[bool] = True
    says_goodbye: ClassVar[bool] = True
    uses_marks: ClassVar[bool] = False

    def __init__(self, bridge_url: str, secret: str) -> None:
        super().__init__(bridge_url, secret)
        self.secret = secret
        self.content_types: list[str] = []
        """The ``playAudio`` content type of each stream, as the bridge first sent it."""
        self._http = webhook_client()
        self._redirects: dict[str, asyncio.Future[str | None]] = {}
        """call → the redirect URL the bridge's Voice API request names (None: the call was hung up)."""
        self._gather: dict[str, tuple[str, dict[str, str]]] = {}
        """call → its ``<StartGather>``: the dtmfUrl and the headers to send with it."""
        self._streams: dict[str, BandwidthStream] = {}
        self._background: set[asyncio.Task[object]] = set()
        self.application_id = APPLICATION_ID
        """The account's Voice application: a call created for another is refused."""
        self._created: dict[str, _CreatedCall] = {}

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        bandwidth = {
            "account_id": ACCOUNT_ID, "application_id": APPLICATION_ID, "client_id": CLIENT_ID, "client_secret": secret, "callback_username": CALLBACK_USER,
            "callback_password": secret, "api_base_url": rest_url + "/api/v2", "token_url": rest_url + "/api/v1/oauth2/token",
        }  # fmt: skip
        return {"bandwidth": bandwidth}

    def new_call_id(self) -> str:
        return f"c-{secrets.token_hex(4)}-{uuid.uuid4()}"

    def in_background(self, coroutine: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ REST

    def rest_routes(self) -> list[BaseRoute]:
        return [
            Route("/api/v1/oauth2/token", self._token, methods=["POST"]),
            Route("/api/v2/accounts/{account}/calls", self._create_call, methods=["POST"]),
            Route("/api/v2/accounts/{account}/calls/{call}", self._update_call, methods=["POST"]),
        ]

    async def _create_call(self, request: Request) -> Response:
        """``POST …/accounts/{account}/calls``: 201 with the ``callId``, then the call goes as its ``Callee`` says."""
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not self._token_valid(token) or request.path_params["account"] != ACCOUNT_ID:
            return JSONResponse({"type": "authentication-error"}, status_code=401)
        body = await self.json_body(request)
        refused = _create_refusal(body, self.application_id)
        if refused is not None:
            return JSONResponse({"type": "validation", "description": refused}, status_code=400)
        assert isinstance(body, dict)
        username, password = body.get("username"), body.get("password")
        auth = {"authorization": _basic(username, password)} if isinstance(username, str) and isinstance(password, str) else {}
        created = _CreatedCall(
            self.new_call_id(), body["to"], body["from"], body["answerUrl"], body.get("disconnectUrl"), int(body.get("callTimeout", 30)), auth,
        )  # fmt: skip
        self._created[created.call_id] = created
        self.dial_taken(created.call_id, self._ring(created, self.callees.get(created.to, Callee())))
        answer = {"callId": created.call_id, "accountId": ACCOUNT_ID, "applicationId": APPLICATION_ID, "to": created.to,
                  "from": created.from_, "answerUrl": created.answer_url, "callTimeout": created.timeout_s}  # fmt: skip
        return JSONResponse(answer, status_code=201)

    async def _ring(self, created: _CreatedCall, callee: Callee) -> CallResult | None:
        """The created call rings, and is answered (then runs as an inbound call does), or not (``disconnect``)."""
        end = await self.ring(created.call_id, callee, created.timeout_s)
        if end != "answered":
            await self._created_disconnect(created, {"canceled": "cancel", "busy": "busy", "fails": "error"}.get(end, "timeout"))
            return None
        self.status_reports.append((created.call_id, "answer"))
        return await self.take_answered(created.call_id, created.to, callee)

    async def _created_disconnect(self, created: _CreatedCall, cause: str) -> None:
        self.status_reports.append((created.call_id, cause))
        if created.disconnect_url is None:
            return
        event = self.event("disconnect", created.call_id, cause=cause)
        if cause == "error":
            event["errorMessage"] = "Service unavailable"
        try:
            await self._http.post(created.disconnect_url, content=orjson.dumps(event), headers={"content-type": "application/json", **created.auth})
        except httpx.HTTPError:
            pass

    async def _token(self, request: Request) -> Response:
        form = await request.form()
        if request.headers.get("authorization") != _basic(CLIENT_ID, self.secret) or form.get("grant_type") != "client_credentials":
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        nonce = secrets.token_urlsafe(12)
        return JSONResponse({"access_token": f"{nonce}.{self._token_mac(nonce)}", "token_type": "Bearer", "expires_in": 3600})

    def _token_mac(self, nonce: str) -> str:
        """Tokens are the secret's MAC of a nonce: any instance with the account's secret takes any other's (a
        load test's processes share one token endpoint)."""
        return hmac.new(self.secret.encode(), nonce.encode(), hashlib.sha256).hexdigest()

    def _token_valid(self, token: str) -> bool:
        nonce, _, mac = token.partition(".")
        return bool(nonce) and hmac.compare_digest(mac, self._token_mac(nonce))

    async def _update_call(self, request: Request) -> Response:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not self._token_valid(token) or request.path_params["account"] != ACCOUNT_ID:
            return JSONResponse({"type": "authentication-error"}, status_code=401)
        call_id = request.path_params["call"]
        call = self.calls.get(call_id)
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return JSONResponse({"type": "validation"}, status_code=400)
        if isinstance(body, dict) and body.get("state") == "completed" and self.stop_ringing(call_id):  # created, not answered
            return Response(status_code=200)
        if call is None or call.ended.is_set():
            return JSONResponse({"type": "call-not-found"}, status_code=404)
        if body.get("state") == "completed":
            self.end_call(call_id)
            return Response(status_code=200)
        url = body.get("redirectUrl")
        if isinstance(url, str) and url:
            pending = self._redirects.get(call_id)
            if pending is not None and not pending.done():
                pending.set_result(url)
            else:  # a redirect while the stream is up: the BXML it returns replaces the call's
                call.result.warnings.append("the bridge redirected a call whose stream was up")
            return Response(status_code=200)
        return JSONResponse({"type": "validation", "description": f"nothing to do in {body}"}, status_code=400)

    def end_call(self, call_id: str) -> bool:
        ended = super().end_call(call_id)
        pending = self._redirects.get(call_id)
        if pending is not None and not pending.done():
            pending.set_result(None)
        call = self.calls.get(call_id)
        if ended and call is not None:
            self.in_background(self.post_disconnect(call, cause="hangup"))
        return ended

    async def aclose(self) -> None:
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        await self._http.aclose()
        await super().aclose()

    # ------------------------------------------------------------- webhooks

    def event(self, event_type: str, call_id: str, **fields: Any) -> dict[str, Any]:
        """A webhook's event about the call: a call the Voice API created says ``outbound``, its own numbers."""
        created = self._created.get(call_id)
        parties = {"from": "+19195551212", "to": "+19195554321", "direction": "inbound"}
        if created is not None:
            parties = {"from": created.from_, "to": created.to, "direction": "outbound"}
        return {
            "eventType": event_type, "eventTime": "2026-12-02T12:00:00.000Z", "accountId": ACCOUNT_ID,
            "applicationId": APPLICATION_ID, **parties,
            "callId": call_id, "callUrl": f"https://voice.bandwidth.com/api/v2/accounts/{ACCOUNT_ID}/calls/{call_id}",
            "startTime": "2026-12-02T12:00:00.000Z", **fields,
        }  # fmt: skip

    async def _post(self, call: SimCall, url: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response | None:
        try:
            response = await self._http.post(url, content=orjson.dumps(body), headers={"content-type": "application/json", **headers})
        except httpx.HTTPError as exc:
            call.result.warnings.append(f"{body['eventType']} webhook failed: {exc!r}")
            return None
        if response.status_code >= 300:
            call.result.warnings.append(f"{body['eventType']} webhook answered HTTP {response.status_code}")
        return response

    def _app_auth(self) -> dict[str, str]:
        return {"authorization": _basic(CALLBACK_USER, self.secret)}

    async def post_dtmf(self, call: SimCall, digit: str) -> None:
        gather = self._gather.get(call.call_id)
        if gather is None:
            call.result.warnings.append(f"digit {digit} pressed with no <StartGather>: nobody hears it")
            return
        url, headers = gather
        await self._post(call, url, self.event("dtmf", call.call_id, digit=digit), headers)

    async def post_stream_event(self, stream: BandwidthStream, cause: str) -> None:
        if stream.event_url is None:
            return
        media = {"id": stream.stream_id, "name": stream.metadata["streamName"], "type": "WebSocket", "tracks": ["inbound"]}
        body = self.event("mediaStreamStopped", stream.call.call_id, cause=cause, mediaStream=media)
        await self._post(stream.call, stream.event_url, body, stream.event_auth)

    async def post_disconnect(self, call: SimCall, cause: str = "hangup") -> None:
        await self._post(call, f"{self.bridge_url}/bandwidth/status", self.event("disconnect", call.call_id, cause=cause), self._app_auth())

    # ------------------------------------------------------------------ call

    async def open_stream(self, call: SimCall, reason: OpenReason) -> BandwidthStream | None:
        """``initiate`` → BXML; after a drop, ``mediaStreamStopped`` → the bridge's redirect → ``redirect`` →
        BXML; then the stream the BXML starts."""
        result = call.result
        created = self._created.get(call.call_id)
        if reason == "answer" and created is not None:  # a call the Voice API created, answered
            url = created.answer_url
            event = self.event("answer", call.call_id)
        elif reason == "answer":
            url, event = self.with_answer_query(f"{self.bridge_url}/bandwidth/answer"), self.event("initiate", call.call_id)
        else:
            old = self._streams.pop(call.call_id, None)
            why = "dropped" if reason == "network_drop" else "was closed by the bridge"
            result.log(call.clock(), self.provider, f"stream {old.stream_id if old else '?'} {why}: mediaStreamStopped")
            pending: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self._redirects[call.call_id] = pending
            try:
                if old is not None:
                    await self.post_stream_event(old, "connection-error")
                redirect = await asyncio.wait_for(pending, _REDIRECT_TIMEOUT_S)
            except TimeoutError:
                redirect = None
            finally:
                self._redirects.pop(call.call_id, None)
            if redirect is None:
                if not call.ended.is_set():
                    result.log(call.clock(), self.provider, "no redirect came: the call ends")
                    self.end_call(call.call_id)
                return None
            url, event = redirect, self.event("redirect", call.call_id)
        for _ in range(5):  # a <Redirect> the BXML names is followed, a few times at most
            response = await self._post(call, url, event, self._app_auth())
            if response is None or response.status_code != 200:
                return None
            next_url, stream = await self._run_bxml(call, response.text)
            if stream is not None or next_url is None:
                return stream
            url, event = next_url, self.event("redirect", call.call_id)
        result.warnings.append("redirected five times without a stream")
        return None

    async def _run_bxml(self, call: SimCall, text: str) -> tuple[str | None, BandwidthStream | None]:
        """Run one BXML document: (a ``<Redirect>`` to follow, the stream it started)."""
        result = call.result
        try:
            root = ET.fromstring(text)
        except ET.ParseError:
            result.warnings.append(f"BXML is not XML: {text[:80]}")
            return None, None
        if root.tag != "Response":
            result.warnings.append(f"BXML root <{root.tag}>")
            return None, None
        stream: BandwidthStream | None = None
        for verb in root:
            if verb.tag == "StartGather":
                if "dtmfUrl" not in verb.attrib:
                    result.warnings.append("<StartGather> without a dtmfUrl")
                    continue
                self._gather[call.call_id] = (verb.attrib["dtmfUrl"], self._verb_auth(verb))
            elif verb.tag == "StartStream":
                stream = await self._start_stream(call, verb)
                if stream is None:
                    return None, None
            elif verb.tag == "Pause":
                if stream is not None:
                    return None, stream  # the call pauses with the stream running beside it
                await asyncio.sleep(float(verb.attrib.get("duration", "1")))
            elif verb.tag == "Redirect":
                return verb.attrib.get("redirectUrl"), stream
            elif verb.tag == "Hangup":
                result.log(call.clock(), self.provider, "BXML <Hangup/>: the call ends")
                return None, None
            elif verb.tag == "Transfer":
                nouns = [(child.text or "").strip() for child in verb if child.tag in ("PhoneNumber", "SipUri")]
                sent_on(result, call.clock(), self.provider, "BXML <Transfer>", nouns[0] if len(nouns) == 1 else nouns)
                return None, None
            else:
                result.warnings.append(f"unexpected BXML verb <{verb.tag}>")
        if stream is not None:
            result.warnings.append("the BXML ends after <StartStream>: Bandwidth ends the call, and the stream with it")
        return None, None

    @staticmethod
    def _verb_auth(verb: ET.Element) -> dict[str, str]:
        user, password = verb.attrib.get("username"), verb.attrib.get("password")
        return {"authorization": _basic(user, password)} if user is not None and password is not None else {}

    async def _start_stream(self, call: SimCall, verb: ET.Element) -> BandwidthStream | None:
        attrs = verb.attrib
        params = {p.attrib.get("name", ""): p.attrib.get("value", "") for p in verb.findall("StreamParam")}
        if (
            attrs.get("mode") != "bidirectional"
            or not attrs.get("destination", "").startswith(("ws://", "wss://"))
            or set(attrs) - _STREAM_ATTRIBUTES
            or attrs.get("tracks", "inbound") != "inbound"
            or len(params) > _MAX_STREAM_PARAMS
            or len(verb) != len(params)
        ):
            call.result.warnings.append(f"Bandwidth rejects the <StartStream>: {attrs}")
            return None
        stream_id = f"s-{uuid.uuid4()}"
        metadata = {
            "accountId": ACCOUNT_ID, "callId": call.call_id, "streamId": stream_id, "streamName": attrs.get("name", stream_id),
            "tracks": [{"name": "inbound", "mediaFormat": {"encoding": "audio/PCMU", "sampleRate": 8000}}],
        }  # fmt: skip
        ws = await connect(attrs["destination"], compression=None)
        await ws.send(orjson.dumps({"eventType": "start", "metadata": metadata, "streamParams": params}).decode())
        stream = BandwidthStream(WebSocketConnection(ws), stream_id, call, self, metadata)
        stream.event_url = attrs.get("streamEventUrl")
        stream.event_auth = self._verb_auth(verb)
        self._streams[call.call_id] = stream
        return stream

    # -------------------------------------------------------------- hostile

    def unknown_event(self, stream: SimStream) -> str:
        return orjson.dumps({"eventType": "transcription", "transcript": {"text": "hi"}}).decode()

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, BandwidthStream)

        def media(payload: str = "/////w==", sequence: object = 10**6, track: str = "inbound") -> str:
            return orjson.dumps({"eventType": "media", "track": track, "sequenceNumber": sequence, "payload": payload}).decode()

        start = {"eventType": "start", "metadata": stream.metadata, "streamParams": {}}
        return {
            "non_json_text": ("{this is not json", "not_json"),
            "binary_frame": (b"\x00\x01\x02", "binary_frame"),
            "invalid_base64": (media(payload="%%%not-base64%%%"), "bad_base64"),
            "oversized_message": ('{"eventType":"media","pad":"' + "x" * 300_000 + '"}', "oversized"),
            "event_not_a_name": ('{"eventType":7}', "bad_field"),
            "second_start": (orjson.dumps(start).decode(), "out_of_order"),
            "bad_sequence_number": (media(sequence="seven"), "bad_field"),
            "bad_track": (media(track="sideways"), "bad_field"),
            "wrong_stream_stop": (orjson.dumps({"eventType": "stop", "metadata": {"streamId": "s-other"}}).decode(), "wrong_stream"),
        }

    async def forged_requests_refused(self) -> bool:
        url = f"{self.bridge_url}/bandwidth/answer"
        call_id = self.new_call_id()
        body = orjson.dumps(self.event("initiate", call_id))
        headers = {"content-type": "application/json"}
        unsigned = await self._http.post(url, content=body, headers=headers)
        wrong = await self._http.post(url, content=body, headers={**headers, "authorization": _basic(CALLBACK_USER, "not-the-secret")})
        refused = unsigned.status_code == wrong.status_code == 403
        # the media upgrade has no credentials; a stream without a minted token is never bridged
        ws_url = url.replace("http", "ws", 1).removesuffix("/answer") + "/media"
        async with connect(ws_url) as ws:
            metadata = {"accountId": ACCOUNT_ID, "callId": call_id, "streamId": "s-forged", "streamName": "x",
                        "tracks": [{"name": "inbound", "mediaFormat": {"encoding": "audio/PCMU", "sampleRate": 8000}}]}  # fmt: skip
            await ws.send(orjson.dumps({"eventType": "start", "metadata": metadata, "streamParams": {"token": "ab" * 32}}).decode())
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
            return refused and ws.close_code == 1008

