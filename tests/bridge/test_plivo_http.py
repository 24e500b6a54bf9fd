"""Plivo's HTTP side: V3 signatures, the answer XML, the media websocket on a real uvicorn bridge over
loopback, the status and hang-up callbacks, and the REST hang-up (telephony-protocols.md §3.2, §7)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import secrets
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import httpx
import orjson
import pytest
from pydantic import SecretStr
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from callbridge.carriers.plivo.http import (
    PlivoRest,
    plivo_signature_v3,
    stream_xml,
    valid_signature_v3,
)
from callbridge.carriers.plivo.wire import decode_stream_token, parse_extra_headers
from callbridge.engine.commands import AppendAudio, CreateTextItem
from callbridge.outbound_http import http_client
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge.twilio_e2e import RecordingEngine, engine, known, settings, until

AUTH_ID = "MAZDQ1ZJIYMDZKMMZLNT"
AUTH_TOKEN = "plivo-test-auth-token"


def _hmac_b64(key: str, data: str) -> str:
    return base64.b64encode(hmac.new(key.encode(), data.encode(), hashlib.sha256).digest()).decode()


class TestSignatureV3:
    """Expected values are built here by hand from the algorithm of plivo-python's ``signature_v3.py``."""

    URL = "https://bridge.example.com/plivo/answer"
    FORM: ClassVar[dict[str, str]] = {"To": "+15550002", "CallUUID": "abc-123", "From": "+15550001"}

    def test_post_signs_the_url_then_sorted_name_value_pairs_then_the_nonce(self) -> None:
        expected = _hmac_b64(AUTH_TOKEN, self.URL + "?CallUUIDabc-123From+15550001To+15550002" + ".nonce42")
        assert plivo_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "nonce42") == expected

    def test_post_with_a_query_string_sorts_it_and_adds_a_dot(self) -> None:
        expected = _hmac_b64(AUTH_TOKEN, self.URL + "?a=2&z=1." + "CallUUIDabc-123From+15550001To+15550002" + ".n")
        assert plivo_signature_v3(AUTH_TOKEN, "POST", self.URL + "?z=1&a=2", self.FORM, "n") == expected

    def test_post_without_parameters(self) -> None:
        assert plivo_signature_v3(AUTH_TOKEN, "POST", self.URL, {}, "n") == _hmac_b64(AUTH_TOKEN, self.URL + ".n")

    def test_get_signs_the_sorted_query_only(self) -> None:
        expected = _hmac_b64(AUTH_TOKEN, self.URL + "?CallUUID=u1&From=%2B1.n".replace("%2B", "+"))
        assert plivo_signature_v3(AUTH_TOKEN, "GET", self.URL + "?From=%2B1&CallUUID=u1", {}, "n") == expected

    def test_repeated_names_sign_each_sorted_value(self) -> None:
        expected = _hmac_b64(AUTH_TOKEN, self.URL + "?kakb.n")
        assert plivo_signature_v3(AUTH_TOKEN, "POST", self.URL, {"k": ["b", "a"]}, "n") == expected

    def test_non_ascii_values_are_signed_as_utf8(self) -> None:
        expected = _hmac_b64(AUTH_TOKEN, self.URL + "?CallerNameJosé.n")
        assert plivo_signature_v3(AUTH_TOKEN, "POST", self.URL, {"CallerName": "José"}, "n") == expected

    def test_plivo_python_known_answer(self) -> None:
        # computed once with plivo-python 4.63.0: plivo.utils.signature_v3.get_signature_v3(
        #   b"plivo-test-auth-token", construct_post_url(URL, FORM), b"nonce42")
        assert plivo_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "nonce42") == _SDK_VECTOR

    def test_validation(self) -> None:
        good = plivo_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "n1")
        assert valid_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "n1", good)
        assert valid_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "n1", f"c29tZXRoaW5nIGVsc2U=,{good}")
        assert not valid_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "n2", good)
        assert not valid_signature_v3("other-token", "POST", self.URL, self.FORM, "n1", good)
        assert not valid_signature_v3(AUTH_TOKEN, "POST", self.URL, {**self.FORM, "To": "+1"}, "n1", good)
        assert not valid_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, None, good)
        assert not valid_signature_v3(AUTH_TOKEN, "POST", self.URL, self.FORM, "n1", None)


_SDK_VECTOR = "Kr546Xb1SuuhS+fqMEnRSIJcjnnji7YUyAiv/+hYZ04="


def test_stream_xml() -> None:
    xml = stream_xml("https://bridge.example.com", "tok_en-1", "audio/x-l16;rate=16000")
    root = ET.fromstring(xml)
    stream, redirect = list(root)
    assert root.tag == "Response" and stream.tag == "Stream" and redirect.tag == "Redirect"
    assert stream.text == "wss://bridge.example.com/plivo/media"
    assert stream.attrib == {
        "bidirectional": "true",
        "keepCallAlive": "true",
        "audioTrack": "inbound",
        "contentType": "audio/x-l16;rate=16000",
        "statusCallbackUrl": "https://bridge.example.com/plivo/stream-status",
        "statusCallbackMethod": "POST",
        "extraHeaders": stream.attrib["extraHeaders"],
    }
    key, _, value = stream.attrib["extraHeaders"].partition("=")
    assert key == "token" and value.isalnum() and decode_stream_token(value) == "tok_en-1"
    assert redirect.text == "https://bridge.example.com/plivo/answer" and redirect.attrib == {"method": "POST"}


# --------------------------------------------------------------------- bridge


def plivo_settings(**sections: dict[str, Any]) -> Any:
    plivo = {"auth_id": AUTH_ID, "auth_token": AUTH_TOKEN, **sections.pop("plivo", {})}
    return settings(plivo=plivo, **sections)


@asynccontextmanager
async def bridge_with(recorder: RecordingEngine, **sections: dict[str, Any]) -> AsyncIterator[RunningBridge]:
    async with running_bridge(plivo_settings(**sections), recorder) as bridge:
        yield bridge


def signed_headers(method: str, url: str, params: dict[str, str]) -> dict[str, str]:
    nonce = secrets.token_hex(10)
    return {"X-Plivo-Signature-V3": plivo_signature_v3(AUTH_TOKEN, method, url, params, nonce), "X-Plivo-Signature-V3-Nonce": nonce}


async def post_signed(bridge: RunningBridge, path: str, params: dict[str, str], *, sign: bool = True) -> httpx.Response:
    url = bridge.base_url + path
    headers = signed_headers("POST", url, params) if sign else {}
    async with http_client() as http:
        return await http.post(url, data=params, headers=headers)


def call_params(call_uuid: str) -> dict[str, str]:
    return {"CallUUID": call_uuid, "From": "+15550001", "To": "+15550002", "Direction": "inbound", "CallStatus": "in-progress"}


class PlivoStream:
    """One stream as Plivo opens it: answer webhook, then the websocket the XML names, then ``start``."""

    def __init__(self, ws: ClientConnection, call_uuid: str, extra_headers: str) -> None:
        self.ws = ws
        self.call_uuid = call_uuid
        self.stream_id = f"{secrets.randbits(32):08x}-0000-4000-8000-{secrets.randbits(48):012x}"
        self.extra_headers = extra_headers
        self.sequence = 1
        self.epoch_ms = int(time.time() * 1000)
        self.chunk = 0

    @classmethod
    async def open(cls, bridge: RunningBridge, call_uuid: str | None = None) -> PlivoStream:
        call_uuid = call_uuid or f"{secrets.randbits(32):08x}-1111-4111-8111-{secrets.randbits(48):012x}"
        answer = await post_signed(bridge, "/plivo/answer", call_params(call_uuid))
        assert answer.status_code == 200, answer.text
        stream = ET.fromstring(answer.text).find("Stream")
        assert stream is not None and stream.text
        ws = await connect(stream.text)
        return cls(ws, call_uuid, stream.attrib["extraHeaders"])

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence

    def start_message(self) -> str:
        start = {
            "callId": self.call_uuid,
            "streamId": self.stream_id,
            "accountId": AUTH_ID,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
        }
        return orjson.dumps({"event": "start", "sequenceNumber": 1, "start": start, "extra_headers": self.extra_headers}).decode()

    def media(self, payload: bytes = b"\xff" * 160) -> str:
        self.chunk += 1
        media = {"track": "inbound", "timestamp": str(self.epoch_ms + 20 * (self.chunk - 1)), "chunk": self.chunk, "payload": base64.b64encode(payload).decode()}
        return orjson.dumps({"event": "media", "sequenceNumber": self._next(), "streamId": self.stream_id, "media": media}).decode()

    def dtmf(self, digit: str) -> str:
        dtmf = {"track": "inbound", "digit": digit, "timestamp": str(self.epoch_ms)}
        return orjson.dumps({"event": "dtmf", "sequenceNumber": self._next(), "streamId": self.stream_id, "dtmf": dtmf}).decode()

    async def closed(self, timeout_s: float = 5.0) -> int | None:
        async def drain() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for _ in self.ws:
                    pass

        await asyncio.wait_for(drain(), timeout_s)
        return self.ws.close_code


async def test_answer_requires_a_valid_signature() -> None:
    recorder = engine()
    async with bridge_with(recorder) as bridge:
        unsigned = await post_signed(bridge, "/plivo/answer", call_params("c-1"), sign=False)
        url = bridge.base_url + "/plivo/answer"
        forged_headers = signed_headers("POST", url, {**call_params("c-1"), "From": "+19999"})
        async with http_client() as http:
            forged = await http.post(url, data=call_params("c-1"), headers=forged_headers)
        good = await post_signed(bridge, "/plivo/answer", call_params("c-1"))
    assert unsigned.status_code == 403 and forged.status_code == 403
    assert good.status_code == 200 and good.headers["content-type"].startswith("application/xml")
    stream = ET.fromstring(good.text).find("Stream")
    assert stream is not None and stream.text == bridge.base_url.replace("http://", "ws://") + "/plivo/media"
    assert stream.attrib["contentType"] == "audio/x-mulaw;rate=8000"
    assert len(recorder.opened) == 1  # the signed answer's session, opened for its stream (engine.open_at_answer)


async def test_answer_by_get_is_signed_over_its_query() -> None:
    recorder = engine()
    async with bridge_with(recorder) as bridge:
        url = bridge.base_url + "/plivo/answer?CallUUID=c-get&From=%2B15550001"
        async with http_client() as http:
            good = await http.get(url, headers=signed_headers("GET", url, {}))
            bad = await http.get(url, headers=signed_headers("GET", url.replace("c-get", "c-other"), {}))
    assert good.status_code == 200 and ET.fromstring(good.text).find("Stream") is not None
    assert bad.status_code == 403


async def test_a_call_streams_to_the_engine_and_resumes_after_a_drop() -> None:
    recorder = engine(agent="tone")
    async with bridge_with(recorder) as bridge:
        first = await PlivoStream.open(bridge)
        await first.ws.send(first.start_message())
        metrics = bridge.app.state.bridge.registry
        await until(lambda: metrics.get_sample_value("callbridge_engine_sessions_total", {"how": "opened"}) == 1)
        for _ in range(10):
            await first.ws.send(first.media())
        await first.ws.send(first.dtmf("7"))
        await until(lambda: CreateTextItem("DTMF 7") in recorder.of(CreateTextItem))
        # the tone agent greets: playAudio in the stream's format, and checkpoints, come back
        replies = [orjson.loads(await asyncio.wait_for(first.ws.recv(), 5)) for _ in range(3)]
        kinds = {reply["event"] for reply in replies}
        assert kinds <= {"playAudio", "checkpoint"} and "playAudio" in kinds
        play = next(reply for reply in replies if reply["event"] == "playAudio")
        assert play["streamId"] == first.stream_id and play["media"]["contentType"] == "audio/x-mulaw"
        payload = base64.b64decode(play["media"]["payload"])
        assert play["media"]["sampleRate"] == 8000 and payload and len(payload) % 160 == 0  # whole 20 ms frames
        await first.ws.close()  # Plivo drops the socket; keepCallAlive runs the <Redirect> back to the answer URL
        await until(lambda: recorder.session_count == 0 or known(bridge.app.state.bridge.services.registry, first.call_uuid))
        second = await PlivoStream.open(bridge, first.call_uuid)
        await second.ws.send(second.start_message())
        await until(lambda: len(recorder.resumed) == 1)
        await second.ws.send(second.media())
        await second.ws.close()
    assert recorder.opened == recorder.resumed  # one engine session, resumed on the new stream
    assert len(recorder.of(AppendAudio)) >= 5


async def test_a_stream_without_the_minted_token_is_refused() -> None:
    recorder = engine()
    async with bridge_with(recorder) as bridge:
        stream = await PlivoStream.open(bridge)
        stream.extra_headers = "token=" + "ab" * 16
        await stream.ws.send(stream.start_message())
        assert await stream.closed() == 1008
        # a token works once, for its own call
        first = await PlivoStream.open(bridge)
        await first.ws.send(first.start_message())
        metrics = bridge.app.state.bridge.registry
        await until(lambda: metrics.get_sample_value("callbridge_engine_sessions_total", {"how": "opened"}) == 1)
        other = await PlivoStream.open(bridge)
        other.extra_headers = first.extra_headers
        await other.ws.send(other.start_message())
        assert await other.closed() == 1008
        await first.ws.close()
        bound = metrics.get_sample_value("callbridge_engine_sessions_total", {"how": "opened"})
    assert bound == 1  # only the stream with its own call's token got an engine session


async def test_an_upgrade_with_a_bad_signature_is_403() -> None:
    recorder = engine()
    async with bridge_with(recorder) as bridge:
        ws_url = bridge.base_url.replace("http://", "ws://") + "/plivo/media"
        with pytest.raises(InvalidStatus) as exc:
            await connect(ws_url, additional_headers={"X-Plivo-Signature-V3": "forged", "X-Plivo-Signature-V3-Nonce": "n"})
        signed = await connect(ws_url, additional_headers=signed_headers("GET", ws_url, {}))
        await signed.close()
    assert exc.value.response.status_code == 403 and recorder.opened == []


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (lambda s: b"\x00\x01", "binary_frame"),
        (lambda s: "{not json", "not_json"),
        (lambda s: s.media().replace(s.stream_id, "00000000-0000-4000-8000-000000000000"), "wrong_stream"),
        (lambda s: s.media().replace('"payload":"', '"payload":"%%'), "bad_base64"),
        (lambda s: f'{{"event":7,"streamId":"{s.stream_id}"}}', "bad_field"),
    ],
)
async def test_bad_input_ends_only_that_call(message: Any, reason: str) -> None:
    recorder = engine()
    async with bridge_with(recorder) as bridge:
        good = await PlivoStream.open(bridge)
        await good.ws.send(good.start_message())
        bad = await PlivoStream.open(bridge)
        await bad.ws.send(bad.start_message())
        await until(lambda: recorder.session_count == 2)
        await bad.ws.send(message(bad))
        assert await bad.closed() == 1008
        await until(lambda: recorder.session_count == 1)
        metrics = bridge.app.state.bridge.registry
        labels = {"provider": "plivo", "reason": reason}
        await until(lambda: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", labels) == 1)
        await good.ws.send(good.media())  # the other call carries on
        await good.ws.close()
        # the failed call is over: Plivo's <Redirect> gets <Hangup/>
        again = await post_signed(bridge, "/plivo/answer", call_params(bad.call_uuid))
    assert ET.fromstring(again.text).find("Hangup") is not None


async def test_status_and_hangup_callbacks() -> None:
    recorder = engine()
    async with bridge_with(recorder) as bridge:
        status = {"Event": "DroppedStream", "CallUUID": "c-9", "StreamID": "s-9", "Error": "Connection reset"}
        assert (await post_signed(bridge, "/plivo/stream-status", status)).status_code == 204
        assert (await post_signed(bridge, "/plivo/stream-status", status, sign=False)).status_code == 403
        metrics = bridge.app.state.bridge.registry
        assert metrics.get_sample_value("callbridge_stream_status_total", {"provider": "plivo", "event": "DroppedStream"}) == 1
        assert (await post_signed(bridge, "/plivo/hangup", {"CallUUID": "c-9"}, sign=False)).status_code == 403
        assert (await post_signed(bridge, "/plivo/hangup", {"CallUUID": "c-9", "HangupCause": "NORMAL_CLEARING"})).status_code == 204
        after = await post_signed(bridge, "/plivo/answer", call_params("c-9"))
    assert ET.fromstring(after.text).find("Hangup") is not None and recorder.opened == []


async def test_calls_past_capacity_are_refused_busy() -> None:
    recorder = engine()
    async with bridge_with(recorder, server={"max_calls": 1}) as bridge:
        first = await PlivoStream.open(bridge)
        await first.ws.send(first.start_message())
        metrics = bridge.app.state.bridge.registry
        await until(lambda: metrics.get_sample_value("callbridge_engine_sessions_total", {"how": "opened"}) == 1)
        refused = await post_signed(bridge, "/plivo/answer", call_params("c-late"))
        again = await post_signed(bridge, "/plivo/answer", call_params(first.call_uuid))  # its own redirect still gets a stream
        await first.ws.close()
    hangup = ET.fromstring(refused.text).find("Hangup")
    assert hangup is not None and hangup.attrib == {"reason": "busy"}
    assert ET.fromstring(again.text).find("Stream") is not None


def test_extra_headers_as_the_xml_writes_them_reach_the_codec() -> None:
    xml = stream_xml("https://b.example", "T-_x", "audio/x-mulaw;rate=8000")
    stream = ET.fromstring(xml).find("Stream")
    assert stream is not None
    assert decode_stream_token(parse_extra_headers(stream.attrib["extraHeaders"])["token"]) == "T-_x"


# ----------------------------------------------------------------------- REST


async def test_rest_hang_up_deletes_the_call_with_basic_auth() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    rest = PlivoRest("https://api.example/", AUTH_ID, SecretStr(AUTH_TOKEN), client=http_client(transport=httpx.MockTransport(handler)))
    await rest.hang_up("1234-abcd", "MAOTHER")
    await rest.aclose()
    (request,) = seen
    assert request.method == "DELETE" and str(request.url) == f"https://api.example/v1/Account/{AUTH_ID}/Call/1234-abcd/"
    assert request.headers["authorization"] == "Basic " + base64.b64encode(f"{AUTH_ID}:{AUTH_TOKEN}".encode()).decode()


@pytest.mark.parametrize(("status", "raises"), [(204, False), (404, False), (401, True), (500, True)])
async def test_rest_hang_up_statuses(status: int, raises: bool) -> None:
    client = http_client(transport=httpx.MockTransport(lambda request: httpx.Response(status)))
    rest = PlivoRest("https://api.example", AUTH_ID, SecretStr(AUTH_TOKEN), client=client)
    if raises:
        with pytest.raises(httpx.HTTPStatusError):
            await rest.hang_up("c", None)
    else:
        await rest.hang_up("c", None)
    await rest.aclose()


async def test_rest_hang_up_needs_credentials() -> None:
    rest = PlivoRest("https://api.example", None, None, client=http_client(transport=httpx.MockTransport(lambda r: httpx.Response(204))))
    with pytest.raises(RuntimeError):
        await rest.hang_up("c", None)
    await rest.aclose()
