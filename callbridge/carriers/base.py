"""What every carrier codec speaks: typed carrier events in, typed actions out, one error type.

A provider codec is sans-I/O, like h11's ``Connection``: ``receive_message``
takes one message (a websocket message, text or binary, or a chunk of a TCP
byte stream) and returns the carrier events it carried; ``send`` turns one
action into the message to write (None: nothing to write, e.g. a flush on a
carrier that has no buffer). No sockets, no clocks, no REST.

``profile`` says how the carrier plays audio, which the call logic follows:
frame size, playback markers, whether a flush echoes the pending markers,
the lead it tolerates, and how a call is hung up (REST, in band, or by
closing the socket). It is known once the stream has started.

Errors::

    RemoteProtocolError          the carrier (or whoever holds the socket) sent something invalid
      reason: ProtocolErrorReason
      call_id, stream_id, provider, detail

The call that receives one ends cleanly; nothing else is affected.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final, Protocol

from callbridge.codecs import AudioEncoding

__all__ = [
    "DEFAULT_PROFILE",
    "CarrierAction",
    "CarrierEvent",
    "CarrierNotice",
    "CarrierProfile",
    "DtmfReceived",
    "HangUp",
    "HangUpMode",
    "MarkEchoed",
    "MediaReceived",
    "PlaybackCleared",
    "ProtocolErrorReason",
    "ProviderCodec",
    "RemoteProtocolError",
    "SendClear",
    "SendMark",
    "SendMedia",
    "StreamConnected",
    "StreamStarted",
    "StreamStopped",
    "UnknownCarrierEvent",
]


@dataclass(frozen=True, slots=True)
class StreamConnected:
    """The carrier opened the media connection (a ``connected`` event); nothing about the call yet."""


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """A media stream of a call starts: the ids, the caller's parameters and the audio format."""

    call_id: str
    stream_id: str
    account_id: str | None
    encoding: AudioEncoding
    rate_hz: int
    custom_parameters: dict[str, str] = field(default_factory=dict)
    out_encoding: AudioEncoding | None = None
    """What the agent's audio goes back in, where the carrier takes another format than it sends; None: the same."""
    out_rate_hz: int | None = None
    caller: str | None = None
    """The caller's number (or URI), where the stream's start says it (carriers with no answer webhook)."""
    called: str | None = None


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
class PlaybackCleared:
    """The carrier confirms a flush (a ``cleared`` event)."""


@dataclass(frozen=True, slots=True)
class CarrierNotice:
    """Something the carrier reports that does not change the call (an ``error`` event, an ignored one): logged."""

    name: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class UnknownCarrierEvent:
    """A well-formed message of an event type this codec does not know (one the carrier added since): ignored,
    the call goes on. Fail open on the unknown, closed on the malformed: a known event that is malformed still ends
    the stream. ``event``: the type, as the carrier named it (at most 64 characters)."""

    event: str


@dataclass(frozen=True, slots=True)
class StreamStopped:
    """The carrier ended the stream (the call ended, or the stream was stopped)."""


CarrierEvent = (
    StreamConnected | StreamStarted | MediaReceived | DtmfReceived | MarkEchoed | PlaybackCleared | CarrierNotice
    | UnknownCarrierEvent | StreamStopped
)


@dataclass(frozen=True, slots=True)
class SendMedia:
    """Agent audio in the stream's encoding: one frame, or several joined where the profile says ``joins_frames``."""

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


class HangUpMode(enum.Enum):
    REST = "rest"
    """The driver ends the call through the carrier's REST API (``CarrierServices.hang_up``)."""
    IN_BAND = "in_band"
    """``send(HangUp)`` is the message that ends the call (a hang-up message of a raw TCP protocol); then the socket closes."""
    CLOSE = "close"
    """Closing the media socket ends our part of the call (the carrier's call flow moves on to its next step)."""


@dataclass(frozen=True, slots=True)
class CarrierProfile:
    """How a carrier plays what we send; the call logic follows it (see the module docstring)."""

    frame_ms: int = 20
    """Outbound audio goes in frames of this length (some carriers want 100 ms chunks)."""
    joins_frames: bool = False
    """The carrier plays a media message of any whole number of frames, buffered: the agent's audio may go several
    frames to a message (``audio.media_message_ms``) where it is ahead of real time."""
    uses_marks: bool = True
    """The carrier echoes playback markers (``SendMark``) when playback reaches them."""
    marks_echoed_on_clear: bool = True
    """A flush makes the carrier echo every pending marker (some do, some do not: each profile says)."""
    lead_ms: int | None = None
    """How far ahead of playback the carrier may be fed; None: ``audio.playout_lead_ms``. Carriers with no
    buffer of their own (raw TCP audio, RTP) play what they get at once: their lead is a frame or two."""
    hang_up: HangUpMode = HangUpMode.REST
    flushes: bool = True
    """The carrier can drop audio it holds (``clear`` and equivalents). Without it (raw TCP audio, RTP) a barge-in
    just stops sending, and everything already sent will be heard: the heard position is what was sent."""
    reconnect_window_ms: int | None = None
    """For carriers that never say goodbye on the wire but reconnect at once if they do (a
    dialplan that loops back into the stream): a dropped connection not back within this window is a call that ended, and its engine
    session is closed rather than held for the whole disconnect grace. None: held for the grace."""


DEFAULT_PROFILE: Final = CarrierProfile()


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

    @property
    def profile(self) -> CarrierProfile: ...

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        """Parse one websocket message. Raises ``RemoteProtocolError``."""
        ...

    def send(self, action: CarrierAction) -> str | bytes | None:
        """The message that performs ``action`` on this stream; None when the carrier needs none."""
        ...
