"""A codec that recognises the carrier from its first messages, then is that carrier's codec: for one media
URL that several carriers point at.

The first message that names its carrier decides (telephony-protocols.md §0):

============================  =============================================
``websocket:connected``       Vonage
``start`` with ``streamSid``  Twilio (``accountSid`` ``AC…``) or SignalWire (a project UUID)
``start`` with ``stream_id``  Telnyx
``start`` with ``stream_sid`` Exotel
``start`` with ``streamId``   Plivo (``start.callId``, integer ``sequenceNumber``)
``eventType`` ``start``       Bandwidth (``metadata``)
``callSid`` and ``mixType``   jambonz (its first text frame; binary L16 follows)
============================  =============================================

A ``connected`` that comes first (Twilio, Telnyx, Exotel send one) is held and
replayed to the codec chosen. Anything else before the carrier is known is an
error, like any codec's; AudioSocket is TCP and has its own listener.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from callbridge.carriers.base import (
    DEFAULT_PROFILE,
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    ProtocolErrorReason,
    ProviderCodec,
    RemoteProtocolError,
)
from callbridge.carriers.json_wire import parse_object
from callbridge.carriers.twilio.wire import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["DetectingCodec", "default_codecs", "recognise"]

UNKNOWN: Final = "unknown"


def recognise(payload: Mapping[str, Any]) -> str | None:
    """The carrier a first message (parsed JSON) comes from, or None when it does not say."""
    if payload.get("eventType") == "start" and isinstance(payload.get("metadata"), dict):
        return "bandwidth"
    if "callSid" in payload and "sampleRate" in payload and "mixType" in payload:
        return "jambonz"
    event = payload.get("event")
    if event == "websocket:connected":
        return "vonage"
    if event != "start":
        return None
    start = payload.get("start")
    start = start if isinstance(start, dict) else {}
    if "streamSid" in payload or "streamSid" in start:
        account = start.get("accountSid")
        return "twilio" if isinstance(account, str) and account.startswith("AC") else "signalwire"
    if "stream_id" in payload:
        return "telnyx"
    if "stream_sid" in payload or "stream_sid" in start:
        return "exotel"
    if "streamId" in payload or "streamId" in start or "callId" in start:
        return "plivo"
    return None


def default_codecs() -> dict[str, Callable[[], ProviderCodec]]:
    """A codec factory for every websocket carrier of the registry."""
    from callbridge.carriers import CARRIERS

    return {spec.name: spec.codec_factory() for spec in CARRIERS if spec.transport == "websocket" and spec.codec is not None}


class DetectingCodec:
    """Recognise the carrier, then delegate every message to its codec (see the module docstring)."""

    def __init__(
        self,
        codecs: Mapping[str, Callable[[], ProviderCodec]] | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._codecs = codecs if codecs is not None else default_codecs()
        self.max_message_bytes = max_message_bytes
        self.inner: ProviderCodec | None = None
        self._held: str | None = None

    @property
    def provider(self) -> str:
        return self.inner.provider if self.inner is not None else UNKNOWN

    @property
    def stream_id(self) -> str | None:
        return self.inner.stream_id if self.inner is not None else None

    @property
    def profile(self) -> CarrierProfile:
        return self.inner.profile if self.inner is not None else DEFAULT_PROFILE

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        if self.inner is not None:
            return self.inner.receive_message(message)
        payload = parse_object(message, self.max_message_bytes, self._error)
        if payload.get("event") == "connected" and self._held is None and isinstance(message, str):
            self._held = message
            return []
        name = recognise(payload)
        if name is None or name not in self._codecs:
            raise self._error(ProtocolErrorReason.UNKNOWN_EVENT, f"cannot tell the carrier from event {payload.get('event')!r}")
        self.inner = self._codecs[name]()
        events: list[CarrierEvent] = []
        if self._held is not None:
            events += self.inner.receive_message(self._held)
            self._held = None
        events += self.inner.receive_message(message)
        return events

    def send(self, action: CarrierAction) -> str | bytes | None:
        if self.inner is None:
            raise RuntimeError("DetectingCodec.send() before the carrier is known")  # a bug in the caller
        return self.inner.send(action)

    def _error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=UNKNOWN)
