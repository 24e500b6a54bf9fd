"""The browser phone's codec and outgoing track, pure: what the call core reads of a browser call, and what the
browser is given to play."""

from __future__ import annotations

import pytest

from callbridge.carriers.base import (
    DtmfReceived,
    MediaReceived,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.webrtc.wire import FRAME_BYTES, RATE_HZ, WebRtcCodec
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core


def test_the_stream_starts_with_the_pages_parameters_at_48_khz() -> None:
    codec = WebRtcCodec("webrtc-1", {"customer": "42"})
    assert codec.receive_message(bytes(FRAME_BYTES)) == []  # nothing before the connection is up
    connected, started = codec.receive_message("start")
    assert isinstance(connected, StreamConnected)
    assert started == StreamStarted("webrtc-1", "webrtc-1", None, AudioEncoding.L16, RATE_HZ, {"customer": "42"})
    assert codec.receive_message(b"\x01\x00" * 960) == [MediaReceived(b"\x01\x00" * 960)]
    assert codec.receive_message("dtmf:5") == [DtmfReceived("5")]
    assert codec.receive_message("bye") == [StreamStopped()]
    assert codec.receive_message(bytes(FRAME_BYTES)) == []  # after the end: nothing


@pytest.mark.parametrize("message", [b"\x00" * 3, bytes(FRAME_BYTES + 2), "dtmf:55", "dtmf:x", "start", "hello"])
def test_what_the_transport_never_sends_ends_the_stream(message: str | bytes) -> None:
    codec = WebRtcCodec("webrtc-1")
    codec.receive_message("start")
    with pytest.raises(RemoteProtocolError):
        codec.receive_message(message)


def test_a_browser_gone_before_it_connected_stops_nothing() -> None:
    assert WebRtcCodec("webrtc-1").receive_message("bye") == []


def test_the_agents_audio_goes_as_it_is_and_markers_and_flushes_are_not_sent() -> None:
    codec = WebRtcCodec("webrtc-1")
    assert codec.send(SendMedia(b"\x01" * FRAME_BYTES)) is None  # not started
    codec.receive_message("start")
    assert codec.send(SendMedia(b"\x01" * FRAME_BYTES)) == b"\x01" * FRAME_BYTES
    assert codec.send(SendMark("m1")) is None
    assert codec.send(SendClear()) is None
    assert codec.frames_sent == 1

