"""Bandwidth's media-stream codec against the wire facts of ``docs/carriers/bandwidth.md``: what it reads, what it
refuses and why, and what it writes; and the BXML and Voice API of its HTTP side."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import orjson
import pytest

from callbridge.carriers.bandwidth.http import BandwidthRest, stream_bxml
from callbridge.carriers.bandwidth.settings import BandwidthSettings
from callbridge.carriers.bandwidth.wire import BANDWIDTH_PROFILE, BandwidthCodec
from callbridge.carriers.base import (
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamStarted,
    StreamStopped,
    UnknownCarrierEvent,
)
from callbridge.codecs import AudioEncoding
from callbridge.outbound_http import http_client

pytestmark = pytest.mark.core

CALL = "c-15ac29a2-1331029c-2cb0-4a07-b215-b22865662d85"
STREAM = "s-3a1e0a0c-7c4a-4c44-9a8f-0e3c9f0d2b11"
METADATA = {
    "accountId": "9900001",
    "callId": CALL,
    "streamId": STREAM,
    "streamName": "callbridge-abc",
    "tracks": [{"name": "inbound", "mediaFormat": {"encoding": "audio/PCMU", "sampleRate": 8000}}],
}
START: dict[str, Any] = {"eventType": "start", "metadata": METADATA, "streamParams": {"token": "t0k", "lang": "en"}}


def j(message: dict[str, Any]) -> str:
    return orjson.dumps(message).decode()


def media(payload: bytes = b"\xff" * 160, sequence: object = 1, track: str = "inbound") -> dict[str, Any]:
    return {"eventType": "media", "track": track, "sequenceNumber": sequence, "payload": base64.b64encode(payload).decode()}


def started() -> BandwidthCodec:
    codec = BandwidthCodec()
    codec.receive_message(j(START))
    return codec


def test_a_stream_starts_carries_caller_audio_and_stops() -> None:
    codec = BandwidthCodec()
    (start,) = codec.receive_message(j(START))
    assert start == StreamStarted(CALL, STREAM, "9900001", AudioEncoding.PCMU, 8000, {"token": "t0k", "lang": "en"})
    assert codec.receive_message(j(media(b"\x7f" * 160, 1))) == [MediaReceived(b"\x7f" * 160)]
    assert codec.receive_message(j(media(sequence=2, track="outbound"))) == []  # the call's other side: not the caller
    assert codec.receive_message(j({"eventType": "stop", "metadata": METADATA})) == [StreamStopped()]
    assert codec.profile == BANDWIDTH_PROFILE and not codec.profile.uses_marks and codec.profile.flushes


def test_it_writes_play_audio_and_clear_and_nothing_for_a_mark() -> None:
    codec = started()
    sent = codec.send(SendMedia(b"\x00\x01\xfe"))
    assert sent is not None
    assert orjson.loads(sent) == {"eventType": "playAudio", "media": {"contentType": "audio/pcmu", "payload": "AAH+"}}
    assert orjson.loads(codec.send(SendClear()) or "") == {"eventType": "clear"}
    assert codec.send(SendMark("r@200")) is None  # no markers on this wire


def test_an_event_type_it_does_not_know_is_let_through() -> None:
    assert started().receive_message(j({"eventType": "transcription", "text": "hi"})) == [UnknownCarrierEvent("transcription")]


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([j(media())], ProtocolErrorReason.OUT_OF_ORDER),  # media before start
        ([j(START), j(START)], ProtocolErrorReason.OUT_OF_ORDER),
        ([j({**START, "metadata": {**METADATA, "callId": "has space"}})], ProtocolErrorReason.BAD_FIELD),
        ([j({**START, "metadata": {k: v for k, v in METADATA.items() if k != "streamId"}})], ProtocolErrorReason.MISSING_FIELD),
        ([j({**START, "metadata": {**METADATA, "tracks": [{"name": "inbound", "mediaFormat": {"encoding": "audio/PCMA", "sampleRate": 8000}}]}})], ProtocolErrorReason.UNSUPPORTED_FORMAT),
        ([j({**START, "metadata": {**METADATA, "tracks": [{"name": "outbound", "mediaFormat": {"encoding": "audio/PCMU", "sampleRate": 8000}}]}})], ProtocolErrorReason.MISSING_FIELD),
        ([j({**START, "streamParams": {"token": 7}})], ProtocolErrorReason.BAD_FIELD),
        ([j(START), j({**media(), "payload": "%%%"})], ProtocolErrorReason.BAD_BASE64),
        ([j(START), j(media(sequence=2)), j(media(sequence=2))], ProtocolErrorReason.OUT_OF_ORDER),
        ([j(START), j(media(sequence="two"))], ProtocolErrorReason.BAD_FIELD),
        ([j(START), j(media(track="sideways"))], ProtocolErrorReason.BAD_FIELD),
        ([j(START), j({"eventType": "media", "track": "inbound"})], ProtocolErrorReason.MISSING_FIELD),
        ([j(START), j({"eventType": "stop", "metadata": {"streamId": "s-other"}})], ProtocolErrorReason.WRONG_STREAM),
        ([j(START), j({"eventType": "stop"}), j(media())], ProtocolErrorReason.OUT_OF_ORDER),
        ([j(START), j({"eventType": 7})], ProtocolErrorReason.BAD_FIELD),
        ([j(START), j({"track": "inbound"})], ProtocolErrorReason.MISSING_FIELD),
        (["{not json"], ProtocolErrorReason.NOT_JSON),
        ([b"\x00\x01"], ProtocolErrorReason.BINARY_FRAME),
    ],
)
def test_what_breaks_the_protocol_ends_the_stream_with_its_reason(messages: list[str | bytes], reason: ProtocolErrorReason) -> None:
    codec = BandwidthCodec()
    with pytest.raises(RemoteProtocolError) as raised:
        for message in messages:
            codec.receive_message(message)
    assert raised.value.reason is reason and raised.value.provider == "bandwidth"


def test_the_answer_streams_with_the_token_and_keeps_the_call_up() -> None:
    config = BandwidthSettings(callback_username="bw", callback_password="pw")  # type: ignore[arg-type]
    bxml = stream_bxml("https://bridge.example.com", "tok-1234567890abcdef", config, 14_400)
    assert '<StartGather dtmfUrl="https://bridge.example.com/bandwidth/dtmf" dtmfMethod="POST" username="bw" password="pw"/>' in bxml
    assert 'mode="bidirectional"' in bxml and 'destination="wss://bridge.example.com/bandwidth/media"' in bxml
    assert 'name="callbridge-tok-12345678"' in bxml and '<StreamParam name="token" value="tok-1234567890abcdef"/>' in bxml
    assert bxml.endswith('<Pause duration="14400"/></Response>')  # <StartStream> does not block: the BXML must not end


async def test_the_voice_api_takes_one_oauth_token_until_it_nears_expiry_and_hangs_up() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.url.path == "/token":
            assert request.headers["authorization"] == "Basic " + base64.b64encode(b"client:secret").decode()
            assert request.content == b"grant_type=client_credentials"
            return httpx.Response(200, json={"access_token": f"tok{len(requests)}", "expires_in": 3600})
        assert request.headers["authorization"] == "Bearer tok1"
        return httpx.Response(404 if CALL in request.url.path and b"redirect" in request.content else 200)

    config = BandwidthSettings(
        account_id="9900001", client_id="client", client_secret="secret",  # type: ignore[arg-type]
        api_base_url="https://voice.test/api/v2", token_url="https://id.test/token",
    )  # fmt: skip
    rest = BandwidthRest(config, client=http_client(transport=httpx.MockTransport(handler)))
    await rest.hang_up(CALL, None)
    assert await rest.redirect(CALL, "https://bridge.example.com/bandwidth/answer") is False  # 404: not live
    await rest.aclose()
    paths = [request.url.path for request in requests]
    assert paths == ["/token", f"/api/v2/accounts/9900001/calls/{CALL}", f"/api/v2/accounts/9900001/calls/{CALL}"]
    assert orjson.loads(requests[1].content) == {"state": "completed"}


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
def test_pcm_playback_announces_wideband_out_and_writes_its_content_type(rate: int) -> None:
    codec = BandwidthCodec(pcm_out_rate_hz=rate)
    (start,) = codec.receive_message(j(START))
    assert isinstance(start, StreamStarted)
    assert (start.encoding, start.rate_hz, start.out_encoding, start.out_rate_hz) == (AudioEncoding.PCMU, 8000, AudioEncoding.L16, rate)
    sent = orjson.loads(codec.send(SendMedia(b"\x01\x00" * 4)) or "")
    assert sent == {"eventType": "playAudio", "media": {
        "contentType": f"audio/pcm;rate={rate};channels=1;bit-depth=16;endian=little;encoding=signed",
        "payload": base64.b64encode(b"\x01\x00" * 4).decode()}}  # fmt: skip


def test_pcm_playback_takes_only_bandwidths_rates_and_settings_name_them() -> None:
    with pytest.raises(ValueError):
        BandwidthCodec(pcm_out_rate_hz=48000)
    assert BandwidthSettings().pcm_out_rate_hz is None
    assert BandwidthSettings(playback="pcm16k").pcm_out_rate_hz == 16000
    (start,) = BandwidthCodec().receive_message(j(START))
    assert isinstance(start, StreamStarted) and start.out_encoding is None and start.out_rate_hz is None
