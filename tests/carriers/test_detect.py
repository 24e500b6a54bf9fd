"""Recognising the carrier from its first messages (telephony-protocols.md §0–3), then delegating."""

from __future__ import annotations

import base64

import orjson
import pytest

from callbridge.carriers.base import (
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    StreamConnected,
    StreamStarted,
)
from callbridge.carriers.generic.wire import DetectingCodec
from callbridge.carriers.twilio.wire import ACCOUNT_PARAM
from callbridge.codecs import AudioEncoding

pytestmark = pytest.mark.core

ULAW_20MS = base64.b64encode(b"\xff" * 160).decode()


def dumps(payload: object) -> str:
    return orjson.dumps(payload).decode()


FIRST_MESSAGES: dict[str, list[str]] = {
    "twilio": [
        '{"event":"connected","protocol":"Call","version":"1.0.0"}',
        dumps({"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
            "streamSid": "MZ1", "accountSid": "AC" + "0" * 32, "callSid": "CA1", "tracks": ["inbound"], "customParameters": {"token": "t"},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}),
    ],
    "signalwire": [
        '{"event":"connected","protocol":"Call","version":"1.0.0"}',
        dumps({"event": "start", "sequenceNumber": "1", "streamSid": "MZ2", "start": {
            "streamSid": "MZ2", "accountSid": "3f2b1c0e-0000-4000-8000-000000000000", "callSid": "c2", "tracks": ["inbound"],
            "customParameters": {"token": "t"}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}),
    ],
    "telnyx": [
        '{"event":"connected","version":"1.0.0"}',
        dumps({"event": "start", "sequence_number": "1", "stream_id": "32de0dea-1", "start": {
            "user_id": "u", "call_control_id": "v3:abc", "call_session_id": "s", "from": "+1", "to": "+2",
            "custom_parameters": {"token": "t"}, "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}}),
    ],
    "plivo": [
        dumps({"event": "start", "sequenceNumber": 1, "start": {
            "callId": "4f0c-uuid", "streamId": "s-uuid", "accountId": "MA1", "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}, "extra_headers": "token=t"}),
    ],
    "exotel": [
        '{"event":"connected"}',
        dumps({"event": "start", "sequence_number": "1", "stream_sid": "MZ3", "start": {
            "stream_sid": "MZ3", "call_sid": "CA3", "account_sid": "AC3", "from": "+91", "to": "+91", "custom_parameters": {"token": "t"},
            "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"}}}),
    ],
    "vonage": [
        dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=16000", "call_uuid": "63f6-uuid", "token": "t"}),
    ],
    "jambonz": [
        dumps({"sampleRate": 16000, "mixType": "mono", "callSid": "9f1c-uuid", "direction": "inbound", "from": "+1", "to": "+2",
               "accountSid": "a1", "callbridge_token": "t"}),
    ],
    "bandwidth": [
        dumps({"eventType": "start", "metadata": {
            "accountId": "9900001", "callId": "c-1-2", "streamId": "s-1", "streamName": "n",
            "tracks": [{"name": "inbound", "mediaFormat": {"encoding": "audio/PCMU", "sampleRate": 8000}}]}, "streamParams": {"token": "t"}}),
    ],
}


@pytest.mark.parametrize("provider", sorted(FIRST_MESSAGES))
def test_recognises_each_carrier_and_replays_what_it_held(provider: str) -> None:
    codec = DetectingCodec()
    assert codec.provider == "unknown"
    events = [event for message in FIRST_MESSAGES[provider] for event in codec.receive_message(message)]
    assert codec.provider == provider
    started = [e for e in events if isinstance(e, StreamStarted)]
    assert len(started) == 1 and started[0].custom_parameters.get("token") == "t"
    if FIRST_MESSAGES[provider][0].startswith('{"event":"connected"'):
        assert events[0] == StreamConnected()  # held, then replayed to the carrier's codec
    assert codec.stream_id is not None and codec.profile is codec.inner.profile  # type: ignore[union-attr]
    assert codec.send(SendClear()) is not None or provider == "audiosocket"


@pytest.mark.parametrize(("account", "provider"), [("AC" + "1" * 32, "twilio"), ("3f2b1c0e-0000-4000-8000-000000000000", "signalwire")])
def test_an_empty_account_is_read_from_what_our_answer_put_in_the_streams_parameters(account: str, provider: str) -> None:
    """#40: a Twilio-protocol sender that leaves ``accountSid`` empty: labelled, and its call hung up, by the
    ``AccountSid`` our answer webhook saw (``ACCOUNT_PARAM``); before, always SignalWire, and no account to hang up with."""
    start = orjson.loads(FIRST_MESSAGES["twilio"][1])
    start["start"]["accountSid"] = ""
    start["start"]["customParameters"] = {"token": "t", ACCOUNT_PARAM: account}
    codec = DetectingCodec()
    (started,) = [e for e in codec.receive_message(dumps(start)) if isinstance(e, StreamStarted)]
    assert codec.provider == provider and started.account_id == account


def test_delegates_media_after_recognition() -> None:
    codec = DetectingCodec()
    for message in FIRST_MESSAGES["twilio"]:
        codec.receive_message(message)
    media = dumps({"event": "media", "sequenceNumber": "3", "streamSid": "MZ1", "media": {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": ULAW_20MS}})
    (event,) = codec.receive_message(media)
    assert isinstance(event, MediaReceived) and event.payload == b"\xff" * 160


def test_signalwire_l16_is_decoded_as_announced() -> None:
    codec = DetectingCodec()
    start = orjson.loads(FIRST_MESSAGES["signalwire"][1])
    start["start"]["mediaFormat"] = {"encoding": "audio/x-l16", "sampleRate": 24000, "channels": 1}
    (event,) = codec.receive_message(dumps(start))
    assert isinstance(event, StreamStarted) and (event.encoding, event.rate_hz) == (AudioEncoding.L16, 24000)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00\x01", ProtocolErrorReason.BINARY_FRAME),
        ("{nope", ProtocolErrorReason.NOT_JSON),
        ("[1, 2]", ProtocolErrorReason.NOT_AN_OBJECT),
        ('{"event":"media","streamSid":"MZ1"}', ProtocolErrorReason.UNKNOWN_EVENT),
        ('{"event":"start","start":{}}', ProtocolErrorReason.UNKNOWN_EVENT),
        ('{"event":"x","pad":"' + "x" * 300_000 + '"}', ProtocolErrorReason.OVERSIZED),
    ],
)
def test_what_names_no_carrier_is_an_error(message: str | bytes, reason: ProtocolErrorReason) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        DetectingCodec().receive_message(message)
    assert exc.value.reason is reason and exc.value.provider == "unknown"


def test_two_connected_messages_are_out_of_order() -> None:
    codec = DetectingCodec()
    codec.receive_message('{"event":"connected"}')
    with pytest.raises(RemoteProtocolError) as exc:
        codec.receive_message('{"event":"connected"}')
    assert exc.value.reason is ProtocolErrorReason.UNKNOWN_EVENT
