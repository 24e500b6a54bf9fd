"""A simulated Twilio, faithful to the wire (telephony-protocols.md §1), for the demo, the tests and load tests.

It does what Twilio does for an inbound call on ``<Connect><Stream>``:
- POSTs the signed answer webhook, parses the TwiML, follows ``<Redirect>``
  when a stream ends without the call ending (and stops at ``<Hangup/>``);
  TwiML of ``<Pause>`` and ``<Redirect>`` only (a draining bridge's) waits, then
  POSTs the webhook again, to the bridge ``route`` picks (the load balancer);
- opens the media websocket with ``X-Twilio-Signature`` over the ``wss`` URL,
  sends ``connected`` and ``start`` (the ``<Parameter>`` values in
  ``customParameters``), then a 20 ms μ-law ``media`` frame every 20 ms at real
  time, with string ``sequenceNumber``, ``chunk`` and ``timestamp`` as Twilio
  sends them; ``dtmf`` and ``stop``;
- plays what the bridge sends (``callbridge.sim.carrier``): echoes each ``mark``
  when playback reaches it and, on ``clear``, every pending one; anything but
  ``media`` / ``mark`` / ``clear`` with the right ``streamSid`` and no extra
  fields is recorded as a 31951 warning, a binary frame as 31950;
- takes the REST dial (``POST …/Calls.json``, basic auth; ``To``, ``From``, ``Url``, ``StatusCallback``,
  ``StatusCallbackEvent``, ``Timeout`` checked as Twilio's API checks them, 400 with its code otherwise), rings
  the number's ``Callee`` (``callees``), reports ``initiated`` / ``ringing`` / ``answered`` / the end to the signed
  ``StatusCallback``, and, answered, POSTs ``Url`` (``Direction=outbound-api``) and streams as for an inbound
  call (``dialled`` holds each such call's ``CallResult``); ``Status=canceled`` (or ``completed``) while it rings
  cancels it (``canceled`` reported);
- serves the REST hang-up (``POST …/Calls/{CallSid}.json`` ``Status=completed``,
  basic auth): the call ends, the stream gets ``stop``; and the call update
  with new ``Twiml`` (a transfer's ``<Dial>``): the TwiML is recorded in
  ``call_updates``, the running ``<Connect><Stream>`` ends (``stop``), and
  the call leaves the bridge.

A dialect of Twilio's is the same in a subclass, with its own paths, signature
header, REST prefix, and optionally PCM16 24 kHz (``L16@24000h``).
"""

from __future__ import annotations

import asyncio
import audioop
import base64
import binascii
import hashlib
import re
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from callbridge.carriers.spec import FarEndMessage
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.codecs import AudioEncoding, decode_to_pcm16, encode_from_pcm16
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import (
    CallerScript,
    CallResult,
    OpenReason,
    SimCall,
    SimStream,
    SimulatedCarrier,
    WebSocketConnection,
    webhook_client,
)
from callbridge.sim.transfer import sent_on

__all__ = [
    "CallResult",
    "CallerScript",
    "DirectTwilioStreams",
    "FAR_END",
    "MediaStream",
    "SimulatedTwilio",
    "TwilioFarEnd",
    "TwilioStream",
    "TwimlRedirect",
    "answer_and_stream",
    "open_media_stream",
]

_OUTBOUND_KEYS = {"media": {"event", "streamSid", "media"}, "mark": {"event", "streamSid", "mark"}, "clear": {"event", "streamSid"}}
_MULAW_FORMAT: Mapping[str, object] = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}


@dataclass(frozen=True, slots=True)
class MediaStream:
    """A media websocket Twilio opened for a call, after ``connected`` and ``start``."""

    ws: ClientConnection
    stream_sid: str
    encoding: AudioEncoding = AudioEncoding.PCMU
    rate_hz: int = 8000
    redirect_url: str | None = None
    """The ``<Redirect>`` after ``<Connect>``: what Twilio POSTs when the stream ends without the call."""


@dataclass(frozen=True, slots=True)
class TwimlDial:
    """TwiML that sends the call on: ``<Dial>`` a number (or ``<Sip>`` a URI)."""

    target: str | None


@dataclass(frozen=True, slots=True)
class TwimlRedirect:
    """TwiML that only waits and redirects: Twilio pauses ``pause_s``, then POSTs ``url``."""

    pause_s: float
    url: str


_E164_OR_URI: Final = re.compile(r"^(\+[1-9][0-9]{6,14}|sips?:[^\s]+|client:[A-Za-z0-9_]+)$")
_STATUS_EVENTS: Final = frozenset({"initiated", "ringing", "answered", "completed"})


@dataclass(frozen=True, slots=True)
class OutboundLeg:
    """A call created through the REST API: what it was asked, as the webhooks for it say."""

    call_sid: str
    to: str
    from_: str
    url: str
    status_callback: str | None
    status_events: frozenset[str]
    timeout_s: int

    def params(self, account_sid: str, status: str) -> dict[str, str]:
        """What Twilio's requests about the call say of it (its answer webhook, its status callbacks)."""
        return {
            "AccountSid": account_sid, "ApiVersion": "2010-04-01", "CallSid": self.call_sid, "CallStatus": status,
            "Direction": "outbound-api", "From": self.from_, "To": self.to, "Called": self.to, "Caller": self.from_,
        }  # fmt: skip


_MAX_REDIRECTS = 10
"""Redirects one webhook may chain before the simulated Twilio gives up on the call (Twilio's own limit is
higher; a test that needs more has a loop)."""


async def answer_and_stream(
    http: httpx.AsyncClient,
    validator: RequestValidator,
    bridge_url: str,
    params: dict[str, str],
    *,
    provider: str = "twilio",
    signature_header: str = "X-Twilio-Signature",
    sign_upgrade: bool = True,
    url: str | None = None,
    stream_codecs: Mapping[str, Mapping[str, object]] | None = None,
) -> MediaStream | TwimlRedirect | TwimlDial | str:
    """What Twilio does when a call comes in (or a ``<Redirect>`` runs): POST the signed answer webhook, and if
    the TwiML says ``<Connect><Stream>``, open that websocket (signed over its URL, no parameters) and send
    ``connected`` and ``start`` with the ``<Parameter>`` values. TwiML of ``<Pause>`` (optional) and ``<Redirect>``
    is returned as ``TwimlRedirect`` for the caller to follow. Returns why not otherwise (HTTP status, verb).
    ``stream_codecs``: the dialect's ``<Stream codec="…">`` values and the ``mediaFormat`` each gets both ways (none
    on Twilio's own). ``url``: the URL a ``<Redirect>`` named (its query kept, signed with it), else the answer
    URL."""
    url = url or f"{bridge_url}/{provider}/voice"
    response = await http.post(url, data=params, headers={signature_header: validator.compute_signature(url, params)})
    if response.status_code != 200:
        return f"answer webhook failed: HTTP {response.status_code}"
    root = ET.fromstring(response.text)
    stream_el = root.find("./Connect/Stream")
    redirect_el = root.find("Redirect")
    if stream_el is None and redirect_el is not None and redirect_el.text and all(el.tag in ("Pause", "Redirect") for el in root):
        pause_el = root.find("Pause")
        return TwimlRedirect(float(pause_el.attrib.get("length", "1")) if pause_el is not None else 0.0, redirect_el.text.strip())
    dial_el = root.find("Dial")
    if stream_el is None and dial_el is not None:
        sip_el = dial_el.find("Sip")
        return TwimlDial(((sip_el.text if sip_el is not None else dial_el.text) or "").strip() or None)
    if stream_el is None:
        return f"TwiML <{root[0].tag if len(root) else 'nothing'}>: the call ends"
    stream_url = stream_el.attrib["url"]
    media_format = (stream_codecs or {}).get(stream_el.attrib.get("codec", ""), _MULAW_FORMAT)
    parameters = {p.attrib["name"]: p.attrib["value"] for p in stream_el.findall("Parameter")}
    headers = {signature_header: validator.compute_signature(stream_url, {})} if sign_upgrade else {}
    redirect = redirect_el.text.strip() if redirect_el is not None and redirect_el.text else None
    return await open_media_stream(
        stream_url, params["AccountSid"], params["CallSid"], headers=headers, parameters=parameters, media_format=media_format,
        redirect=redirect,
    )  # fmt: skip


async def open_media_stream(
    stream_url: str,
    account_sid: str,
    call_sid: str,
    *,
    headers: Mapping[str, str] | None = None,
    parameters: Mapping[str, str] | None = None,
    media_format: Mapping[str, object] = _MULAW_FORMAT,
    redirect: str | None = None,
) -> MediaStream:
    """Open a Twilio media websocket at ``stream_url`` and send ``connected`` and ``start``, as Twilio does."""
    ws = await connect(stream_url, additional_headers=dict(headers or {}), compression=None)
    stream_sid = "MZ" + secrets.token_hex(16)
    for message in stream_opening(stream_sid, account_sid, call_sid, parameters or {}, media_format):
        await ws.send(message)
    l16 = media_format["encoding"] == "audio/x-l16"
    rate = media_format["sampleRate"]
    assert isinstance(rate, int)
    return MediaStream(ws, stream_sid, AudioEncoding.L16 if l16 else AudioEncoding.PCMU, rate, redirect)


def stream_opening(
    stream_sid: str, account_sid: str, call_sid: str, parameters: Mapping[str, str], media_format: Mapping[str, object]
) -> tuple[str, str]:
    """A stream's first two messages, as Twilio sends them: ``connected``, then ``start``."""
    start = {
        "streamSid": stream_sid,
        "accountSid": account_sid,
        "callSid": call_sid,
        "tracks": ["inbound"],
        "customParameters": dict(parameters),
        "mediaFormat": dict(media_format),
    }
    return (
        '{"event":"connected","protocol":"Call","version":"1.0.0"}',
        orjson.dumps({"event": "start", "sequenceNumber": "1", "start": start, "streamSid": stream_sid}).decode(),
    )


def inbound_media(stream_sid: str, payload: bytes | bytearray | memoryview, sequence: int, chunk: int, timestamp_ms: int) -> str:
    """Caller audio (already in the stream's encoding) as Twilio sends it."""
    media = {"track": "inbound", "chunk": str(chunk), "timestamp": str(timestamp_ms), "payload": base64.b64encode(payload).decode()}
    return orjson.dumps({"event": "media", "sequenceNumber": str(sequence), "media": media, "streamSid": stream_sid}).decode()


def mark_echo(stream_sid: str, name: str, sequence: int) -> str:
    """Twilio's echo of the bridge's mark ``name``: the audio before it has played."""
    return orjson.dumps({"event": "mark", "sequenceNumber": str(sequence), "streamSid": stream_sid, "mark": {"name": name}}).decode()


def read_outbound(message: str | bytes, stream_sid: str | None) -> FarEndMessage | str:
    """What Twilio makes of a message from the bridge: audio to play (the payload's bytes), a mark, a clear — or, a
    str, the warning it raises instead (31950, 31951), as it would for anything but those three, exactly keyed."""
    if isinstance(message, bytes):
        return "31950 binary frame"
    try:
        payload = orjson.loads(message)
    except orjson.JSONDecodeError:
        return "31951 not JSON"
    event = payload.get("event") if isinstance(payload, dict) else None
    if event not in _OUTBOUND_KEYS or set(payload) != _OUTBOUND_KEYS[event] or payload.get("streamSid") != stream_sid:
        return f"31951 invalid message {message[:80]}"
    if event == "media":
        media = payload["media"]
        if not isinstance(media, dict) or set(media) != {"payload"}:
            return "31951 media with fields other than payload"
        try:
            return ("media", binascii.a2b_base64(media["payload"], strict_mode=True))
        except (binascii.Error, TypeError):
            return "31951 media payload is not base64"
    if event == "mark":
        name = payload["mark"].get("name") if isinstance(payload["mark"], dict) else None
        return ("mark", name) if isinstance(name, str) else "31951 mark without a name"
    return ("clear", None)


class TwilioStream(SimStream):
    """One Twilio media websocket: μ-law 8 kHz (or a compatible carrier's PCM16) JSON messages."""

    def __init__(self, conn: WebSocketConnection, stream_sid: str, call: SimCall, account_sid: str, encoding: AudioEncoding, rate_hz: int) -> None:
        super().__init__(conn, stream_sid, rate_hz, call)
        self.account_sid = account_sid
        self.encoding = encoding
        self.sequence = 1  # start was message 1
        self.chunk = 0
        self.media_ms = 0
        self._resample_state: Any = None

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    async def _send_json(self, payload: dict[str, Any]) -> None:
        await self.send(orjson.dumps(payload).decode())

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.rate_hz != 8000:
            pcm_8k, self._resample_state = audioop.ratecv(pcm_8k, 2, 1, 8000, self.rate_hz, self._resample_state)
        self.chunk += 1
        await self.send(inbound_media(self.stream_id, encode_from_pcm16(self.encoding, pcm_8k), self._next_sequence(), self.chunk, self.media_ms))
        self.media_ms += 20

    async def send_dtmf(self, digit: str) -> None:
        await self._send_json({"event": "dtmf", "streamSid": self.stream_id, "sequenceNumber": str(self._next_sequence()), "dtmf": {"track": "inbound_track", "digit": digit}})

    async def send_stop(self) -> None:
        stop = {"accountSid": self.account_sid, "callSid": self.call.call_id}
        await self._send_json({"event": "stop", "sequenceNumber": str(self._next_sequence()), "stop": stop, "streamSid": self.stream_id})
        await self.conn.close()

    def mark_message(self, name: str) -> str:
        return mark_echo(self.stream_id, name, self._next_sequence())

    def receive(self, message: str | bytes) -> None:
        read = read_outbound(message, self.stream_id)
        if isinstance(read, str):
            self.warn(read)
        elif read[0] == "media":
            self.enqueue_audio(decode_to_pcm16(self.encoding, read[1]))
        elif read[0] == "mark":
            self.add_mark(read[1])
        else:
            self.clear()


class SimulatedTwilio(SimulatedCarrier):
    """Twilio's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str] = "twilio"
    signature_header: ClassVar[str] = "X-Twilio-Signature"
    signs_upgrade: ClassVar[bool] = True
    """Whether the media websocket's upgrade carries the signature (Twilio's does; a dialect that does not document
    it sends none, so the bridge is tested on the token alone)."""
    stream_codecs: ClassVar[Mapping[str, Mapping[str, object]]] = {}
    """``<Stream codec="…">`` values the dialect takes, and the ``mediaFormat`` each gets."""
    rest_prefix: ClassVar[str] = ""
    places_calls: ClassVar[bool] = True
    """It takes the REST dial (``POST …/Calls.json``): the bridge places calls through it."""
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/2010-04-01/Accounts/{account}/Calls.json"})
    """The dial names no call yet: a load test split across processes sends it to any one, which runs the call."""

    def __init__(self, bridge_url: str, auth_token: str, *, account_sid: str | None = None) -> None:
        super().__init__(bridge_url, auth_token)
        self.auth_token = auth_token
        self.account_sid = account_sid or account_of(auth_token)
        self._outbound: dict[str, OutboundLeg] = {}
        self._validator = RequestValidator(auth_token)
        self._http = webhook_client()
        self.call_updates: list[tuple[str, str]] = []
        """(CallSid, TwiML) of every REST update that replaced a call's instructions."""
        self._redirects: dict[str, str] = {}
        """CallSid → the ``<Redirect>`` its stream's TwiML named: POSTed when the stream ends without the call."""

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        settings = {"auth_token": secret, "api_base_url": rest_url, "validate_signatures": True}
        if cls.places_calls:
            settings["account_sid"] = account_of(secret)
        return {"twilio": settings}

    def rest_routes(self) -> list[BaseRoute]:
        dial = [Route(self.rest_prefix + "/2010-04-01/Accounts/{account}/Calls.json", self._create_call, methods=["POST"])]
        hang_up = Route(self.rest_prefix + "/2010-04-01/Accounts/{account}/Calls/{call}.json", self._rest_call, methods=["POST"])
        return [*(dial if self.places_calls else []), hang_up]

    def _authenticated(self, request: Request) -> bool:
        expected = "Basic " + base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        return request.headers.get("authorization") == expected and request.path_params["account"] == self.account_sid

    async def _create_call(self, request: Request) -> Response:
        """Twilio's ``POST /Accounts/{AccountSid}/Calls.json``: 201 with the call's ``sid`` (``queued``), then the
        call goes as its ``Callee`` says; 400 with Twilio's code for what its API refuses."""
        if not self._authenticated(request):
            return JSONResponse({"code": 20003, "message": "Authenticate", "status": 401}, status_code=401)
        form = await request.form()
        values = {key: str(value) for key, value in form.items()}
        refused = _create_refusal(values, [str(v) for v in form.getlist("StatusCallbackEvent")])
        if refused is not None:
            return JSONResponse({"code": refused[0], "message": refused[1], "status": 400}, status_code=400)
        leg = OutboundLeg(
            self.new_call_id(), values["To"], values["From"], values["Url"], values.get("StatusCallback"),
            frozenset(str(v) for v in form.getlist("StatusCallbackEvent")) | {"completed"}, int(values.get("Timeout", "60")),
        )  # fmt: skip
        self._outbound[leg.call_sid] = leg
        self.dial_taken(leg.call_sid, self._ring(leg, self.callees.get(leg.to, Callee())))
        body = {"sid": leg.call_sid, "account_sid": self.account_sid, "to": leg.to, "from": leg.from_, "status": "queued",
                "direction": "outbound-api", "api_version": "2010-04-01"}  # fmt: skip
        return JSONResponse(body, status_code=201)

    async def _ring(self, leg: OutboundLeg, callee: Callee) -> CallResult | None:
        """The call the REST API created: it rings, and is answered (then runs as an inbound call does), or not."""
        await self._report(leg, "initiated", "initiated")
        await self._report(leg, "ringing", "ringing")
        end = await self.ring(leg.call_sid, callee, leg.timeout_s)
        if end != "answered":
            await self._report(leg, "completed", {"canceled": "canceled", "busy": "busy", "fails": "failed"}.get(end, "no-answer"))
            return None
        await self._report(leg, "answered", "in-progress")
        answered = asyncio.get_running_loop().time()
        result = await self.take_answered(leg.call_sid, leg.to, callee)
        if result is None:  # a load test runs it
            return None
        duration = str(max(1, round(asyncio.get_running_loop().time() - answered)))
        await self._report(leg, "completed", "completed", CallDuration=duration)
        return result

    async def _report(self, leg: OutboundLeg, event: str, status: str, **extra: str) -> None:
        """The signed status callback for ``event`` (where the dial asked for it)."""
        if leg.status_callback is None or event not in leg.status_events:
            return
        sequence = str(sum(sid == leg.call_sid for sid, _ in self.status_reports))
        params = {**leg.params(self.account_sid, status), "CallbackSource": "call-progress-events", "SequenceNumber": sequence, **extra}
        self.status_reports.append((leg.call_sid, status))
        signature = self._validator.compute_signature(leg.status_callback, params)
        await self._http.post(leg.status_callback, data=params, headers={self.signature_header: signature})

    async def _rest_call(self, request: Request) -> Response:
        if not self._authenticated(request):
            return JSONResponse({"code": 20003, "message": "Authenticate"}, status_code=401)
        form = await request.form()
        if form.get("Status") in ("canceled", "completed") and self.stop_ringing(request.path_params["call"]):  # not answered yet
            return JSONResponse({"sid": request.path_params["call"], "status": "canceled"})
        call = self.calls.get(request.path_params["call"])
        if call is None or call.ended.is_set():
            return JSONResponse({"code": 20404, "message": "not found"}, status_code=404)
        twiml = form.get("Twiml")
        if isinstance(twiml, str) and form.get("Status") is None:
            try:
                ET.fromstring(twiml)
            except ET.ParseError:
                return JSONResponse({"code": 12100, "message": "Document parse failure"}, status_code=400)
            self.call_updates.append((call.call_id, twiml))
            call.result.log(call.clock(), self.provider, f"call update: new TwiML {twiml}")
            self.end_call(call.call_id)  # the new TwiML replaces <Connect><Stream>: the stream stops
            return JSONResponse({"sid": call.call_id, "status": "in-progress"})
        if form.get("Status") != "completed":
            return JSONResponse({"code": 21220, "message": "Invalid call state"}, status_code=400)
        self.end_call(call.call_id)
        return JSONResponse({"sid": call.call_id, "status": "completed"})

    async def aclose(self) -> None:
        await self.stop_dialled()  # before the client their reports go out on
        await self._http.aclose()
        await super().aclose()

    @classmethod
    def direct(cls, ws_url: str) -> SimulatedCarrier:
        if cls is not SimulatedTwilio:  # a dialect's streams are its own
            return super().direct(ws_url)
        return DirectTwilioStreams(ws_url)

    def _redirect_target(self, bridge_url: str, redirect: str) -> str:
        """A ``<Redirect>`` URL on the bridge this request goes to (the load balancer's pick, where there is one),
        its path and query as the TwiML wrote them."""
        voice = f"/{self.provider}/voice"
        query = redirect.split(voice, 1)[1] if voice in redirect else ""
        return f"{bridge_url}{voice}{query}"

    def answer_params(self, call_id: str, first: bool) -> dict[str, str]:
        leg = self._outbound.get(call_id)
        if leg is not None:  # a call the REST API created, answered
            return leg.params(self.account_sid, "in-progress")
        return {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "CallSid": call_id,
            "CallStatus": "ringing" if first else "in-progress",
            "Direction": "inbound",
            "From": "+15005550006",
            "To": "+15005550001",
            "Called": "+15005550001",
            "Caller": "+15005550006",
        }

    async def open_stream(self, call: SimCall, reason: OpenReason) -> TwilioStream | None:
        """POST the answer webhook (again after a drop: the ``<Redirect>``) and open the stream it names."""
        result = call.result
        if reason == "closed_by_bridge":
            result.log(call.clock(), self.provider, "the bridge closed the stream: following <Redirect>")
        params = self.answer_params(call.call_id, first=reason == "answer")
        bridge_url = self.bridge_url
        redirect = None if reason == "answer" else self._redirects.get(call.call_id)
        for _ in range(_MAX_REDIRECTS):
            opened = await answer_and_stream(
                self._http, self._validator, bridge_url, params,
                provider=self.provider, signature_header=self.signature_header, sign_upgrade=self.signs_upgrade,
                stream_codecs=self.stream_codecs,
                url=self._answer_url(call.call_id, bridge_url) if redirect is None else self._redirect_target(bridge_url, redirect),
            )  # fmt: skip
            if not isinstance(opened, TwimlRedirect):
                break
            result.log(call.clock(), self.provider, f"TwiML <Pause> {opened.pause_s:g} s, then <Redirect>")
            await asyncio.sleep(opened.pause_s)
            params = self.answer_params(call.call_id, first=False)
            redirect = opened.url
            if self.route is not None:  # the redirect URL is the load balancer's: it picks the bridge again
                bridge_url = self.bridge_url = self.route("redirected").rstrip("/")
            else:
                bridge_url = opened.url.split(f"/{self.provider}/voice")[0]
        else:
            result.log(call.clock(), self.provider, f"more than {_MAX_REDIRECTS} redirects: the call ends")
            return None
        if isinstance(opened, TwimlDial):
            sent_on(result, call.clock(), self.provider, "TwiML <Dial>", opened.target)
            return None
        if isinstance(opened, str):
            result.log(call.clock(), self.provider, opened)
            return None
        if opened.redirect_url is not None:
            self._redirects[call.call_id] = opened.redirect_url
        return TwilioStream(WebSocketConnection(opened.ws), opened.stream_sid, call, self.account_sid, opened.encoding, opened.rate_hz)

    def _answer_url(self, call_id: str, bridge_url: str) -> str:
        """Where a call's first answer webhook goes: a created call's ``Url``, else the number's answer URL."""
        leg = self._outbound.get(call_id)
        return leg.url if leg is not None else self.with_answer_query(f"{bridge_url}/{self.provider}/voice")

    def unknown_event(self, stream: SimStream) -> str:
        return orjson.dumps({"event": "transcription", "streamSid": stream.stream_id, "transcription": {"text": "hi"}}).decode()

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, TwilioStream)
        sid = stream.stream_id

        def media(payload: str = "/////w==", stream_sid: str = sid) -> str:
            body = {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": payload}
            return orjson.dumps({"event": "media", "sequenceNumber": "2", "media": body, "streamSid": stream_sid}).decode()

        return {
            "non_json_text": ("{this is not json", "not_json"),
            "binary_frame": (b"\x00\x01\x02", "binary_frame"),
            "wrong_stream_id": (media(stream_sid="MZ" + "0" * 32), "wrong_stream"),
            "invalid_base64": (media(payload="%%%not-base64%%%"), "bad_base64"),
            "oversized_message": ('{"event":"media","pad":"' + "x" * 300_000 + '"}', "oversized"),
            "event_not_a_name": (f'{{"event":7,"streamSid":"{sid}"}}', "bad_field"),
            "second_start": (orjson.dumps({"event": "start", "start": {"streamSid": sid, "callSid": stream.call.call_id}, "streamSid": sid}).decode(), "out_of_order"),
        }

    async def forged_requests_refused(self) -> bool:
        url = f"{self.bridge_url}/{self.provider}/voice"
        params = self.answer_params(self.new_call_id(), first=True)
        forged = await self._http.post(url, data=params, headers={self.signature_header: "forged"})
        unsigned = await self._http.post(url, data=params)
        refused = forged.status_code == unsigned.status_code == 403
        ws_url = url.replace("http", "ws", 1).removesuffix("/voice") + "/media"
        try:
            async with connect(ws_url, additional_headers={self.signature_header: "forged"}):
                return False
        except InvalidStatus as exc:
            return refused and exc.response.status_code == 403


def account_of(auth_token: str) -> str:
    """The simulated account's ``AccountSid``: made from its auth token, so the bridge's settings can name it."""
    return "AC" + hashlib.sha256(auth_token.encode()).hexdigest()[:32]


def _create_refusal(form: Mapping[str, str], status_events: list[str]) -> tuple[int, str] | None:
    """What Twilio's API says to a create-call request it refuses (its error code and message), or None. The codes
    for a bad method, status event or timeout are this simulator's stand-ins; the others are Twilio's."""
    to, from_, url = form.get("To"), form.get("From"), form.get("Url")
    if not to:
        return 21201, "No 'To' number is specified"
    if not _E164_OR_URI.match(to):
        return 21211, f"Invalid 'To' Phone Number: {to}"
    if not from_:
        return 21213, "No 'From' number is specified"
    if not _E164_OR_URI.match(from_):
        return 21212, f"Invalid 'From' Phone Number: {from_}"
    if not url and not form.get("Twiml") and not form.get("ApplicationSid"):
        return 21205, "Url parameter is required"
    for name in ("Url", "StatusCallback"):
        value = form.get(name)
        if value is not None and not value.startswith(("http://", "https://")):
            return 21205, f"{name} is not a valid URL: {value}"
    if form.get("Method", "POST") not in ("GET", "POST") or form.get("StatusCallbackMethod", "POST") not in ("GET", "POST"):
        return 21207, "Method must be GET or POST"
    if not set(status_events) <= _STATUS_EVENTS:
        return 21626, f"Invalid StatusCallbackEvent: {sorted(set(status_events) - _STATUS_EVENTS)}"
    timeout = form.get("Timeout", "60")
    if not timeout.isdigit() or not 1 <= int(timeout) <= 600:
        return 21216, f"Timeout must be an integer from 1 to 600: {timeout}"
    if url is None:
        return 21205, "only Url is simulated (not Twiml or ApplicationSid)"
    return None


class DirectTwilioStreams(SimulatedTwilio):
    """Calls straight onto a server that speaks Twilio Media Streams at ``ws_url`` — any voice bot's (pipecat's
    Twilio transport, your own) — with no voice webhook, no signatures and no REST: each call opens the websocket,
    sends ``connected`` and ``start`` (μ-law 8 kHz) and then its media, and plays what comes back as Twilio would
    (``media``; ``mark`` echoed, ``clear`` honoured where the server sends them). A closed connection ends the
    call: Twilio opens a new one only where TwiML says so."""

    def __init__(self, ws_url: str) -> None:
        super().__init__(ws_url, "direct")
        self.ws_url = ws_url

    def rest_routes(self) -> list[BaseRoute]:
        return []

    async def open_stream(self, call: SimCall, reason: OpenReason) -> TwilioStream | None:
        if reason != "answer":
            call.result.log(call.clock(), self.provider, "the media connection closed: the call ends")
            return None
        try:
            opened = await open_media_stream(self.ws_url, self.account_sid, call.call_id)
        except (OSError, InvalidHandshake) as exc:  # no server's answer: raised (None is a server's no)
            call.result.log(call.clock(), self.provider, f"cannot open {self.ws_url}: {exc}")
            raise
        return TwilioStream(WebSocketConnection(opened.ws), opened.stream_sid, call, self.account_sid, opened.encoding, opened.rate_hz)


class TwilioFarEnd:
    """Twilio's side of a media stream as pure messages (``callbridge.sim.faults.FarEnd``): the deterministic fault
    simulator's carrier."""

    def codec(self) -> TwilioCodec:
        return TwilioCodec()

    def opening(self, stream_number: int, call_id: str) -> list[str | bytes]:
        return list(stream_opening(f"MZ{stream_number:032x}", "AC0", call_id, {}, _MULAW_FORMAT))

    def media(self, stream_id: str, ulaw: bytes, media_ms: int) -> str:
        return inbound_media(stream_id, ulaw, 2, 1, media_ms)

    def mark_echo(self, stream_id: str, name: str) -> str:
        return mark_echo(stream_id, name, 2)

    def stop(self, stream_id: str) -> str:
        return orjson.dumps({"event": "stop", "streamSid": stream_id, "stop": {}}).decode()

    def read(self, stream_id: str, message: str | bytes) -> FarEndMessage | str:
        return read_outbound(message, stream_id)


FAR_END: Final = TwilioFarEnd()
