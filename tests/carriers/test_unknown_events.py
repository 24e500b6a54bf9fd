"""Fail open on the unknown, closed on the malformed (issue #15): a well-formed message of an event type a
carrier added since is ignored — the codec says so, and the stream's next messages parse as before — on every
carrier's codec; a message whose event is missing or not a string still ends the stream."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from callbridge.carriers.base import (
    MediaReceived,
    ProtocolErrorReason,
    ProviderCodec,
    RemoteProtocolError,
    UnknownCarrierEvent,
)
from tests.carriers import test_exotel, test_plivo, test_telnyx, test_twilio, test_vonage

pytestmark = pytest.mark.core

CARRIERS: dict[str, tuple[Callable[[], ProviderCodec], str, str, str | bytes]] = {
    # carrier: (a started codec, its stream field and id, a media message that must still parse after)
    "twilio": (test_twilio.started, "streamSid", test_twilio.SID, test_twilio.media()),
    "telnyx": (test_telnyx.started, "stream_id", test_telnyx.SID, test_telnyx.media(seq=2)),
    "plivo": (test_plivo.started, "streamId", test_plivo.STREAM, test_plivo.media()),
    "exotel": (test_exotel.started, "stream_sid", test_exotel.SID, test_exotel.media()),
}


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
@pytest.mark.parametrize("event", ["teleport", "connected.v2", "media_v2"])
def test_an_event_type_added_since_is_ignored(carrier: str, event: str) -> None:
    started, key, stream_id, media = CARRIERS[carrier]
    codec = started()
    assert codec.receive_message(f'{{"event":"{event}","{key}":"{stream_id}","x":{{"y":1}}}}') == [UnknownCarrierEvent(event)]
    (received,) = codec.receive_message(media)
    assert isinstance(received, MediaReceived) and received.payload


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_an_unknown_event_before_the_start_is_ignored_too(carrier: str) -> None:
    codec = type(CARRIERS[carrier][0]())()  # the same codec, not started
    assert codec.receive_message('{"event":"hello"}') == [UnknownCarrierEvent("hello")]


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
@pytest.mark.parametrize(("event", "reason"), [("7", ProtocolErrorReason.BAD_FIELD), ("null", ProtocolErrorReason.MISSING_FIELD)])
def test_an_event_that_is_not_a_name_ends_the_stream(carrier: str, event: str, reason: ProtocolErrorReason) -> None:
    started, key, stream_id, _ = CARRIERS[carrier]
    with pytest.raises(RemoteProtocolError) as caught:
        started().receive_message(f'{{"event":{event},"{key}":"{stream_id}"}}')
    assert caught.value.reason is reason


def test_a_long_event_name_is_cut_to_64_characters() -> None:
    codec = test_twilio.started()
    assert codec.receive_message('{"event":"' + "x" * 500 + '"}') == [UnknownCarrierEvent("x" * 64)]


def test_vonage_ignores_its_own_new_events_and_refuses_others() -> None:
    codec = test_vonage.started()
    assert codec.receive_message('{"event":"websocket:transcript"}') == [UnknownCarrierEvent("websocket:transcript")]
    with pytest.raises(RemoteProtocolError):
        codec.receive_message('{"event":"media"}')  # not Vonage's namespace: not a Vonage peer
