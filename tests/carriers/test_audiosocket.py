"""The Asterisk AudioSocket codec on the frame layouts of ``res_audiosocket`` (telephony-protocols.md §4.1)."""

from __future__ import annotations

import uuid

import pytest

from callbridge.carriers.audiosocket.wire import (
    AUDIO_KINDS,
    HANGUP_FRAME,
    PROFILE,
    AudioSocketCodec,
    first_frame_bytes,
    frame,
    peek_call_id,
)
from callbridge.carriers.base import (
    CarrierNotice,
    DtmfReceived,
    HangUp,
    HangUpMode,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
    UnknownCarrierEvent,
)
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

CALL = uuid.UUID("40325ec2-5efd-4bd3-805f-53576e581d13")
UUID_FRAME = b"\x01\x00\x10" + CALL.bytes
PCM_20MS_8K = bytes(range(256)) + bytes(64)  # 320 bytes: 160 samples
SLIN = b"\x10\x01\x40" + PCM_20MS_8K  # kind 0x10, length 0x0140 = 320, big-endian


def connected(connection: int = 7) -> AudioSocketCodec:
    codec = AudioSocketCodec(connection)
    assert codec.receive_message(UUID_FRAME) == [StreamConnected()]
    return codec


def started() -> AudioSocketCodec:
    codec = connected()
    codec.receive_message(SLIN)
    return codec


def reason_of(codec: AudioSocketCodec, message: str | bytes) -> ProtocolErrorReason:
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(message)
    assert exc.value.provider == "audiosocket"
    return exc.value.reason


def test_header_layout_is_kind_then_big_endian_length() -> None:
    assert frame(0x10, PCM_20MS_8K) == SLIN
    assert frame(0x12, b"\x01\x02" * 300)[:3] == b"\x12\x02\x58"  # 600 = 0x0258
    assert HANGUP_FRAME == b"\x00\x00\x00"


def test_uuid_frame_is_the_call_id_and_the_first_audio_frame_starts_the_stream() -> None:
    codec = connected(connection=7)
    assert codec.call_id == str(CALL) and codec.stream_id == f"{CALL}#7" and not codec.started
    events = codec.receive_message(SLIN)
    assert events == [
        StreamStarted(str(CALL), f"{CALL}#7", None, AudioEncoding.L16, 8000, {}),
        MediaReceived(PCM_20MS_8K, None),
    ]
    assert codec.started and codec.rate_hz == 8000
    assert codec.receive_message(SLIN) == [MediaReceived(PCM_20MS_8K, None)]


def test_the_call_id_is_the_canonical_lower_case_uuid() -> None:
    upper = uuid.UUID("ABCDEF01-2345-6789-ABCD-EF0123456789")
    codec = AudioSocketCodec()
    codec.receive_message(frame(0x01, upper.bytes))
    assert codec.call_id == "abcdef01-2345-6789-abcd-ef0123456789"


@pytest.mark.parametrize(("kind", "rate"), sorted(AUDIO_KINDS.items()))
def test_every_audio_kind_fixes_its_rate(kind: int, rate: int) -> None:
    codec = connected()
    payload = b"\x01\x00" * (rate // 50)  # 20 ms
    started_event, media = codec.receive_message(frame(kind, payload))
    assert isinstance(started_event, StreamStarted) and started_event.rate_hz == rate
    assert started_event.encoding is AudioEncoding.L16 and media == MediaReceived(payload, None)


def test_slin16_is_kind_0x12_in_current_asterisk() -> None:
    codec = connected()
    event = codec.receive_message(frame(0x12, bytes(640)))[0]
    assert isinstance(event, StreamStarted) and event.rate_hz == 16000


def test_a_change_of_audio_kind_mid_stream_is_unsupported() -> None:
    assert reason_of(started(), frame(0x12, bytes(640))) is ProtocolErrorReason.UNSUPPORTED_FORMAT


def test_frames_split_across_chunks_and_several_per_chunk() -> None:
    stream = UUID_FRAME + SLIN + frame(0x03, b"5") + SLIN + frame(0x10, b"\x02\x00" * 80)
    whole = AudioSocketCodec().receive_message(stream)
    for size in (1, 2, 3, 4, 17, 100, 323, 500):
        codec = AudioSocketCodec()
        events = []
        for i in range(0, len(stream), size):
            events.extend(codec.receive_message(stream[i : i + size]))
        assert events == whole, size
    assert [type(e) for e in whole] == [StreamConnected, StreamStarted, MediaReceived, DtmfReceived, MediaReceived, MediaReceived]


def test_a_header_split_before_its_length() -> None:
    codec = connected()
    assert codec.receive_message(b"\x10") == []
    assert codec.receive_message(b"\x01") == []
    assert codec.receive_message(b"\x40" + PCM_20MS_8K[:100]) == []
    events = codec.receive_message(PCM_20MS_8K[100:])
    assert events[-1] == MediaReceived(PCM_20MS_8K, None)


@pytest.mark.parametrize("digit", list("0123456789*#ABCD"))
def test_dtmf_is_one_ascii_byte(digit: str) -> None:
    assert started().receive_message(frame(0x03, digit.encode())) == [DtmfReceived(digit)]


def test_lower_case_dtmf_letters_are_accepted() -> None:
    assert started().receive_message(frame(0x03, b"b")) == [DtmfReceived("B")]


def test_dtmf_before_the_first_audio_follows_the_start() -> None:
    codec = connected()
    assert codec.receive_message(frame(0x03, b"1") + frame(0x03, b"#")) == []
    events = codec.receive_message(SLIN)
    assert [type(e) for e in events] == [StreamStarted, DtmfReceived, DtmfReceived, MediaReceived]
    assert events[1:3] == [DtmfReceived("1"), DtmfReceived("#")]


def test_hangup_from_asterisk_stops_the_stream() -> None:
    codec = started()
    assert codec.receive_message(HANGUP_FRAME) == [StreamStopped()]
    assert reason_of(codec, SLIN) is ProtocolErrorReason.OUT_OF_ORDER


def test_hangup_before_any_audio_is_a_notice() -> None:
    codec = connected()
    (event,) = codec.receive_message(HANGUP_FRAME)
    assert isinstance(event, CarrierNotice) and event.name == "hangup_before_audio"


def test_error_caller_hung_up_stops_the_stream() -> None:
    assert started().receive_message(frame(0xFF, b"\x01")) == [StreamStopped()]


@pytest.mark.parametrize(("payload", "detail"), [(b"\x02", "frame forwarding error"), (b"\x04", "memory error"), (b"", "no code")])
def test_other_errors_are_notices(payload: bytes, detail: str) -> None:
    codec = started()
    (event,) = codec.receive_message(frame(0xFF, payload))
    assert isinstance(event, CarrierNotice) and event.name == "error" and detail in event.detail
    assert codec.receive_message(SLIN) == [MediaReceived(PCM_20MS_8K, None)]  # the stream goes on


def test_silence_frames_of_the_original_protocol_are_ignored() -> None:
    assert started().receive_message(frame(0x02)) == []


def test_an_empty_audio_frame_carries_nothing() -> None:
    codec = connected()
    assert codec.receive_message(frame(0x10)) == []
    assert not codec.started


# ---------------------------------------------------------------- bad input


def test_audio_before_the_uuid_frame() -> None:
    assert reason_of(AudioSocketCodec(), SLIN) is ProtocolErrorReason.OUT_OF_ORDER


def test_dtmf_before_the_uuid_frame() -> None:
    assert reason_of(AudioSocketCodec(), frame(0x03, b"1")) is ProtocolErrorReason.OUT_OF_ORDER


def test_a_second_uuid_frame() -> None:
    assert reason_of(started(), UUID_FRAME) is ProtocolErrorReason.OUT_OF_ORDER


@pytest.mark.parametrize("length", [0, 15, 17, 36])
def test_uuid_of_the_wrong_length(length: int) -> None:
    assert reason_of(AudioSocketCodec(), frame(0x01, bytes(length))) is ProtocolErrorReason.BAD_FIELD


def test_uuid_string_instead_of_raw_bytes() -> None:
    assert reason_of(AudioSocketCodec(), frame(0x01, str(CALL).encode())) is ProtocolErrorReason.BAD_FIELD


@pytest.mark.parametrize("kind", [0x04, 0x05, 0x0F, 0x19, 0x20, 0x7F, 0xFE])
def test_a_kind_asterisk_added_since_is_skipped(kind: int) -> None:
    """Fail open on the unknown: its payload is skipped, counted by the driver, and the call goes on."""
    codec = started()
    assert codec.receive_message(frame(kind, b"\x00\x00") + frame(0x10, bytes(320))) == [
        UnknownCarrierEvent(f"0x{kind:02x}"), MediaReceived(bytes(320), None)
    ]


def test_an_unknown_kind_before_the_uuid_or_too_long_for_a_control_frame_fails_at_its_header() -> None:
    assert reason_of(AudioSocketCodec(), b"\x42\x00\x02") is ProtocolErrorReason.UNKNOWN_EVENT
    assert reason_of(started(), b"\x42\x01\x01") is ProtocolErrorReason.UNKNOWN_EVENT  # 257 bytes: out of step


def test_garbage_where_the_uuid_should_be() -> None:
    assert reason_of(AudioSocketCodec(), b"GET / HTTP/1.1\r\n\r\n") is ProtocolErrorReason.UNKNOWN_EVENT


@pytest.mark.parametrize("payload", [b"", b"12", b"x", b"\x00", b"E"])
def test_bad_dtmf(payload: bytes) -> None:
    assert reason_of(started(), frame(0x03, payload)) is ProtocolErrorReason.BAD_FIELD


def test_odd_length_pcm16() -> None:
    assert reason_of(connected(), frame(0x10, bytes(321))) is ProtocolErrorReason.BAD_FIELD


def test_oversized_control_frames() -> None:
    assert reason_of(started(), b"\xff\x10\x00") is ProtocolErrorReason.OVERSIZED
    assert reason_of(started(), b"\x00\x01\x01") is ProtocolErrorReason.OVERSIZED


def test_too_many_bytes_buffered() -> None:
    codec = AudioSocketCodec(max_buffer_bytes=1024)
    codec.receive_message(UUID_FRAME + b"\x10\xff\xfe")  # a 65534-byte frame begins: legal, buffered
    codec.receive_message(bytes(1000))
    assert reason_of(codec, bytes(100)) is ProtocolErrorReason.OVERSIZED


def test_a_text_message() -> None:
    assert reason_of(AudioSocketCodec(), "hello") is ProtocolErrorReason.BAD_FIELD


def test_too_many_digits_before_any_audio() -> None:
    codec = connected()
    codec.receive_message(frame(0x03, b"1") * 16)
    assert reason_of(codec, frame(0x03, b"1")) is ProtocolErrorReason.FLOOD


def test_errors_carry_the_call() -> None:
    codec = started()
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message(frame(0x03, b"x"))
    assert exc.value.call_id == str(CALL) and exc.value.stream_id == f"{CALL}#7"


# ---------------------------------------------------------------- out


def test_media_goes_out_in_the_stream_kind() -> None:
    codec = connected()
    codec.receive_message(frame(0x12, bytes(640)))
    assert codec.send(SendMedia(b"\x01\x02" * 320)) == b"\x12\x02\x80" + b"\x01\x02" * 320


def test_media_before_the_stream_started_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        connected().send(SendMedia(bytes(320)))


def test_no_empty_audio_frames() -> None:
    assert started().send(SendMedia(b"")) is None


def test_payloads_beyond_a_frame_are_split_into_whole_samples() -> None:
    payload = bytes(range(256)) * 300  # 76800 bytes
    message = started().send(SendMedia(payload))
    assert message is not None
    first_length = int.from_bytes(message[1:3], "big")
    assert message[0] == 0x10 and first_length % 2 == 0
    second = message[3 + first_length :]
    assert second[0] == 0x10 and int.from_bytes(second[1:3], "big") == len(payload) - first_length
    assert message[3 : 3 + first_length] + second[3:] == payload


def test_marks_and_clears_send_nothing_and_hang_up_is_in_band() -> None:
    codec = started()
    assert codec.send(SendMark("r1@100")) is None and codec.send(SendClear()) is None
    assert codec.send(HangUp("agent_done")) == b"\x00\x00\x00"


def test_profile() -> None:
    assert PROFILE.hang_up is HangUpMode.IN_BAND and not PROFILE.uses_marks and not PROFILE.flushes
    assert PROFILE.frame_ms == 20 and PROFILE.lead_ms == 3 * PROFILE.frame_ms  # room to catch up a late send


# ---------------------------------------------------------------- the listener's peek


def test_peek_call_id() -> None:
    assert first_frame_bytes(b"\x01\x00") is None
    assert first_frame_bytes(UUID_FRAME[:5]) == 19
    assert peek_call_id(UUID_FRAME[:18]) is None
    assert peek_call_id(UUID_FRAME + SLIN) == str(CALL)
    assert first_frame_bytes(SLIN[:4]) == 4 and peek_call_id(SLIN) is None  # not a uuid: the codec rejects it
