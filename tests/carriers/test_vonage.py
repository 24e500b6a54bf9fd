"""The Vonage websocket codec on the message shapes of telephony-protocols.md §2.2–2.3."""

from __future__ import annotations

import orjson
import pytest

from callbridge.carriers.base import (
    CarrierNotice,
    DtmfReceived,
    HangUp,
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
from callbridge.carriers.vonage.wire import (
    VONAGE_PROFILE,
    VonageCodec,
    content_type,
)
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

CALL = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"


def connected(rate: int = 16000, **headers: object) -> str:
    message: dict[str, object] = {"event": "websocket:connected", "content-type": f"audio/l16;rate={rate}"}
    message.update({"call_uuid": CALL, "token": "tok-1"} | headers)
    return orjson.dumps(message).decode()


def started(rate: int = 16000) -> VonageCodec:
    codec = VonageCodec()
    codec.receive_message(connected(rate))
    return codec


def expect(codec: VonageCodec, message: str | bytes, reason: ProtocolErrorReason) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        codec.receive_message(message)
    assert info.value.reason is reason
    assert info.value.provider == "vonage"
    return info.value


# ------------------------------------------------------------------ start


@pytest.mark.parametrize("rate", [8000, 16000])
def test_connected_starts_the_stream_at_the_announced_rate(rate: int) -> None:
    codec = VonageCodec()
    (event,) = codec.receive_message(connected(rate))
    assert isinstance(event, StreamStarted)
    assert event.call_id == CALL and event.account_id is None
    assert event.encoding is AudioEncoding.L16 and event.rate_hz == rate
    assert event.custom_parameters == {"call_uuid": CALL, "token": "tok-1"}
    assert event.stream_id == codec.stream_id and event.stream_id.startswith("vonage-ws-")
    assert codec.call_id == CALL and codec.frame_bytes == rate // 50 * 2


def test_each_socket_gets_its_own_stream_id() -> None:
    assert started().stream_id != started().stream_id


def test_other_headers_become_text_parameters() -> None:
    (event,) = VonageCodec().receive_message(connected(extra={"a": [1, 2]}, n=5, flag=True))
    assert isinstance(event, StreamStarted)
    assert event.custom_parameters["n"] == "5"
    assert event.custom_parameters["flag"] == "true"
    assert orjson.loads(event.custom_parameters["extra"]) == {"a": [1, 2]}
    assert "event" not in event.custom_parameters and "content-type" not in event.custom_parameters


@pytest.mark.parametrize("announced", ["audio/l16;rate=16000", "Audio/L16; rate=16000", " audio/l16 ;rate = 16000 "])
def test_content_type_is_parsed_leniently(announced: str) -> None:
    message = orjson.dumps({"event": "websocket:connected", "content-type": announced, "call_uuid": CALL}).decode()
    (event,) = VonageCodec().receive_message(message)
    assert isinstance(event, StreamStarted) and event.rate_hz == 16000


@pytest.mark.parametrize("announced", ["audio/l16;rate=44100", "audio/pcmu;rate=8000", "audio/l16", "", 16000, None])
def test_unsupported_or_bad_content_type(announced: object) -> None:
    message = orjson.dumps({"event": "websocket:connected", "content-type": announced, "call_uuid": CALL}).decode()
    reason = ProtocolErrorReason.MISSING_FIELD if announced is None else ProtocolErrorReason.UNSUPPORTED_FORMAT
    expect(VonageCodec(), message, reason)


def test_call_uuid_is_required_and_checked() -> None:
    without = orjson.dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=8000"}).decode()
    expect(VonageCodec(), without, ProtocolErrorReason.MISSING_FIELD)
    for bad in ("", "a b", "x" * 200, 42, '"};'):
        expect(VonageCodec(), connected(call_uuid=bad), ProtocolErrorReason.BAD_FIELD)


def test_a_second_connected_is_out_of_order() -> None:
    expect(started(), connected(), ProtocolErrorReason.OUT_OF_ORDER)


# ------------------------------------------------------------------ media


@pytest.mark.parametrize(("rate", "size"), [(16000, 640), (8000, 320)])
def test_binary_frames_are_audio_without_timestamps(rate: int, size: int) -> None:
    frame = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert started(rate).receive_message(frame) == [MediaReceived(frame, None)]


@pytest.mark.parametrize("size", [2, 320, 642, 6400])
def test_inbound_frame_size_is_lenient(size: int) -> None:
    (event,) = started().receive_message(b"\x01\x00" * (size // 2))
    assert isinstance(event, MediaReceived) and len(event.payload) == size


def test_media_accepts_bytearray_and_memoryview() -> None:
    codec = started()
    assert codec.receive_message(bytearray(640)) == [MediaReceived(bytes(640), None)]
    assert codec.receive_message(memoryview(bytes(640))) == [MediaReceived(bytes(640), None)]


def test_empty_binary_frame_carries_nothing() -> None:
    assert started().receive_message(b"") == []


def test_odd_byte_count_is_a_bad_frame() -> None:
    expect(started(), bytes(641), ProtocolErrorReason.BAD_FIELD)


@pytest.mark.parametrize(("rate", "limit"), [(16000, 6400), (8000, 3200)])
def test_oversized_frame(rate: int, limit: int) -> None:
    assert started(rate).receive_message(bytes(limit))
    expect(started(rate), bytes(limit + 2), ProtocolErrorReason.OVERSIZED)


def test_media_before_connected_is_out_of_order() -> None:
    error = expect(VonageCodec(), bytes(640), ProtocolErrorReason.OUT_OF_ORDER)
    assert error.stream_id is None


# ----------------------------------------------------------------- events


@pytest.mark.parametrize(
    ("message", "digit"),
    [
        ({"event": "websocket:dtmf", "digit": "5", "duration": 260}, "5"),
        ({"event": "websocket:dtmf", "digit": "#", "duration": "100"}, "#"),
        ({"event": "websocket:dtmf", "digit": 7}, "7"),
        ({"event": "websocket:dtmf", "dtmf": {"digit": "*", "duration": 100}}, "*"),
    ],
)
def test_dtmf(message: dict[str, object], digit: str) -> None:
    assert started().receive_message(orjson.dumps(message).decode()) == [DtmfReceived(digit)]


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"event": "websocket:dtmf"}, ProtocolErrorReason.MISSING_FIELD),
        ({"event": "websocket:dtmf", "dtmf": {}}, ProtocolErrorReason.MISSING_FIELD),
        ({"event": "websocket:dtmf", "digit": "55"}, ProtocolErrorReason.BAD_FIELD),
        ({"event": "websocket:dtmf", "digit": "x"}, ProtocolErrorReason.BAD_FIELD),
        ({"event": "websocket:dtmf", "digit": 12}, ProtocolErrorReason.BAD_FIELD),
        ({"event": "websocket:dtmf", "digit": True}, ProtocolErrorReason.BAD_FIELD),
    ],
)
def test_bad_dtmf(message: dict[str, object], reason: ProtocolErrorReason) -> None:
    expect(started(), orjson.dumps(message).decode(), reason)


def test_notify_echo_is_a_mark() -> None:
    codec = started()
    codec.send(SendMark("r1@100"))
    message = '{"event":"websocket:notify","payload":{"name":"r1@100"}}'
    assert codec.receive_message(message) == [MarkEchoed("r1@100")]


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"event": "websocket:notify"}, ProtocolErrorReason.MISSING_FIELD),
        ({"event": "websocket:notify", "payload": "r1"}, ProtocolErrorReason.BAD_FIELD),
        ({"event": "websocket:notify", "payload": {}}, ProtocolErrorReason.MISSING_FIELD),
        ({"event": "websocket:notify", "payload": {"name": 5}}, ProtocolErrorReason.MISSING_FIELD),
    ],
)
def test_bad_notify(message: dict[str, object], reason: ProtocolErrorReason) -> None:
    expect(started(), orjson.dumps(message).decode(), reason)


def test_cleared_voids_pending_notifies_and_drops_their_late_echoes() -> None:
    codec = started()
    codec.send(SendMark("r1@100"))
    codec.send(SendMark("r1@200"))
    assert codec.receive_message('{"event":"websocket:notify","payload":{"name":"r1@100"}}') == [MarkEchoed("r1@100")]
    assert codec.send(SendClear()) == '{"action":"clear"}'
    assert codec.receive_message('{"event":"websocket:cleared"}') == [PlaybackCleared()]
    (late,) = codec.receive_message('{"event":"websocket:notify","payload":{"name":"r1@200"}}')
    assert isinstance(late, CarrierNotice) and "r1@200" in late.detail
    codec.send(SendMark("r2@100"))
    assert codec.receive_message('{"event":"websocket:notify","payload":{"name":"r2@100"}}') == [MarkEchoed("r2@100")]


def test_unknown_vonage_event_is_ignored() -> None:
    assert started().receive_message('{"event":"websocket:something-new","x":1}') == [UnknownCarrierEvent("websocket:something-new")]


def test_event_outside_vonage_namespace_is_unknown() -> None:
    expect(started(), '{"event":"media","media":{"payload":"AAAA"}}', ProtocolErrorReason.UNKNOWN_EVENT)


@pytest.mark.parametrize(
    "event",
    ['{"event":"websocket:dtmf","digit":"1"}', '{"event":"websocket:notify","payload":{"name":"a"}}', '{"event":"websocket:cleared"}'],
)
def test_events_before_connected_are_out_of_order(event: str) -> None:
    expect(VonageCodec(), event, ProtocolErrorReason.OUT_OF_ORDER)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("not json", ProtocolErrorReason.NOT_JSON),
        ("[1,2]", ProtocolErrorReason.NOT_AN_OBJECT),
        ('"websocket:dtmf"', ProtocolErrorReason.NOT_AN_OBJECT),
        ('{"digit":"1"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":5}', ProtocolErrorReason.BAD_FIELD),
        ('{"event":"websocket:dtmf","digit":"' + "1" * 20_000 + '"}', ProtocolErrorReason.OVERSIZED),
    ],
)
def test_bad_text(message: str, reason: ProtocolErrorReason) -> None:
    error = expect(started(), message, reason)
    assert error.call_id == CALL


# -------------------------------------------------------------------- out


@pytest.mark.parametrize("rate", [8000, 16000])
def test_media_goes_out_as_exact_binary_frames(rate: int) -> None:
    codec = started(rate)
    size = rate // 50 * 2
    frame = b"\x01\x02" * (size // 2)
    assert codec.send(SendMedia(frame)) == frame
    assert codec.send(SendMedia(b"\x01\x02" * 10)) == b"\x01\x02" * 10 + bytes(size - 20)
    with pytest.raises(ValueError):
        codec.send(SendMedia(bytes(size + 2)))


def test_mark_and_clear_messages() -> None:
    codec = started()
    assert orjson.loads(codec.send(SendMark('r"1@20')) or "") == {"action": "notify", "payload": {"name": 'r"1@20'}}
    assert orjson.loads(codec.send(SendClear()) or "") == {"action": "clear"}
    assert codec.send(HangUp("bye")) is None


def test_send_before_connected_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        VonageCodec().send(SendClear())


def test_profile_and_helpers() -> None:
    assert VONAGE_PROFILE.frame_ms == 20 and VONAGE_PROFILE.uses_marks and not VONAGE_PROFILE.marks_echoed_on_clear
    assert content_type(8000) == "audio/l16;rate=8000" and content_type(16000) == "audio/l16;rate=16000"
