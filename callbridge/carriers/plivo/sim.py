"""A simulated Plivo, faithful to the wire (telephony-protocols.md §3.2, §7), for the demo, the tests and load
tests.

What Plivo does for an inbound call, and what this does:
- POSTs the answer URL (form ``CallUUID``, ``From``, ``To``, ``CallStatus``…)
  signed with ``X-Plivo-Signature-V3`` and its nonce, parses the XML, and
  requires a bidirectional ``<Stream>`` whose attributes are ones Plivo
  accepts (``audioTrack="inbound"`` when bidirectional, a known
  ``contentType``, ``extraHeaders`` of letters and digits only, at most 512
  bytes); with ``keepCallAlive="true"`` the XML goes on when the stream ends,
  so a ``<Redirect>`` after it is followed (POST, signed) and ``<Hangup/>``
  ends the call;
- opens the websocket named in the element body and sends ``start``
  (camelCase, integer ``sequenceNumber``, ``extraHeaders`` forwarded as
  ``extra_headers`` with ``;`` between pairs as Plivo's event docs show), then
  a 20 ms ``media`` frame every 20 ms at real time, in the stream's format,
  with integer ``sequenceNumber`` / ``chunk`` and a wall-clock Unix epoch ms
  ``timestamp`` (with a few ms of jitter); ``dtmf``;
- plays what the bridge sends (``callbridge.sim.carrier``): ``playAudio``
  (its ``contentType`` and ``sampleRate`` must be the stream's), a
  ``checkpoint`` answered with ``playedStream`` when playback reaches it,
  ``clearAudio`` answered with ``clearedAudio`` and **no** ``playedStream``
  for the checkpoints it voided; anything else (unknown event, wrong
  ``streamId``, bad base64, binary frame, extra fields) is recorded as a
  warning;
- never says goodbye on the socket: when the call ends it closes the socket
  and POSTs the application's hang-up URL (``/plivo/hangup``, signed);
- serves the REST hang-up (``DELETE /v1/Account/{auth_id}/Call/{uuid}/``,
  basic auth ``auth_id:auth_token``): 204, 404 for a call that is not live,
  401 without the credentials;
- makes calls (#42): ``POST /v1/Account/{auth_id}/Call/`` (JSON ``from``, ``to``: digits, E.164 without the +;
  ``answer_url``; ``ring_timeout`` 5–120 s; URLs http/https; 400 ``{"error": …}`` otherwise), 201 with the
  ``request_uuid``. The call rings its ``Callee``: the ``ring_url`` hears ``ringing``; answered, the ``answer_url``
  gets the call (``Direction`` outbound, ``RequestUUID``) and it runs as an inbound one; unanswered, the
  ``hangup_url`` gets its ``CallStatus`` and ``HangupCause`` (``busy`` ``USER_BUSY``, ``no-answer`` ``NO_ANSWER``,
  ``failed`` ``NETWORK_OUT_OF_ORDER``, ``cancel`` ``ORIGINATOR_CANCEL`` after ``DELETE …/Request/{request_uuid}/``).
"""

from __future__ import annotations

import audioop
import base64
import binascii
import contextlib
import hashlib
import random
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from callbridge.carriers.plivo.http import plivo_signature_v3
from callbridge.codecs import AudioEncoding, decode_to_pcm16, encode_from_pcm16
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

__all__ = ["PlivoStream", "SimulatedPlivo", "auth_id_for", "valid_extra_headers"]

_CONTENT_TYPES: Final = {
    "audio/x-mulaw;rate=8000": (AudioEncoding.PCMU, "audio/x-mulaw", 8000),
    "audio/x-l16;rate=8000": (AudioEncoding.L16, "audio/x-l16", 8000),
    "audio/x-l16;rate=16000": (AudioEncoding.L16, "audio/x-l16", 16000),
}
_OUTBOUND_KEYS: Final = {
    "playAudio": ({"event", "media"}, {"streamId"}),
    "checkpoint": ({"event", "name"}, {"streamId"}),
    "clearAudio": ({"event"}, {"streamId"}),
    "sendDTMF": ({"event", "dtmf"}, {"streamId"}),
}
"""Plivo's inbound events: (required keys, optional keys)."""
_EXTRA_HEADERS_MAX: Final = 512


_UNANSWERED: Final = {
    "canceled": ("cancel", "ORIGINATOR_CANCEL"), "busy": ("busy", "USER_BUSY"), "fails": ("failed", "NETWORK_OUT_OF_ORDER"),
    "no_answer": ("no-answer", "NO_ANSWER"),
}  # fmt: skip
"""How a made call that was not answered ends: its hang-up callback's ``CallStatus`` and ``HangupCause``."""


@dataclass(frozen=True, slots=True)
class _MadeCall:
    """A call the Call API made: what it was asked."""

    request_uuid: str
    call_uuid: str
    to: str
    from_: str
    answer_url: str
    ring_url: str | None
    hangup_url: str | None
    ring_timeout_s: int


def _make_refusal(body: object) -> str | None:
    """What Plivo's Call API refuses in ``body`` (its 400 ``error``), or None."""
    if not isinstance(body, dict):
        return "invalid JSON body"
    for key in ("from", "to", "answer_url"):
        if not isinstance(body.get(key), str) or not body[key]:
            return f"{key} is a required parameter"
    for key in ("from", "to"):
        digits = body[key].removeprefix("+")
        if not digits.isascii() or not digits.isdigit() or not 7 <= len(digits) <= 15:
            return f"{key} is not a valid phone number"
    for key in ("answer_url", "ring_url", "hangup_url"):
        if key in body and not (isinstance(body[key], str) and body[key].startswith(("http://", "https://"))):
            return f"{key} is not a valid URL"
    timeout = body.get("ring_timeout", 60)
    if not isinstance(timeout, int) or not 5 <= timeout <= 120:
        return "ring_timeout must be between 5 and 120"
    return None


def auth_id_for(secret: str) -> str:
    """The simulated account's Auth ID (``MA`` + 18 characters), derived from its auth token."""
    return "MA" + hashlib.sha256(secret.encode()).hexdigest()[:18].upper()


def valid_extra_headers(value: str) -> bool:
    """Plivo: key=value pairs, ``,`` between them, only ``[A-Za-z0-9]`` in keys and values, ≤ 512 bytes."""
    if len(value.encode()) > _EXTRA_HEADERS_MAX:
        return False
    for pair in value.split(","):
        key, sep, val = pair.partition("=")
        if not sep or not key.isalnum() or not key.isascii() or not val.isalnum() or not val.isascii():
            return False
    return True


class PlivoStream(SimStream):
    """One Plivo audio stream: camelCase JSON, epoch-ms timestamps, checkpoints and clearedAudio."""

    marks_echoed_on_clear: ClassVar[bool] = False

    def __init__(
        self, conn: WebSocketConnection, stream_id: str, call: SimCall, encoding: AudioEncoding, wire_type: str, rate_hz: int
    ) -> None:
        super().__init__(conn, stream_id, rate_hz, call)
        self.encoding = encoding
        self.wire_type = wire_type
        self.sequence = 1  # start was message 1
        self.chunk = 0
        self.epoch_ms = int(time.time() * 1000)
        self._jitter = random.Random(stream_id)
        self._resample_state: Any = None
        self.on_hangup: Callable[[], Awaitable[None]] | None = None

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    async def _send_json(self, payload: dict[str, Any]) -> None:
        await self.send(orjson.dumps(payload).decode())

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.rate_hz != 8000:
            pcm_8k, self._resample_state = audioop.ratecv(pcm_8k, 2, 1, 8000, self.rate_hz, self._resample_state)
        await self.send_audio_at_rate(pcm_8k)

    async def send_audio_at_rate(self, pcm: bytes) -> None:
        payload = encode_from_pcm16(self.encoding, pcm)
        stamp = self.epoch_ms + 20 * self.chunk + self._jitter.randint(0, 4)  # a wall-clock stamp
        self.chunk += 1
        media = {"track": "inbound", "timestamp": str(stamp), "chunk": self.chunk, "payload": base64.b64encode(payload).decode()}
        await self._send_json({"event": "media", "sequenceNumber": self._next_sequence(), "streamId": self.stream_id, "media": media})

    async def send_dtmf(self, digit: str) -> None:
        dtmf = {"track": "inbound", "digit": digit, "timestamp": str(int(time.time() * 1000))}
        await self._send_json({"event": "dtmf", "sequenceNumber": self._next_sequence(), "streamId": self.stream_id, "dtmf": dtmf})

    async def send_stop(self) -> None:
        """Plivo says nothing on the socket when the call ends: it calls the application's hang-up URL and
        closes the socket (in that order here; Plivo documents neither the order nor the timing)."""
        if self.on_hangup is not None:
            await self.on_hangup()
        self.dropped = True
        await self.conn.close()

    def mark_message(self, name: str) -> str:
        return orjson.dumps({"event": "playedStream", "sequenceNumber": self._next_sequence(), "streamId": self.stream_id, "name": name}).decode()

    def cleared_message(self) -> str:
        return orjson.dumps({"event": "clearedAudio", "sequenceNumber": self._next_sequence(), "streamId": self.stream_id}).decode()

    def receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.warn("binary frame")
            return
        try:
            payload = orjson.loads(message)
        except orjson.JSONDecodeError:
            self.warn("not JSON")
            return
        event = payload.get("event") if isinstance(payload, dict) else None
        if event not in _OUTBOUND_KEYS:
            self.warn(f"unknown event {message[:80]}")
            return
        required, optional = _OUTBOUND_KEYS[event]
        keys = set(payload)
        if not required <= keys or keys - required - optional or payload.get("streamId", self.stream_id) != self.stream_id:
            self.warn(f"invalid {event} {message[:80]}")
            return
        if event == "playAudio":
            self._play_audio(payload["media"])
        elif event == "checkpoint":
            if not isinstance(payload["name"], str) or not payload["name"]:
                self.warn("checkpoint without a name")
            else:
                self.add_mark(payload["name"])
        elif event == "clearAudio":
            self.clear()
        else:
            self.warn("sendDTMF: not expected from the bridge")

    def _play_audio(self, media: object) -> None:
        if not isinstance(media, dict) or set(media) != {"contentType", "sampleRate", "payload"}:
            self.warn(f"playAudio media {str(media)[:80]}")
            return
        rate = media["sampleRate"]
        if media["contentType"] != self.wire_type or str(rate) != str(self.rate_hz) or isinstance(rate, bool):
            self.warn(f"playAudio as {media['contentType']}/{rate} on a {self.wire_type}/{self.rate_hz} stream")
            return
        try:
            audio = binascii.a2b_base64(media["payload"], strict_mode=True)
        except (binascii.Error, TypeError):
            self.warn("playAudio payload is not base64")
            return
        if self.encoding is AudioEncoding.L16 and len(audio) % 2:
            self.warn("playAudio L16 payload of an odd length")
            return
        self.enqueue_audio(decode_to_pcm16(self.encoding, audio))


class SimulatedPlivo(SimulatedCarrier):
    """Plivo's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str] = "plivo"
    places_calls: ClassVar[bool] = True
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/v1/Account/{auth_id}/Call/"})
    can_reconnect: ClassVar[bool] = True
    says_goodbye: ClassVar[bool] = False
    calls_hangup_url: ClassVar[bool] = True
    """The Plivo application has a Hangup URL (the bridge's ``/plivo/hangup``): it is POSTed when a call ends."""

    def __init__(self, bridge_url: str, auth_token: str) -> None:
        super().__init__(bridge_url, auth_token)
        self.auth_token = auth_token
        self.auth_id = auth_id_for(auth_token)
        self._http = webhook_client()
        self._redirects: dict[str, str] = {}
        """call → the ``<Redirect>`` URL that follows its stream."""
        self._made: dict[str, _MadeCall] = {}
        """CallUUID → a call the Call API made."""

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        plivo = {"auth_id": auth_id_for(secret), "auth_token": secret, "api_base_url": rest_url, "validate_signatures": True}
        return {"plivo": plivo}

    def new_call_id(self) -> str:
        return str(uuid.uuid4())

    # ------------------------------------------------------------------ REST

    def rest_routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/Account/{auth_id}/Call/", self._make_call, methods=["POST"]),
            Route("/v1/Account/{auth_id}/Call/{call}/", self._rest_hang_up, methods=["DELETE"]),
            Route("/v1/Account/{auth_id}/Request/{request}/", self._cancel_request, methods=["DELETE"]),
        ]

    def _authenticated(self, request: Request) -> bool:
        expected = "Basic " + base64.b64encode(f"{self.auth_id}:{self.auth_token}".encode()).decode()
        return request.headers.get("authorization") == expected and request.path_params["auth_id"] == self.auth_id

    async def _rest_hang_up(self, request: Request) -> Response:
        if not self._authenticated(request):
            return JSONResponse({"error": "authentication failed"}, status_code=401)
        if not self.end_call(request.path_params["call"]):
            return JSONResponse({"error": "call not found"}, status_code=404)
        return Response(status_code=204)

    async def _make_call(self, request: Request) -> Response:
        """``POST …/Call/``: 201 with the ``request_uuid``, then the call goes as its ``Callee`` says."""
        if not self._authenticated(request):
            return JSONResponse({"error": "authentication failed"}, status_code=401)
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            body = None
        refused = _make_refusal(body)
        if refused is not None:
            return JSONResponse({"api_id": str(uuid.uuid4()), "error": refused}, status_code=400)
        assert isinstance(body, dict)
        made = _MadeCall(
            str(uuid.uuid4()), self.new_call_id(), "+" + body["to"].removeprefix("+"), "+" + body["from"].removeprefix("+"),
            body["answer_url"], body.get("ring_url"), body.get("hangup_url"), int(body.get("ring_timeout", 60)),
        )  # fmt: skip
        self._made[made.call_uuid] = made
        self.dial_taken(made.request_uuid, self._ring(made, self.callees.get(made.to, Callee())))
        return JSONResponse({"api_id": str(uuid.uuid4()), "message": "call fired", "request_uuid": made.request_uuid}, status_code=201)

    async def _cancel_request(self, request: Request) -> Response:
        if not self._authenticated(request):
            return JSONResponse({"error": "authentication failed"}, status_code=401)
        if not self.stop_ringing(request.path_params["request"]):
            return JSONResponse({"error": "not found"}, status_code=404)
        return Response(status_code=204)

    async def _ring(self, made: _MadeCall, callee: Callee) -> CallResult | None:
        """The call rings (``ring_url``), and is answered (then runs as an inbound call does), or not (its
        ``hangup_url`` says how)."""
        await self._made_callback(made, made.ring_url, "ringing", Event="Ring")
        end = await self.ring(made.request_uuid, callee, made.ring_timeout_s)
        if end != "answered":
            status, cause = _UNANSWERED[end]
            await self._made_callback(made, made.hangup_url, status, Event="Hangup", HangupCause=cause, Duration="0")
            return None
        return await self.take_answered(made.call_uuid, made.to, callee)

    async def _made_callback(self, made: _MadeCall, url: str | None, status: str, **extra: str) -> None:
        self.status_reports.append((made.request_uuid, status))
        if url is None:
            return
        params = {**self.call_params(made.call_uuid, status), **extra}
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(url, data=params, headers=self._signed("POST", url, params))

    async def aclose(self) -> None:
        await self._http.aclose()
        await super().aclose()

    # ------------------------------------------------------------------ call

    def _signed(self, method: str, url: str, params: dict[str, str]) -> dict[str, str]:
        nonce = str(random.randrange(10**19, 10**20))
        signature = plivo_signature_v3(self.auth_token, method, url, params if method == "POST" else {}, nonce)
        return {"X-Plivo-Signature-V3": signature, "X-Plivo-Signature-V3-Nonce": nonce}

    def call_params(self, call_id: str, status: str) -> dict[str, str]:
        made = self._made.get(call_id)
        if made is not None:  # a call the Call API made
            return {
                "CallUUID": call_id, "RequestUUID": made.request_uuid, "From": made.from_.removeprefix("+"),
                "To": made.to.removeprefix("+"), "CallStatus": status, "Direction": "outbound",
                "Event": "StartApp" if status == "in-progress" else status, "ALegUUID": call_id,
                "ALegRequestUUID": made.request_uuid, "BillRate": "0.00850",
            }  # fmt: skip
        return {
            "CallUUID": call_id,
            "From": "14155550006",
            "To": "14155550001",
            "CallStatus": status,
            "Direction": "inbound",
            "Event": "StartApp" if status == "ringing" else "Redirect",
            "ALegUUID": call_id,
            "ALegRequestUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, call_id)),
            "BillRate": "0.00850",
            "CallerName": "+14155550006",
        }

    async def open_stream(self, call: SimCall, reason: OpenReason) -> PlivoStream | None:
        """Fetch the answer URL (after a stream ends: the ``<Redirect>`` that follows it) and open the stream."""
        result = call.result
        made = self._made.get(call.call_id)
        first = made.answer_url if made is not None else self.with_answer_query(f"{self.bridge_url}/plivo/answer")
        url = self._redirects.pop(call.call_id, first)
        if reason != "answer":
            result.log(call.clock(), self.provider, "the stream ended: the XML goes on to <Redirect>")
        params = self.call_params(call.call_id, "ringing" if reason == "answer" and made is None else "in-progress")
        response = await self._http.post(url, data=params, headers=self._signed("POST", url, params))
        if response.status_code != 200:
            result.log(call.clock(), self.provider, f"answer URL failed: HTTP {response.status_code}")
            return None
        root = ET.fromstring(response.text)
        stream_el = root.find("Stream")
        dial_el = root.find("Dial")
        if stream_el is None and dial_el is not None:
            number, user = dial_el.find("Number"), dial_el.find("User")
            digits = (number.text or "").strip() if number is not None else ""  # Plivo's numbers: E.164 without the +
            target = f"+{digits}" if digits.isdigit() else (user.text or "").strip() if user is not None else None
            sent_on(result, call.clock(), self.provider, "XML <Dial>", target)
            return None
        if stream_el is None:
            result.log(call.clock(), self.provider, f"XML <{root[0].tag if len(root) else 'nothing'}>: the call ends")
            return None
        attrs = stream_el.attrib
        content = _CONTENT_TYPES.get(attrs.get("contentType", "audio/x-l16;rate=8000"))
        if (
            content is None
            or attrs.get("bidirectional") != "true"
            or attrs.get("keepCallAlive") != "true"
            or attrs.get("audioTrack", "inbound") != "inbound"
            or not valid_extra_headers(attrs.get("extraHeaders", "x=1"))
        ):
            result.warnings.append(f"Plivo rejects the <Stream> element: {attrs}")
            return None
        redirect = root.find("Redirect")
        if redirect is not None and redirect.text:
            self._redirects[call.call_id] = redirect.text.strip()
        encoding, wire_type, rate = content
        ws = await connect((stream_el.text or "").strip(), compression=None)
        stream_id = str(uuid.uuid4())
        start = {
            "callId": call.call_id,
            "streamId": stream_id,
            "accountId": self.auth_id,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": wire_type, "sampleRate": rate},
        }
        message: dict[str, Any] = {"event": "start", "sequenceNumber": 1, "start": start}
        if "extraHeaders" in attrs:
            message["extra_headers"] = attrs["extraHeaders"].replace(",", ";")
        await ws.send(orjson.dumps(message).decode())
        stream = PlivoStream(WebSocketConnection(ws), stream_id, call, encoding, wire_type, rate)

        async def hung_up() -> None:
            await self._hangup_callback(call)

        if self.calls_hangup_url:
            stream.on_hangup = hung_up
        return stream

    async def _hangup_callback(self, call: SimCall) -> None:
        """The application's hang-up URL, once the call is over."""
        url = f"{self.bridge_url}/plivo/hangup"
        cause = "NORMAL_CLEARING"
        params = {**self.call_params(call.call_id, "completed"), "Event": "Hangup", "HangupCause": cause, "Duration": "3"}
        try:
            response = await self._http.post(url, data=params, headers=self._signed("POST", url, params))
        except httpx.HTTPError as exc:
            call.result.warnings.append(f"hang-up URL failed: {exc!r}")
            return
        if response.status_code >= 300:
            call.result.warnings.append(f"hang-up URL failed: HTTP {response.status_code}")

    # -------------------------------------------------------------- hostile

    def unknown_event(self, stream: SimStream) -> str:
        return orjson.dumps({"event": "transcription", "streamId": stream.stream_id, "transcription": {"text": "hi"}}).decode()

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, PlivoStream)
        sid = stream.stream_id

        def media(payload: str = "/////w==", stream_id: str = sid, sequence: object = 10**6) -> str:
            body = {"track": "inbound", "timestamp": str(stream.epoch_ms), "chunk": 1, "payload": payload}
            return orjson.dumps({"event": "media", "sequenceNumber": sequence, "streamId": stream_id, "media": body}).decode()

        start = {"callId": stream.call.call_id, "streamId": sid, "accountId": self.auth_id, "mediaFormat": {"encoding": stream.wire_type, "sampleRate": stream.rate_hz}}
        return {
            "non_json_text": ("{this is not json", "not_json"),
            "binary_frame": (b"\x00\x01\x02", "binary_frame"),
            "wrong_stream_id": (media(stream_id=str(uuid.uuid4())), "wrong_stream"),
            "invalid_base64": (media(payload="%%%not-base64%%%"), "bad_base64"),
            "oversized_message": ('{"event":"media","pad":"' + "x" * 300_000 + '"}', "oversized"),
            "event_not_a_name": (f'{{"event":7,"sequenceNumber":7,"streamId":"{sid}"}}', "bad_field"),
            "second_start": (orjson.dumps({"event": "start", "sequenceNumber": 2, "start": start}).decode(), "out_of_order"),
            "bad_sequence_number": (media(sequence="seven"), "bad_field"),
            "bad_dtmf_digit": (orjson.dumps({"event": "dtmf", "sequenceNumber": 10**6, "streamId": sid, "dtmf": {"digit": "X"}}).decode(), "bad_field"),
        }

    async def forged_requests_refused(self) -> bool:
        url = f"{self.bridge_url}/plivo/answer"
        params = self.call_params(self.new_call_id(), "ringing")
        forged_headers = {"X-Plivo-Signature-V3": base64.b64encode(b"f" * 32).decode(), "X-Plivo-Signature-V3-Nonce": "1"}
        forged = await self._http.post(url, data=params, headers=forged_headers)
        unsigned = await self._http.post(url, data=params)
        wrong_key_headers = {"X-Plivo-Signature-V3": plivo_signature_v3("not-the-token", "POST", url, params, "5"), "X-Plivo-Signature-V3-Nonce": "5"}
        wrong_key = await self._http.post(url, data=params, headers=wrong_key_headers)
        refused = forged.status_code == unsigned.status_code == wrong_key.status_code == 403
        ws_url = url.replace("http", "ws", 1).removesuffix("/answer") + "/media"
        try:
            async with connect(ws_url, additional_headers=forged_headers):
                return False
        except InvalidStatus as exc:
            refused = refused and exc.response.status_code == 403
        # an unsigned upgrade is let in, but a stream without a minted token is never bridged
        async with connect(ws_url) as ws:
            start = {"callId": params["CallUUID"], "streamId": str(uuid.uuid4()), "accountId": self.auth_id, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}
            await ws.send(orjson.dumps({"event": "start", "sequenceNumber": 1, "start": start, "extra_headers": "token=" + "ab" * 32}).decode())
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
            return refused and ws.close_code == 1008
