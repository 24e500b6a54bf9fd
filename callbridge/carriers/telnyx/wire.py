"""Telnyx media streaming over websockets, bidirectional ``rtp`` mode: the wire codec (telephony-protocols.md §3.1).

Telnyx → us (JSON text, snake_case, the stream id at the top level as
``stream_id``): ``connected``, ``start``, then ``media`` / ``dtmf`` / ``mark``
/ ``error`` interleaved, finally ``stop``. Numbers may arrive as strings.
Us → Telnyx: ``media`` (raw codec bytes of the stream's codec, base64, no RTP
header), ``mark`` and ``clear``, each with the stream's ``stream_id`` (Telnyx
does not require it; it is harmless).

Decisions on the points the reference leaves open:

- **Codec**: what ``start.media_format`` announces, never a configured guess:
  ``PCMU``/``audio/x-mulaw`` and ``PCMA``/``audio/x-alaw`` at 8 kHz, and
  ``L16`` at the announced ``sample_rate``. Telnyx media payloads are RTP
  payloads, and an RTP L16 payload is in network byte order (RFC 3551 §4.5.11;
  pipecat's Telnyx serializer byte-swaps L16 both ways): L16 is big-endian here.
- **Order**: Telnyx does not guarantee the order of media frames. They are put
  back in ``sequence_number`` order in a window of ``reorder_window`` frames:
  a frame that arrives early waits for the ones before it; a missing frame is
  given up once a frame ``reorder_window + 1`` numbers past it has come, so no
  frame waits longer than the window (the frames after it go on, and the call
  fills the gap with silence from ``media.timestamp``, stream-relative ms;
  ``callbridge.reorder`` does the ordering, as for RTP);
  a duplicate, or a frame older than what was already released, is dropped and
  counted. ``sequence_number`` counts every message of the stream, so a
  ``dtmf``/``error`` (or an outbound-track frame) takes a number too and fills
  its slot. ``stop`` releases what is held first.
- **Marks on clear**: Telnyx's AsyncAPI page says "a clear frame also returns
  queued marks" — the profile says ``marks_echoed_on_clear``. Were that
  wrong, an unechoed mark only leaves a name in a set; echoes are never
  mistaken for playback.
- **Token**: our answer carries the stream token in ``custom_parameters``
  (a list of ``{"name", "value"}`` in the command, an object in ``start``;
  both forms are read). If no ``token`` is there, a ``client_state`` that is
  base64 JSON ``{"token": …}`` is read instead.

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
    CarrierNotice,
    CarrierProfile,
    DtmfReceived,
    HangUpMode,
    MarkEchoed,
    MediaReceived,
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
from callbridge.reorder import Missing, Placed, Reorder

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_REORDER_WINDOW", "TELNYX_PROFILE", "TelnyxCodec", "recognises", "telnyx_format"]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
"""A 20 ms frame is a few hundred bytes; even a second of 48 kHz L16 in one message stays below this."""
DEFAULT_REORDER_WINDOW: Final = 4
"""Frames held while waiting for a missing one: 80 ms of 20 ms frames, the most a gap may delay the caller."""

TELNYX_PROFILE: Final = CarrierProfile(frame_ms=20, joins_frames=True, uses_marks=True, marks_echoed_on_clear=True, hang_up=HangUpMode.REST)
"""Frames of 20 ms (rtp mode takes 20 ms to 30 s a message), marks echoed as played and on clear, REST hang-up."""

_GIVEN_UP_KEPT: Final = 256
"""Given-up sequence numbers remembered (to tell a late frame from a duplicate)."""
_DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
_ID: Final = re.compile(r"[A-Za-z0-9._:=-]{1,256}")
"""Stream ids are UUIDs, call control ids ``v3:`` + base64url; nothing that needs escaping in JSON or a URL path."""
_G711: Final = {
    "pcmu": AudioEncoding.PCMU,
    "audio/x-mulaw": AudioEncoding.PCMU,
    "pcma": AudioEncoding.PCMA,
    "audio/x-alaw": AudioEncoding.PCMA,
}
_L16_NAMES: Final = frozenset({"l16", "audio/l16", "audio/x-l16"})
_L16_RATES: Final = frozenset({8000, 16000, 24000, 48000})
"""``stream_bidirectional_sampling_rate`` offers 22050 too: not accepted (no whole-ratio resampling to the engine)."""


def telnyx_format(encoding: object, sample_rate: object) -> tuple[AudioEncoding, int] | None:
    """The audio format a ``media_format`` announces (G.711 is 8 kHz by definition), or None if unsupported."""
    if not isinstance(encoding, str):
        return None
    name = encoding.strip().lower()
    rate = json_number(sample_rate) if sample_rate is not None else None
    if name in _G711:
        return (_G711[name], 8000) if rate in (None, 8000) else None
    if name in _L16_NAMES and rate in _L16_RATES:
        assert rate is not None
        return AudioEncoding.L16_BE, rate
    return None


class TelnyxCodec(JsonCodec):
    """One Telnyx media stream, message by message (see the module docstring)."""

    stream_key = "stream_id"
    provider = "telnyx"
    profile: Final = TELNYX_PROFILE

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, reorder_window: int = DEFAULT_REORDER_WINDOW) -> None:
        if reorder_window < 0:
            raise ValueError("reorder_window must be >= 0")
        self.max_message_bytes = max_message_bytes
        self.reorder_window = reorder_window
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.encoding: AudioEncoding | None = None
        self.stopped = False
        self._order: Reorder[MediaReceived | None] = Reorder(reorder_window + 1)
        """Frames by ``sequence_number`` (``callbridge.reorder``: a gap is given up once ``reorder_window`` frames
        wait behind it); None marks a slot taken by a message that is not inbound audio."""
        self.reordered = 0
        """Frames that arrived early and were put back in place."""
        self.duplicates_dropped = 0
        self.late_dropped = 0
        """Frames that came after their gap had been given up."""
        self.gaps = 0
        """Gaps given up (frames never received in the window)."""
        self._given_up: set[int] = set()
        """Sequence numbers given up, so that one arriving later counts as late, not as a duplicate."""
        self._last_given_up: int | None = None

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message into carrier events (media in sequence order). Raises ``RemoteProtocolError``."""
        payload = self._parse(message)
        event = payload.get("event")
        if event == "media":  # the hot path first
            self._check_stream(payload, event, required=True)
            seq = self._sequence(payload)
            return self._place(seq, self._media(payload))
        if event == "connected":
            if self.stream_id is not None:
                raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "connected after start")
            return [StreamConnected()]
        if event == "start":
            return [self._start(payload)]
        if event in ("dtmf", "mark", "error", "stop"):
            self._check_stream(payload, event, required=event != "error")
            seq = self._sequence(payload)
            if event == "stop":
                return self._stop(payload)
            return [self._control(payload, event), *self._place(seq, None)]
        return self._unknown(event)

    def _start(self, payload: dict[str, Any]) -> StreamStarted:
        if self.stream_id is not None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second start")
        start = self._object(payload, "start")
        stream_id = self._string(payload, "stream_id", "start")
        call_id = self._string(start, "call_control_id", "start")
        for name, value in (("stream_id", stream_id), ("start.call_control_id", call_id)):
            if not _ID.fullmatch(value):
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"{name} {value!r}")
        fmt = start.get("media_format")
        if not isinstance(fmt, dict):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "start.media_format missing")
        announced = telnyx_format(fmt.get("encoding"), fmt.get("sample_rate"))
        if announced is None or json_number(fmt.get("channels", 1)) != 1:
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"media_format {fmt!r}")
        params = self._parameters(start)
        seq = payload.get("sequence_number")
        if seq is not None:
            number = json_number(seq)
            if number is None or number < 0:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"sequence_number {seq!r}")
            self._order.restart(number + 1)
        account = start.get("user_id")
        self.stream_id, self.call_id, self.encoding = stream_id, call_id, announced[0]
        return StreamStarted(
            call_id=call_id,
            stream_id=stream_id,
            account_id=account if isinstance(account, str) else None,
            encoding=announced[0],
            rate_hz=announced[1],
            custom_parameters=params,
        )

    def _parameters(self, start: dict[str, Any]) -> dict[str, str]:
        """``custom_parameters`` as an object or as ``[{"name", "value"}]``; the token from ``client_state`` if need be."""
        raw = start.get("custom_parameters") or {}
        params: dict[str, str] = {}
        if isinstance(raw, dict):
            params = {str(k): str(v) for k, v in raw.items()}
        elif isinstance(raw, list):
            for item in raw:
                if not isinstance(item, dict) or not isinstance(item.get("name"), str) or "value" not in item:
                    raise self._error(ProtocolErrorReason.BAD_FIELD, f"start.custom_parameters item {item!r}")
                params[item["name"]] = str(item["value"])
        else:
            raise self._error(ProtocolErrorReason.BAD_FIELD, "start.custom_parameters is neither an object nor a list")
        if "token" not in params and isinstance(start.get("client_state"), str):
            token = _client_state_token(start["client_state"])
            if token is not None:
                params["token"] = token
        return params

    def _media(self, payload: dict[str, Any]) -> MediaReceived | None:
        """The frame's audio; None for an outbound-track frame (``both_tracks``: the agent's own voice)."""
        media = payload.get("media")
        if not isinstance(media, dict):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "media without a media object")
        encoded = media.get("payload")
        if not isinstance(encoded, str):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "media without a payload")
        track = media.get("track")
        if track not in (None, "inbound", "outbound", "inbound_track", "outbound_track"):
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.track {track!r}")
        try:
            audio = binascii.a2b_base64(encoded, strict_mode=True)
        except ValueError as exc:  # binascii.Error, or text that is not ASCII at all
            raise self._error(ProtocolErrorReason.BAD_BASE64, str(exc)) from None
        if self.encoding is AudioEncoding.L16_BE and len(audio) % 2:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"L16 payload of {len(audio)} bytes (odd)")
        timestamp = media.get("timestamp")
        timestamp_ms = json_number(timestamp) if timestamp is not None else None
        if timestamp is not None and (timestamp_ms is None or timestamp_ms < 0):
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.timestamp {timestamp!r}")
        if track in ("outbound", "outbound_track"):
            return None
        return MediaReceived(audio, timestamp_ms)

    def _control(self, payload: dict[str, Any], event: str) -> CarrierEvent:
        """``dtmf``, ``mark`` or ``error`` as its event."""
        if event == "error":
            body = payload.get("error")
            if not isinstance(body, dict):
                return CarrierNotice("error", "error frame without an error object")
            code, title, detail = body.get("code"), body.get("title"), body.get("detail")
            return CarrierNotice("error", f"{code} {title}: {detail}")
        body = self._object(payload, event)
        if event == "mark":
            return MarkEchoed(self._string(body, "name", "mark"))
        digit = self._string(body, "digit", "dtmf").upper()
        if digit not in _DTMF_DIGITS:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf digit {digit!r}")
        return DtmfReceived(digit)

    def _stop(self, payload: dict[str, Any]) -> list[CarrierEvent]:
        body = payload.get("stop")
        if isinstance(body, dict) and body.get("call_control_id", self.call_id) != self.call_id:
            raise self._error(ProtocolErrorReason.WRONG_STREAM, f"stop for call {body.get('call_control_id')!r}")
        events = self._release_all()
        self.stopped = True
        events.append(StreamStopped())
        return events

    # ------------------------------------------------------------- ordering

    def _place(self, seq: int | None, frame: MediaReceived | None) -> list[CarrierEvent]:
        """Put a numbered message in order (a frame; None: a slot taken by any other message, which is passed on
        at once); return the frames now due."""
        if seq is None:  # unnumbered: nothing to order by, pass it on as it comes
            return [frame] if frame is not None else []
        placed, due = self._order.push(seq, frame)
        if placed is Placed.BEHIND or placed is Placed.DUPLICATE:
            if frame is None:
                return []  # a control message behind the window fills nothing
            if placed is Placed.BEHIND and seq in self._given_up:
                self._given_up.discard(seq)
                self.late_dropped += 1
                return [CarrierNotice("media_dropped", f"sequence_number {seq} came after its gap was given up")]
            self.duplicates_dropped += 1
            return [CarrierNotice("media_dropped", f"duplicate sequence_number {seq}")]
        if placed is Placed.AHEAD and frame is not None:
            self.reordered += 1
        events: list[CarrierEvent] = []
        for item in due:
            if isinstance(item, Missing):
                self._gave_up(item)
            elif item is not None:
                events.append(item)
        return events

    def _gave_up(self, missing: Missing) -> None:
        """Frames that never came in the window; numbers given up in a row are one gap. Those of a short gap are
        remembered (a bounded few), so that one arriving later counts as late, not as a duplicate."""
        if self._last_given_up != missing.sequence - 1:
            self.gaps += 1
        last = missing.sequence + missing.count - 1
        self._last_given_up = last
        if len(self._given_up) > _GIVEN_UP_KEPT:  # forget gaps long past (rare: this runs once per gap)
            self._given_up = {s for s in self._given_up if s > last - _GIVEN_UP_KEPT}
        if missing.count <= _GIVEN_UP_KEPT:
            self._given_up.update(range(missing.sequence, last + 1))

    def _release_all(self) -> list[CarrierEvent]:
        return [frame for frame in self._order.flush() if frame is not None]

    # ---------------------------------------------------------- validation

    def _sequence(self, payload: dict[str, Any]) -> int | None:
        seq = payload.get("sequence_number")
        if seq is None:
            return None
        number = json_number(seq)
        if number is None or number < 0:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"sequence_number {seq!r}")
        return number


    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> str | None:
        """The JSON text message for ``action`` (None for a hang-up: that is a REST call). Only valid once the
        stream has started."""
        if self.stream_id is None:
            raise RuntimeError("TelnyxCodec.send() before start")  # a bug in the caller, not the peer
        if isinstance(action, SendMedia):
            payload = binascii.b2a_base64(action.payload, newline=False).decode("ascii")
            return f'{{"event":"media","stream_id":"{self.stream_id}","media":{{"payload":"{payload}"}}}}'
        if isinstance(action, SendMark):
            return orjson.dumps({"event": "mark", "stream_id": self.stream_id, "mark": {"name": action.name}}).decode()
        if isinstance(action, SendClear):
            return f'{{"event":"clear","stream_id":"{self.stream_id}"}}'
        return None


def _client_state_token(client_state: str) -> str | None:
    """The token in a ``client_state`` that is base64 JSON ``{"token": …}``; None for any other client state."""
    try:
        state = orjson.loads(binascii.a2b_base64(client_state, strict_mode=True))
    except ValueError:  # not base64 (or not even ASCII), or not JSON
        return None
    token = state.get("token") if isinstance(state, dict) else None
    return token if isinstance(token, str) else None


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is Telnyx's: a ``start`` with ``stream_id`` at the top."""
    return start_body(first) is not None and "stream_id" in first
