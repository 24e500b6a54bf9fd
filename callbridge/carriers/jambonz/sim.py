"""A simulated jambonz, faithful to the wire (``docs/carriers/jambonz.md``), for the demo, the tests and load
tests.

What jambonz does for an inbound call, and what this does:
- POSTs the application's calling webhook (``/jambonz/call``) the call's attributes, snake_case JSON
  (``call_sid``, ``from``, ``to``, ``direction``, ``call_status`` …), signed with ``Jambonz-Signature``
  (``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` keyed with the account's webhook secret), and runs the
  verbs it gets: a ``listen`` (which must be bidirectional and streaming, ``mono``, at 8000 or 16000 Hz with
  ``bidirectionalAudio.sampleRate`` the same, with an ``actionHook``) or ``hangup``; anything else is a warning;
- opens the listen's websocket with the ``audio.jambonz.org`` subprotocol (and its ``wsAuth`` as Basic auth),
  sends one text frame (the call's attributes in camelCase, ``sampleRate``, ``mixType``, the verb's ``metadata``
  merged in), then 20 ms binary frames of L16 at real time; with ``passDtmf`` a digit is ``{"event": "dtmf",
  "dtmf": …, "duration": …}``;
- plays what the bridge sends: binary L16 frames (whole samples), ``{"type": "killAudio"}`` (drops what is
  queued), ``{"type": "disconnect"}`` (the listen ends: its ``actionHook`` is POSTed, signed, and its verbs run);
  anything else is a warning;
- when its socket drops mid-call, the listen ends too: the ``actionHook``'s verbs give the call its next listen;
- when the caller hangs up: the socket closes (nothing said on it) and the call-status webhook (``/jambonz/status``)
  gets ``call_status: completed``;
- creates calls (#42): ``POST /v1/Accounts/{account_sid}/Calls`` (Bearer API key; ``from``, a ``to`` of type
  ``phone``, a ``call_hook`` URL, ``timeout`` 1–300 s; 400 ``{"msg": …}`` otherwise), 201 with the ``sid``. Its status
  changes go to its ``call_status_hook`` (``trying``, ``ringing``; then ``in-progress`` … ``completed``, or ``busy``,
  ``no-answer``, ``failed`` with the SIP status); answered, its ``call_hook`` gets the call (``direction`` outbound)
  and the call runs as an inbound one. ``PUT …/Calls/{sid}`` ``{"call_status": "no-answer"}`` stops one ringing.
"""

from __future__ import annotations

import asyncio
import audioop
import base64
import contextlib
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from callbridge.carriers.jambonz.http import jambonz_signature
from callbridge.carriers.jambonz.wire import SUBPROTOCOL
from callbridge.sim.callee import Callee
from callbridge.sim.caller import CallResult
from callbridge.sim.carrier import OpenReason, SimCall, SimStream, SimulatedCarrier, WebSocketConnection, webhook_client
from callbridge.sim.transfer import sent_on

__all__ = ["JambonzStream", "SimulatedJambonz"]

ACCOUNT_SID: Final = "9351f46a-678c-43f5-b8a6-d4eb58d131af"
APPLICATION_SID: Final = "0dddaabf-0a30-43e3-84e8-426873b1a78b"
WS_USERNAME: Final = "jambonz"
_RATES: Final = frozenset({8000, 16000})


@dataclass(frozen=True, slots=True)
class _Created:
    """A call the REST API created: what it was asked."""

    call_sid: str
    to: str
    from_: str
    call_hook: str
    status_hook: str | None
    timeout_s: int


def _hook_url(hook: object) -> str | None:
    """A webhook spec's URL (jambonz takes ``{"url", "method"}`` or a bare URL)."""
    url = hook.get("url") if isinstance(hook, dict) else hook
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def _create_refusal(body: object) -> str | None:
    """What jambonz's create-call API refuses in ``body`` (its 400 ``msg``), or None."""
    if not isinstance(body, dict):
        return "invalid JSON"
    to = body.get("to")
    if not isinstance(body.get("from"), str) or not body["from"]:
        return "missing from"
    if not (isinstance(to, dict) and to.get("type") == "phone" and isinstance(to.get("number"), str) and to["number"]):
        return "to must be a phone target with a number"
    if _hook_url(body.get("call_hook")) is None and "application_sid" not in body:
        return "call_hook or application_sid is required"
    if "call_status_hook" in body and _hook_url(body["call_status_hook"]) is None:
        return "invalid call_status_hook"
    timeout = body.get("timeout", 60)
    if not isinstance(timeout, int) or not 1 <= timeout <= 300:
        return "timeout must be 1 to 300 seconds"
    return None


class JambonzStream(SimStream):
    """One ``listen`` websocket: L16 binary frames both ways, ``killAudio``, ``disconnect``."""

    marks_echoed_on_clear: ClassVar[bool] = False

    def __init__(
        self, conn: WebSocketConnection, call: SimCall, carrier: SimulatedJambonz, rate_hz: int, action_hook: str, *, pass_dtmf: bool
    ) -> None:
        super().__init__(conn, f"{call.call_id}~{secrets.token_hex(4)}", rate_hz, call)
        self.carrier = carrier
        self.action_hook = action_hook
        self.pass_dtmf = pass_dtmf
        """The listen asked for ``passDtmf``: without it jambonz keeps the caller's digits to itself."""
        self.disconnected = False
        """The bridge sent ``disconnect``: the listen ended by the application's word."""
        self._resample_state: Any = None
        self._closing: asyncio.Task[None] | None = None

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.rate_hz != 8000:
            pcm_8k, self._resample_state = audioop.ratecv(pcm_8k, 2, 1, 8000, self.rate_hz, self._resample_state)
        await self.send_audio_at_rate(pcm_8k)

    async def send_audio_at_rate(self, pcm: bytes) -> None:
        await self.send(pcm)

    async def send_dtmf(self, digit: str) -> None:
        if not self.pass_dtmf:
            self.warn(f"digit {digit} pressed on a listen without passDtmf: nobody hears it")
            return
        await self.send(orjson.dumps({"event": "dtmf", "dtmf": digit, "duration": "800"}).decode())

    async def send_stop(self) -> None:
        """The caller hangs up: jambonz reports the call's end and closes the socket without a word on it (in
        that order here; jambonz documents neither the order nor the timing: either way the session closes)."""
        await self.carrier.post_status(self.call, "completed")
        self.dropped = True
        await self.conn.close()

    def _close_soon(self) -> None:
        self._closing = asyncio.get_running_loop().create_task(self.conn.close())

    def mark_message(self, name: str) -> None:
        return None

    def receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            if len(message) % 2:
                self.warn(f"a {len(message)}-byte audio frame: not whole 16-bit samples")
                return
            self.enqueue_audio(message)
            return
        try:
            payload = orjson.loads(message)
        except orjson.JSONDecodeError:
            self.warn("not JSON")
            return
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "killAudio" and set(payload) <= {"type", "data"}:
            self.clear()
        elif kind == "disconnect" and set(payload) <= {"type", "data"}:
            self.disconnected = self.dropped = True  # the listen ends: jambonz closes its socket, then the actionHook
            self._close_soon()
        else:
            self.warn(f"unknown or malformed command {message[:80]}")


class SimulatedJambonz(SimulatedCarrier):
    """jambonz's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str] = "jambonz"
    places_calls: ClassVar[bool] = True
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/v1/Accounts/{account}/Calls"})
    can_reconnect: ClassVar[bool] = True
    says_goodbye: ClassVar[bool] = False
    uses_marks: ClassVar[bool] = False

    def __init__(self, bridge_url: str, secret: str) -> None:
        super().__init__(bridge_url, secret)
        self.secret = secret
        self._http = webhook_client()
        self._streams: dict[str, JambonzStream] = {}
        self._created: dict[str, _Created] = {}

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        jambonz = {"webhook_secret": secret, "ws_username": WS_USERNAME, "ws_password": secret, "validate_signatures": True}
        return {"jambonz": {**jambonz, "api_base_url": rest_url, "account_sid": ACCOUNT_SID, "api_key": secret}}

    # ------------------------------------------------------------------ REST

    def rest_routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/Accounts/{account}/Calls", self._create_call, methods=["POST"]),
            Route("/v1/Accounts/{account}/Calls/{sid}", self._update_call, methods=["PUT"]),
        ]

    def _authorised(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {self.secret}" and request.path_params["account"] == ACCOUNT_SID

    async def _create_call(self, request: Request) -> Response:
        """``POST …/Calls``: 201 with the call's ``sid``, then it goes as its ``Callee`` says."""
        if not self._authorised(request):
            return JSONResponse({"msg": "unauthorized"}, status_code=401)
        body = await self.json_body(request)
        refused = _create_refusal(body)
        if refused is not None:
            return JSONResponse({"msg": refused}, status_code=400)
        assert isinstance(body, dict)
        call_hook = _hook_url(body.get("call_hook"))
        assert call_hook is not None
        created = _Created(
            self.new_call_id(), body["to"]["number"], body["from"], call_hook, _hook_url(body.get("call_status_hook")), int(body.get("timeout", 60))
        )
        self._created[created.call_sid] = created
        self.dial_taken(created.call_sid, self._ring(created, self.callees.get(created.to, Callee())))
        return JSONResponse({"sid": created.call_sid}, status_code=201)

    async def _update_call(self, request: Request) -> Response:
        if not self._authorised(request):
            return JSONResponse({"msg": "unauthorized"}, status_code=401)
        body = await self.json_body(request)
        sid = request.path_params["sid"]
        status = body.get("call_status") if isinstance(body, dict) else None
        if status == "no-answer" and self.stop_ringing(sid):
            return Response(status_code=202)
        if status == "completed" and self.end_call(sid):
            return Response(status_code=202)
        return JSONResponse({"msg": "call not found"}, status_code=404)

    async def _ring(self, created: _Created, callee: Callee) -> CallResult | None:
        """The created call rings, and is answered (then runs as an inbound call does), or not."""
        await self._created_status(created, "trying", 100)
        await self._created_status(created, "ringing", 180)
        end = await self.ring(created.call_sid, callee, created.timeout_s)
        if end != "answered":
            status, sip = {"busy": ("busy", 486), "fails": ("failed", 503)}.get(end, ("no-answer", 487))
            await self._created_status(created, status, sip)
            return None
        await self._created_status(created, "in-progress", 200)
        return await self.take_answered(created.call_sid, created.to, callee)

    async def _created_status(self, created: _Created, status: str, sip_status: int) -> None:
        self.status_reports.append((created.call_sid, status))
        if created.status_hook is None:
            return
        body = orjson.dumps(self._snake({**self.attributes(created.call_sid, status), "sipStatus": sip_status}))
        headers = {"content-type": "application/json", "jambonz-signature": jambonz_signature(self.secret, int(time.time()), body)}
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(created.status_hook, content=body, headers=headers)

    def new_call_id(self) -> str:
        return str(uuid.uuid4())

    async def aclose(self) -> None:
        await self._http.aclose()
        await super().aclose()

    # ------------------------------------------------------------- webhooks

    def attributes(self, call_id: str, status: str) -> dict[str, Any]:
        """The call's attributes as jambonz keeps them (camelCase; webhooks send them snake_case)."""
        attributes = {
            "callSid": call_id, "direction": "inbound", "from": "+15083728299", "to": "+15083871234",
            "callId": f"{secrets.token_hex(8)}@192.168.1.10", "sipStatus": 200, "callStatus": status,
            "callerId": "+15083728299", "accountSid": ACCOUNT_SID, "applicationSid": APPLICATION_SID,
        }  # fmt: skip
        created = self._created.get(call_id)
        if created is not None:  # a call the REST API created
            attributes |= {"direction": "outbound", "from": created.from_, "to": created.to, "callerId": created.from_}
        return attributes

    @staticmethod
    def _snake(attributes: dict[str, Any]) -> dict[str, Any]:
        return {"".join(f"_{c.lower()}" if c.isupper() else c for c in key): value for key, value in attributes.items()}

    async def _post(self, call: SimCall, url: str, payload: dict[str, Any]) -> httpx.Response | None:
        body = orjson.dumps(payload)
        headers = {"content-type": "application/json", "jambonz-signature": jambonz_signature(self.secret, int(time.time()), body)}
        try:
            response = await self._http.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            call.result.warnings.append(f"webhook {url} failed: {exc!r}")
            return None
        if response.status_code >= 300:
            call.result.warnings.append(f"webhook {url} answered HTTP {response.status_code}")
        return response

    async def post_status(self, call: SimCall, status: str) -> None:
        await self._post(call, f"{self.bridge_url}/jambonz/status", self._snake(self.attributes(call.call_id, status)))

    # ------------------------------------------------------------------ call

    async def open_stream(self, call: SimCall, reason: OpenReason) -> JambonzStream | None:
        """The calling webhook; after a listen ends, its ``actionHook``: then the verbs they answer."""
        result = call.result
        old = self._streams.pop(call.call_id, None)
        created = self._created.get(call.call_id)
        if (reason == "answer" or old is None) and created is not None:
            url = created.call_hook
        elif reason == "answer" or old is None:
            url = self.with_answer_query(f"{self.bridge_url}/jambonz/call")
        else:
            why = "the bridge said disconnect" if old.disconnected else "its socket dropped" if reason == "network_drop" else "the bridge closed its socket"
            result.log(call.clock(), self.provider, f"listen ended ({why}): its actionHook")
            url = old.action_hook
        response = await self._post(call, url, self._snake(self.attributes(call.call_id, "in-progress" if reason != "answer" else "trying")))
        if response is None or response.status_code != 200:
            return None
        try:
            verbs = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            result.warnings.append(f"the webhook's verbs are not JSON: {response.text[:80]}")
            return None
        if not isinstance(verbs, list) or not verbs or not all(isinstance(v, dict) for v in verbs):
            result.warnings.append(f"the webhook's answer is not a list of verbs: {response.text[:80]}")
            return None
        verb = verbs[0]
        if verb.get("verb") == "hangup":
            result.log(call.clock(), self.provider, "verb hangup: the call ends")
            if old is not None and old.disconnected:
                self.end_call(call.call_id)
            return None
        if verb.get("verb") == "dial":
            targets = verb.get("target")
            dialled = targets[0] if isinstance(targets, list) and len(targets) == 1 and isinstance(targets[0], dict) else {}
            target = dialled.get("sipUri") if dialled.get("type") == "sip" else dialled.get("number") if dialled.get("type") == "phone" else None
            sent_on(result, call.clock(), self.provider, "verb dial", target)
            return None
        if verb.get("verb") != "listen":
            result.warnings.append(f"unexpected verb {verb.get('verb')!r}")
            return None
        return await self._listen(call, verb)

    async def _listen(self, call: SimCall, verb: dict[str, Any]) -> JambonzStream | None:
        rate = verb.get("sampleRate", 8000)
        bidirectional = verb.get("bidirectionalAudio") or {}
        if (
            rate not in _RATES
            or verb.get("mixType", "mono") != "mono"
            or bidirectional.get("enabled", True) is not True
            or bidirectional.get("streaming") is not True
            or bidirectional.get("sampleRate") != rate
            or not isinstance(verb.get("actionHook"), str)
            or not str(verb.get("url", "")).startswith(("ws://", "wss://"))
        ):
            call.result.warnings.append(f"jambonz would not stream both ways with this listen: {verb}")
            return None
        headers: dict[str, str] = {}
        auth = verb.get("wsAuth")
        if isinstance(auth, dict):
            pair = f"{auth.get('username')}:{auth.get('password')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        ws = await connect(verb["url"], subprotocols=[SUBPROTOCOL], additional_headers=headers, compression=None)  # type: ignore[list-item]
        if ws.subprotocol != SUBPROTOCOL:
            call.result.warnings.append(f"the server took subprotocol {ws.subprotocol!r}, not {SUBPROTOCOL}")
        given = verb.get("metadata")
        metadata: dict[str, Any] = given if isinstance(given, dict) else {}
        first = {"sampleRate": rate, "mixType": "mono", **self.attributes(call.call_id, "in-progress"), **metadata}
        await ws.send(orjson.dumps(first).decode())
        stream = JambonzStream(WebSocketConnection(ws), call, self, rate, verb["actionHook"], pass_dtmf=verb.get("passDtmf") is True)
        self._streams[call.call_id] = stream
        return stream

    # -------------------------------------------------------------- hostile

    def unknown_event(self, stream: SimStream) -> str:
        return orjson.dumps({"type": "playDone", "data": {"id": "x"}}).decode()

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        return {
            "non_json_text": ("{this is not json", "not_json"),
            "odd_audio_frame": (b"\x00\x01\x02", "bad_field"),
            "oversized_audio_frame": (bytes(stream.rate_hz * 2), "oversized"),
            "bad_dtmf_digit": (orjson.dumps({"event": "dtmf", "dtmf": "X"}).decode(), "bad_field"),
            "event_not_a_name": ('{"event":7}', "bad_field"),
            "oversized_message": ('{"event":"dtmf","pad":"' + "x" * 100_000 + '"}', "oversized"),
        }

    async def forged_requests_refused(self) -> bool:
        url = f"{self.bridge_url}/jambonz/call"
        body = orjson.dumps(self._snake(self.attributes(self.new_call_id(), "trying")))
        now = int(time.time())
        attempts = [
            {},
            {"jambonz-signature": jambonz_signature("not-the-secret", now, body)},
            {"jambonz-signature": jambonz_signature(self.secret, now - 3600, body)},  # an old signature
        ]
        refused = True
        for headers in attempts:
            response = await self._http.post(url, content=body, headers={"content-type": "application/json", **headers})
            refused = refused and response.status_code == 403
        ws_url = url.replace("http", "ws", 1).removesuffix("/call") + "/media"
        try:
            wrong = {"Authorization": "Basic " + base64.b64encode(f"{WS_USERNAME}:forged".encode()).decode()}
            async with connect(ws_url, subprotocols=[SUBPROTOCOL], additional_headers=wrong):  # type: ignore[list-item]
                return False
        except InvalidStatus as exc:
            refused = refused and exc.response.status_code == 403
        # the right upgrade credentials, but no token minted for the call: never bridged
        good = {"Authorization": "Basic " + base64.b64encode(f"{WS_USERNAME}:{self.secret}".encode()).decode()}
        async with connect(ws_url, subprotocols=[SUBPROTOCOL], additional_headers=good) as ws:  # type: ignore[list-item]
            first = {"sampleRate": 8000, "mixType": "mono", **self.attributes(self.new_call_id(), "in-progress"), "callbridge_token": "ab" * 32}
            await ws.send(orjson.dumps(first).decode())
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
            return refused and ws.close_code == 1008


