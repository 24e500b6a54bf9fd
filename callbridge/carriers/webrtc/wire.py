"""A browser call's media as a carrier codec: what ``PeerTransport`` (``transport.py``) hands the call core.

The browser's Opus is decoded by aiortc (48 kHz); the transport folds it to mono, and the bridge sees L16 at
48 kHz both ways — its resamplers take it to the engine's rate and back, as for any wideband carrier. Messages in are
of two kinds. Bytes are 20 ms of the caller's audio (PCM16, mono, 48 kHz); text comes from the transport: ``start``
(the browser connected: ``StreamStarted`` with the page's parameters), ``bye`` (it hung up, closed its tab, or
went silent past ``webrtc.idle_timeout_s``) and ``dtmf:<digit>`` (the page's keypad, over its data channel).

Out: ``SendMedia`` → the same bytes, which the transport's outgoing track plays on its own 20 ms clock. Like RTP,
the track holds no more than the bridge's lead (``PROFILE.lead_ms``): no markers (the heard position is the send
clock) and nothing to flush (a barge-in stops sending). Hanging up is closing the transport (the peer connection).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    DtmfReceived,
    HangUpMode,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.codecs import AudioEncoding

__all__ = ["FRAME_BYTES", "KEYS", "PROFILE", "PROVIDER", "RATE_HZ", "WebRtcCodec"]

PROVIDER: Final = "webrtc"
RATE_HZ: Final = 48_000
"""Opus's own rate, which aiortc decodes to and encodes from."""
FRAME_BYTES: Final = RATE_HZ // 50 * 2
"""20 ms of PCM16 mono at 48 kHz."""
PROFILE: Final = CarrierProfile(
    frame_ms=20, uses_marks=False, marks_echoed_on_clear=False, lead_ms=60, hang_up=HangUpMode.CLOSE, flushes=False,
    reconnect_window_ms=1,
)
"""As RTP's (``carriers/sip/wire.py``): the outgoing track plays what it is given at once on its 20 ms clock. A
browser call never comes back on a new stream (a new offer is a new call): a stream gone quiet is a call that ended,
its engine session closed at once rather than held for the engine's disconnect grace."""
KEYS: Final = frozenset("0123456789*#ABCD")
"""The keys a ``dtmf:<key>`` control message may name (the page's keypad)."""


class WebRtcCodec:
    """One browser call's media (see the module docstring)."""

    profile: Final = PROFILE
    provider: Final = PROVIDER
    max_message_bytes: Final = FRAME_BYTES

    def __init__(self, call_id: str, parameters: Mapping[str, str] | None = None) -> None:
        self.call_id = call_id
        self.stream_id: str | None = call_id
        self.parameters = dict(parameters or {})
        self.started = False
        self.stopped = False
        self.frames_sent = 0

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        if isinstance(message, str):
            return self._control(message)
        if not self.started or self.stopped:
            return []
        if len(message) % 2 or len(message) > FRAME_BYTES:
            raise RemoteProtocolError(
                ProtocolErrorReason.BAD_FIELD, f"{len(message)} bytes of audio", provider=PROVIDER, stream_id=self.stream_id, call_id=self.call_id
            )  # fmt: skip
        return [MediaReceived(message)] if message else []

    def _control(self, message: str) -> list[CarrierEvent]:
        if message == "start" and not self.started:
            self.started = True
            start = StreamStarted(self.call_id, self.call_id, None, AudioEncoding.L16, RATE_HZ, dict(self.parameters))
            return [StreamConnected(), start]
        if message == "bye" and not self.stopped:
            self.stopped = True
            return [StreamStopped()] if self.started else []
        if message.startswith("dtmf:") and self.started and not self.stopped and message[5:] in KEYS and len(message) == 6:
            return [DtmfReceived(message[5:])]
        raise RemoteProtocolError(
            ProtocolErrorReason.OUT_OF_ORDER, f"control {message[:16]!r}", provider=PROVIDER, stream_id=self.stream_id, call_id=self.call_id
        )  # fmt: skip

    def send(self, action: CarrierAction) -> bytes | None:
        if isinstance(action, SendMedia) and self.started and not self.stopped and action.payload:
            self.frames_sent += 1
            return action.payload
        return None  # markers are not used, nothing to flush; hang-up is closing the transport
