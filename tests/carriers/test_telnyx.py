"""The Telnyx media streaming codec on the documented message shapes (telephony-protocols.md §3.1)."""

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
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.telnyx.wire import TelnyxCodec, telnyx_format
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

SID = "32de0dea-53cb-4b21-89a4-9e1819c043bc"
CALL = "v3:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"
CONNECTED = '{"event":"connected","version":"1.0.0"}'


def start(
    encoding: object = "PCMU",
    sample_rate: object = 8000,
    params: object = None,
    seq: object = "1",
    **start_extra: object,
) -> str:
    body: dict[str, Any] = {
        "user_id": "3e6f995f-85f7-4705-9741-53b116d28237",
        "call_control_id": CALL,
        "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
        "from": "+13122010094",
        "to": "+13122123456",
        "custom_parameters": {"token": "abc", "n": 5} if params is None else params,
        "media_format": {"encoding": encoding, "sample_rate": sample_rate, "channels": 1},
        **start_extra,
    }
    return orjson.dumps({"event": "start", "sequence_number": seq, "stream_id": SID, "start": body}).decode()


START = start()


def media(seq: object = 2, payload: bytes = b"\xff" * 160, timestamp: object = None, sid: str = SID, **extra: object) -> str:
    number = _int(seq)
    ts = 20 * (number - 2) if timestamp is None and number is not None else timestamp
    body = {"track": "inbound", "chunk": str(number), "timestamp": ts, "payload": base64.b64encode(payload).decode()}
    return orjson.dumps({"event": "media", "sequence_number": seq, "stream_id": sid, "media": body, **extra}).decode()


def _int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        return None


def dtmf(seq: int, digit: str = "1") -> str:
    return orjson.dumps(
        {"event": "dtmf", "stream_id": SID, "occurred_at": "2025-06-05T08:54:19Z", "sequence_number": str(seq), "dtmf": {"digit": digit}}
    ).decode()


def started(**options: Any) -> TelnyxCodec:
    codec = TelnyxCodec(**options)
    assert codec.receive_message(CONNECTED) == [StreamConnected()]
    codec.receive_message(START)
    return codec


def frame_seqs(events: list[Any]) -> list[int]:
    """The sequence numbers of the media frames in ``events`` (each test frame's first byte is its number)."""
    return [e.payload[0] for e in events if isinstance(e, MediaReceived)]


def numbered(seq: int) -> str:
    return media(seq, bytes([seq]) * 160)


def feed(codec: TelnyxCodec, seqs: list[int]) -> list[Any]:
    events: list[Any] = []
    for seq in seqs:
        events += codec.receive_message(numbered(seq))
    return events


def test_start() -> None:
    codec = TelnyxCodec()
    (event,) = codec.receive_message(START)
    assert event == StreamStarted(CALL, SID, "3e6f995f-85f7-4705-9741-53b116d28237", AudioEncoding.PCMU, 8000, {"token": "abc", "n": "5"})
    assert codec.stream_id == SID and codec.call_id == CALL
    assert codec.profile.hang_up is HangUpMode.REST and codec.profile.marks_echoed_on_clear and codec.profile.frame_ms == 20


@pytest.mark.parametrize(
    ("encoding", "rate", "expected"),
    [
        ("PCMU", 8000, (AudioEncoding.PCMU, 8000)),
        ("audio/x-mulaw", "8000", (AudioEncoding.PCMU, 8000)),
        ("PCMA", 8000, (AudioEncoding.PCMA, 8000)),
        ("audio/x-alaw", None, (AudioEncoding.PCMA, 8000)),
        ("L16", 16000, (AudioEncoding.L16_BE, 16000)),
        ("L16", "24000", (AudioEncoding.L16_BE, 24000)),
        ("PCMU", 16000, None),
        ("L16", None, None),
        ("L16", 22050, None),
        ("G722", 16000, None),
        ("OPUS", 48000, None),
        (None, 8000, None),
    ],
)
def test_the_announced_format_decides(encoding: object, rate: object, expected: object) -> None:
    assert telnyx_format(encoding, rate) == expected


def test_pcma_and_l16_streams_start_with_their_format() -> None:
    (pcma,) = TelnyxCodec().receive_message(start("PCMA"))
    (l16,) = TelnyxCodec().receive_message(start("L16", "16000"))
    assert isinstance(pcma, StreamStarted) and (pcma.encoding, pcma.rate_hz) == (AudioEncoding.PCMA, 8000)
    assert isinstance(l16, StreamStarted) and (l16.encoding, l16.rate_hz) == (AudioEncoding.L16_BE, 16000)


def test_custom_parameters_as_a_list_of_name_value() -> None:
    (event,) = TelnyxCodec().receive_message(start(params=[{"name": "token", "value": "t-1"}, {"name": "x", "value": 2}]))
    assert isinstance(event, StreamStarted) and event.custom_parameters == {"token": "t-1", "x": "2"}


def test_token_from_client_state_when_no_custom_parameter_has_it() -> None:
    state = base64.b64encode(b'{"token":"from-state"}').decode()
    (event,) = TelnyxCodec().receive_message(start(params={}, client_state=state))
    assert isinstance(event, StreamStarted) and event.custom_parameters == {"token": "from-state"}
    (other,) = TelnyxCodec().receive_message(start(params={}, client_state="aGF2ZSBhIG5pY2UgZGF5ID1d"))  # not ours
    assert isinstance(other, StreamStarted) and other.custom_parameters == {}


@pytest.mark.parametrize(("timestamp", "expected"), [("40", 40), (40, 40), ("0", 0)])
def test_media_numbers_as_strings_or_numbers(timestamp: object, expected: int) -> None:
    assert started().receive_message(media("2", timestamp=timestamp)) == [MediaReceived(b"\xff" * 160, expected)]


def test_media_without_timestamp_or_sequence_number_passes_in_arrival_order() -> None:
    codec = started()
    raw = {"event": "media", "stream_id": SID, "media": {"payload": base64.b64encode(b"\x01" * 80).decode()}}
    assert codec.receive_message(orjson.dumps(raw).decode()) == [MediaReceived(b"\x01" * 80, None)]


@pytest.mark.parametrize("size", [1, 80, 160, 333, 8000])
def test_media_of_any_length(size: int) -> None:
    (event,) = started().receive_message(media(payload=bytes(range(256)) * (size // 256) + bytes(size % 256)))
    assert isinstance(event, MediaReceived) and len(event.payload) == size


def test_l16_payload_is_passed_as_sent_and_must_be_whole_samples() -> None:
    codec = TelnyxCodec()
    codec.receive_message(start("L16", 16000))
    assert codec.receive_message(media(payload=b"\x12\x34" * 320)) == [MediaReceived(b"\x12\x34" * 320, 0)]
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(media(3, payload=b"\x12\x34\x56"))
    assert exc.value.reason is ProtocolErrorReason.BAD_FIELD


def test_outbound_track_frames_are_not_caller_audio_but_hold_their_place() -> None:
    codec = started()
    outbound = orjson.loads(numbered(3))
    outbound["media"]["track"] = "outbound"
    assert frame_seqs(feed(codec, [2])) == [2]
    assert feed(codec, [4]) == []  # waits for 3
    assert codec.receive_message(orjson.dumps(outbound).decode()) == [MediaReceived(bytes([4]) * 160, 40)]
    assert codec.gaps == 0


def test_unknown_fields_are_ignored() -> None:
    (event,) = started().receive_message(media(extra_field={"x": 1}))
    assert isinstance(event, MediaReceived)


def test_dtmf_mark_error_stop() -> None:
    codec = started()
    assert codec.receive_message(dtmf(2, "7")) == [DtmfReceived("7")]
    assert codec.receive_message(dtmf(3, "a")) == [DtmfReceived("A")]
    assert codec.receive_message(f'{{"event":"mark","stream_id":"{SID}","mark":{{"name":"resp-1@100"}}}}') == [MarkEchoed("resp-1@100")]
    error = {"event": "error", "stream_id": SID, "sequence_number": "4", "error": {"title": "rate_limit_reached", "code": "100005", "detail": "Too many requests"}}
    assert codec.receive_message(orjson.dumps(error).decode()) == [CarrierNotice("error", "100005 rate_limit_reached: Too many requests")]
    stop = {"event": "stop", "sequence_number": "5", "stream_id": SID, "stop": {"user_id": "u", "call_control_id": CALL}}
    assert codec.receive_message(orjson.dumps(stop).decode()) == [StreamStopped()]
    assert codec.stopped


def test_error_frame_without_stream_id_is_a_notice() -> None:
    (notice,) = started().receive_message('{"event":"error","error":{"code":"100003","title":"malformed_frame"}}')
    assert isinstance(notice, CarrierNotice) and "100003" in notice.detail


class TestReordering:
    def test_in_order_frames_pass_at_once(self) -> None:
        codec = started()
        for seq in range(2, 12):
            assert frame_seqs(codec.receive_message(numbered(seq))) == [seq]
        assert codec.reordered == codec.gaps == codec.duplicates_dropped == 0

    def test_a_swapped_pair_is_put_back_in_place(self) -> None:
        codec = started()
        assert frame_seqs(feed(codec, [2, 4])) == [2]
        assert frame_seqs(codec.receive_message(numbered(3))) == [3, 4]
        assert codec.reordered == 1

    def test_timestamps_follow_the_frames(self) -> None:
        codec = started()
        events = feed(codec, [3, 2, 5, 4])
        assert [e.timestamp_ms for e in events] == [0, 20, 40, 60]

    def test_a_gap_is_given_up_when_the_window_is_full(self) -> None:
        codec = started(reorder_window=3)
        assert frame_seqs(feed(codec, [2, 4, 5, 6])) == [2]  # 3 is missing; 3 frames held
        assert frame_seqs(codec.receive_message(numbered(7))) == [4, 5, 6, 7]  # the fourth overflows the window
        assert codec.gaps == 1
        (notice,) = codec.receive_message(numbered(3))  # too late
        assert isinstance(notice, CarrierNotice) and notice.name == "media_dropped" and codec.late_dropped == 1

    def test_the_released_frames_carry_the_timestamps_for_the_silence(self) -> None:
        codec = started(reorder_window=1)
        events = feed(codec, [2, 4, 5])
        assert [(e.payload[0], e.timestamp_ms) for e in events] == [(2, 0), (4, 40), (5, 60)]  # 20-40 ms is the gap

    def test_duplicates_are_dropped_and_counted(self) -> None:
        codec = started()
        events = feed(codec, [2, 2, 4, 4, 3])
        assert frame_seqs(events) == [2, 3, 4]
        assert codec.duplicates_dropped == 2
        assert [e.name for e in events if isinstance(e, CarrierNotice)] == ["media_dropped"] * 2

    def test_control_messages_take_their_numbers(self) -> None:
        codec = started()
        assert frame_seqs(feed(codec, [2, 4])) == [2]
        assert codec.receive_message(dtmf(3)) == [DtmfReceived("1"), MediaReceived(bytes([4]) * 160, 40)]
        assert codec.gaps == 0

    def test_stop_releases_what_is_held_first(self) -> None:
        codec = started()
        assert frame_seqs(feed(codec, [2, 5, 4])) == [2]
        events = codec.receive_message(f'{{"event":"stop","sequence_number":"7","stream_id":"{SID}"}}')
        assert frame_seqs(events) == [4, 5] and events[-1] == StreamStopped()

    def test_a_frame_may_run_ahead_of_start_numbering(self) -> None:
        codec = TelnyxCodec()
        codec.receive_message(start(seq=None))
        assert frame_seqs(feed(codec, [7, 8])) == [7, 8]  # no start number: the first frame sets the baseline

    def test_no_window_releases_every_gap_at_once(self) -> None:
        codec = started(reorder_window=0)
        assert frame_seqs(feed(codec, [2, 4, 3, 5])) == [2, 4, 5]
        assert codec.late_dropped == 1


def test_outbound_messages() -> None:
    codec = started()
    sent = orjson.loads(codec.send(SendMedia(b"\x01\x02\xff")))  # type: ignore[arg-type]
    assert sent == {"event": "media", "stream_id": SID, "media": {"payload": base64.b64encode(b"\x01\x02\xff").decode()}}
    assert orjson.loads(codec.send(SendMark('resp-"1"@20'))) == {"event": "mark", "stream_id": SID, "mark": {"name": 'resp-"1"@20'}}  # type: ignore[arg-type]
    assert orjson.loads(codec.send(SendClear())) == {"event": "clear", "stream_id": SID}  # type: ignore[arg-type]
    assert codec.send(HangUp("done")) is None


def test_send_before_start_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        TelnyxCodec().send(SendClear())


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00\x01", ProtocolErrorReason.BINARY_FRAME),
        ("not json", ProtocolErrorReason.NOT_JSON),
        ("[1]", ProtocolErrorReason.NOT_AN_OBJECT),
        ('{"no":"event"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":["media"],"stream_id":"' + SID + '"}', ProtocolErrorReason.BAD_FIELD),
        (media(sid="00000000-0000-0000-0000-000000000000"), ProtocolErrorReason.WRONG_STREAM),
        ('{"event":"media","sequence_number":"2","media":{"payload":""}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"media","stream_id":"' + SID + '","media":{}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"media","stream_id":"' + SID + '","media":"x"}', ProtocolErrorReason.MISSING_FIELD),
        (media().replace('"payload":"', '"payload":"!!'), ProtocolErrorReason.BAD_BASE64),
        (media(timestamp="soon"), ProtocolErrorReason.BAD_FIELD),
        (media(timestamp=-20), ProtocolErrorReason.BAD_FIELD),
        (media(seq="two"), ProtocolErrorReason.BAD_FIELD),
        (media(seq=-1), ProtocolErrorReason.BAD_FIELD),
        (media().replace('"track":"inbound"', '"track":"sideways"'), ProtocolErrorReason.BAD_FIELD),
        ('{"event":"mark","stream_id":"' + SID + '","mark":{}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"mark","mark":{"name":"n"}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"dtmf","stream_id":"' + SID + '","dtmf":{"digit":"x"}}', ProtocolErrorReason.BAD_FIELD),
        ('{"event":"dtmf","stream_id":"' + SID + '"}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"error","stream_id":"someone-else","error":{}}', ProtocolErrorReason.WRONG_STREAM),
        ('{"event":"stop","stream_id":"' + SID + '","stop":{"call_control_id":"v3:other"}}', ProtocolErrorReason.WRONG_STREAM),
        (START, ProtocolErrorReason.OUT_OF_ORDER),
        (CONNECTED, ProtocolErrorReason.OUT_OF_ORDER),
        ("x" * 300_000, ProtocolErrorReason.OVERSIZED),
    ],
)
def test_bad_input_after_start(message: str | bytes, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        started().receive_message(message)
    assert exc.value.reason is reason
    assert exc.value.provider == "telnyx" and exc.value.stream_id == SID and exc.value.call_id == CALL


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (start("G722", 16000), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start("PCMU", 16000), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (start("L16", None), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (START.replace('"channels":1', '"channels":2'), ProtocolErrorReason.UNSUPPORTED_FORMAT),
        (START.replace(',"media_format":{"encoding":"PCMU","sample_rate":8000,"channels":1}', ""), ProtocolErrorReason.MISSING_FIELD),
        (START.replace(CALL, 'v3:\\"x'), ProtocolErrorReason.BAD_FIELD),
        (START.replace(CALL, "v3:a/b"), ProtocolErrorReason.BAD_FIELD),
        (START.replace(f'"stream_id":"{SID}"', '"stream_id":"a b"'), ProtocolErrorReason.BAD_FIELD),
        (START.replace(f'"stream_id":"{SID}",', ""), ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"start","stream_id":"s","start":{"media_format":{"encoding":"PCMU"}}}', ProtocolErrorReason.MISSING_FIELD),
        ('{"event":"start","stream_id":"s"}', ProtocolErrorReason.MISSING_FIELD),
        (start(params="token=abc"), ProtocolErrorReason.BAD_FIELD),
        (start(params=[{"value": "abc"}]), ProtocolErrorReason.BAD_FIELD),
        (start(seq="first"), ProtocolErrorReason.BAD_FIELD),
    ],
)
def test_bad_start(message: str, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        TelnyxCodec().receive_message(message)
    assert exc.value.reason is reason


@pytest.mark.parametrize(
    "message",
    [media(), f'{{"event":"mark","stream_id":"{SID}","mark":{{"name":"n"}}}}', f'{{"event":"stop","stream_id":"{SID}"}}', dtmf(2)],
)
def test_nothing_before_start(message: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        TelnyxCodec().receive_message(message)
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER


def test_nothing_after_stop() -> None:
    codec = started()
    codec.receive_message(f'{{"event":"stop","stream_id":"{SID}"}}')
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(media())
    assert exc.value.reason is ProtocolErrorReason.OUT_OF_ORDER


def test_reorder_window_cannot_be_negative() -> None:
    with pytest.raises(ValueError):
        TelnyxCodec(reorder_window=-1)
