"""Plivo Audio Streams, bidirectional (``<Stream bidirectional="true">``): the wire codec
(telephony-protocols.md §3.2).

Plivo → us (JSON text, **camelCase**, integer ``sequenceNumber``): ``start``
(ids under ``start``, our ``extraHeaders`` as the top-level string
``extra_headers``), then ``media`` / ``dtmf`` / ``playedStream`` (a checkpoint
we sent was played) / ``clearedAudio`` (our ``clearAudio`` took effect). Plivo
reports the end of a stream on its HTTP status callback, not on the socket;
a ``stop`` event, should one come, is accepted as the end of the stream.

Us → Plivo: ``playAudio`` (``contentType`` and ``sampleRate`` those of the
stream), ``checkpoint`` (our playback marker) and ``clearAudio``, each with
the stream's ``streamId``. Pending checkpoints are not acknowledged after a
``clearAudio`` (profile ``marks_echoed_on_clear=False``; UNSURE for Plivo
itself, documented by a Plivo-compatible carrier).

``media.timestamp`` is Unix epoch ms, not stream time: it becomes stream time
relative to the first media frame (a timestamp before that one gives None).
It is a wall-clock stamp, so it jitters: a frame stamped up to
``TIMESTAMP_JITTER_MS`` after where the audio so far ends is reported at that
end (no gap); a later one is a real gap (lost frames), which the call fills
with silence.

The stream token: Plivo only allows ``[A-Za-z0-9]`` in ``extraHeaders``
values, so the answer webhook sends our token hex-encoded
(``stream_token_header``) and this codec decodes it back into
``custom_parameters["token"]``.

Validated once, here: a message that breaks the protocol raises
``RemoteProtocolError`` with its reason, and the call ends.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    DtmfReceived,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    SendClear,
    SendMark,
    SendMedia,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.json_wire import JsonCodec, json_number, start_body
from callbridge.codecs import AudioEncoding

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "PLIVO_FORMATS", "PLIVO_PROFILE", "TIMESTAMP_JITTER_MS", "PlivoCodec", "decode_stream_token", "encode_stream_token", "parse_extra_headers", "recognises", "stream_token_header"]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
"""A 20 ms L16 16 kHz frame is about 900 bytes of JSON; a second of audio in one message stays far below this."""

PLIVO_PROFILE: Final = CarrierProfile(joins_frames=True, marks_echoed_on_clear=False)
"""20 ms frames, checkpoints echoed as ``playedStream``, none echoed after ``clearAudio``, REST hang-up."""

PLIVO_FORMATS: Final = {
    ("audio/x-mulaw", 8000): AudioEncoding.PCMU,
    ("audio/x-l16", 8000): AudioEncoding.L16,
    ("audio/x-l16", 16000): AudioEncoding.L16,
}
"""What ``start.mediaFormat`` may announce. L16 is taken as little-endian (UNSURE, §8.6: a third-party
serializer makes the byte order configurable; the documented default and every sample we found are LE)."""

_WIRE_NAMES: Final = {AudioEncoding.PCMU: "audio/x-mulaw", AudioEncoding.L16: "audio/x-l16"}
_DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Plivo ids are UUIDs (``MA…`` auth ids for accounts); this also keeps them safe to splice into JSON."""
TIMESTAMP_JITTER_MS: Final = 60
"""How late a frame's wall-clock stamp may be before it counts as a gap in the audio (three frames)."""
_TOKEN_KEY: Final = "token"
_HEADER_SEPARATORS: Final = re.compile(r"[;,&\n]")


def encode_stream_token(token: str) -> str:
    """Our stream token as Plivo lets it through ``extraHeaders`` (letters and digits only): hex."""
    return token.encode().hex()


def decode_stream_token(value: str) -> str:
    """The inverse of ``encode_stream_token``; a value that is not our hex comes back unchanged (and will not
    match any token)."""
    try:
        return bytes.fromhex(value).decode()
    except (ValueError, UnicodeDecodeError):
        return value


def stream_token_header(token: str) -> str:
    """The ``extraHeaders`` attribute value that carries ``token``."""
    return f"{_TOKEN_KEY}={encode_stream_token(token)}"


def parse_extra_headers(raw: object) -> dict[str, str]:
    """``extra_headers`` as a dict. UNSURE wire format: Plivo's XML docs write ``a=1,b=2``, its event docs show
    ``a=1;b=2``; a JSON object (or its text) is accepted too. Keys lose an ``X-PH-`` prefix (how Plivo names
    custom SIP headers) should one appear. Pieces without ``=`` are ignored."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str) and raw.lstrip().startswith("{"):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    if isinstance(raw, dict):
        pairs = [(str(key), str(value)) for key, value in raw.items()]
    elif isinstance(raw, str):
        pairs = []
        for piece in _HEADER_SEPARATORS.split(raw):
            key, sep, value = piece.partition("=")
            if sep and key.strip():
                pairs.append((key.strip(), value.strip()))
    else:
        raise TypeError(type(raw).__name__)
    headers: dict[str, str] = {}
    for key, value in pairs:
        if key.lower().startswith("x-ph-"):
            key = key[5:]
        headers[key] = value
    return headers


class PlivoCodec(JsonCodec):
    """One Plivo audio stream, message by message."""

    stream_key = "streamId"
    provider = "plivo"
    profile: Final = PLIVO_PROFILE

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.encoding: AudioEncoding | None = None
        self.rate_hz: int | None = None
        self.stopped = False
        self._first_timestamp: int | None = None
        self._media_ms = 0
        """Where the audio reported so far ends, in stream ms (as the call counts it: payloads and gaps)."""
        self._last_media_sequence = -1
        self._media_head = ""
        """``{"event":"playAudio","media":{"contentType":…,"sampleRate":…,"payload":"`` for this stream."""

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message into carrier events. Raises ``RemoteProtocolError``."""
        payload = self._parse(message)
        event = payload.get("event")
        if event == "media":  # the hot path first
            self._check_stream(payload, event)
            return self._media(payload)
        if event == "start":
            return [self._start(payload)]
        if event == "dtmf":
            self._check_stream(payload, event)
            body = self._object(payload, "dtmf")
            digit = self._string(body, "digit", "dtmf")
            if digit not in _DTMF_DIGITS:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf digit {digit!r}")
            return [DtmfReceived(digit)]
        if event == "playedStream":
            self._check_stream(payload, event)
            return [MarkEchoed(self._string(payload, "name", "playedStream"))]
        if event == "clearedAudio":
            self._check_stream(payload, event)
            return [PlaybackCleared()]
        if event == "stop":
            # Not in Plivo's documented protocol (the end comes on the status callback); accepted leniently,
            # with or without a streamId, as the end of this stream.
            self._check_stream(payload, event, required=False)
            self.stopped = True
            return [StreamStopped()]
        return self._unknown(event)

    def _start(self, payload: dict[str, Any]) -> StreamStarted:
        if self.stream_id is not None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second start")
        start = self._object(payload, "start")
        stream_id = self._string(start, "streamId", "start")
        call_id = self._string(start, "callId", "start")
        if payload.get("streamId", stream_id) != stream_id:
            raise self._error(ProtocolErrorReason.WRONG_STREAM, "start.streamId differs from streamId")
        for name, value in (("streamId", stream_id), ("callId", call_id)):
            if not _ID.fullmatch(value):
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"start.{name} {value!r}")
        account = start.get("accountId")
        fmt = start.get("mediaFormat")
        if fmt is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "start.mediaFormat missing")
        if not isinstance(fmt, dict):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "start.mediaFormat is not an object")
        encoding, rate = self._format(fmt)
        try:
            params = parse_extra_headers(payload.get("extra_headers"))
        except TypeError:
            raise self._error(ProtocolErrorReason.BAD_FIELD, "extra_headers is neither a string nor an object") from None
        token = next((value for key, value in params.items() if key.lower() == _TOKEN_KEY), None)
        params = {key: value for key, value in params.items() if key.lower() != _TOKEN_KEY}
        if token is not None:
            params[_TOKEN_KEY] = decode_stream_token(token)
        self.stream_id, self.call_id, self.encoding, self.rate_hz = stream_id, call_id, encoding, rate
        self._media_head = (
            f'{{"event":"playAudio","streamId":"{stream_id}","media":{{"contentType":"{_WIRE_NAMES[encoding]}",'
            f'"sampleRate":{rate},"payload":"'
        )
        return StreamStarted(
            call_id=call_id,
            stream_id=stream_id,
            account_id=account if isinstance(account, str) and account else None,
            encoding=encoding,
            rate_hz=rate,
            custom_parameters=params,
        )

    def _format(self, fmt: dict[str, Any]) -> tuple[AudioEncoding, int]:
        """The announced encoding and rate. ``audio/x-l16;rate=16000`` (the XML ``contentType`` spelling) is
        accepted as well, its rate used when ``sampleRate`` is absent."""
        name = fmt.get("encoding")
        if not isinstance(name, str):
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"mediaFormat {fmt!r}")
        base, _, rest = name.partition(";")
        inline_rate = rest.strip().removeprefix("rate=") if rest else None
        rate = json_number(fmt.get("sampleRate", inline_rate))
        channels = fmt.get("channels", 1)
        encoding = PLIVO_FORMATS.get((base.strip().lower(), rate)) if rate is not None else None
        if encoding is None or rate is None or json_number(channels) != 1:
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"mediaFormat {fmt!r}")
        return encoding, rate

    def _media(self, payload: dict[str, Any]) -> list[CarrierEvent]:
        media = payload.get("media")
        if not isinstance(media, dict):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "media without a media object")
        self._last_media_sequence = self._media_sequence(payload.get("sequenceNumber"), self._last_media_sequence)
        encoded = media.get("payload")
        audio = self._audio(encoded)
        if self.encoding is AudioEncoding.L16 and len(audio) % 2:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"{len(audio)}-byte L16 payload (odd length)")
        track = media.get("track", "inbound")
        if track != "inbound":
            if track == "outbound":
                return []  # our own audio (audioTrack="both"); never asked for, not the caller's
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.track {track!r}")
        timestamp_ms = self._stream_time(media.get("timestamp"))
        assert self.rate_hz is not None and self.encoding is not None
        self._media_ms = max(self._media_ms, timestamp_ms or 0) + len(audio) * 1000 // (self.rate_hz * self.encoding.sample_bytes)
        return [MediaReceived(audio, timestamp_ms)]

    def _stream_time(self, timestamp: object) -> int | None:
        """Epoch ms → ms since this stream's first media frame (jitter absorbed, see the module docstring);
        None without a timestamp or with one before the first."""
        if timestamp is None:
            return None
        value = json_number(timestamp)
        if value is None or value < 0:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.timestamp {timestamp!r}")
        if self._first_timestamp is None:
            self._first_timestamp = value
        relative = value - self._first_timestamp
        if relative < 0:
            return None
        return relative if relative > self._media_ms + TIMESTAMP_JITTER_MS else min(relative, self._media_ms)


    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> str | None:
        """The JSON text message for ``action`` (None for a hang-up: that is a REST call). Only valid once the
        stream has started."""
        if self.stream_id is None:
            raise RuntimeError("PlivoCodec.send() before start")  # a bug in the caller, not the peer
        if isinstance(action, SendMedia):
            return self._media_head + binascii.b2a_base64(action.payload, newline=False).decode("ascii") + '"}}'
        if isinstance(action, SendMark):
            return orjson.dumps({"event": "checkpoint", "streamId": self.stream_id, "name": action.name}).decode()
        if isinstance(action, SendClear):
            return f'{{"event":"clearAudio","streamId":"{self.stream_id}"}}'
        return None


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is Plivo's: a ``start`` with ``streamId`` or ``start.callId``."""
    start = start_body(first)
    return start is not None and ("streamId" in first or "streamId" in start or "callId" in start)
