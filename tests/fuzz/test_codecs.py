"""Every websocket carrier codec, fuzzed: arbitrary bytes, text and JSON, and each carrier's own messages broken
one field at a time and sent in any order. Only ``RemoteProtocolError`` may escape; the events that do come
out obey the stream's order (nothing before start or after stop, one start), and a started codec still makes
every message the call sends (tests/fuzz/contract.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from callbridge.carriers.bandwidth.wire import BandwidthCodec
from callbridge.carriers.base import ProviderCodec
from callbridge.carriers.exotel.wire import ExotelCodec
from callbridge.carriers.generic.wire import DetectingCodec
from callbridge.carriers.jambonz.wire import JambonzCodec
from callbridge.carriers.plivo.wire import PlivoCodec
from callbridge.carriers.signalwire.wire import signalwire_codec
from callbridge.carriers.telnyx.wire import TelnyxCodec
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.carriers.vonage.wire import VonageCodec
from tests.carriers import (
    test_bandwidth,
    test_exotel,
    test_jambonz,
    test_plivo,
    test_telnyx,
    test_twilio,
    test_vonage,
)
from tests.carriers.test_detect import FIRST_MESSAGES
from tests.fuzz.contract import CodecRun
from tests.fuzz.strategies import json_text, messages, sequences

pytestmark = [pytest.mark.hot_path, pytest.mark.background]
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""


def _j(message: str) -> Any:
    return orjson.loads(message)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


TWILIO = [
    _j(test_twilio.CONNECTED),
    _j(test_twilio.START),
    _j(test_twilio.media()),
    _j(test_twilio.media(timestamp=40)),
    {
        "event": "dtmf",
        "streamSid": test_twilio.SID,
        "sequenceNumber": "5",
        "dtmf": {"track": "inbound_track", "digit": "1"},
    },
    {"event": "mark", "streamSid": test_twilio.SID, "sequenceNumber": "4", "mark": {"name": "resp-1@200"}},
    {
        "event": "stop",
        "streamSid": test_twilio.SID,
        "sequenceNumber": "6",
        "stop": {"accountSid": "AC0000", "callSid": test_twilio.CALL},
    },
]
SIGNALWIRE = [
    *TWILIO,
    _j(test_twilio.START.replace("audio/x-mulaw", "audio/x-l16").replace("8000", "16000")),
]
TELNYX = [
    _j(test_telnyx.CONNECTED),
    _j(test_telnyx.START),
    _j(test_telnyx.start("L16", 16000)),
    *(_j(test_telnyx.media(seq)) for seq in (2, 3, 5, 9)),
    _j(test_telnyx.dtmf(4)),
    {"event": "mark", "stream_id": test_telnyx.SID, "sequence_number": "6", "mark": {"name": "resp-1@200"}},
    {
        "event": "error",
        "stream_id": test_telnyx.SID,
        "sequence_number": "7",
        "error": {"code": "100005", "title": "rate_limit_reached", "detail": "Too many requests"},
    },
    {
        "event": "stop",
        "stream_id": test_telnyx.SID,
        "sequence_number": "8",
        "stop": {"call_control_id": test_telnyx.CALL},
    },
]
PLIVO = [
    _j(test_plivo.start()),
    _j(test_plivo.start("audio/x-l16", 16000)),
    _j(test_plivo.media()),
    _j(test_plivo.media(timestamp=str(test_plivo.EPOCH + 500), sequence=3)),
    _j(test_plivo.event("dtmf", dtmf={"track": "inbound", "digit": "5", "timestamp": str(test_plivo.EPOCH)})),
    _j(test_plivo.event("playedStream", name="resp-1@200")),
    _j(test_plivo.event("clearedAudio")),
    _j(test_plivo.event("stop")),
]
EXOTEL = [
    _j(test_exotel.CONNECTED),
    _j(test_exotel.START),
    _j(test_exotel.start_message("16000")),
    _j(test_exotel.media()),
    {"event": "dtmf", "sequence_number": "3", "stream_sid": test_exotel.SID, "dtmf": {"duration": "100", "digit": "5"}},
    {"event": "mark", "sequence_number": "4", "stream_sid": test_exotel.SID, "mark": {"name": "resp-1@200"}},
    {"event": "clear", "stream_sid": test_exotel.SID},
    {
        "event": "stop",
        "sequence_number": "5",
        "stream_sid": test_exotel.SID,
        "stop": {"call_sid": test_exotel.CALL, "reason": "callended"},
    },
]
VONAGE = [
    _j(test_vonage.connected()),
    _j(test_vonage.connected(8000)),
    {"event": "websocket:dtmf", "digit": "5", "duration": 260},
    {"event": "websocket:dtmf", "dtmf": {"digit": "*", "duration": 100}},
    {"event": "websocket:notify", "payload": {"name": "resp-1@200"}},
    {"event": "websocket:cleared"},
    {"event": "websocket:media:update", "content-type": "audio/l16;rate=16000"},
]
BANDWIDTH = [
    test_bandwidth.START,
    test_bandwidth.media(),
    test_bandwidth.media(sequence=2, track="outbound"),
    {"eventType": "stop", "metadata": test_bandwidth.METADATA},
]
JAMBONZ = [test_jambonz.FIRST, {"event": "dtmf", "dtmf": "5", "duration": "800"}, {"type": "playDone", "data": {"id": "1"}}]
DETECT = [_j(m) for messages in FIRST_MESSAGES.values() for m in messages] + TWILIO + TELNYX + PLIVO + EXOTEL + VONAGE + BANDWIDTH

_pcm = st.binary(max_size=700)
CODECS: dict[str, tuple[Callable[[], ProviderCodec], list[Any], st.SearchStrategy[bytes] | None]] = {
    "twilio": (TwilioCodec, TWILIO, None),
    "signalwire": (signalwire_codec, SIGNALWIRE, None),
    "telnyx": (TelnyxCodec, TELNYX, None),
    "plivo": (PlivoCodec, PLIVO, None),
    "exotel": (ExotelCodec, EXOTEL, None),
    "vonage": (VonageCodec, VONAGE, _pcm),
    "bandwidth": (BandwidthCodec, BANDWIDTH, None),
    "jambonz": (JambonzCodec, JAMBONZ, _pcm),
    "detect": (DetectingCodec, DETECT, _pcm),
}
NAMES = sorted(CODECS)


def opening(name: str) -> list[str]:
    """The messages that start a stream on ``name``'s codec: its first templates, up to the start."""
    templates = CODECS[name][1]
    return [orjson.dumps(m).decode() for m in templates[: 1 if name in ("plivo", "vonage", "bandwidth", "jambonz") else 2]]


@pytest.mark.parametrize("name", NAMES)
@given(message=st.binary(max_size=300) | st.text(max_size=300) | json_text)
def test_any_single_message(name: str, message: str | bytes) -> None:
    factory, _, _ = CODECS[name]
    CodecRun(factory()).feed([message])


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_near_valid_sequences(name: str, data: st.DataObject) -> None:
    factory, templates, binary = CODECS[name]
    messages = data.draw(sequences(templates, binary=binary), label="messages")
    CodecRun(factory()).feed(messages)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_near_valid_sequences_after_a_valid_start(name: str, data: st.DataObject) -> None:
    """The same, from a started stream: the media, marks and stops of the steady state get the mutations."""
    factory, templates, binary = CODECS[name]
    run = CodecRun(factory())
    run.feed(opening(name))
    assert run.started is not None
    run.feed(data.draw(sequences(templates, binary=binary, max_size=20), label="messages"))


_NON_ASCII_BASE64 = orjson.dumps(
    {
        "event": "media",
        "sequence_number": 2,
        "streamSid": test_twilio.SID,  # every carrier's stream key, so that each codec reads the payload
        "stream_id": test_telnyx.SID,
        "streamId": test_plivo.STREAM,
        "stream_sid": test_exotel.SID,
        "media": {"track": "inbound", "payload": "////\u00ff"},
    }
).decode()


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@example(data=None)  # a media payload that is not even ASCII: a2b_base64 raised ValueError, not binascii.Error
def test_any_message_after_a_valid_start(name: str, data: st.DataObject | None) -> None:
    factory, templates, binary = CODECS[name]
    run = CodecRun(factory())
    run.feed(opening(name))
    assert run.started is not None
    if data is None:
        run.feed([_NON_ASCII_BASE64])
        return
    run.feed([data.draw(messages(templates, binary=binary), label="message")])
