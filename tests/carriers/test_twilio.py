"""The Twilio Media Streams codec on recorded message shapes (telephony-protocols.md §1.2–1.3)."""

from __future__ import annotations

import base64

import orjson
import pytest

from callbridge.carriers.base import (
    DtmfReceived,
    MarkEchoed,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL = "CA00000000000000000000000000000001"
CONNECTED = '{"event":"connected","protocol":"Call","version":"1.0.0"}'
START = orjson.dumps(
    {
        "event": "start",
        "sequenceNumber": "1",
        "start": {
            "streamSid": SID,
            "accountSid": "AC0000",
            "callSid": CALL,
            "tracks": ["inbound"],
            "customParameters": {"token": "abc", "n": 5},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
        "streamSid": SID,
    }
).decode()


def media(payload: bytes = b"\xff" * 160, timestamp: object = "20", sid: str = SID, **extra: object) -> str:
    body = {"track": "inbound", "chunk": "2", "timestamp": timestamp, "payload": base64.b64encode(payload).decode()}
    return orjson.dumps({"event": "media", "sequenceNumber": "3", "media": body, "streamSid": sid, **extra}).decode()


def started() -> TwilioCodec:
    codec = TwilioCodec()
    assert codec.receive_message(CONNECTED) == [StreamConnected()]
    codec.receive_message(START)
    return codec


def test_start() -> None:
    codec = TwilioCodec()
    (event,) = codec.receive_message(START)
    assert event == StreamStarted(CALL, SID, "AC0000", AudioEncoding.PCMU, 8000, {"token": "abc", "n": "5"})
    assert codec.stream_id == SID and codec.call_id == CALL


@pytest.mark.parametrize(("timestamp", "expected"), [("20", 20), (20, 20), (None, None)])
def test_media_numbers_as_strings_or_numbers(timestamp: object, expected: int | None) -> None:
    assert started().receive_message(media(timestamp=timestamp)) == [MediaReceived(b"\xff" * 160, expected)]


@pytest.mark.parametrize("size", [1, 80, 160, 333, 8000])
def test_media_of_any_length(size: int) -> None:
    (event,) = started().receive_message(media(bytes(range(256)) * (size // 256) + bytes(size % 256)))
    assert isinstance(event, MediaReceived) and len(event.payload) == size


def test_unknown_fields_are_ignored() -> None:
    (event,) = started().receive_message(media(extra_field={"x": 1}))
    assert isinstance(event, MediaReceived)


def test_dtmf_mark_stop() -> None:
    codec = started()
    assert codec.receive_message(f'{{"event":"dtmf","streamSid":"{SID}","sequenceNumber":"5","dtmf":{{"track":"inbound_track","digit":"7"}}}}') == [DtmfReceived("7")]
    assert codec.receive_message(f'{{"event":"mark","sequenceNumber":"4","streamSid":"{SID}","mark":{{"name":"resp-1:100"}}}}') == [MarkEchoed("resp-1:100")]
    assert codec.receive_message(f'{{"event":"stop","sequenceNumber":"6","stop":{{"accountSid":"AC0000","callSid":"{CALL}"}},"streamSid":"{SID}"}}') == [StreamStopped()]
    assert codec.stopped


def test_outbound_messages_are_exactly_the_three_documented() -> None:
    codec = started()
    sent = orjson.loads(codec.send(SendMedia(b"\x01\x02\xff")))
    assert sent == {"event": "media", "streamSid": SID, "media": {"payload": base64.b64encode(b"\x01\x02\xff").decode()}}
    assert orjson.loads(codec.send(SendMark('resp-"1":20'))) == {"event": "mark", "streamSid": SID, "mark": {"name": 'resp-"1":20'}}
    assert orjson.loads(codec.send(SendClear())) == {"event": "clear", "streamSid": SID}


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00\x01", ProtocolErrorReason.BINARY_FRAME),
        ("not json", ProtocolErrorReason.NOT_JSON),
        ("[1]", ProtocolErrorReason.NOT_AN_OBJECT),
        ('{"no":"event"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":7,"streamSid":"' + SID + '"}', ProtocolErrorReason.BAD_FIELD),
        (media(sid="MZother"), ProtocolErrorReason.WRONG_STREAM),
        ('{"event":"media","media":{"payload":""}}', ProtocolErrorReason.MISSING_FIELD),
        (media().replace('"payload":"', '"payload":"!!'), ProtocolErrorReason.BAD_BASE64),
        (media(timestamp="soon"), ProtocolErrorReason.BAD_FIELD),
        ('{"event":"mark","streamSid":"' + SID + '","mark":{}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"dtmf","streamSid":"' + SID + '","dtmf":{"digit":"x"}}', ProtocolErrorReason.BAD_FIELD),
        (START, ProtocolErrorReason.OUT_OF_ORDER),
        (CONNECTED, ProtocolErrorReason.OUT_OF_ORDER),
        ("x" * 300_000, ProtocolErrorReason.OVERSIZED),
    ],
)
def test_bad_input_after_start(message: str | bytes, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        started().receive_message(message)
    assert exc.value.reason is reason
    assert exc.value.provider == "twilio"


@pytest.mark.parametrize(
    ("start", "reason"),
    [
        (START.replace("audio/x-mulaw", "audio/x-l16"), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (START.replace('"sampleRate":8000', '"sampleRate":16000'), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (START.replace(f'"callSid":"{CALL}"', '"callSid":"CA\\"x"'), ProtocolErrorReason.BAD_FIELD),
        ('{"event":"start","start":{"callSid":"CA1"}}', ProtocolErrorReason.MISSING_FIELD),
        (START.replace(f'"streamSid":"{SID}"}}', '"streamSid":"MZelse"}'), ProtocolErrorReason.WRONG_STREAM),
    ],
)
def test_bad_start(start: str, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        TwilioCodec().receive_message(start)
    assert exc.value.reason is reason


@pytest.mark.parametrize("message", [media(), '{"event":"mark","streamSid":"x","mark":{"name":"n"}}', '{"event":"stop","streamSid":"x"}'])
def test_nothing_before_start(message: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        TwilioCodec().receive_message(message)
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER


def test_nothing_after_stop() -> None:
    codec = started()
    codec.receive_message(f'{{"event":"stop","streamSid":"{SID}"}}')
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(media())
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER
