"""Vonage Voice API websockets: the wire codec (telephony-protocols.md §2).

Vonage → us: one text message first, ``{"event":"websocket:connected",
"content-type":"audio/l16;rate=16000", …}`` with the NCCO endpoint's
``headers`` flattened into it (ours: ``call_uuid`` and the stream ``token``);
then binary frames of signed 16-bit little-endian PCM, 20 ms each, and text
events interleaved: ``websocket:dtmf``, ``websocket:notify`` (a ``notify``
of ours reached in playback), ``websocket:cleared`` (our ``clear`` done).
Vonage says to ignore JSON events one does not know; there is no stop
message, the socket just closes.

Us → Vonage: binary frames of exactly 20 ms at the announced rate (640 bytes
at 16 kHz, 320 at 8 kHz; ``CallSession`` frames and pads them),
``{"action":"notify","payload":{"name":…}}`` and ``{"action":"clear"}``.

Validated once, here: a message that breaks the protocol raises
``RemoteProtocolError`` with its reason, and the call ends.
"""

from __future__ import annotations

import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

import orjson

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierNotice,
    CarrierProfile,
    DtmfReceived,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamStarted,
    UnknownCarrierEvent,
)
from callbridge.carriers.json_wire import parse_object
from callbridge.codecs import AudioEncoding, frame_bytes

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "SUPPORTED_RATES", "VONAGE_PROFILE", "VonageCodec", "content_type", "recognises"]

DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024
"""Text events are a few hundred bytes (the connected message carries our headers, under 512 bytes)."""

MAX_MEDIA_MS: Final = 200
"""Vonage sends exactly 20 ms per binary frame; we accept any whole number of samples up to this."""

SUPPORTED_RATES: Final = frozenset({8000, 16000, 24000})
"""8 and 16 kHz are documented; 24 kHz is used by some integrations (UNSURE, §2.1): decoded if announced."""

VONAGE_PROFILE: Final = CarrierProfile(frame_ms=20, uses_marks=True, marks_echoed_on_clear=False)
"""Exact 20 ms frames; ``notify`` is the playback marker. Whether a ``clear`` makes Vonage echo the pending
notifies is UNSURE (§2.3, §8.4): we treat ``websocket:cleared`` as "every pending notify is void", and the
codec drops any late echo of a voided notify itself, so either behaviour leaves the ledger right."""

_DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
_CALL_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""Vonage uuids are 36-character hex UUIDs; this also keeps ids safe to log and splice into URLs."""
_CONTENT_TYPE: Final = re.compile(r"\s*audio/l16\s*;\s*rate\s*=\s*(\d{4,6})\s*", re.IGNORECASE)
_VOIDED_KEEP: Final = 256
"""How many voided notify names to remember (their late echoes, if Vonage sends any, are dropped)."""
_RESERVED_KEYS: Final = frozenset({"event", "content-type"})


def content_type(rate_hz: int) -> str:
    """The ``content-type`` of the NCCO websocket endpoint for ``rate_hz``."""
    return f"audio/l16;rate={rate_hz}"


class VonageCodec:
    """One Vonage websocket, message by message."""

    provider: Final = "vonage"
    profile: Final = VONAGE_PROFILE

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.parameters: dict[str, str] = {}
        """The endpoint headers ``websocket:connected`` carried (our ``call_uuid`` and ``token``)."""
        self.rate_hz: int | None = None
        self.frame_bytes = 0
        self._max_media_bytes = 0
        self._pending_notifies: set[str] = set()
        self._voided_notifies: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes | bytearray | memoryview) -> list[CarrierEvent]:
        """Parse one websocket message into carrier events. Raises ``RemoteProtocolError``."""
        if isinstance(message, bytes | bytearray | memoryview):  # the hot path first: 20 ms of audio
            return self._media(message)
        payload = parse_object(message, self.max_message_bytes, self._error)
        event = payload.get("event")
        if event is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "message without an event")
        if not isinstance(event, str):
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"event {event!r}")
        if event == "websocket:connected":
            return [self._connected(payload)]
        self._check_open(event)
        if event == "websocket:dtmf":
            return [self._dtmf(payload)]
        if event == "websocket:notify":
            return self._notify(payload)
        if event == "websocket:cleared":
            self._void_pending()
            return [PlaybackCleared()]
        if event.startswith("websocket:"):
            # Vonage: "switch on event, ignore unknown ones" — a new event of Vonage's own is counted, not fatal.
            return [UnknownCarrierEvent(event[:64])]
        # Not Vonage's namespace at all (another carrier's "media", a typo): not a Vonage peer.
        raise self._error(ProtocolErrorReason.UNKNOWN_EVENT, f"event {event[:64]!r}")

    def _media(self, message: bytes | bytearray | memoryview) -> list[CarrierEvent]:
        size = len(message)
        if self.stream_id is None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{size}-byte audio frame before websocket:connected")
        if size > self._max_media_bytes:
            raise self._error(ProtocolErrorReason.OVERSIZED, f"{size}-byte audio frame > {self._max_media_bytes}")
        if size % 2:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"{size}-byte audio frame: not whole 16-bit samples")
        if not size:
            return []
        return [MediaReceived(bytes(message), None)]  # Vonage frames carry no timestamp

    def _connected(self, payload: dict[str, Any]) -> StreamStarted:
        if self.stream_id is not None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second websocket:connected")
        announced = payload.get("content-type")
        if announced is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "websocket:connected without content-type")
        match = _CONTENT_TYPE.fullmatch(announced) if isinstance(announced, str) else None
        rate = int(match.group(1)) if match else None
        if rate not in SUPPORTED_RATES:
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"content-type {str(announced)[:64]!r}")
        assert rate is not None
        call_id = payload.get("call_uuid")
        if call_id is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "websocket:connected without the call_uuid header")
        if not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"call_uuid {str(call_id)[:64]!r}")
        parameters = {key: _text(value) for key, value in payload.items() if key not in _RESERVED_KEYS}
        # Vonage gives the websocket no id of its own in this message: one per socket, for the logs.
        self.stream_id = f"vonage-ws-{secrets.token_hex(8)}"
        self.call_id, self.rate_hz, self.parameters = call_id, rate, parameters
        self.frame_bytes = frame_bytes(rate, AudioEncoding.L16)
        self._max_media_bytes = rate * MAX_MEDIA_MS // 1000 * 2
        return StreamStarted(
            call_id=call_id,
            stream_id=self.stream_id,
            account_id=None,
            encoding=AudioEncoding.L16,
            rate_hz=rate,
            custom_parameters=dict(parameters),
        )

    def _dtmf(self, payload: dict[str, Any]) -> DtmfReceived:
        digit = payload.get("digit")
        nested = payload.get("dtmf")
        if digit is None and isinstance(nested, dict):  # some bridges see {"dtmf":{"digit":…}}: accepted
            digit = nested.get("digit")
        if digit is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "websocket:dtmf without a digit")
        if isinstance(digit, int) and not isinstance(digit, bool) and 0 <= digit <= 9:
            digit = str(digit)
        if not isinstance(digit, str) or digit.upper() not in _DTMF_DIGITS or len(digit) != 1:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf digit {str(digit)[:16]!r}")
        return DtmfReceived(digit.upper())

    def _notify(self, payload: dict[str, Any]) -> list[CarrierEvent]:
        body = payload.get("payload")
        if not isinstance(body, dict):
            reason = ProtocolErrorReason.MISSING_FIELD if body is None else ProtocolErrorReason.BAD_FIELD
            raise self._error(reason, "websocket:notify without a payload object")
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "websocket:notify payload without a name")
        if name in self._voided_notifies:
            del self._voided_notifies[name]
            return [CarrierNotice("websocket:notify", f"late echo of cleared notify {name[:64]!r}")]
        self._pending_notifies.discard(name)
        return [MarkEchoed(name)]

    def _void_pending(self) -> None:
        for name in self._pending_notifies:
            self._voided_notifies[name] = None
        self._pending_notifies.clear()
        while len(self._voided_notifies) > _VOIDED_KEEP:
            self._voided_notifies.popitem(last=False)

    def _check_open(self, event: str) -> None:
        if self.stream_id is None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{event[:64]} before websocket:connected")

    def _error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=self.provider, stream_id=self.stream_id, call_id=self.call_id)

    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> str | bytes | None:
        """The message for ``action``: a binary frame of exactly 20 ms (a short one is padded with silence),
        or a JSON text action; None for a hang-up (a REST call). Only valid once the stream has started."""
        if self.stream_id is None:
            raise RuntimeError("VonageCodec.send() before websocket:connected")  # a bug in the caller, not the peer
        if isinstance(action, SendMedia):
            frame = action.payload
            if len(frame) == self.frame_bytes:
                return frame
            if len(frame) < self.frame_bytes:
                return bytes(frame) + bytes(self.frame_bytes - len(frame))
            raise ValueError(f"{len(frame)}-byte frame for Vonage, which takes exactly {self.frame_bytes}")
        if isinstance(action, SendMark):
            self._pending_notifies.add(action.name)
            return orjson.dumps({"action": "notify", "payload": {"name": action.name}}).decode()
        if isinstance(action, SendClear):
            # Void now, not only at websocket:cleared: an echo racing the clear is not "played".
            self._void_pending()
            return '{"action":"clear"}'
        return None


def _text(value: Any) -> str:
    """A flattened header as text: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is Vonage's: ``websocket:connected``."""
    return first.get("event") == "websocket:connected"
