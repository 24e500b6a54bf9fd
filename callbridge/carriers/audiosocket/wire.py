"""Asterisk AudioSocket over TCP: the wire codec (telephony-protocols.md §4.1).

Asterisk is the TCP client and we are the server. The stream is a sequence of
TLV frames: a 3-byte header (kind, payload length as a big-endian uint16), then
the payload. ``receive_message`` takes arbitrary chunks of that byte stream (a
frame may be split across chunks, one chunk may hold several frames) and parses
them incrementally.

Asterisk → us:

- ``0x01`` uuid: 16 raw bytes, always the first frame. It is the UUID the
  dialplan passed to ``AudioSocket(<uuid>,host:port)``, hence the call id: a
  dialplan that loops back to ``AudioSocket()`` with the same UUID after a drop
  resumes the call (§7). Formatted as the canonical lower-case UUID string.
- ``0x10``–``0x18`` audio: signed 16-bit little-endian PCM at 8, 12, 16, 24,
  32, 44.1, 48, 96 or 192 kHz (current Asterisk numbering; an older header
  revision called ``0x11`` slin16 — we follow current master, §8.7). The app
  always sends ``0x10`` (8 kHz); the channel driver sends the kind of its codec.
- ``0x03`` DTMF: one ASCII byte.
- ``0x00`` hangup and ``0xff`` error (an optional code; ``0x01`` is "caller
  hung up"): current Asterisk sends neither — it closes the socket — but the
  protocol defines them, so they are handled.
- ``0x02`` "silence" exists only in the original CyCoreSystems protocol text and
  carries no audio: accepted and ignored (lenient; Asterisk never sends it).

The stream's audio format is not announced: the first audio frame fixes it.
So ``StreamConnected`` comes with the uuid frame and ``StreamStarted`` (with
the rate of that first frame's kind) with the first audio frame; a DTMF digit
pressed before it is held and delivered right after ``StreamStarted``. A change
of audio kind mid-stream is ``UNSUPPORTED_FORMAT``: the call's format cannot
change. AudioSocket carries no media timestamps (``timestamp_ms`` is None) and
no token: connections are admitted by source address (the listener).

Us → Asterisk: only audio frames of the stream's kind and hangup (``00 00 00``):
Asterisk ends the session on any other kind, and on an empty audio frame
("Invalid message length"), so neither is ever produced. There is no flush:
Asterisk plays what it gets at once, so the bridge paces and holds the queue,
one frame ahead (``PROFILE.lead_ms``); a barge-in simply stops sending.

Asterisk echoes nothing, so there are no playback markers (``uses_marks=False``):
the playout ledger reports what the caller heard from its own model, and as
nothing is ever flushed, a barge-in counts all that was sent as heard.
"""

from __future__ import annotations

import uuid
from typing import Final

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierNotice,
    CarrierProfile,
    DtmfReceived,
    HangUp,
    HangUpMode,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
    UnknownCarrierEvent,
)
from callbridge.codecs import AudioEncoding

__all__ = [
    "AUDIO_KINDS",
    "DEFAULT_MAX_BUFFER_BYTES",
    "HANGUP_FRAME",
    "PROFILE",
    "PROVIDER",
    "AudioSocketCodec",
    "Kind",
    "first_frame_bytes",
    "frame",
    "peek_call_id",
]

PROVIDER: Final = "audiosocket"


class Kind:
    """Frame kinds (``res_audiosocket.h``)."""

    HANGUP: Final = 0x00
    UUID: Final = 0x01
    SILENCE: Final = 0x02
    DTMF: Final = 0x03
    SLIN: Final = 0x10
    ERROR: Final = 0xFF


AUDIO_KINDS: Final = {
    0x10: 8000,
    0x11: 12000,
    0x12: 16000,
    0x13: 24000,
    0x14: 32000,
    0x15: 44100,
    0x16: 48000,
    0x17: 96000,
    0x18: 192000,
}
"""Audio kind → sample rate (signed 16-bit little-endian mono)."""

HEADER_BYTES: Final = 3
MAX_PAYLOAD_BYTES: Final = 0xFFFF
HANGUP_FRAME: Final = b"\x00\x00\x00"

_UUID_BYTES: Final = 16
_MAX_CONTROL_PAYLOAD: Final = 256
"""Hangup, error and silence frames carry at most a code; anything longer is not AudioSocket."""
_MAX_PENDING_DTMF: Final = 16
_DTMF_DIGITS: Final = frozenset(b"0123456789*#ABCD")
_HANGUP_ERROR_CODES: Final = frozenset({0x01})
"""Error codes that mean the call is over (``0x01``: caller hung up)."""
_ERROR_NAMES: Final = {0x01: "caller hung up", 0x02: "frame forwarding error", 0x04: "memory error"}

DEFAULT_MAX_BUFFER_BYTES: Final = 256 * 1024
"""Bytes one ``receive_message`` may leave buffered together with its chunk (a frame is at most 65538)."""

PROFILE: Final = CarrierProfile(
    frame_ms=20,
    uses_marks=False,
    marks_echoed_on_clear=False,
    lead_ms=60,
    hang_up=HangUpMode.IN_BAND,
    flushes=False,
    reconnect_window_ms=3000,
)
"""Asterisk neither queues nor flushes: whatever was sent will be heard (a barge-in's heard position is what was
sent). The lead is three frames: a pacer woken late sends two at once and catches up, where a one-frame lead
would turn every late wake-up into a gap and let the audio drift behind real time; a barge-in then leaves at
most 60 ms playing. No markers (the ledger reports heard positions itself); hang-up is in band. Asterisk
never says the caller hung up (it closes the socket), and a dialplan that loops back into ``AudioSocket()``
reconnects within milliseconds: a connection not back in 3 s is a call that ended."""


def frame(kind: int, payload: bytes = b"") -> bytes:
    """One AudioSocket frame (header and payload in one buffer: Asterisk gives the payload only a 5 ms poll
    after the header, so the two must go out in one write)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"{len(payload)}-byte payload > {MAX_PAYLOAD_BYTES}")
    return bytes((kind,)) + len(payload).to_bytes(2, "big") + payload


def first_frame_bytes(data: bytes | bytearray) -> int | None:
    """How many bytes the listener must read before it can see the call id: the whole uuid frame when the data
    starts with a well-formed uuid header, otherwise what it has (the codec rejects it); None: not a header yet."""
    if len(data) < HEADER_BYTES:
        return None
    if data[0] == Kind.UUID and int.from_bytes(data[1:3], "big") == _UUID_BYTES:
        return HEADER_BYTES + _UUID_BYTES
    return len(data)


def peek_call_id(data: bytes | bytearray) -> str | None:
    """The call id of a stream that starts with ``data``, if it starts with a complete, well-formed uuid frame."""
    if first_frame_bytes(data) != HEADER_BYTES + _UUID_BYTES or len(data) < HEADER_BYTES + _UUID_BYTES:
        return None
    return str(uuid.UUID(bytes=bytes(data[HEADER_BYTES : HEADER_BYTES + _UUID_BYTES])))


class AudioSocketCodec:
    """One AudioSocket connection, chunk by chunk. ``connection`` numbers the connections of this process:
    the stream id is ``<uuid>#<connection>`` (the call id is the uuid, the same on every reconnect)."""

    profile: Final = PROFILE
    provider: Final = PROVIDER

    def __init__(self, connection: int = 1, *, max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> None:
        self.connection = connection
        self.max_buffer_bytes = max_buffer_bytes
        self.call_id: str | None = None
        self.stream_id: str | None = None
        self.audio_kind: int | None = None
        self.rate_hz: int | None = None
        self.stopped = False
        self.frames_received = 0
        self._rest = bytearray()
        self._need = HEADER_BYTES
        """Bytes the incomplete frame in ``_rest`` needs before it can be parsed."""
        self._pending_dtmf: list[str] = []

    @property
    def started(self) -> bool:
        """Whether the first audio frame (hence ``StreamStarted``) has come."""
        return self.audio_kind is not None

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one chunk of the byte stream into carrier events. Raises ``RemoteProtocolError``."""
        if isinstance(message, str):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "text on a binary byte stream")
        rest = self._rest
        if len(rest) + len(message) > self.max_buffer_bytes:
            raise self._error(ProtocolErrorReason.OVERSIZED, f"{len(rest) + len(message)} bytes buffered > {self.max_buffer_bytes}")
        if rest:
            rest += message  # amortised: a frame trickling in byte by byte is not copied over and over
            if len(rest) < self._need:
                return []
            data, self._rest = bytes(rest), bytearray()
        else:
            data = bytes(message)
        events: list[CarrierEvent] = []
        pos, end = 0, len(data)
        self._need = HEADER_BYTES
        while end - pos >= HEADER_BYTES:
            kind, length = data[pos], (data[pos + 1] << 8) | data[pos + 2]
            self._check_header(kind, length)  # garbage fails at its header, before its "payload" arrives
            if end - pos - HEADER_BYTES < length:
                self._need = HEADER_BYTES + length
                break
            payload = data[pos + HEADER_BYTES : pos + HEADER_BYTES + length]
            pos += HEADER_BYTES + length
            self.frames_received += 1
            self._frame(kind, payload, events)
        if pos < end:
            self._rest = bytearray(data[pos:])
        return events

    def _check_header(self, kind: int, length: int) -> None:
        if self.stopped:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"kind 0x{kind:02x} after hangup")
        if kind == Kind.UUID:
            if self.call_id is not None:
                raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second uuid frame")
            if length != _UUID_BYTES:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"{length}-byte uuid")
            return
        if kind in AUDIO_KINDS:
            if self.audio_kind is not None and kind != self.audio_kind:
                raise self._error(
                    ProtocolErrorReason.UNSUPPORTED_FORMAT,
                    f"audio kind 0x{kind:02x} ({AUDIO_KINDS[kind]} Hz) in a 0x{self.audio_kind:02x} stream",
                )
            if length % 2:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"{length}-byte PCM16 frame")
        elif kind == Kind.DTMF:
            if length != 1:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"{length}-byte dtmf")
        elif kind in (Kind.HANGUP, Kind.ERROR, Kind.SILENCE):
            if length > _MAX_CONTROL_PAYLOAD:
                raise self._error(ProtocolErrorReason.OVERSIZED, f"{length}-byte payload of kind 0x{kind:02x}")
        elif self.call_id is None or length > _MAX_CONTROL_PAYLOAD:
            # not a peer's first frame, or longer than any control frame: garbage (an HTTP request, a port scan),
            # or a stream out of step — skipping that "payload" would swallow the call's audio
            raise self._error(ProtocolErrorReason.UNKNOWN_EVENT, f"kind 0x{kind:02x}, {length} bytes")
        # else a kind Asterisk added since: its payload is skipped (``_frame``), the call goes on
        if self.call_id is None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"kind 0x{kind:02x} before the uuid frame")

    def _frame(self, kind: int, payload: bytes, events: list[CarrierEvent]) -> None:
        if kind in AUDIO_KINDS:  # the hot path first
            if not payload:
                return  # nothing to play (lenient: Asterisk itself refuses empty audio frames)
            if self.audio_kind is None:
                self._start(kind, events)
            events.append(MediaReceived(payload, None))
        elif kind == Kind.UUID:
            self.call_id = str(uuid.UUID(bytes=payload))
            self.stream_id = f"{self.call_id}#{self.connection}"
            events.append(StreamConnected())
        elif kind == Kind.DTMF:
            # a-d taken as A-D, in ASCII: str.upper() maps 0xdf "ß" to "SS", which is not one digit
            byte = payload[0] - 0x20 if 0x61 <= payload[0] <= 0x64 else payload[0]
            if byte not in _DTMF_DIGITS:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf digit {payload!r}")
            digit = chr(byte)
            if self.started:
                events.append(DtmfReceived(digit))
            elif len(self._pending_dtmf) < _MAX_PENDING_DTMF:
                self._pending_dtmf.append(digit)
            else:
                raise self._error(ProtocolErrorReason.FLOOD, f"over {_MAX_PENDING_DTMF} digits before any audio")
        elif kind == Kind.HANGUP:
            self._stop("hangup", events)
        elif kind == Kind.ERROR:
            code = payload[0] if payload else None
            detail = "no code" if code is None else f"code 0x{code:02x} ({_ERROR_NAMES.get(code, 'application error')})"
            if len(payload) > 1:
                detail += f" {payload[1:].hex()}"
            if code in _HANGUP_ERROR_CODES:
                self._stop(f"error {detail}", events)
            else:
                events.append(CarrierNotice("error", detail))
        elif kind != Kind.SILENCE:  # a kind Asterisk added since (``_check_header``); silence: nothing to do
            events.append(UnknownCarrierEvent(f"0x{kind:02x}"))

    def _start(self, kind: int, events: list[CarrierEvent]) -> None:
        assert self.call_id is not None and self.stream_id is not None
        self.audio_kind, self.rate_hz = kind, AUDIO_KINDS[kind]
        events.append(StreamStarted(self.call_id, self.stream_id, None, AudioEncoding.L16, self.rate_hz, {}))
        events.extend(DtmfReceived(digit) for digit in self._pending_dtmf)
        self._pending_dtmf.clear()

    def _stop(self, what: str, events: list[CarrierEvent]) -> None:
        self.stopped = True
        # before any audio the stream never started: there is nothing to stop, the socket closes next
        events.append(StreamStopped() if self.started else CarrierNotice("hangup_before_audio", what))

    def _error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=PROVIDER, stream_id=self.stream_id, call_id=self.call_id)

    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> bytes | None:
        """The bytes for ``action``: audio frames of the stream's kind, or the hangup frame. Markers and flushes
        send nothing (Asterisk has neither)."""
        if isinstance(action, SendMedia):
            if self.audio_kind is None:
                raise RuntimeError("AudioSocketCodec.send() before the first audio frame")  # a bug in the caller
            payload = action.payload
            if not payload:
                return None  # Asterisk ends the session on an empty audio frame
            if len(payload) <= MAX_PAYLOAD_BYTES:
                return frame(self.audio_kind, payload)
            step = MAX_PAYLOAD_BYTES - 1  # even: whole samples per frame
            return b"".join(frame(self.audio_kind, payload[i : i + step]) for i in range(0, len(payload), step))
        if isinstance(action, HangUp):
            return HANGUP_FRAME
        return None  # markers and flushes: Asterisk has neither
