"""jambonz's ``listen`` codec against the wire facts of ``docs/carriers/jambonz.md``, its webhook signature, and the
``listen`` verb the bridge answers."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import orjson
import pytest

from callbridge.carriers.base import (
    DtmfReceived,
    HangUp,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamStarted,
    UnknownCarrierEvent,
)
from callbridge.carriers.jambonz.http import jambonz_signature, listen_verbs, valid_signature
from callbridge.carriers.jambonz.settings import JambonzSettings
from callbridge.carriers.jambonz.wire import JAMBONZ_PROFILE, JambonzCodec
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

CALL = "9f1c6e2a-36bd-4c3c-9d2b-7d6c1a2b3c4d"
FIRST: dict[str, Any] = {
    "sampleRate": 16000, "mixType": "mono", "callSid": CALL, "direction": "inbound", "from": "+15083728299",
    "to": "+15083871234", "callId": "a1b2@10.0.0.1", "accountSid": "acc-1", "callbridge_token": "t0k",
}  # fmt: skip


def j(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


def started() -> JambonzCodec:
    codec = JambonzCodec()
    codec.receive_message(j(FIRST))
    return codec


def test_the_first_frame_starts_the_stream_then_binary_audio_and_digits() -> None:
    codec = JambonzCodec()
    (start,) = codec.receive_message(j(FIRST))
    assert isinstance(start, StreamStarted)
    assert (start.call_id, start.encoding, start.rate_hz, start.account_id) == (CALL, AudioEncoding.L16, 16000, "acc-1")
    assert start.stream_id.startswith(CALL + "~") and start.custom_parameters["token"] == "t0k"
    assert start.custom_parameters["from"] == "+15083728299"
    assert codec.receive_message(b"\x01\x00" * 320) == [MediaReceived(b"\x01\x00" * 320)]
    assert codec.receive_message(j({"event": "dtmf", "dtmf": "5", "duration": "800"})) == [DtmfReceived("5")]
    assert codec.receive_message(j({"type": "playDone", "data": {}})) == [UnknownCarrierEvent("playDone")]
    assert codec.profile == JAMBONZ_PROFILE and not codec.profile.uses_marks


def test_each_listen_is_its_own_stream() -> None:
    assert started().stream_id != started().stream_id


def test_it_writes_binary_audio_kill_audio_and_disconnect() -> None:
    codec = started()
    assert codec.send(SendMedia(b"\x00\x01" * 320)) == b"\x00\x01" * 320
    assert orjson.loads(codec.send(SendClear()) or "") == {"type": "killAudio"}
    assert orjson.loads(codec.send(HangUp("agent_ended_the_call")) or "") == {"type": "disconnect"}
    assert codec.send(SendMark("r@200")) is None


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([b"\x00\x00"], ProtocolErrorReason.OUT_OF_ORDER),  # audio before the first frame
        ([j({**FIRST, "callSid": None})], ProtocolErrorReason.MISSING_FIELD),
        ([j({**FIRST, "callSid": "has space"})], ProtocolErrorReason.BAD_FIELD),
        ([j({**FIRST, "sampleRate": 44100})], ProtocolErrorReason.UNSUPPORTED_FORMAT),
        ([j({**FIRST, "mixType": "stereo"})], ProtocolErrorReason.UNSUPPORTED_FORMAT),
        ([j(FIRST), b"\x00\x01\x02"], ProtocolErrorReason.BAD_FIELD),
        ([j(FIRST), bytes(16000 * 2)], ProtocolErrorReason.OVERSIZED),
        ([j(FIRST), j({"event": "dtmf", "dtmf": "X"})], ProtocolErrorReason.BAD_FIELD),
        ([j(FIRST), j({"event": 7})], ProtocolErrorReason.BAD_FIELD),
        ([j(FIRST), j({"data": 1})], ProtocolErrorReason.MISSING_FIELD),
        (["{not json"], ProtocolErrorReason.NOT_JSON),
    ],
)
def test_what_breaks_the_protocol_ends_the_stream_with_its_reason(messages: list[str | bytes], reason: ProtocolErrorReason) -> None:
    codec = JambonzCodec()
    with pytest.raises(RemoteProtocolError) as raised:
        for message in messages:
            codec.receive_message(message)
    assert raised.value.reason is reason and raised.value.provider == "jambonz"


def test_the_signature_is_jambonz_s_hmac_of_the_timestamp_and_body_within_five_minutes() -> None:
    body = b'{"call_sid":"x"}'
    header = jambonz_signature("s3cret", 1_764_000_000, body)
    expected = hmac.new(b"s3cret", b"1764000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1764000000,v1={expected}"
    assert valid_signature("s3cret", header, body, 1_764_000_100)
    assert not valid_signature("s3cret", header, body, 1_764_000_301)  # too old
    assert not valid_signature("other", header, body, 1_764_000_000)
    assert not valid_signature("s3cret", header, body + b" ", 1_764_000_000)
    assert not valid_signature("s3cret", "t=abc,v1=00", body, 1_764_000_000)
    assert not valid_signature("s3cret", None, body, 1_764_000_000)


def test_the_answer_is_one_bidirectional_streaming_listen_with_the_token() -> None:
    config = JambonzSettings(ws_username="jz", ws_password="pw", sample_rate_hz=8000)  # type: ignore[arg-type]
    (listen,) = orjson.loads(listen_verbs("https://bridge.example.com", "tok", config))
    assert listen["verb"] == "listen" and listen["url"] == "wss://bridge.example.com/jambonz/media"
    assert listen["bidirectionalAudio"] == {"enabled": True, "streaming": True, "sampleRate": 8000} and listen["sampleRate"] == 8000
    assert listen["metadata"] == {"callbridge_token": "tok"} and listen["passDtmf"] is True
    assert listen["actionHook"] == "https://bridge.example.com/jambonz/action"
    assert listen["wsAuth"] == {"username": "jz", "password": "pw"}
