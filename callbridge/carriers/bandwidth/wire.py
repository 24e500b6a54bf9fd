"""Bandwidth Programmable Voice media streams, bidirectional (``<StartStream mode="bidirectional">``): the wire
codec (the facts, and where they come from: ``docs/carriers/bandwidth.md``).

Bandwidth → us (JSON text, ``eventType``): ``start`` (``metadata``: ``accountId``, ``callId``, ``streamId``,
``streamName``, ``tracks`` with each track's ``mediaFormat`` — ``audio/PCMU`` at 8000 Hz; ``streamParams``: our
``<StreamParam>`` pairs), then ``media`` (``track``, ``sequenceNumber``, ``payload``: base64 μ-law, at the top
level; no stream id), then ``stop`` (``metadata`` again) when the stream is stopped or the call ends. No DTMF on
the socket (digits come by the ``<StartGather>`` webhook), no playback markers.

Us → Bandwidth: ``playAudio`` (``media``: ``contentType`` ``audio/pcmu`` and the base64 ``payload``) and
``clear`` (drop what is queued). Bandwidth echoes nothing we send: the call logic models its playback by the
clock (profile ``uses_marks=False``), and a ``clear`` empties its buffer (``flushes``).

Validated once, here: a message that breaks the protocol raises ``RemoteProtocolError`` with its reason, and the
call ends.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping
from typing import Any, Final

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    MediaReceived,
    ProtocolErrorReason,
    SendClear,
    SendMedia,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.json_wire import JsonCodec, json_number
from callbridge.codecs import AudioEncoding

__all__ = ["BANDWIDTH_PROFILE", "DEFAULT_MAX_MESSAGE_BYTES", "PLAYBACK_RATES", "TOKEN_PARAM", "BandwidthCodec", "playback_content_type", "recognises"]

DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024
BANDWIDTH_PROFILE: Final = CarrierProfile(frame_ms=20, uses_marks=False, marks_echoed_on_clear=False)
"""20 ms frames, no markers (none exist on this wire), ``clear`` flushes, REST hang-up."""
TOKEN_PARAM: Final = "token"
"""The ``<StreamParam>`` that carries the stream's single-use token (``streamParams.token`` in ``start``)."""

_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""Call ids look like ``c-15ac29a2-1331029c-…``; this also keeps them safe to log and splice."""
_CLEAR: Final = '{"eventType":"clear"}'
PLAYBACK_RATES: Final = frozenset({8000, 16000, 24000})
"""The rates of 16-bit PCM ``playAudio`` takes (besides μ-law at 8 kHz)."""


def playback_content_type(pcm_rate_hz: int | None) -> str:
    """``playAudio``'s ``contentType``: μ-law (None), or little-endian signed 16-bit PCM at ``pcm_rate_hz``."""
    if pcm_rate_hz is None:
        return "audio/pcmu"
    return f"audio/pcm;rate={pcm_rate_hz};channels=1;bit-depth=16;endian=little;encoding=signed"


class BandwidthCodec(JsonCodec):
    """One Bandwidth media stream, message by message."""

    provider = "bandwidth"
    stream_key = "streamId"
    profile: Final = BANDWIDTH_PROFILE

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, pcm_out_rate_hz: int | None = None) -> None:
        """``pcm_out_rate_hz``: send the agent's audio as 16-bit PCM at this rate (8, 16 or 24 kHz: wideband the
        caller's leg may carry), not μ-law at 8 kHz; the caller's audio still comes as μ-law."""
        if pcm_out_rate_hz is not None and pcm_out_rate_hz not in PLAYBACK_RATES:
            raise ValueError(f"pcm_out_rate_hz must be one of {sorted(PLAYBACK_RATES)}")
        self.max_message_bytes = max_message_bytes
        self.pcm_out_rate_hz = pcm_out_rate_hz
        self._media_head = '{"eventType":"playAudio","media":{"contentType":"%s","payload":"' % playback_content_type(pcm_out_rate_hz)
        self.stream_id: str | None = None
        self.call_id: str | None = None
        self.stopped = False
        self._last_sequence = -1

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message into carrier events. Raises ``RemoteProtocolError``."""
        payload = self._parse(message)
        event = payload.get("eventType")
        if event == "media":  # the hot path first
            self._live(event)
            return self._media(payload)
        if event == "start":
            return [self._start(payload)]
        if event == "stop":
            self._live(event)
            self._same_stream(payload, event)
            self.stopped = True
            return [StreamStopped()]
        return self._unknown(event)

    def _live(self, event: str) -> None:
        if self.stream_id is None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{event} before start")
        if self.stopped:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, f"{event} after stop")

    def _same_stream(self, payload: dict[str, Any], event: str) -> None:
        """A ``stop`` names its stream in ``metadata`` (may be left out); another stream's is an error."""
        metadata = payload.get("metadata")
        stream_id = metadata.get("streamId") if isinstance(metadata, dict) else None
        if stream_id is not None and stream_id != self.stream_id:
            raise self._error(ProtocolErrorReason.WRONG_STREAM, f"{event} for stream {stream_id!r}")

    def _start(self, payload: dict[str, Any]) -> StreamStarted:
        if self.stream_id is not None:
            raise self._error(ProtocolErrorReason.OUT_OF_ORDER, "a second start")
        metadata = self._object(payload, "metadata")
        stream_id = self._string(metadata, "streamId", "metadata")
        call_id = self._string(metadata, "callId", "metadata")
        for name, value in (("streamId", stream_id), ("callId", call_id)):
            if not _ID.fullmatch(value):
                raise self._error(ProtocolErrorReason.BAD_FIELD, f"metadata.{name} {value!r}")
        self._inbound_format(metadata.get("tracks"))
        params = payload.get("streamParams", {})
        if not isinstance(params, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
            raise self._error(ProtocolErrorReason.BAD_FIELD, "streamParams is not an object of strings")
        account = metadata.get("accountId")
        self.stream_id, self.call_id = stream_id, call_id
        return StreamStarted(
            call_id=call_id,
            stream_id=stream_id,
            account_id=account if isinstance(account, str) and account else None,
            encoding=AudioEncoding.PCMU,
            rate_hz=8000,
            custom_parameters=dict(params),
            out_encoding=AudioEncoding.L16 if self.pcm_out_rate_hz else None,
            out_rate_hz=self.pcm_out_rate_hz,
        )

    def _inbound_format(self, tracks: object) -> None:
        """The ``inbound`` track must be there, in the one format Bandwidth streams: ``audio/PCMU`` at 8 kHz."""
        if not isinstance(tracks, list):
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "metadata.tracks missing")
        inbound = next((t for t in tracks if isinstance(t, dict) and t.get("name") == "inbound"), None)
        if inbound is None:
            raise self._error(ProtocolErrorReason.MISSING_FIELD, "no inbound track")
        fmt = inbound.get("mediaFormat")
        encoding = fmt.get("encoding") if isinstance(fmt, dict) else None
        rate = json_number(fmt.get("sampleRate")) if isinstance(fmt, dict) else None
        if not isinstance(encoding, str) or encoding.lower() != "audio/pcmu" or rate != 8000:
            raise self._error(ProtocolErrorReason.UNSUPPORTED_FORMAT, f"inbound mediaFormat {fmt!r}")

    def _media(self, payload: dict[str, Any]) -> list[CarrierEvent]:
        self._last_sequence = self._media_sequence(payload.get("sequenceNumber"), self._last_sequence)
        encoded = payload.get("payload")
        audio = self._audio(encoded)
        track = payload.get("track", "inbound")
        if track != "inbound":
            if track == "outbound":
                return []  # the call's other side (tracks="both"); never asked for
            raise self._error(ProtocolErrorReason.BAD_FIELD, f"media.track {str(track)[:32]!r}")
        return [MediaReceived(audio)]

    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> str | None:
        """The JSON text message for ``action`` (None for a marker, which this wire has not, and for a hang-up,
        a REST call). Only valid once the stream has started."""
        if self.stream_id is None:
            raise RuntimeError("BandwidthCodec.send() before start")  # a bug in the caller, not the peer
        if isinstance(action, SendMedia):
            return self._media_head + binascii.b2a_base64(action.payload, newline=False).decode("ascii") + '"}}'
        if isinstance(action, SendClear):
            return _CLEAR
        return None


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is Bandwidth's: ``eventType`` ``start`` with ``metadata``."""
    return first.get("eventType") == "start" and isinstance(first.get("metadata"), dict)
