"""A simulated Telnyx (Call Control + media streaming), faithful to the wire (telephony-protocols.md §3.1, §7).

What Telnyx does for an inbound call, and what this does:
- POSTs the ``call.initiated`` webhook to ``/telnyx/events``, signed with the
  account's ed25519 key (``telnyx-signature-ed25519`` over
  ``f"{telnyx-timestamp}|{body}"``), and waits for the Call Control
  ``answer`` command, which must ask for an ``rtp`` bidirectional stream in
  one codec (``stream_codec`` = ``stream_bidirectional_codec``, PCMU or PCMA);
- opens the ``stream_url`` websocket, sends ``connected`` and ``start``
  (``custom_parameters`` as an object, ``media_format`` of the codec asked
  for), then a 20 ms ``media`` frame every 20 ms at real time, snake_case,
  with string ``sequence_number`` (one counter for every numbered message),
  ``chunk`` and stream-relative ``timestamp`` — and, as Telnyx warns it may,
  **not always in order**: every ``swap_every``-th frame is sent after the one
  that follows it; ``dtmf``; ``stop``;
- plays what the bridge sends (``callbridge.sim.carrier``): ``mark`` echoed
  when playback reaches it, and on ``clear`` every queued one (Telnyx: "a
  clear frame also returns queued marks"); anything else, a payload that is
  not base64 or not 20 ms–30 s of the codec, or a wrong ``stream_id`` is
  recorded as a warning and answered with an ``error`` frame (100003
  malformed_frame / 100004 invalid_media);
- when a media connection drops while the call is up, POSTs
  ``streaming.stopped`` and waits for ``streaming_start`` (a new stream,
  same ``call_control_id``); when the call ends, ``stop`` on the socket, then
  ``call.hangup`` and ``streaming.stopped`` webhooks;
- serves Call Control (``POST /v2/calls/{id}/actions/{answer,streaming_start,
  hangup,reject}``, Bearer API key): 401 without the key, 422 code 90018 for a
  call that has already ended;
- dials (#42): ``POST /v2/calls`` (the account's ``connection_id``, E.164 ``to``/``from``, ``timeout_secs`` 5–600,
  an http(s) ``webhook_url``; 422 with Telnyx's error otherwise), answered with the ``call_control_id``. Every
  webhook of the call goes to its ``webhook_url`` with its ``client_state``: ``call.initiated`` (``outgoing``);
  answered, ``call.answered``, after which the bridge's ``streaming_start`` opens the stream and the call runs as an
  inbound one; unanswered, ``call.hangup`` with ``user_busy``, ``timeout``, ``unspecified``, or
  ``originator_cancel`` after a ``hangup`` command while it rings.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

import httpx
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

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

__all__ = ["SimulatedTelnyx", "TelnyxStream", "connection_of", "signing_key"]

_E164: Final = re.compile(r"^\+[1-9][0-9]{6,14}$")

_CODECS: Final = {"PCMU": AudioEncoding.PCMU, "PCMA": AudioEncoding.PCMA}
_STREAM_KEYS: Final = {
    "stream_url",
    "stream_track",
    "stream_codec",
    "stream_bidirectional_mode",
    "stream_bidirectional_codec",
    "stream_bidirectional_target_legs",
    "stream_bidirectional_sampling_rate",
    "stream_auth_token",
    "custom_parameters",
    "client_state",
    "command_id",
}
_OUTBOUND_KEYS: Final = {"media": {"event", "media"}, "mark": {"event", "mark"}, "clear": {"event"}}
_MIN_CHUNK_MS: Final = 20
_MAX_CHUNK_MS: Final = 30_000
_COMMAND_TIMEOUT_S: Final = 5.0


def signing_key(secret: str) -> Ed25519PrivateKey:
    """The simulated account's webhook signing key, derived from its secret (the bridge gets the public half)."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"telnyx-sim:" + secret.encode()).digest())


def public_key_b64(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def _error_body(code: str, title: str, status: int) -> JSONResponse:
    return JSONResponse({"errors": [{"code": code, "title": title}]}, status_code=status)


class TelnyxStream(SimStream):
    """One Telnyx media websocket in bidirectional rtp mode: G.711 JSON messages, some out of order."""

    marks_echoed_on_clear: ClassVar[bool] = True

    def __init__(
        self,
        conn: WebSocketConnection,
        stream_id: str,
        call: SimCall,
        encoding: AudioEncoding,
        *,
        user_id: str,
        swap_every: int,
        on_caller_hangup: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(conn, stream_id, 8000, call)
        self.encoding = encoding
        self.user_id = user_id
        self.on_caller_hangup = on_caller_hangup
        self.sequence = 1  # start was message 1
        self.chunk = 0
        self.media_ms = 0
        self.swap_every = swap_every
        self.swapped = 0
        """Frames sent after the frame that follows them."""
        self._held: str | None = None

    def _next_sequence(self) -> str:
        self.sequence += 1
        return str(self.sequence)

    async def send_audio(self, pcm_8k: bytes) -> None:
        payload = encode_from_pcm16(self.encoding, pcm_8k)
        self.chunk += 1
        media = {"track": "inbound", "chunk": str(self.chunk), "timestamp": str(self.media_ms), "payload": base64.b64encode(payload).decode()}
        self.media_ms += 20
        message = orjson.dumps({"event": "media", "sequence_number": self._next_sequence(), "stream_id": self.stream_id, "media": media}).decode()
        if self._held is not None:
            held, self._held = self._held, None
            await self.send(message)
            await self.send(held)
        elif self.swap_every and self.chunk % self.swap_every == 0:
            self._held = message  # goes after the next frame
            self.swapped += 1
        else:
            await self.send(message)

    async def _flush_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            await self.send(held)

    async def send_dtmf(self, digit: str) -> None:
        dtmf = {"event": "dtmf", "stream_id": self.stream_id, "occurred_at": _now_iso(), "sequence_number": self._next_sequence(), "dtmf": {"digit": digit}}
        await self.send(orjson.dumps(dtmf).decode())

    async def send_stop(self) -> None:
        """The call is over: ``stop``, close; if the caller hung up, the webhooks (the bridge's hang-up posts its own)."""
        await self._flush_held()
        stop = {"user_id": self.user_id, "call_control_id": self.call.call_id}
        await self.send(orjson.dumps({"event": "stop", "sequence_number": self._next_sequence(), "stream_id": self.stream_id, "stop": stop}).decode())
        await self.conn.close()
        if not self.call.ended.is_set():
            await self.on_caller_hangup()

    def mark_message(self, name: str) -> str:
        return orjson.dumps({"event": "mark", "stream_id": self.stream_id, "mark": {"name": name}}).decode()

    def _reject(self, code: str, title: str, detail: str) -> None:
        """A frame Telnyx would not take: a warning, and the ``error`` frame Telnyx answers with."""
        self.warn(f"{code} {title}: {detail}")
        error = {"event": "error", "stream_id": self.stream_id, "sequence_number": self._next_sequence(), "error": {"title": title, "code": code, "detail": detail}}
        self._send_soon(orjson.dumps(error).decode())

    def receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self._reject("100003", "malformed_frame", "binary frame")
            return
        try:
            payload = orjson.loads(message)
        except orjson.JSONDecodeError:
            self._reject("100003", "malformed_frame", "not JSON")
            return
        event = payload.get("event") if isinstance(payload, dict) else None
        if event not in _OUTBOUND_KEYS or not set(payload) - {"stream_id"} <= _OUTBOUND_KEYS[event] or not _OUTBOUND_KEYS[event] <= set(payload):
            self._reject("100003", "malformed_frame", f"invalid message {message[:80]}")
            return
        if payload.get("stream_id", self.stream_id) != self.stream_id:
            self._reject("100003", "malformed_frame", f"stream_id {payload.get('stream_id')!r}")
            return
        if event == "media":
            media = payload["media"]
            if not isinstance(media, dict) or set(media) != {"payload"} or not isinstance(media["payload"], str):
                self._reject("100003", "malformed_frame", "media with fields other than payload")
                return
            try:
                audio = binascii.a2b_base64(media["payload"], strict_mode=True)
            except binascii.Error:
                self._reject("100004", "invalid_media", "payload is not base64")
                return
            chunk_ms = len(audio) * 1000 // (8000 * self.encoding.sample_bytes)
            if not _MIN_CHUNK_MS <= chunk_ms <= _MAX_CHUNK_MS:
                self._reject("100004", "invalid_media", f"{chunk_ms} ms of audio in one rtp message")
                return
            self.enqueue_audio(decode_to_pcm16(self.encoding, audio))
        elif event == "mark":
            name = payload["mark"].get("name") if isinstance(payload["mark"], dict) else None
            if not isinstance(name, str):
                self._reject("100003", "malformed_frame", "mark without a name")
            else:
                self.add_mark(name)
        else:
            self.clear()


class SimulatedTelnyx(SimulatedCarrier):
    """Telnyx's side of inbound Call Control calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str] = "telnyx"
    places_calls: ClassVar[bool] = True
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset({"/v2/calls"})
    swap_every: ClassVar[int] = 7
    """Every 7th media frame goes out after the next one (0: always in order)."""

    def __init__(self, bridge_url: str, secret: str) -> None:
        super().__init__(bridge_url, secret)
        self.api_key = secret
        self.key = signing_key(secret)
        self.connection_id = connection_of(secret)
        self.commands: list[tuple[str, str, dict[str, Any]]] = []
        """Every Call Control command received: (call_control_id, action, body)."""
        self._pending: dict[str, asyncio.Future[tuple[str, dict[str, Any]]]] = {}
        self._streams: dict[str, TelnyxStream] = {}
        self._background: set[asyncio.Task[object]] = set()
        self.user_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, self.api_key))
        self._http = webhook_client()
        self._dialled: dict[str, _Dialled] = {}

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        telnyx = {"api_key": secret, "public_key": public_key_b64(signing_key(secret)), "api_base_url": rest_url, "validate_signatures": True}
        return {"telnyx": {**telnyx, "connection_id": connection_of(secret)}}

    def new_call_id(self) -> str:
        return "v3:" + secrets.token_urlsafe(30)

    # ---------------------------------------------------------------- webhooks

    def signed(self, body: bytes, *, key: Ed25519PrivateKey | None = None, timestamp: int | None = None) -> dict[str, str]:
        """Telnyx's webhook headers for ``body``."""
        sent_at = str(int(time.time()) if timestamp is None else timestamp)
        signature = (key or self.key).sign(sent_at.encode() + b"|" + body)
        return {"telnyx-signature-ed25519": base64.b64encode(signature).decode(), "telnyx-timestamp": sent_at, "content-type": "application/json"}

    def webhook_body(self, event_type: str, call_id: str, **payload: Any) -> bytes:
        dialled = self._dialled.get(call_id)
        if dialled is not None:  # a call the bridge dialled: every webhook echoes its client_state
            payload = {"client_state": dialled.client_state, "direction": "outgoing", "from": dialled.from_, "to": dialled.to, **payload}
        data = {
            "record_type": "event",
            "event_type": event_type,
            "id": str(uuid.uuid4()),
            "occurred_at": _now_iso(),
            "payload": {"call_control_id": call_id, "call_leg_id": str(uuid.uuid5(uuid.NAMESPACE_URL, call_id)), "connection_id": self.connection_id, **payload},
        }
        return orjson.dumps({"data": data, "meta": {"attempt": 1, "delivered_to": self.bridge_url + "/telnyx/events"}})

    async def post_webhook(self, event_type: str, call: SimCall | str, **payload: Any) -> int:
        """POST a signed webhook for ``call`` (a call id: one that rings, with no ``SimCall`` yet); its status, 0 when
        it could not be sent."""
        call_id = call if isinstance(call, str) else call.call_id
        body = self.webhook_body(event_type, call_id, **payload)
        dialled = self._dialled.get(call_id)
        url = dialled.webhook_url if dialled is not None else self.with_answer_query(self.bridge_url + "/telnyx/events")
        try:
            response = await self._http.post(url, content=body, headers=self.signed(body))
        except (httpx.HTTPError, RuntimeError) as exc:  # the bridge is gone (shutting down), or we are
            if not isinstance(call, str):
                call.result.log(call.clock(), self.provider, f"webhook {event_type} failed: {exc!r}")
            return 0
        if response.status_code != 200 and not isinstance(call, str):
            call.result.warnings.append(f"webhook {event_type} answered HTTP {response.status_code}")
        return response.status_code

    # -------------------------------------------------------------- Call Control

    def rest_routes(self) -> list[BaseRoute]:
        return [Route("/v2/calls", self._dial, methods=["POST"]), Route("/v2/calls/{call_control_id}/actions/{action}", self._command, methods=["POST"])]

    async def _dial(self, request: Request) -> Response:
        """``POST /v2/calls``: the call control id at once, then the call goes as its ``Callee`` says."""
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error_body("10009", "Authentication failed", 401)
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return _error_body("10015", "Invalid JSON", 400)
        problem = _dial_problem(body, self.connection_id)
        if problem is not None:
            return _error_body("10015", problem, 422)
        dialled = _Dialled(
            self.new_call_id(), body["to"], body["from"], body.get("webhook_url") or self.bridge_url + "/telnyx/events",
            int(body.get("timeout_secs", 30)), str(body.get("client_state", "")),
        )  # fmt: skip
        self._dialled[dialled.call_id] = dialled
        self.dial_taken(dialled.call_id, self._ring(dialled, self.callees.get(dialled.to, Callee())))
        data = {"call_control_id": dialled.call_id, "call_leg_id": str(uuid.uuid5(uuid.NAMESPACE_URL, dialled.call_id)),
                "call_session_id": str(uuid.uuid5(uuid.NAMESPACE_OID, dialled.call_id)), "is_alive": False, "record_type": "call"}  # fmt: skip
        return JSONResponse({"data": data})

    async def _ring(self, dialled: _Dialled, callee: Callee) -> CallResult | None:
        """The dialled call rings, and is answered (``call.answered``: the bridge starts its stream), or not."""
        await self.post_webhook("call.initiated", dialled.call_id, state="bridging")
        end = await self.ring(dialled.call_id, callee, dialled.timeout_s)
        if end != "answered":
            cause = {"canceled": "originator_cancel", "busy": "user_busy", "fails": "unspecified"}.get(end, "timeout")
            self.status_reports.append((dialled.call_id, cause))
            await self.post_webhook("call.hangup", dialled.call_id, hangup_cause=cause, hangup_source="callee")
            return None
        self.status_reports.append((dialled.call_id, "answered"))
        return await self.take_answered(dialled.call_id, dialled.to, callee)

    async def _command(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error_body("10009", "Authentication failed", 401)
        call_id, action = request.path_params["call_control_id"], request.path_params["action"]
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return _error_body("10015", "Invalid JSON", 400)
        if not isinstance(body, dict):
            return _error_body("10015", "Invalid JSON", 400)
        self.commands.append((call_id, action, body))
        if action == "hangup" and self.stop_ringing(call_id):  # a dialled call not answered yet: it stops ringing
            return JSONResponse({"data": {"result": "ok"}})
        call = self.calls.get(call_id)
        if call is None:
            return _error_body("90015", "Invalid call control id", 422)
        if call.ended.is_set():
            return _error_body("90018", "Call has already ended", 422)
        if action in ("answer", "streaming_start"):
            problem = _stream_problem(body)
            if problem is not None:
                call.result.warnings.append(f"{action}: {problem}")
                return _error_body("10015", problem, 422)
        elif action == "hangup":
            call.result.log(call.clock(), self.provider, "Call Control hangup")
            self.end_call(call_id)
        elif action == "reject":
            call.result.log(call.clock(), self.provider, f"call rejected ({body.get('cause')})")
            self.end_call(call_id)
        elif action == "transfer":  # Telnyx dials ``to`` and bridges the caller to it: the call leaves us
            if "to" not in body:
                return _error_body("10015", "Missing required parameter 'to'", 422)
            sent_on(call.result, call.clock(), self.provider, "Call Control transfer", body["to"])
            self.end_call(call_id)
        else:
            return _error_body("10005", "Resource not found", 404)
        self._resolve(call_id, action, body)
        return JSONResponse({"data": {"result": "ok"}})

    def _resolve(self, call_id: str, action: str, body: dict[str, Any]) -> None:
        pending = self._pending.get(call_id)
        if pending is not None and not pending.done():
            pending.set_result((action, body))

    async def _webhook_then_command(self, call: SimCall, event_type: str, **payload: Any) -> tuple[str, dict[str, Any]] | None:
        """Post a webhook and wait for the command it makes the bridge send (None: none came, or the call ended)."""
        if call.ended.is_set():
            return None
        future: asyncio.Future[tuple[str, dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._pending[call.call_id] = future
        try:
            status = await self.post_webhook(event_type, call, **payload)
            if status != 200 or call.ended.is_set():
                return None
            return await asyncio.wait_for(future, _COMMAND_TIMEOUT_S)
        except TimeoutError:
            return None
        finally:
            self._pending.pop(call.call_id, None)

    # ------------------------------------------------------------------ streams

    async def open_stream(self, call: SimCall, reason: OpenReason) -> TelnyxStream | None:
        """``call.initiated`` → ``answer``; after a drop ``streaming.stopped`` → ``streaming_start``; then the stream."""
        result = call.result
        if reason == "answer" and call.call_id in self._dialled:  # a call the bridge dialled, answered
            command = await self._webhook_then_command(call, "call.answered", state="answered")
        elif reason == "answer":
            command = await self._webhook_then_command(
                call, "call.initiated", direction="incoming", state="parked", **{"from": "+13122010094", "to": "+13122123456"}
            )
        else:
            old = self._streams.pop(call.call_id, None)
            why = "dropped" if reason == "network_drop" else "was closed by the bridge"
            result.log(call.clock(), self.provider, f"stream {old.stream_id if old else '?'} {why}: streaming.stopped")
            command = await self._webhook_then_command(call, "streaming.stopped", stream_id=old.stream_id if old else None)
        if command is None:
            if not call.ended.is_set():
                result.log(call.clock(), self.provider, "no stream command: the call ends")
                self.end_call(call.call_id)
            return None
        action, body = command
        if action not in ("answer", "streaming_start"):
            if action != "transfer":
                result.log(call.clock(), self.provider, f"{action}: the call ends")
            return None
        encoding = _CODECS[body.get("stream_codec", "PCMU")]
        ws = await connect(body["stream_url"], compression=None)
        stream_id = str(uuid.uuid4())
        params = body.get("custom_parameters") or []
        start = {
            "user_id": self.user_id,
            "call_control_id": call.call_id,
            "call_session_id": str(uuid.uuid5(uuid.NAMESPACE_OID, call.call_id)),
            "from": "+13122010094",
            "to": "+13122123456",
            "custom_parameters": {p["name"]: p["value"] for p in params},
            "media_format": {"encoding": body.get("stream_codec", "PCMU"), "sample_rate": 8000, "channels": 1},
        }
        if "client_state" in body:
            start["client_state"] = body["client_state"]
        await ws.send('{"event":"connected","version":"1.0.0"}')
        await ws.send(orjson.dumps({"event": "start", "sequence_number": "1", "stream_id": stream_id, "start": start}).decode())
        stream = TelnyxStream(
            WebSocketConnection(ws), stream_id, call, encoding,
            user_id=self.user_id, swap_every=self.swap_every, on_caller_hangup=lambda: self._call_over(call, "normal_clearing", "caller"),
        )  # fmt: skip
        self._streams[call.call_id] = stream
        self._in_background(self.post_webhook("streaming.started", call, stream_id=stream_id))  # webhooks trail the media
        return stream

    def _in_background(self, coroutine: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def end_call(self, call_id: str) -> bool:
        """The call ends on Telnyx's side (Call Control hangup or reject): its webhooks follow."""
        ended = super().end_call(call_id)
        call = self.calls.get(call_id)
        if ended and call is not None:
            self._resolve(call_id, "ended", {})
            self._in_background(self._call_over(call, "normal_clearing", "callee"))
        return ended

    async def _call_over(self, call: SimCall, cause: str, source: str) -> None:
        await self.post_webhook("call.hangup", call, hangup_cause=cause, hangup_source=source)
        stream = self._streams.pop(call.call_id, None)
        if stream is not None:
            await self.post_webhook("streaming.stopped", call, stream_id=stream.stream_id)

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        await self._http.aclose()
        await super().aclose()

    # ------------------------------------------------------------ the matrix

    def unknown_event(self, stream: SimStream) -> str:
        return orjson.dumps({"event": "transcription", "stream_id": stream.stream_id, "transcription": {"text": "hi"}}).decode()

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, TelnyxStream)
        sid = stream.stream_id

        def media(payload: str = "/////w==", stream_id: str | None = sid, seq: str = "900") -> str:
            body = {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": payload}
            message: dict[str, Any] = {"event": "media", "sequence_number": seq, "media": body}
            if stream_id is not None:
                message["stream_id"] = stream_id
            return orjson.dumps(message).decode()

        second_start = {"event": "start", "sequence_number": "1", "stream_id": sid, "start": {"call_control_id": stream.call.call_id}}
        return {
            "non_json_text": ("{this is not json", "not_json"),
            "binary_frame": (b"\x00\x01\x02", "binary_frame"),
            "wrong_stream_id": (media(stream_id=str(uuid.uuid4())), "wrong_stream"),
            "media_without_stream_id": (media(stream_id=None), "missing_field"),
            "invalid_base64": (media(payload="%%%not-base64%%%"), "bad_base64"),
            "bad_sequence_number": (media(seq="next"), "bad_field"),
            "oversized_message": ('{"event":"media","pad":"' + "x" * 300_000 + '"}', "oversized"),
            "event_not_a_name": (f'{{"event":7,"stream_id":"{sid}"}}', "bad_field"),
            "second_start": (orjson.dumps(second_start).decode(), "out_of_order"),
        }

    async def forged_requests_refused(self) -> bool:
        url = self.bridge_url + "/telnyx/events"
        body_call_id = self.new_call_id()
        body = self.webhook_body("call.initiated", body_call_id, direction="incoming")
        attempts = [
            self.signed(body, key=Ed25519PrivateKey.generate()),  # another account's key
            self.signed(body, timestamp=int(time.time()) - 600),  # a replay, 10 minutes late
            {**self.signed(body), "telnyx-signature-ed25519": base64.b64encode(bytes(64)).decode()},
            {"content-type": "application/json"},  # unsigned
        ]
        statuses = [(await self._http.post(url, content=body, headers=headers)).status_code for headers in attempts]
        tampered = self.signed(body)
        statuses.append((await self._http.post(url, content=body.replace(b"incoming", b"outgoing"), headers=tampered)).status_code)
        if any(status != 403 for status in statuses) or any(c[0] == body_call_id for c in self.commands):
            return False
        # the media socket has no signature: a stream without a token minted by an answer is refused
        ws_url = self.bridge_url.replace("http", "ws", 1) + "/telnyx/media"
        async with connect(ws_url, compression=None) as ws:
            start = {
                "call_control_id": self.new_call_id(),
                "custom_parameters": {"token": secrets.token_urlsafe(24)},
                "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
            }
            await ws.send('{"event":"connected","version":"1.0.0"}')
            await ws.send(orjson.dumps({"event": "start", "sequence_number": "1", "stream_id": str(uuid.uuid4()), "start": start}).decode())
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
            return ws.close_code == 1008


def connection_of(secret: str) -> str:
    """The simulated account's Call Control connection id (derived from its secret: the settings and the carrier
    agree)."""
    return str(int(hashlib.sha256(b"telnyx-connection:" + secret.encode()).hexdigest()[:15], 16))


@dataclass(frozen=True, slots=True)
class _Dialled:
    """A call ``POST /v2/calls`` dialled: what it was asked."""

    call_id: str
    to: str
    from_: str
    webhook_url: str
    timeout_s: int
    client_state: str


def _dial_problem(body: object, connection_id: str) -> str | None:
    """What Telnyx's dial command refuses in ``body``, or None."""
    if not isinstance(body, dict):
        return "Invalid JSON"
    if body.get("connection_id") != connection_id:
        return "connection_id: not a connection of this account"
    for key in ("to", "from"):
        if not isinstance(body.get(key), str) or not _E164.match(body[key]):
            return f"{key}: must be an E.164 number"
    timeout = body.get("timeout_secs", 30)
    if not isinstance(timeout, int) or not 5 <= timeout <= 600:
        return "timeout_secs: 5 to 600"
    url = body.get("webhook_url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        return "webhook_url: an http or https URL"
    return None


def _stream_problem(body: dict[str, Any]) -> str | None:
    """Why Telnyx would not stream as asked (or the bridge could not use it), or None."""
    unknown = set(body) - _STREAM_KEYS - {"cause"}
    url = body.get("stream_url")
    if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
        return f"stream_url {url!r}"
    if unknown:
        return f"unknown parameters {sorted(unknown)}"
    if body.get("stream_track", "inbound_track") not in ("inbound_track", "outbound_track", "both_tracks"):
        return f"stream_track {body.get('stream_track')!r}"
    if body.get("stream_bidirectional_mode") != "rtp":
        return "stream_bidirectional_mode is not rtp: the bridge's raw payloads would be taken for mp3"
    codec, back = body.get("stream_codec", "default"), body.get("stream_bidirectional_codec", "PCMU")
    if codec not in _CODECS or back not in _CODECS:
        return f"codecs {codec!r} / {back!r}"
    if codec != back:
        return f"stream_codec {codec} differs from stream_bidirectional_codec {back}"
    params = body.get("custom_parameters", [])
    if not isinstance(params, list) or not all(isinstance(p, dict) and set(p) == {"name", "value"} for p in params):
        return "custom_parameters is not a list of {name, value}"
    return None


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
