"""A simulated Exotel Voicebot applet, faithful to the wire (telephony-protocols.md §3.3), for the tests.

It does what Exotel does when a call reaches the flow ``Voicebot → Passthru →
(Voicebot again if the stream failed | Hangup)``:
- opens the applet's fixed URL, ``ws://API_KEY:API_TOKEN@host/exotel/media?sample-rate=…&…``:
  the credentials go as ``Authorization: Basic``, the other query parameters
  come back in ``start.custom_parameters``; a refused handshake is retried
  once, then the flow moves on (the call ends);
- sends ``connected`` and ``start`` (``media_format``: ``audio/x-raw``, the
  rate as a string), then 100 ms of caller audio per ``media`` message at real
  time (16-bit little-endian PCM at 8, 16 or 24 kHz), with string
  ``sequence_number``, ``chunk`` and ``timestamp`` (stream ms at the chunk's
  end); ``dtmf`` with ``digit`` and ``duration``; ``stop`` with ``reason``
  ``callended`` when the caller hangs up, then closes;
- plays what the bridge sends (``callbridge.sim.carrier``): a ``media`` chunk
  must be a multiple of 320 bytes, at least 3.2 kB and 100 ms, at most 100 kB
  (anything else plays with a gap on the real platform: a recorded warning),
  as must be anything but ``media`` / ``mark`` / ``clear`` with the stream's
  ``stream_sid``; echoes each ``mark`` when playback reaches it and, on
  ``clear``, every pending one (UNSURE upstream; ``marks_echoed_on_clear``
  switches it off);
- when the bridge closes the socket, the flow goes on to Hangup: the call
  ends; when the connection drops, the Passthru routes the call back into the
  Voicebot applet: a new stream (new ``stream_sid``) on the same ``call_sid``.

There is no REST API to serve: the bridge hangs up by closing the socket.
"""

from __future__ import annotations

import audioop
import base64
import binascii
import secrets
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Final
from urllib.parse import parse_qsl, urlsplit

import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from callbridge.sim.carrier import (
    OpenReason,
    SimCall,
    SimStream,
    SimulatedCarrier,
    WebSocketConnection,
)

__all__ = ["ExotelConnection", "ExotelStream", "SimulatedExotel"]

CHUNK_MS: Final = 100
MIN_CHUNK_BYTES: Final = 3200
MAX_CHUNK_BYTES: Final = 100_000
_OUTBOUND_KEYS: Final = {"media": {"event", "stream_sid", "media"}, "mark": {"event", "stream_sid", "mark"}, "clear": {"event", "stream_sid"}}
_ACCOUNT: Final = "exotelsim1"


class ExotelConnection(WebSocketConnection):
    """The media websocket; when the bridge closes it (not a drop, not the caller's stop) the flow moves on to
    its next applet, Hangup, and ``on_closed_by_bridge`` ends the call."""

    def __init__(self, ws: Any, call: SimCall, carrier: SimulatedCarrier) -> None:
        super().__init__(ws)
        self.call = call
        self.carrier = carrier
        self.ours = False
        """We aborted (a network drop) or closed it (the caller's stop)."""

    async def messages(self) -> AsyncIterator[str | bytes]:
        async for message in super().messages():
            yield message
        if not self.ours and self.carrier.end_call(self.call.call_id):
            self.call.result.log(self.call.clock(), "exotel", "the bot closed the stream: next applet, Hangup")

    def abort(self) -> None:
        self.ours = True
        super().abort()

    async def close(self) -> None:
        self.ours = True
        await super().close()


class ExotelStream(SimStream):
    """One Voicebot media websocket: JSON text, PCM16 little-endian at ``rate_hz``, 100 ms chunks."""

    marks_echoed_on_clear: ClassVar[bool] = True

    def __init__(self, conn: ExotelConnection, stream_sid: str, call: SimCall, rate_hz: int) -> None:
        super().__init__(conn, stream_sid, rate_hz, call)
        self.sequence = 1  # start was message 1
        self.chunk = 0
        self.pending = bytearray()
        self.chunk_bytes = rate_hz * 2 * CHUNK_MS // 1000
        self._resample_state: Any = None

    def _next_sequence(self) -> str:
        self.sequence += 1
        return str(self.sequence)

    def _message(self, event: str, **body: Any) -> str:
        return orjson.dumps({"event": event, "sequence_number": self._next_sequence(), "stream_sid": self.stream_id, **body}).decode()

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.rate_hz != 8000:
            pcm_8k, self._resample_state = audioop.ratecv(pcm_8k, 2, 1, 8000, self.rate_hz, self._resample_state)
        self.pending += pcm_8k
        if len(self.pending) < self.chunk_bytes:
            return
        chunk, self.pending = bytes(self.pending[: self.chunk_bytes]), self.pending[self.chunk_bytes :]
        self.chunk += 1
        media = {"chunk": str(self.chunk), "timestamp": str(self.chunk * CHUNK_MS), "payload": base64.b64encode(chunk).decode()}
        await self.send(self._message("media", media=media))

    async def send_dtmf(self, digit: str) -> None:
        await self.send(self._message("dtmf", dtmf={"digit": digit, "duration": "100"}))

    async def send_stop(self) -> None:
        stop = {"call_sid": self.call.call_id, "account_sid": _ACCOUNT, "reason": "callended"}
        await self.send(self._message("stop", stop=stop))
        await self.conn.close()

    def mark_message(self, name: str) -> str:
        return self._message("mark", mark={"name": name})

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
        if event not in _OUTBOUND_KEYS or set(payload) != _OUTBOUND_KEYS[event] or payload.get("stream_sid") != self.stream_id:
            self.warn(f"invalid message {message[:80]}")
            return
        if event == "media":
            self._media(payload["media"])
        elif event == "mark":
            name = payload["mark"].get("name") if isinstance(payload["mark"], dict) else None
            if not isinstance(name, str) or not name:
                self.warn("mark without a name")
            else:
                self.add_mark(name)
        else:
            self.clear()

    def _media(self, media: Any) -> None:
        if not isinstance(media, dict) or set(media) != {"payload"}:
            self.warn("media with fields other than payload")
            return
        try:
            audio = binascii.a2b_base64(media["payload"], strict_mode=True)
        except (binascii.Error, TypeError):
            self.warn("media payload is not base64")
            return
        size = len(audio)
        if size % 320 or size < MIN_CHUNK_BYTES or size * 1000 < CHUNK_MS * self.rate_hz * 2 or size > MAX_CHUNK_BYTES:
            self.warn(f"media chunk of {size} bytes ({size * 500 // self.rate_hz} ms): a gap in playback")
        self.enqueue_audio(audio[: size - size % 2])


class SimulatedExotel(SimulatedCarrier):
    """Exotel's side of inbound calls through a Voicebot applet pointed at the bridge at ``bridge_url``."""

    provider: ClassVar[str] = "exotel"
    can_reconnect: ClassVar[bool] = True
    says_goodbye: ClassVar[bool] = True
    uses_marks: ClassVar[bool] = True
    stream_class: ClassVar[type[ExotelStream]] = ExotelStream

    def __init__(self, bridge_url: str, secret: str, *, rate_hz: int = 8000) -> None:
        super().__init__(bridge_url, secret)
        self.api_key, self.api_token = self.credentials(secret)
        self.rate_hz = rate_hz
        """The applet's ``sample-rate`` (8000, 16000 or 24000)."""
        self.custom_parameters = {"lang": "en", "campaign": "sim"}
        """The applet URL's other query parameters (Exotel allows three)."""

    @staticmethod
    def credentials(secret: str) -> tuple[str, str]:
        """The API key and token of the simulated account (both derived from the shared secret)."""
        return "key" + secret[:12], secret

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        key, token = cls.credentials(secret)
        return {"exotel": {"api_key": key, "api_token": token, "validate_credentials": True}}

    def new_call_id(self) -> str:
        return secrets.token_hex(16)  # Exotel's CallSid: 32 hex digits

    def applet_url(self, key: str | None = None, token: str | None = None) -> str:
        """The URL configured in the Voicebot applet, with credentials."""
        host = urlsplit(self.bridge_url).netloc
        scheme = "wss" if self.bridge_url.startswith("https://") else "ws"
        query = "&".join([f"sample-rate={self.rate_hz}", *(f"{k}={v}" for k, v in self.custom_parameters.items())])
        userinfo = f"{key or self.api_key}:{token or self.api_token}@"
        return f"{scheme}://{userinfo}{host}/exotel/media?{query}"

    async def open_stream(self, call: SimCall, reason: OpenReason) -> ExotelStream | None:
        """The Voicebot applet runs (again, after a dropped stream: the Passthru routes back): open its URL
        (one retry if the handshake fails) and send ``connected`` and ``start``."""
        result = call.result
        if reason == "closed_by_bridge":
            self.end_call(call.call_id)
            result.log(call.clock(), self.provider, "the bot closed the stream: next applet, Hangup")
            return None
        if reason == "network_drop":
            result.log(call.clock(), self.provider, "stream failed: Passthru routes the call back into the Voicebot applet")
        url = self.applet_url()
        ws = None
        for attempt in (1, 2):
            try:
                ws = await connect(url, compression=None)
                break
            except (InvalidStatus, InvalidHandshake, OSError) as exc:
                result.log(call.clock(), self.provider, f"handshake failed (attempt {attempt}): {exc}")
        if ws is None:
            result.log(call.clock(), self.provider, "Voicebot applet failed: next applet, Hangup")
            return None
        stream_sid = secrets.token_hex(16)
        query = dict(parse_qsl(urlsplit(url).query))
        rate = query.pop("sample-rate", "8000")
        start = {
            "stream_sid": stream_sid,
            "call_sid": call.call_id,
            "account_sid": _ACCOUNT,
            "from": "+919800000001",
            "to": "+918000000002",
            "custom_parameters": query,
            "media_format": {"encoding": "audio/x-raw", "sample_rate": rate, "bit_rate": "16"},
        }
        await ws.send('{"event":"connected"}')
        await ws.send(orjson.dumps({"event": "start", "sequence_number": "1", "stream_sid": stream_sid, "start": start}).decode())
        return self.stream_class(ExotelConnection(ws, call, self), stream_sid, call, int(rate))

    def unknown_event(self, stream: SimStream) -> str:
        return orjson.dumps({"event": "transcription", "stream_sid": stream.stream_id, "transcription": {"text": "hi"}}).decode()

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        assert isinstance(stream, ExotelStream)
        sid = stream.stream_id
        chunk = base64.b64encode(bytes(stream.chunk_bytes)).decode()

        def media(payload: str = chunk, stream_sid: str = sid, timestamp: str = "100") -> str:
            body = {"chunk": "1", "timestamp": timestamp, "payload": payload}
            return orjson.dumps({"event": "media", "sequence_number": "2", "stream_sid": stream_sid, "media": body}).decode()

        start = {"stream_sid": sid, "call_sid": stream.call.call_id, "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000"}}
        return {
            "non_json_text": ("{this is not json", "not_json"),
            "binary_frame": (b"\x00\x01\x02", "binary_frame"),
            "wrong_stream_id": (media(stream_sid="0" * 32), "wrong_stream"),
            "invalid_base64": (media(payload="%%%not-base64%%%"), "bad_base64"),
            "odd_pcm_length": (media(payload=base64.b64encode(bytes(3)).decode()), "bad_field"),
            "bad_timestamp": (media(timestamp="soon"), "bad_field"),
            "oversized_message": ('{"event":"media","pad":"' + "x" * 300_000 + '"}', "oversized"),
            "event_not_a_name": (f'{{"event":7,"stream_sid":"{sid}"}}', "bad_field"),
            "second_start": (orjson.dumps({"event": "start", "stream_sid": sid, "start": start}).decode(), "out_of_order"),
        }

    async def forged_requests_refused(self) -> bool:
        """Wrong token, wrong key, no credentials at all: every upgrade must be answered 403."""
        host = urlsplit(self.bridge_url).netloc
        attempts = [self.applet_url(token="forged"), self.applet_url(key="forged"), f"ws://{host}/exotel/media?sample-rate=8000"]
        for url in attempts:
            try:
                async with connect(url, compression=None):
                    return False
            except InvalidStatus as exc:
                if exc.response.status_code != 403:
                    return False
        return True
