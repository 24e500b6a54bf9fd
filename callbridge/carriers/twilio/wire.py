"""Twilio Media Streams, bidirectional (``<Connect><Stream>``): the wire codec (telephony-protocols.md §1).

Twilio → us (JSON text): ``connected``, ``start``, then ``media`` / ``dtmf`` /
``mark`` interleaved, finally ``stop``. Numbers may arrive as strings; any
payload length is accepted; unknown fields are ignored. Us → Twilio: only
``media`` (μ-law 8 kHz, base64, no header), ``mark`` and ``clear``, each with
the stream's ``streamSid`` (anything else draws warning 31951).

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

__all__ = ["ACCOUNT_PARAM", "DEFAULT_MAX_MESSAGE_BYTES", "MULAW_8K", "TwilioCodec", "recognises"]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
"""A 20 ms frame is about 300 bytes; even a second of audio in one message stays far below this."""

ACCOUNT_PARAM: Final = "callbridge_account"
"""The ``<Parameter>`` our answer's ``<Stream>`` carries the webhook's ``AccountSid`` in: where a Twilio-protocol
sender's ``start`` leaves ``accountSid`` empty, the stream is still labelled and hung up by it."""
_DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")
_SID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Twilio SIDs are two letters and 32 hex digits; this also keeps them safe to splice into JSON."""


MULAW_8K: Final = {("audio/x-mulaw", 8000): AudioEncoding.PCMU}
"""Twilio's only media format."""


TWILIO_PROFILE: Final = CarrierProfile(joins_frames=True)
"""Outbound media "can be of any size", queued and played in order; marks echoed as played and on clear."""


class TwilioCodec(JsonCodec):
    """One Twilio media stream, message by message. A Twilio-compatible carrier is this codec with
    its own ``provider`` name and the media formats it adds."""

    stream_key = "streamSid"
    profile: Final = TWILIO_PROFILE

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        provider: str = "twilio",
        formats: dict[tuple[str, int], AudioEncoding] = MULAW_8K,
    ) -> None:
        self.provider = provider
        self.formats = formats
        self.max_message_bytes = max_message_bytes
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.stopped = False

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
        if event in ("dtmf", "mark", "stop"):
            self._check_stream(payload, event)
            if event == "stop":
                self.stopped = True
                return [StreamStopped()]
            body = self._object(payload, event)
            if event == "mark":
                return [MarkEchoed(self._string(body, "name", "mark"))]
            digit = self._string(body, "digit", "dtmf")
            if digit not in _DTMF_DIGITS:
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"dtmf digit {digit!r}")
            return [DtmfReceived(digit)]
        return self._unknown(event)

    def _start(self, payload: dict[str, Any]) -> StreamStarted:
        if self.stream_id is not None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second start")
        start = self._object(payload, "start")
        stream_id = self._string(start, "streamSid", "start")
        call_id = self._string(start, "callSid", "start")
        if payload.get("streamSid", stream_id) != stream_id:
            raise self._error(ProtocolErrorReason.WRONG_STREAM, "start.streamSid differs from streamSid")
        account = start.get("accountSid") or _parameter_account(start)
        fmt = start.get("mediaFormat", {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1})
        if not isinstance(fmt, dict):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "start.mediaFormat is not an object")
        name, rate, channels = fmt.get("encoding"), json_number(fmt.get("sampleRate", 8000)), json_number(fmt.get("channels", 1))
        encoding = self.formats.get((name, rate)) if isinstance(name, str) and rate is not None else None
        if encoding is None or rate is None or channels != 1:
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"mediaFormat {fmt!r}")
        params = start.get("customParameters") or {}
        if not isinstance(params, dict):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "start.customParameters is not an object")
        for name, sid in (("streamSid", stream_id), ("callSid", call_id)):
            if not _SID.fullmatch(sid):
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"start.{name} {sid!r}")
        self.stream_id, self.call_id = stream_id, call_id
        return StreamStarted(
            call_id=call_id,
            stream_id=stream_id,
            account_id=account if isinstance(account, str) else None,
            encoding=encoding,
            rate_hz=rate,
            custom_parameters={str(k): str(v) for k, v in params.items()},
        )

    def _media(self, payload: dict[str, Any]) -> MediaReceived:
        media = payload.get("media")
        if not isinstance(media, dict):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "media without a media object")
        encoded = media.get("payload")
        audio = self._audio(encoded)
        timestamp = media.get("timestamp")
        timestamp_ms = json_number(timestamp) if timestamp is not None else None
        if timestamp is not None and (timestamp_ms is None or timestamp_ms < 0):
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.timestamp {timestamp!r}")
        return MediaReceived(audio, timestamp_ms)


    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> str | None:
        """The JSON text message for ``action`` (None for a hang-up: that is a REST call). Only valid once the
        stream has started."""
        if self.stream_id is None:
            raise RuntimeError("TwilioCodec.send() before start")  # a bug in the caller, not the peer
        if isinstance(action, SendMedia):
            payload = binascii.b2a_base64(action.payload, newline=False).decode("ascii")
            return f'{{"event":"media","streamSid":"{self.stream_id}","media":{{"payload":"{payload}"}}}}'
        if isinstance(action, SendMark):
            return orjson.dumps({"event": "mark", "streamSid": self.stream_id, "mark": {"name": action.name}}).decode()
        if isinstance(action, SendClear):
            return f'{{"event":"clear","streamSid":"{self.stream_id}"}}'
        return None


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is Twilio's: a ``start`` with ``streamSid`` and an account
    ``AC…`` (a dialect's project is a UUID) — its ``accountSid``, or where a sender leaves that empty, the one our
    answer put in its ``<Parameter>``s (``ACCOUNT_PARAM``)."""
    start = start_body(first)
    if start is None or not ("streamSid" in first or "streamSid" in start):
        return False
    account = start.get("accountSid") or _parameter_account(start)
    return isinstance(account, str) and account.startswith("AC")


def _parameter_account(start: Mapping[str, Any]) -> object:
    """The account our answer webhook saw, from the ``start``'s custom parameters (None: not there)."""
    params = start.get("customParameters")
    return params.get(ACCOUNT_PARAM) if isinstance(params, dict) else None
