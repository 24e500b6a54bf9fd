"""The Plivo audio stream codec on the documented message shapes (telephony-protocols.md §3.2)."""

from __future__ import annotations

import base64

import orjson
import pytest

from callbridge.carriers.base import (
    DtmfReceived,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.plivo.wire import (
    PlivoCodec,
    decode_stream_token,
    encode_stream_token,
    parse_extra_headers,
    stream_token_header,
)
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

STREAM = "87654321-4321-4321-4321-cba987654321"
CALL = "12345678-1234-1234-1234-123456789abc"
ACCOUNT = "MAXXXXXXXXXXXXXXXXXX"
TOKEN = "tok-en_with-URLsafe_chars"
EPOCH = 1_705_312_200_000


def start(
    encoding: object = "audio/x-mulaw", rate: object = 8000, extra_headers: object = None, **start_fields: object
) -> str:
    body: dict[str, object] = {
        "callId": CALL,
        "streamId": STREAM,
        "accountId": ACCOUNT,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": encoding, "sampleRate": rate},
        **start_fields,
    }
    message: dict[str, object] = {"event": "start", "sequenceNumber": 1, "start": body}
    message["extra_headers"] = stream_token_header(TOKEN) + ";userId=12345" if extra_headers is None else extra_headers
    return orjson.dumps(message).decode()


def media(
    payload: bytes = b"\xff" * 160, timestamp: object = str(EPOCH), sequence: object = 2, stream: str = STREAM, **extra: object
) -> str:
    body: dict[str, object] = {"track": "inbound", "timestamp": timestamp, "chunk": 1, "payload": base64.b64encode(payload).decode()}
    if timestamp is None:
        del body["timestamp"]
    message = {"event": "media", "sequenceNumber": sequence, "streamId": stream, "media": body, **extra}
    return orjson.dumps(message).decode()


def event(kind: str, **fields: object) -> str:
    return orjson.dumps({"event": kind, "sequenceNumber": 9, "streamId": STREAM, **fields}).decode()


def started(message: str | None = None) -> PlivoCodec:
    codec = PlivoCodec()
    (ev,) = codec.receive_message(message or start())
    assert isinstance(ev, StreamStarted)
    return codec


def test_start_carries_the_call_id_stream_id_format_and_decoded_token() -> None:
    codec = PlivoCodec()
    (ev,) = codec.receive_message(start())
    assert ev == StreamStarted(CALL, STREAM, ACCOUNT, AudioEncoding.PCMU, 8000, {"token": TOKEN, "userId": "12345"})
    assert codec.stream_id == STREAM and codec.call_id == CALL
    assert codec.profile.marks_echoed_on_clear is False and codec.profile.uses_marks


@pytest.mark.parametrize(("encoding", "rate", "expected"), [("audio/x-l16", 8000, 8000), ("audio/x-l16", 16000, 16000), ("audio/x-l16", "16000", 16000)])
def test_start_l16(encoding: str, rate: object, expected: int) -> None:
    (ev,) = PlivoCodec().receive_message(start(encoding, rate))
    assert isinstance(ev, StreamStarted) and ev.encoding is AudioEncoding.L16 and ev.rate_hz == expected


def test_start_with_the_xml_content_type_spelling() -> None:
    message = orjson.loads(start())
    message["start"]["mediaFormat"] = {"encoding": "audio/x-l16;rate=16000"}
    (ev,) = PlivoCodec().receive_message(orjson.dumps(message).decode())
    assert isinstance(ev, StreamStarted) and (ev.encoding, ev.rate_hz) == (AudioEncoding.L16, 16000)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("userId=12345;sessionId=abc-xyz", {"userId": "12345", "sessionId": "abc-xyz"}),
        ("test1=12,test2=123", {"test1": "12", "test2": "123"}),
        (" a = 1 ; ; junk ; X-PH-b=2 ", {"a": "1", "b": "2"}),
        ('{"a": "1", "n": 2}', {"a": "1", "n": "2"}),
        ({"a": 1}, {"a": "1"}),
        ("", {}),
        (None, {}),
    ],
)
def test_extra_headers_are_parsed_leniently(raw: object, expected: dict[str, str]) -> None:
    assert parse_extra_headers(raw) == expected


def test_token_round_trip_uses_only_letters_and_digits() -> None:
    header = stream_token_header(TOKEN)
    key, _, value = header.partition("=")
    assert key == "token" and value.isalnum() and value.isascii()
    assert decode_stream_token(encode_stream_token(TOKEN)) == TOKEN
    assert decode_stream_token("not-hex!") == "not-hex!"


def test_start_without_extra_headers_has_no_token() -> None:
    (ev,) = PlivoCodec().receive_message(start(extra_headers=""))
    assert isinstance(ev, StreamStarted) and ev.custom_parameters == {}


def test_media_timestamps_become_stream_relative() -> None:
    codec = started()
    assert codec.receive_message(media(timestamp=str(EPOCH), sequence=2)) == [MediaReceived(b"\xff" * 160, 0)]
    assert codec.receive_message(media(timestamp=EPOCH + 20, sequence=3)) == [MediaReceived(b"\xff" * 160, 20)]
    assert codec.receive_message(media(timestamp=str(EPOCH + 140), sequence=4)) == [MediaReceived(b"\xff" * 160, 140)]
    # a clock step back: no usable stream time, the audio still counts
    assert codec.receive_message(media(timestamp=str(EPOCH - 5), sequence=5)) == [MediaReceived(b"\xff" * 160, None)]
    assert codec.receive_message(media(timestamp=None, sequence=6)) == [MediaReceived(b"\xff" * 160, None)]


def test_wall_clock_jitter_is_not_a_gap_but_lost_frames_are() -> None:
    codec = started()
    frame = b"\xff" * 160  # 20 ms
    stamps = [0, 23, 38, 65, 80, 100 + 20 + 61]  # late by 3, early by 2, late by 5, on time, then 3 frames lost
    seen = [codec.receive_message(media(frame, str(EPOCH + at), i + 2))[0] for i, at in enumerate(stamps)]
    assert [ev.timestamp_ms for ev in seen if isinstance(ev, MediaReceived)] == [0, 20, 38, 60, 80, 181]
    # after the gap, stream time goes on from where the lost frames would have ended
    (ev,) = codec.receive_message(media(frame, str(EPOCH + 201), 9))
    assert ev == MediaReceived(frame, 201)


@pytest.mark.parametrize("size", [1, 80, 160, 333, 8000])
def test_media_of_any_length(size: int) -> None:
    (ev,) = started().receive_message(media(bytes(range(256)) * (size // 256) + bytes(size % 256)))
    assert isinstance(ev, MediaReceived) and len(ev.payload) == size


def test_l16_media_and_playaudio_match_the_stream_format() -> None:
    codec = started(start("audio/x-l16", 16000))
    pcm = b"\x01\x00\xff\x7f" * 160
    assert codec.receive_message(media(pcm)) == [MediaReceived(pcm, 0)]
    sent = orjson.loads(codec.send(SendMedia(pcm)) or "")
    assert sent == {
        "event": "playAudio",
        "streamId": STREAM,
        "media": {"contentType": "audio/x-l16", "sampleRate": 16000, "payload": base64.b64encode(pcm).decode()},
    }


def test_outbound_track_media_is_skipped_and_unknown_fields_ignored() -> None:
    codec = started()
    message = orjson.loads(media())
    message["media"]["track"] = "outbound"
    assert codec.receive_message(orjson.dumps(message).decode()) == []
    (ev,) = codec.receive_message(media(sequence=3, extra_headers="userId=1", something={"x": 1}))
    assert isinstance(ev, MediaReceived)


def test_dtmf_played_stream_cleared_audio_and_stop() -> None:
    codec = started()
    assert codec.receive_message(event("dtmf", dtmf={"track": "inbound", "digit": "5", "timestamp": str(EPOCH)})) == [DtmfReceived("5")]
    assert codec.receive_message(event("playedStream", name="cp-1")) == [MarkEchoed("cp-1")]
    assert codec.receive_message(event("clearedAudio")) == [PlaybackCleared()]
    assert codec.receive_message('{"event":"stop"}') == [StreamStopped()]
    assert codec.stopped


def test_outbound_messages() -> None:
    codec = started()
    assert orjson.loads(codec.send(SendMedia(b"\x01\x02\xff")) or "") == {
        "event": "playAudio",
        "streamId": STREAM,
        "media": {"contentType": "audio/x-mulaw", "sampleRate": 8000, "payload": base64.b64encode(b"\x01\x02\xff").decode()},
    }
    assert orjson.loads(codec.send(SendMark('resp-"1":20')) or "") == {"event": "checkpoint", "streamId": STREAM, "name": 'resp-"1":20'}
    assert orjson.loads(codec.send(SendClear()) or "") == {"event": "clearAudio", "streamId": STREAM}


def test_send_before_start_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        PlivoCodec().send(SendClear())


def _media_with(**media_fields: object) -> str:
    message = orjson.loads(media())
    message["media"].update(media_fields)
    return orjson.dumps(message).decode()


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00\x01", ProtocolErrorReason.BINARY_FRAME),
        ("not json", ProtocolErrorReason.NOT_JSON),
        ("[1]", ProtocolErrorReason.NOT_AN_OBJECT),
        ('{"no":"event"}', ProtocolErrorReason.MISSING_FIELD),
        (orjson.dumps({"event": {"media": 1}, "streamId": STREAM}).decode(), ProtocolErrorReason.BAD_FIELD),
        (media(stream="11111111-2222-3333-4444-555555555555"), ProtocolErrorReason.WRONG_STREAM),
        (media().replace(f'"streamId":"{STREAM}",', ""), ProtocolErrorReason.MISSING_FIELD),
        (orjson.dumps({"event": "media", "streamId": STREAM}).decode(), ProtocolErrorReason.MISSING_FIELD),
        (_media_with(payload=None), ProtocolErrorReason.MISSING_FIELD),
        (_media_with(payload="!!" + base64.b64encode(b"abc").decode()), ProtocolErrorReason.BAD_BASE64),
        (_media_with(payload="YWJj\n"), ProtocolErrorReason.BAD_BASE64),
        (_media_with(timestamp="soon"), ProtocolErrorReason.BAD_FIELD),
        (_media_with(track="sideways"), ProtocolErrorReason.BAD_FIELD),
        (media(sequence="two"), ProtocolErrorReason.BAD_FIELD),
        (event("dtmf", dtmf={"digit": "x"}), ProtocolErrorReason.BAD_FIELD),
        (event("dtmf"), ProtocolErrorReason.MISSING_FIELD),
        (event("playedStream"), ProtocolErrorReason.MISSING_FIELD),
        (event("playedStream", name=7), ProtocolErrorReason.MISSING_FIELD),
        (event("clearedAudio", streamId="other"), ProtocolErrorReason.WRONG_STREAM),
        ('{"event":"stop","streamId":"other"}', ProtocolErrorReason.WRONG_STREAM),
        (start(), ProtocolErrorReason.OUT_OF_ORDER),
        ("x" * 300_000, ProtocolErrorReason.OVERSIZED),
    ],
)
def test_bad_input_after_start(message: str | bytes, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        started().receive_message(message)
    assert exc.value.reason is reason
    assert exc.value.provider == "plivo"
    assert exc.value.stream_id == STREAM and exc.value.call_id == CALL


def test_media_sequence_must_increase() -> None:
    codec = started()
    codec.receive_message(media(sequence=5))
    for sequence in (5, 4):
        with pytest.raises(RemoteProtocolError) as exc:
            codec.receive_message(media(sequence=sequence))
        assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER


def test_odd_length_l16_payload() -> None:
    codec = started(start("audio/x-l16", 8000))
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(media(b"\x00\x01\x02"))
    assert exc.value.reason is ProtocolErrorReason.BAD_FIELD


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (start("audio/x-l16", 24000), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start("audio/x-mulaw", 16000), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start("audio/x-alaw", 8000), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start("audio/x-mulaw", "fast"), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start(encoding=None), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start(mediaFormat={"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 2}), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start(mediaFormat=None), ProtocolErrorReason.MISSING_FIELD),
        (start(mediaFormat="mulaw"), ProtocolErrorReason.BAD_FIELD),
        (start(callId='12"34'), ProtocolErrorReason.BAD_FIELD),
        (start(streamId="x" * 65), ProtocolErrorReason.BAD_FIELD),
        (start(callId=None), ProtocolErrorReason.MISSING_FIELD),
        (start(extra_headers=["token", "x"]), ProtocolErrorReason.BAD_FIELD),
        ('{"event":"start","start":{"callId":"c1"}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"start"}', ProtocolErrorReason.MISSING_FIELD),
        (start().replace('"sequenceNumber":1', f'"sequenceNumber":1,"streamId":"{"9" * 36}"'), ProtocolErrorReason.WRONG_STREAM),
    ],
)
def test_bad_start(message: str, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        PlivoCodec().receive_message(message)
    assert exc.value.reason is reason


def test_start_with_mediaformat_none_is_missing() -> None:
    message = orjson.loads(start())
    del message["start"]["mediaFormat"]
    with pytest.raises(RemoteProtocolError) as exc:
        PlivoCodec().receive_message(orjson.dumps(message).decode())
    assert exc.value.reason is ProtocolErrorReason.MISSING_FIELD


@pytest.mark.parametrize("message", [media(), event("dtmf", dtmf={"digit": "1"}), event("playedStream", name="n"), event("clearedAudio"), '{"event":"stop"}'])
def test_nothing_before_start(message: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        PlivoCodec().receive_message(message)
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER


def test_nothing_after_stop() -> None:
    codec = started()
    codec.receive_message(event("stop"))
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(media())
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER
