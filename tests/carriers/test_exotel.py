"""The Exotel Voicebot codec on the message shapes of telephony-protocols.md §3.3."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from callbridge.carriers.base import (
    CarrierNotice,
    DtmfReceived,
    HangUp,
    HangUpMode,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.exotel.wire import ExotelCodec, exotel_frame_ms
from callbridge.codecs import AudioEncoding
from callbridge.codecs.framing import frame_bytes

pytestmark = pytest.mark.core

SID = "MZ5a0c3f3f1e2d4b6a8c9d0e1f2a3b4c5d"
CALL = "b6a1f0e3c2d94c7e8f1a2b3c4d5e6f70"
CONNECTED = '{"event":"connected"}'


def start_message(rate: object = "8000", sid: str = SID, call: str = CALL, **start_fields: Any) -> str:
    start: dict[str, Any] = {
        "stream_sid": sid,
        "call_sid": call,
        "account_sid": "exotel1",
        "from": "+919800000001",
        "to": "+918000000002",
        "custom_parameters": {"key1": "value1"},
        "media_format": {"encoding": "audio/x-raw", "sample_rate": rate, "bit_rate": "16"},
    }
    start.update(start_fields)
    return orjson.dumps({"event": "start", "sequence_number": "1", "stream_sid": sid, "start": start}).decode()


START = start_message()


def media(payload: bytes = b"\x01\x00" * 800, timestamp: object = "100", sid: str = SID, **extra: object) -> str:
    body = {"chunk": "1", "timestamp": timestamp, "payload": base64.b64encode(payload).decode()}
    return orjson.dumps({"event": "media", "sequence_number": "2", "stream_sid": sid, "media": body, **extra}).decode()


def started(rate: object = "8000") -> ExotelCodec:
    codec = ExotelCodec()
    assert codec.receive_message(CONNECTED) == [StreamConnected()]
    codec.receive_message(start_message(rate))
    return codec


def test_start_announces_the_call_the_stream_and_the_format() -> None:
    codec = ExotelCodec()
    (event,) = codec.receive_message(START)
    assert event == StreamStarted(
        CALL, SID, "exotel1", AudioEncoding.L16, 8000, {"key1": "value1"}, caller="+919800000001", called="+918000000002"
    )  # who calls: the application's context (no answer webhook)
    assert codec.stream_id == SID and codec.call_id == CALL


@pytest.mark.parametrize(("rate", "expected"), [("8000", 8000), ("16000", 16000), (24000, 24000), ("24000", 24000)])
def test_the_rate_is_what_exotel_announces(rate: object, expected: int) -> None:
    (event,) = ExotelCodec().receive_message(start_message(rate))
    assert isinstance(event, StreamStarted) and event.rate_hz == expected and event.encoding is AudioEncoding.L16


def test_start_without_media_format_is_exotels_default() -> None:
    message = orjson.dumps({"event": "start", "stream_sid": SID, "start": {"stream_sid": SID, "call_sid": CALL}}).decode()
    (event,) = ExotelCodec().receive_message(message)
    assert event == StreamStarted(CALL, SID, None, AudioEncoding.L16, 8000, {})


def test_stream_sid_only_inside_start_or_only_outside() -> None:
    inner = orjson.dumps({"event": "start", "start": {"stream_sid": SID, "call_sid": CALL}}).decode()
    outer = orjson.dumps({"event": "start", "stream_sid": SID, "start": {"call_sid": CALL}}).decode()
    for message in (inner, outer):
        codec = ExotelCodec()
        codec.receive_message(message)
        assert codec.stream_id == SID


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"token": "t-1", "lang": "hi"}, {"token": "t-1", "lang": "hi"}),
        ({"n": 5}, {"n": "5"}),
        ("token=t-1&lang=hi", {"token": "t-1", "lang": "hi"}),
        (None, {}),
        ({}, {}),
    ],
)
def test_custom_parameters(params: object, expected: dict[str, str]) -> None:
    (event,) = ExotelCodec().receive_message(start_message(custom_parameters=params))
    assert isinstance(event, StreamStarted) and event.custom_parameters == expected


@pytest.mark.parametrize(("rate", "frame_ms", "chunk_bytes"), [(8000, 200, 3200), (16000, 100, 3200), (24000, 100, 4800)])
def test_profile_frames_are_chunks_exotel_accepts(rate: int, frame_ms: int, chunk_bytes: int) -> None:
    codec = started(str(rate))
    profile = codec.profile
    assert profile.frame_ms == frame_ms == exotel_frame_ms(rate)
    assert frame_bytes(rate, AudioEncoding.L16, frame_ms) == chunk_bytes
    assert chunk_bytes % 320 == 0 and chunk_bytes >= 3200 and frame_ms >= 100
    assert profile.hang_up is HangUpMode.CLOSE and profile.uses_marks and profile.marks_echoed_on_clear
    assert profile.lead_ms is not None and profile.lead_ms >= 2 * frame_ms


def test_min_chunk_bytes_1600_gives_100_ms_everywhere() -> None:
    assert [exotel_frame_ms(rate, 1600) for rate in (8000, 16000, 24000)] == [100, 100, 100]
    with pytest.raises(ValueError):
        ExotelCodec(min_chunk_bytes=3000)


def test_profile_lead_follows_the_configured_lead() -> None:
    codec = ExotelCodec(lead_ms=600)
    codec.receive_message(start_message("16000"))
    assert codec.profile.lead_ms == 600


@pytest.mark.parametrize(("timestamp", "expected"), [("100", 0), (100, 0), (None, None)])
def test_first_media_timestamp_is_time_zero(timestamp: object, expected: int | None) -> None:
    assert started().receive_message(media(timestamp=timestamp)) == [MediaReceived(b"\x01\x00" * 800, expected)]


def test_later_timestamps_count_from_the_first() -> None:
    codec = started()
    stamps = [codec.receive_message(media(timestamp=str(t)))[0] for t in (100, 200, 500, 50)]
    assert [e.timestamp_ms for e in stamps if isinstance(e, MediaReceived)] == [0, 100, 400, None]


@pytest.mark.parametrize("size", [2, 320, 1600, 3202, 9600])
def test_media_of_any_even_length(size: int) -> None:
    (event,) = started().receive_message(media(bytes(range(256)) * (size // 256) + bytes(size % 256)))
    assert isinstance(event, MediaReceived) and len(event.payload) == size


def test_unknown_fields_are_ignored() -> None:
    (event,) = started().receive_message(media(extra_field={"x": 1}))
    assert isinstance(event, MediaReceived)


def test_dtmf_mark_clear_stop() -> None:
    codec = started()
    assert codec.receive_message(f'{{"event":"dtmf","sequence_number":"7","stream_sid":"{SID}","dtmf":{{"digit":"5","duration":"100"}}}}') == [DtmfReceived("5")]
    assert codec.receive_message(f'{{"event":"dtmf","sequence_number":8,"stream_sid":"{SID}","dtmf":{{"digit":9}}}}') == [DtmfReceived("9")]
    assert codec.receive_message(f'{{"event":"mark","sequence_number":"15","stream_sid":"{SID}","mark":{{"name":"r1@200"}}}}') == [MarkEchoed("r1@200")]
    assert codec.receive_message(f'{{"event":"clear","stream_sid":"{SID}"}}') == [PlaybackCleared()]
    stop = f'{{"event":"stop","sequence_number":"16","stream_sid":"{SID}","stop":{{"call_sid":"{CALL}","account_sid":"exotel1","reason":"callended"}}}}'
    assert codec.receive_message(stop) == [CarrierNotice("stop", "reason=callended"), StreamStopped()]
    assert codec.stopped and codec.stop_reason == "callended"


def test_outbound_messages_are_the_three_documented() -> None:
    codec = started()
    chunk = bytes(range(256)) * 12 + bytes(128)  # 3200 bytes: 200 ms at 8 kHz
    sent = orjson.loads(codec.send(SendMedia(chunk)))  # type: ignore[arg-type]
    assert sent == {"event": "media", "stream_sid": SID, "media": {"payload": base64.b64encode(chunk).decode()}}
    assert orjson.loads(codec.send(SendMark('r-"1"@20'))) == {"event": "mark", "stream_sid": SID, "mark": {"name": 'r-"1"@20'}}  # type: ignore[arg-type]
    assert orjson.loads(codec.send(SendClear())) == {"event": "clear", "stream_sid": SID}  # type: ignore[arg-type]
    assert codec.send(HangUp("done")) is None  # closing the socket is the hang-up


@pytest.mark.parametrize("size", [1600, 3210, 200_000])
def test_we_never_send_a_chunk_exotel_would_play_badly(size: int) -> None:
    with pytest.raises(ValueError):
        started().send(SendMedia(bytes(size)))


def test_send_before_start_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        ExotelCodec().send(SendClear())


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00\x01", ProtocolErrorReason.BINARY_FRAME),
        ("not json", ProtocolErrorReason.NOT_JSON),
        ("[1]", ProtocolErrorReason.NOT_AN_OBJECT),
        ('{"no":"event"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":null,"stream_sid":"' + SID + '"}', ProtocolErrorReason.MISSING_FIELD),
        (media(sid="MZother"), ProtocolErrorReason.WRONG_STREAM),
        ('{"event":"media","media":{"payload":"AAA="}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"media","stream_sid":"' + SID + '"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"media","stream_sid":"' + SID + '","media":{}}', ProtocolErrorReason.MISSING_FIELD),
        (media().replace('"payload":"', '"payload":"!!'), ProtocolErrorReason.BAD_BASE64),
        (media(b"\x01\x02\x03"), ProtocolErrorReason.BAD_FIELD),
        (media(timestamp="soon"), ProtocolErrorReason.BAD_FIELD),
        (media(timestamp="-5"), ProtocolErrorReason.BAD_FIELD),
        (media(sequence_number="third"), ProtocolErrorReason.BAD_FIELD),
        ('{"event":"mark","stream_sid":"' + SID + '","mark":{}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"mark","stream_sid":"' + SID + '"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"dtmf","stream_sid":"' + SID + '","dtmf":{"digit":"x"}}', ProtocolErrorReason.BAD_FIELD),
        ('{"event":"dtmf","stream_sid":"' + SID + '","dtmf":{}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"stop"}', ProtocolErrorReason.MISSING_FIELD),
        (START, ProtocolErrorReason.OUT_OF_ORDER),
        (CONNECTED, ProtocolErrorReason.OUT_OF_ORDER),
        ("x" * 300_000, ProtocolErrorReason.OVERSIZED),
    ],
)
def test_bad_input_after_start(message: str | bytes, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        started().receive_message(message)
    assert exc.value.reason is reason
    assert exc.value.provider == "exotel" and exc.value.stream_id == SID and exc.value.call_id == CALL


@pytest.mark.parametrize(
    ("start", "reason"),
    [
        (start_message("11025"), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start_message("fast"), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (START.replace("audio/x-raw", "audio/x-mulaw"), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (START.replace('"bit_rate":"16"', '"bit_rate":"8"'), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start_message(media_format={"encoding": "audio/x-raw", "sample_rate": "8000", "channels": 2}), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start_message(media_format="slin"), ProtocolErrorReason.BAD_FIELD),
        (start_message(custom_parameters=[1]), ProtocolErrorReason.BAD_FIELD),
        (start_message(call='CA"x'), ProtocolErrorReason.BAD_FIELD),
        (start_message(sid="MZ 1"), ProtocolErrorReason.BAD_FIELD),
        ('{"event":"start","start":{"call_sid":"c1"}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"start","stream_sid":"s1","start":{}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"start","stream_sid":"s1"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"start","stream_sid":"s1","start":{"stream_sid":"s2","call_sid":"c1"}}', ProtocolErrorReason.WRONG_STREAM),
        ('{"event":"start","stream_sid":"s1","sequence_number":"one","start":{"call_sid":"c1"}}', ProtocolErrorReason.BAD_FIELD),
    ],
)
def test_bad_start(start: str, reason: ProtocolErrorReason) -> None:
    codec = ExotelCodec()
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(start)
    assert exc.value.reason is reason
    assert codec.stream_id is None  # nothing of a refused start is kept


@pytest.mark.parametrize(
    "message",
    [media(), '{"event":"mark","stream_sid":"x","mark":{"name":"n"}}', '{"event":"stop","stream_sid":"x"}', '{"event":"dtmf","stream_sid":"x","dtmf":{"digit":"1"}}'],
)
def test_nothing_before_start(message: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        ExotelCodec().receive_message(message)
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER


def test_nothing_after_stop() -> None:
    codec = started()
    assert codec.receive_message(f'{{"event":"stop","stream_sid":"{SID}","stop":{{"reason":"stopped"}}}}')[-1] == StreamStopped()
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(media())
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER
