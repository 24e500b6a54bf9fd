"""What every carrier codec speaks: typed carrier events in, typed actions out, one error type.

A provider codec is sans-I/O, like h11's ``Connection``: ``receive_message``
takes one websocket message (text or binary) and returns the carrier events
it carried; ``send`` turns one action into the message to write. No sockets,
no clocks, no REST. Hanging up is an action the driver performs.

Errors::

    RemoteProtocolError          the carrier (or whoever holds the socket) sent something invalid
      reason: ProtocolErrorReason
      call_id, stream_id, provider, detail

The call that receives one ends cleanly; nothing else is affected.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from callbridge.codecs import AudioEncoding

__all__ = [
    "CarrierAction",
    "CarrierEvent",
    "DtmfReceived",
    "HangUp",
    "MarkEchoed",
    "MediaReceived",
    "ProtocolErrorReason",
    "ProviderCodec",
    "RemoteProtocolError",
    "SendClear",
    "SendMark",
    "SendMedia",
    "StreamConnected",
    "StreamStarted",
    "StreamStopped",
]


@dataclass(frozen=True, slots=True)
class StreamConnected:
    """The carrier opened the media connection (Twilio ``connected``); nothing about the call yet."""


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """A media stream of a call starts: the ids, the caller's parameters and the audio format."""

    call_id: str
    stream_id: str
    account_id: str | None
    encoding: AudioEncoding
    rate_hz: int
    custom_parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MediaReceived:
    """Caller audio in the stream's encoding. ``timestamp_ms`` is stream time (ms since the stream began)."""

    payload: bytes = field(repr=False)
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    digit: str


@dataclass(frozen=True, slots=True)
class MarkEchoed:
    """The carrier reached (or flushed) a playback marker we sent."""

    name: str


@dataclass(frozen=True, slots=True)
class StreamStopped:
    """The carrier ended the stream (the call ended, or the stream was stopped)."""


CarrierEvent = StreamConnected | StreamStarted | MediaReceived | DtmfReceived | MarkEchoed | StreamStopped


@dataclass(frozen=True, slots=True)
class SendMedia:
    """One frame of agent audio, already in the stream's encoding."""

    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class SendMark:
    name: str


@dataclass(frozen=True, slots=True)
class SendClear:
    """Flush: the carrier drops every frame it has not played yet."""


@dataclass(frozen=True, slots=True)
class HangUp:
    """End the phone call (the driver does it through the carrier's REST API)."""

    reason: str


CarrierAction = SendMedia | SendMark | SendClear | HangUp


class ProtocolErrorReason(enum.Enum):
    NOT_JSON = "not_json"
    BINARY_FRAME = "binary_frame"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"
    BAD_BASE64 = "bad_base64"
    WRONG_STREAM = "wrong_stream"
    OUT_OF_ORDER = "out_of_order"
    OVERSIZED = "oversized"
    UNSUPPORTED_FORMAT = "unsupported_format"
    FLOOD = "flood"


class RemoteProtocolError(Exception):
    """The peer sent a message the carrier's protocol does not allow."""

    def __init__(
        self,
        reason: ProtocolErrorReason,
        detail: str,
        *,
        provider: str,
        stream_id: str | None = None,
        call_id: str | None = None,
    ) -> None:
        super().__init__(f"{provider}: {reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.provider = provider
        self.stream_id = stream_id
        self.call_id = call_id


class ProviderCodec(Protocol):
    """The shape every carrier codec has (see the module docstring)."""

    @property
    def provider(self) -> str: ...

    @property
    def stream_id(self) -> str | None: ...

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message. Raises ``RemoteProtocolError``."""
        ...

    def send(self, action: SendMedia | SendMark | SendClear) -> str | bytes:
        """The message that performs ``action`` on this stream."""
        ...
