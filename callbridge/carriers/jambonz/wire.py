"""jambonz ``listen`` with bidirectional streaming audio: the wire codec (the facts and their sources:
``docs/carriers/jambonz.md``).

jambonz → us on the ``audio.jambonz.org`` websocket: one JSON text frame first (the call's attributes —
``callSid``, ``from``, ``to``, ``direction``, ``accountSid`` … — with ``sampleRate`` and ``mixType``, and our
``listen`` ``metadata`` merged in), then binary frames of 16-bit little-endian PCM at that rate (mono); with
``passDtmf``, a digit is a text frame ``{"event": "dtmf", "dtmf": "5", "duration": …}``. Nothing says goodbye:
jambonz closes the socket when the call ends, and its call-status webhook tells why.

Us → jambonz: binary frames of L16 at the same rate (``bidirectionalAudio.streaming``), ``{"type":
"killAudio"}`` to drop what is queued, ``{"type": "disconnect"}`` to end the ``listen`` (its ``actionHook`` then
gets the call's next verbs: the bridge answers ``hangup``). No playback markers.

Validated once, here: a message that breaks the protocol raises ``RemoteProtocolError`` with its reason, and the
call ends.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any, Final

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    DtmfReceived,
    HangUp,
    HangUpMode,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMedia,
    StreamStarted,
    UnknownCarrierEvent,
)
from callbridge.carriers.json_wire import json_number, parse_object
from callbridge.codecs import AudioEncoding

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "JAMBONZ_PROFILE", "SUBPROTOCOL", "TOKEN_KEY", "JambonzCodec", "recognises"]

SUBPROTOCOL: Final = "audio.jambonz.org"
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024
MAX_MEDIA_MS: Final = 200
"""jambonz's frames are 20 ms or so; any whole number of samples up to this is taken."""
SUPPORTED_RATES: Final = frozenset({8000, 16000, 24000})
JAMBONZ_PROFILE: Final = CarrierProfile(frame_ms=20, uses_marks=False, marks_echoed_on_clear=False, hang_up=HangUpMode.IN_BAND)
"""20 ms frames, no markers, ``killAudio`` flushes, ``disconnect`` on the socket ends the call's ``listen``."""
TOKEN_KEY: Final = "callbridge_token"
"""The ``listen`` ``metadata`` key that carries the stream's single-use token (it comes back in the first frame)."""

_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
_CLEAR: Final = '{"type":"killAudio"}'
_DISCONNECT: Final = '{"type":"disconnect"}'
_PARAMETERS: Final = ("from", "to", "direction", "callId", "accountSid", "applicationSid", "callerName")
"""Call attributes of the first frame kept as the stream's custom parameters (besides our metadata)."""


class JambonzCodec:
    """One jambonz ``listen`` websocket, message by message."""

    provider: Final = "jambonz"
    profile: Final = JAMBONZ_PROFILE

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.rate_hz: int | None = None
        self._max_media_bytes = 0

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message into carrier events. Raises ``RemoteProtocolError``."""
        if isinstance(message, bytes | bytearray | memoryview):  # the hot path first: 20 ms of audio
            return self._media(message)
        payload = parse_object(message, self.max_message_bytes, self._error)
        if self.stream_id is None:
            return [self._start(payload)]
        event = payload.get("event")
        if event == "dtmf":
            digit = payload.get("dtmf")
            if not isinstance(digit, str) or digit not in _DTMF_DIGITS:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf {str(digit)[:16]!r}")
            return [DtmfReceived(digit)]
        name = event if event is not None else payload.get("type")
        if not isinstance(name, str) or not name:
            raise self._error(ProtocolErrorReason.MISSING_FIELD if name is None else ProtocolErrorReason.BAD_FIELD, "a text frame without an event")
        return [UnknownCarrierEvent(name[:64])]  # e.g. ``playDone``: jambonz's own, counted, the call goes on

    def _start(self, payload: dict[str, Any]) -> StreamStarted:
        call_id = payload.get("callSid")
        if not isinstance(call_id, str) or not call_id:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "the first frame has no callSid")
        if not _ID.fullmatch(call_id):
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"callSid {call_id[:64]!r}")
        rate = json_number(payload.get("sampleRate"))
        if rate not in SUPPORTED_RATES or payload.get("mixType", "mono") != "mono":
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"sampleRate {payload.get('sampleRate')!r}, mixType {payload.get('mixType')!r}")
        assert rate is not None
        parameters = {key: str(payload[key]) for key in _PARAMETERS if isinstance(payload.get(key), str | int)}
        token = payload.get(TOKEN_KEY)
        if isinstance(token, str):
            parameters["token"] = token
        self.call_id = call_id
        self.stream_id = f"{call_id}~{secrets.token_hex(4)}"  # jambonz names no stream: each listen gets its own
        self.rate_hz = rate
        self._max_media_bytes = rate * 2 * MAX_MEDIA_MS // 1000
        account = payload.get("accountSid")
        return StreamStarted(
            call_id=call_id,
            stream_id=self.stream_id,
            account_id=account if isinstance(account, str) and account else None,
            encoding=AudioEncoding.L16,
            rate_hz=rate,
            custom_parameters=parameters,
        )

    def _media(self, message: bytes | bytearray | memoryview) -> list[CarrierEvent]:
        size = len(message)
        if self.stream_id is None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{size}-byte audio frame before the first text frame")
        if size > self._max_media_bytes:
            raise self._error(ProtocolErrorReason.OVERSIZED, f"{size}-byte audio frame > {self._max_media_bytes}")
        if size % 2:
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"{size}-byte audio frame: not whole 16-bit samples")
        return [MediaReceived(bytes(message))] if size else []

    def send(self, action: CarrierAction) -> str | bytes | None:
        """The message for ``action``: a binary L16 frame, ``killAudio``, or ``disconnect`` for a hang-up. Only
        valid once the stream has started."""
        if self.stream_id is None:
            raise RuntimeError("JambonzCodec.send() before the first frame")  # a bug in the caller, not the peer
        if isinstance(action, SendMedia):
            return action.payload
        if isinstance(action, SendClear):
            return _CLEAR
        if isinstance(action, HangUp):
            return _DISCONNECT
        return None

    def _error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=self.provider, stream_id=self.stream_id, call_id=self.call_id)


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is jambonz's: its first text frame, with ``callSid``,
    ``sampleRate`` and ``mixType``."""
    return "callSid" in first and "sampleRate" in first and "mixType" in first
