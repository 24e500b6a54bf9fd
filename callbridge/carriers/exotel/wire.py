"""Exotel Voicebot applet (bidirectional stream): the wire codec (telephony-protocols.md §3.3).

Exotel → us (JSON text, snake_case, the stream id is ``stream_sid``):
``connected``, ``start``, then ``media`` / ``dtmf`` / ``mark`` interleaved,
finally ``stop`` (``stop.reason``: ``stopped`` | ``callended``). Audio is
16-bit little-endian linear PCM, base64, at the rate ``start.media_format``
announces (8000 | 16000 | 24000, sent as strings), in chunks of about 100 ms —
any length is accepted. Numbers may arrive as strings or JSON numbers; unknown
fields are ignored. Us → Exotel: ``media``, ``mark`` and ``clear``, each with
the stream's ``stream_sid``.

Outbound chunks must be at least 3.2 kB, at least 100 ms, at most 100 kB and a
multiple of 320 bytes (a short or odd chunk makes the platform wait, which
the caller hears as a gap). Exotel's page calls 3.2 kB "100 ms", which holds at
16 kHz but is 200 ms at 8 kHz; ``profile`` satisfies both readings: frames are
the shortest multiple of 20 ms that is ≥ 100 ms and ≥ ``min_chunk_bytes``
(200 ms at 8 kHz, 100 ms at 16 and 24 kHz with the default 3200).

UNSURE points and what this codec does about them:
- mark echoes on ``clear``: not documented. The profile says they are echoed
  (as the protocol Exotel's mirrors does). That is the safe choice either
  way: the ledger ignores echoes of flushed marks, and a mark that is never
  echoed costs nothing.
- an inbound ``clear`` (one third-party list of Exotel's events has it): taken
  as the carrier's confirmation of a flush (``PlaybackCleared``).
- ``media.timestamp``: stream-relative ms per Exotel, but whether a chunk is
  stamped with its start or its end is not said; timestamps are counted from
  the stream's first media message, so only later gaps show (and an epoch
  clock would work too). One going backwards gives no timestamp.
- ``start.custom_parameters``: an object; a query string is accepted too.

Validated once, here: a message that breaks the protocol raises
``RemoteProtocolError`` with its reason, and the call ends.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl

import orjson

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierNotice,
    CarrierProfile,
    DtmfReceived,
    HangUpMode,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.json_wire import JsonCodec, json_number, start_body
from callbridge.codecs import AudioEncoding

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_MIN_CHUNK_BYTES", "EXOTEL_RATES", "MAX_CHUNK_BYTES", "ExotelCodec", "exotel_frame_ms", "recognises"]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
"""A 100 ms chunk at 24 kHz is about 6.5 kB of JSON; Exotel's 100 kB chunk limit, base64, stays below this."""

DEFAULT_MIN_CHUNK_BYTES: Final = 3200
MAX_CHUNK_BYTES: Final = 100_000
CHUNK_MULTIPLE_BYTES: Final = 320
EXOTEL_RATES: Final = frozenset({8000, 16000, 24000})

_MIN_CHUNK_MS: Final = 100
_FRAME_STEP_MS: Final = 20
_PCM_ENCODINGS: Final = frozenset({"audio/x-raw", "raw/slin", "slin", "audio/l16", "audio/x-l16", "l16"})
"""Names of little-endian 16-bit PCM: Exotel's ``audio/x-raw`` and its docs' ``raw/slin``, compared lowercased."""
_DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
_SID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""Exotel's sids are hex or alphanumeric; this also keeps them safe to splice into JSON."""


def exotel_frame_ms(rate_hz: int, min_chunk_bytes: int = DEFAULT_MIN_CHUNK_BYTES) -> int:
    """The shortest multiple of 20 ms that is ≥ 100 ms and ≥ ``min_chunk_bytes`` of 16-bit PCM at ``rate_hz``.

    20 ms of 16-bit PCM at 8/16/24 kHz is 320/640/960 bytes, so every such frame is a multiple of 320 bytes.
    """
    bytes_per_step = rate_hz * 2 * _FRAME_STEP_MS // 1000
    steps = max(_MIN_CHUNK_MS // _FRAME_STEP_MS, -(-min_chunk_bytes // bytes_per_step))
    return steps * _FRAME_STEP_MS


class ExotelCodec(JsonCodec):
    """One Exotel Voicebot stream, message by message.

    ``lead_ms``: how far ahead of playback the bridge may feed Exotel (``audio.playout_lead_ms``); the profile
    raises it to two frames, so that one frame is always queued behind the one playing (with a lead of one
    frame, each frame would leave only when the last one ended: a gap per frame).
    """

    stream_key = "stream_sid"
    provider = "exotel"

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        min_chunk_bytes: int = DEFAULT_MIN_CHUNK_BYTES,
        lead_ms: int | None = None,
    ) -> None:
        if min_chunk_bytes % CHUNK_MULTIPLE_BYTES or not 0 < min_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"min_chunk_bytes {min_chunk_bytes} is not a multiple of 320 in (0, 100000]")
        self.max_message_bytes = max_message_bytes
        self.min_chunk_bytes = min_chunk_bytes
        self.lead_ms = lead_ms
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.rate_hz = 8000
        self.stopped = False
        self.stop_reason: str | None = None
        self._first_timestamp: int | None = None
        self._profile = self._profile_for(self.rate_hz)

    @property
    def profile(self) -> CarrierProfile:
        """Frames of ``exotel_frame_ms`` at the stream's rate (known once it has started); hang-up by closing."""
        return self._profile

    def _profile_for(self, rate_hz: int) -> CarrierProfile:
        frame_ms = exotel_frame_ms(rate_hz, self.min_chunk_bytes)
        lead_ms = max(self.lead_ms or 0, 2 * frame_ms)
        return CarrierProfile(
            frame_ms=frame_ms,
            joins_frames=True,  # any multiple of 320 bytes up to 100 kB, as a frame is
            uses_marks=True,
            marks_echoed_on_clear=True,  # UNSURE (module docstring): safe either way
            lead_ms=lead_ms,
            hang_up=HangUpMode.CLOSE,
        )

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message into carrier events. Raises ``RemoteProtocolError``."""
        payload = self._parse(message)
        event = payload.get("event")
        if event == "media":  # the hot path first
            self._check_stream(payload, event)
            return [self._media(payload)]
        if event == "connected":
            if self.stream_id is not None:
                raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "connected after start")
            return [StreamConnected()]
        if event == "start":
            return [self._start(payload)]
        if event in ("dtmf", "mark", "stop", "clear"):
            self._check_stream(payload, event)
            if event == "stop":
                return self._stop(payload)
            if event == "clear":
                return [PlaybackCleared()]
            body = self._object(payload, event)
            if event == "mark":
                return [MarkEchoed(self._string(body, "name", "mark"))]
            return [DtmfReceived(self._digit(body))]
        return self._unknown(event)

    def _start(self, payload: dict[str, Any]) -> StreamStarted:
        if self.stream_id is not None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second start")
        self._sequence(payload)
        start = self._object(payload, "start")
        call_id = self._string(start, "call_sid", "start")
        outer, inner = payload.get("stream_sid"), start.get("stream_sid")
        if outer is not None and inner is not None and outer != inner:
            raise self._error(ProtocolErrorReason.WRONG_STREAM, "start.stream_sid differs from stream_sid")
        stream_id = inner if inner is not None else outer
        if stream_id is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "start without a stream_sid")
        for name, sid in (("stream_sid", stream_id), ("call_sid", call_id)):
            if not isinstance(sid, str) or not _SID.fullmatch(sid):
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"start.{name} {sid!r}")
        rate = self._format(start.get("media_format"))
        params = self._custom_parameters(start.get("custom_parameters"))
        account = start.get("account_sid")
        self.stream_id, self.call_id, self.rate_hz = stream_id, call_id, rate
        self._profile = self._profile_for(rate)
        return StreamStarted(
            call_id=call_id,
            stream_id=stream_id,
            account_id=account if isinstance(account, str) and account else None,
            encoding=AudioEncoding.L16,
            rate_hz=rate,
            custom_parameters=params,
            caller=_number(start.get("from")),
            called=_number(start.get("to")),
        )

    def _format(self, fmt: Any) -> int:
        """The stream's rate from ``media_format``; absent, Exotel's documented default (PCM16 8 kHz)."""
        if fmt is None:
            return 8000
        if not isinstance(fmt, dict):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "start.media_format is not an object")
        name = fmt.get("encoding", "audio/x-raw")
        rate = json_number(fmt.get("sample_rate", 8000))
        bits = json_number(fmt.get("bit_rate", 16))
        channels = json_number(fmt.get("channels", 1))
        if not isinstance(name, str) or name.lower() not in _PCM_ENCODINGS or rate not in EXOTEL_RATES or bits != 16 or channels != 1:
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"media_format {fmt!r}")
        assert rate is not None
        return rate

    def _custom_parameters(self, params: Any) -> dict[str, str]:
        if params is None or params == "":
            return {}
        if isinstance(params, str):  # a raw query string (the applet's URL parameters), leniently
            return dict(parse_qsl(params.removeprefix("?"), keep_blank_values=True))
        if not isinstance(params, dict):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "start.custom_parameters is not an object")
        return {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in params.items()}

    def _media(self, payload: dict[str, Any]) -> MediaReceived:
        media = payload.get("media")
        if not isinstance(media, dict):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "media without a media object")
        encoded = media.get("payload")
        audio = self._audio(encoded)
        if len(audio) % 2:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"{len(audio)} bytes of 16-bit PCM")
        return MediaReceived(audio, self._timestamp(media.get("timestamp")))

    def _timestamp(self, value: Any) -> int | None:
        """ms since the stream's first media message (see the module docstring); None when there is none."""
        if value is None:
            return None
        timestamp = json_number(value)
        if timestamp is None or timestamp < 0:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.timestamp {value!r}")
        if self._first_timestamp is None:
            self._first_timestamp = timestamp
        relative = timestamp - self._first_timestamp
        return relative if relative >= 0 else None

    def _stop(self, payload: dict[str, Any]) -> list[CarrierEvent]:
        self.stopped = True
        body = payload.get("stop")
        reason = body.get("reason") if isinstance(body, dict) else None
        self.stop_reason = reason if isinstance(reason, str) else None
        # ``callended``: the caller hung up; ``stopped``: the flow stopped the stream. Either ends our part.
        return [CarrierNotice("stop", f"reason={self.stop_reason}"), StreamStopped()]

    def _digit(self, body: dict[str, Any]) -> str:
        value = body.get("digit")
        digit = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if digit is None or digit == "":
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "dtmf.digit missing")
        if not isinstance(digit, str) or digit.upper() not in _DTMF_DIGITS:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf digit {value!r}")
        return digit.upper()

    def _check_stream(self, payload: dict[str, Any], event: str, *, required: bool = True) -> None:
        super()._check_stream(payload, event, required=required)
        self._sequence(payload)

    def _sequence(self, payload: dict[str, Any]) -> None:
        """``sequence_number`` is optional (``connected`` has none) and must be a number when present. Its order
        is not enforced: the websocket already keeps order, and Exotel does not document the counter."""
        value = payload.get("sequence_number")
        if value is not None and json_number(value) is None:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"sequence_number {value!r}")

    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> str | None:
        """The JSON text message for ``action``; None for a hang-up (the driver closes the socket). Only valid
        once the stream has started. Media must be a whole chunk Exotel accepts (the call logic sends frames
        of ``profile.frame_ms``); anything else is a bug on our side, not the peer's."""
        if self.stream_id is None:
            raise RuntimeError("ExotelCodec.send() before start")
        if isinstance(action, SendMedia):
            size = len(action.payload)
            if size % CHUNK_MULTIPLE_BYTES or not self.min_chunk_bytes <= size <= MAX_CHUNK_BYTES:
                raise ValueError(f"an Exotel media chunk of {size} bytes (wants a multiple of 320 in [{self.min_chunk_bytes}, 100000])")
            payload = binascii.b2a_base64(action.payload, newline=False).decode("ascii")
            return f'{{"event":"media","stream_sid":"{self.stream_id}","media":{{"payload":"{payload}"}}}}'
        if isinstance(action, SendMark):
            return orjson.dumps({"event": "mark", "stream_sid": self.stream_id, "mark": {"name": action.name}}).decode()
        if isinstance(action, SendClear):
            return f'{{"event":"clear","stream_sid":"{self.stream_id}"}}'
        return None


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is Exotel's: a ``start`` with ``stream_sid``."""
    start = start_body(first)
    return start is not None and ("stream_sid" in first or "stream_sid" in start)


def _number(value: object) -> str | None:
    """A ``from``/``to`` of the start as given (at most 64 characters: a number or a SIP user), or None."""
    return value[:64] if isinstance(value, str) and value else None
