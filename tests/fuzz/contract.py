"""The contract every carrier codec keeps whatever it is fed, checked message by message: only
``RemoteProtocolError`` escapes, the events make sense in their order, and a started codec can still send."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from callbridge.carriers.base import (
    CarrierEvent,
    CarrierNotice,
    DtmfReceived,
    HangUp,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    ProviderCodec,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
    UnknownCarrierEvent,
)
from callbridge.codecs import AudioEncoding, frame_bytes

__all__ = ["CodecRun"]

_EVENTS = (
    StreamConnected,
    StreamStarted,
    MediaReceived,
    DtmfReceived,
    MarkEchoed,
    PlaybackCleared,
    CarrierNotice,
    UnknownCarrierEvent,
    StreamStopped,
)
_DIGITS = frozenset("0123456789*#ABCD")
_RATES = frozenset({8000, 12000, 16000, 24000, 32000, 44100, 48000, 96000, 192000})


@dataclass
class CodecRun:
    """Feeds one codec and checks each answer against what came before."""

    codec: ProviderCodec
    started: StreamStarted | None = None
    stopped: bool = False
    events: list[CarrierEvent] = field(default_factory=list)
    errors: list[RemoteProtocolError] = field(default_factory=list)

    def feed(self, messages: Iterable[str | bytes]) -> None:
        for message in messages:
            self.receive(message)
        self.check_sends()

    def receive(self, message: str | bytes) -> None:
        try:
            events = self.codec.receive_message(message)
        except RemoteProtocolError as exc:
            assert isinstance(exc.reason, ProtocolErrorReason) and isinstance(exc.detail, str)
            assert isinstance(exc.provider, str)
            self.errors.append(exc)
            return
        assert isinstance(events, list)
        for event in events:
            self.check(event)

    def check(self, event: CarrierEvent) -> None:
        assert isinstance(event, _EVENTS), event
        self.events.append(event)
        if isinstance(event, CarrierNotice):
            assert isinstance(event.name, str) and isinstance(event.detail, str)
            return
        if isinstance(event, UnknownCarrierEvent):  # ignored by the call, wherever it comes
            assert isinstance(event.event, str) and 0 < len(event.event) <= 64, event
            return
        assert not self.stopped, f"{event!r} after the stream stopped"
        if isinstance(event, StreamConnected):
            assert self.started is None, "connected after start"
            return
        if isinstance(event, StreamStarted):
            assert self.started is None, "a second StreamStarted"
            assert isinstance(event.call_id, str) and event.call_id, event
            assert isinstance(event.stream_id, str) and event.stream_id, event
            assert event.account_id is None or isinstance(event.account_id, str)
            assert isinstance(event.encoding, AudioEncoding) and event.rate_hz in _RATES, event
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in event.custom_parameters.items())
            assert self.codec.stream_id == event.stream_id
            self.started = event
            return
        assert self.started is not None, f"{event!r} before the stream started"
        if isinstance(event, MediaReceived):
            assert isinstance(event.payload, bytes)
            assert event.timestamp_ms is None or (isinstance(event.timestamp_ms, int) and event.timestamp_ms >= 0)
            assert len(event.payload) % self.started.encoding.sample_bytes == 0, (
                len(event.payload),
                self.started.encoding,
            )
        elif isinstance(event, DtmfReceived):
            assert event.digit in _DIGITS and len(event.digit) == 1, event
        elif isinstance(event, MarkEchoed):
            assert isinstance(event.name, str) and event.name, event
        elif isinstance(event, StreamStopped):
            self.stopped = True

    def check_sends(self) -> None:
        """Once started, the codec still makes every action's message (after any error: the call's clean end)."""
        if self.started is None:
            return
        profile = self.codec.profile
        frame = bytes(frame_bytes(self.started.rate_hz, self.started.encoding, profile.frame_ms))
        for action in (SendMedia(frame), SendMark("resp-1@200"), SendClear(), HangUp("fuzz")):
            message = self.codec.send(action)
            assert message is None or isinstance(message, str | bytes)
            if isinstance(message, str):
                assert isinstance(orjson.loads(message), dict)
