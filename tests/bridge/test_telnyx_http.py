"""Telnyx's HTTP side in parts: webhook signatures, the Call Control client, and what each webhook makes the bridge do."""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr

from callbridge.bridge.app import create_app
from callbridge.bridge.services import BridgeServices
from callbridge.carriers.telnyx.http import (
    ANSWERED,
    MAX_STREAM_RESTARTS,
    RESTARTS,
    TelnyxCalls,
    TelnyxRest,
    TelnyxSignatures,
    stream_parameters,
)
from callbridge.config import ConfigError, Settings, load_settings
from callbridge.outbound_http import http_client
from tests.bridge.twilio_e2e import engine
from tests.redis_server import redis_server

KEY = Ed25519PrivateKey.generate()
PUBLIC = base64.b64encode(KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
BODY = b'{"data":{"event_type":"call.initiated","payload":{"call_control_id":"v3:abc"}}}'
NOW = 1_750_000_000


def sign(body: bytes, timestamp: int = NOW, key: Ed25519PrivateKey = KEY) -> tuple[str, str]:
    signature = key.sign(f"{timestamp}|".encode() + body)
    return base64.b64encode(signature).decode(), str(timestamp)


class TestSignatures:
    def signatures(self, **options: Any) -> TelnyxSignatures:
        return TelnyxSignatures(PUBLIC, clock=lambda: NOW + 10, **options)

    def test_a_signed_webhook_is_valid(self) -> None:
        assert self.signatures().valid(BODY, *sign(BODY))

    def test_the_body_is_signed_byte_for_byte(self) -> None:
        assert not self.signatures().valid(BODY.replace(b"abc", b"abd"), *sign(BODY))
        assert not self.signatures().valid(BODY + b" ", *sign(BODY))

    def test_the_timestamp_is_signed(self) -> None:
        signature, _ = sign(BODY)
        assert not self.signatures().valid(BODY, signature, str(NOW + 1))

    def test_another_key_is_refused(self) -> None:
        assert not self.signatures().valid(BODY, *sign(BODY, key=Ed25519PrivateKey.generate()))

    @pytest.mark.parametrize("skew_s", [-291, 311])  # the clock reads NOW + 10: 301 s off either way
    def test_more_than_five_minutes_off_is_refused(self, skew_s: int) -> None:
        assert not self.signatures().valid(BODY, *sign(BODY, NOW + skew_s))
        assert self.signatures().valid(BODY, *sign(BODY, NOW + 290))

    @pytest.mark.parametrize(
        ("signature", "timestamp"), [(None, str(NOW)), ("", str(NOW)), ("!!notbase64", str(NOW)), ("AAAA", None), ("AAAA", "soon")]
    )
    def test_missing_or_malformed_headers_are_refused(self, signature: str | None, timestamp: str | None) -> None:
        assert not self.signatures().valid(BODY, signature, timestamp)

    def test_no_public_key_refuses_everything_unless_validation_is_off(self) -> None:
        assert not TelnyxSignatures(None).valid(BODY, *sign(BODY))
        assert TelnyxSignatures(None, enabled=False).valid(b"anything", None, None)


def test_public_key_must_be_a_base64_ed25519_key() -> None:
    assert load_settings(None, {"telnyx": {"public_key": PUBLIC}}).telnyx.public_key == PUBLIC
    for bad in ("not-a-key", PUBLIC[:-2], base64.b64encode(bytes(33)).decode()):
        with pytest.raises(ConfigError) as exc:
            load_settings(None, {"telnyx": {"public_key": bad}})
        assert [p.key for p in exc.value.problems] == ["telnyx.public_key"]


class TestRest:
    def rest(self, handler: Any, key: str | None = "KEY123") -> tuple[TelnyxRest, list[httpx.Request]]:
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            response: httpx.Response = handler(request)
            return response

        client = http_client(transport=httpx.MockTransport(record))
        return TelnyxRest("https://api.example/", SecretStr(key) if key else None, client=client), seen

    async def test_hang_up_is_a_bearer_authenticated_command(self) -> None:
        rest, seen = self.rest(lambda r: httpx.Response(200, json={"data": {"result": "ok"}}))
        await rest.hang_up("v3:abc-_=", None)
        (request,) = seen
        assert request.method == "POST" and str(request.url) == "https://api.example/v2/calls/v3:abc-_%3D/actions/hangup"
        assert request.headers["authorization"] == "Bearer KEY123"
        assert set(orjson.loads(request.content)) == {"command_id"}
        await rest.aclose()

    async def test_a_call_already_ended_counts_as_hung_up(self) -> None:
        ended = {"errors": [{"code": "90018", "title": "Call has already ended"}]}
        rest, _ = self.rest(lambda r: httpx.Response(422, json=ended))
        await rest.hang_up("v3:abc", None)
        assert await rest.start_streaming("v3:abc", "wss://b/telnyx/media", "tok", "PCMU") is False

    @pytest.mark.parametrize(
        "response",
        [
            httpx.Response(422, json={"errors": [{"code": "90015", "title": "Invalid call control id"}]}),
            httpx.Response(422, text="not json"),
            httpx.Response(401, json={"errors": [{"code": "10009"}]}),
            httpx.Response(500),
        ],
    )
    async def test_other_failures_raise(self, response: httpx.Response) -> None:
        rest, _ = self.rest(lambda r: response)
        with pytest.raises(httpx.HTTPStatusError):
            await rest.hang_up("v3:abc", None)

    async def test_no_api_key_is_an_error_not_a_request(self) -> None:
        rest, seen = self.rest(lambda r: httpx.Response(200), key=None)
        with pytest.raises(RuntimeError):
            await rest.hang_up("v3:abc", None)
        assert seen == []

    async def test_answer_asks_for_an_rtp_stream_in_one_codec_with_the_token(self) -> None:
        rest, seen = self.rest(lambda r: httpx.Response(200, json={"data": {"result": "ok"}}))
        assert await rest.answer("v3:abc", "wss://bridge/telnyx/media", "tok-1", "PCMA")
        body = orjson.loads(seen[0].content)
        assert seen[0].url.path == "/v2/calls/v3:abc/actions/answer"
        assert body == {**stream_parameters("wss://bridge/telnyx/media", "tok-1", "PCMA"), "command_id": body["command_id"]}
        assert body["stream_codec"] == body["stream_bidirectional_codec"] == "PCMA"
        assert body["stream_bidirectional_mode"] == "rtp" and body["stream_track"] == "inbound_track"
        assert body["custom_parameters"] == [{"name": "token", "value": "tok-1"}]


class RecordingRest(TelnyxRest):
    """Records the commands instead of sending them; ``ended`` calls answer as Telnyx does (422, 90018)."""

    def __init__(self) -> None:
        super().__init__("https://api.example", SecretStr("k"))
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.ended: set[str] = set()

    async def command(self, call_id: str, action: str, body: dict[str, Any] | None = None) -> bool:
        self.sent.append((call_id, action, body or {}))
        return call_id not in self.ended


def services(**settings: Any) -> BridgeServices:
    app = create_app(Settings.model_validate({"telnyx": {"validate_signatures": False}, **settings}), engine())
    state: BridgeServices = app.state.bridge.services
    return state


BASE = "https://bridge.example"


class TestCallControl:
    async def test_an_incoming_call_while_the_registry_is_down_is_rejected_busy(self, caplog: pytest.LogCaptureFixture) -> None:
        """Redis killed: ``call.initiated`` returns normally with the call rejected busy (``USER_BUSY``), logged as
        a warning with no traceback — not an exception out of the webhook (an HTTP 500, which Telnyx retries)."""
        with redis_server() as (url, process):
            svc = services(registry={"backend": "redis", "redis_url": url})
            calls = TelnyxCalls(svc, RecordingRest())
            try:
                process.kill()
                process.wait()
                caplog.clear()
                await calls.on_event("call.initiated", {"call_control_id": "v3:down", "direction": "incoming"}, BASE)
            finally:
                await svc.registry.aclose()
        assert calls.rest.sent == [("v3:down", "reject", {"cause": "USER_BUSY"})]  # type: ignore[attr-defined]
        assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]

    async def test_an_incoming_call_is_answered_with_a_fresh_token(self) -> None:
        svc = services()
        calls = TelnyxCalls(svc, RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a", "direction": "incoming"}, BASE)
        ((call_id, action, body),) = calls.rest.sent  # type: ignore[attr-defined]
        assert (call_id, action, body["stream_url"]) == ("v3:a", "answer", "wss://bridge.example/telnyx/media")
        token = body["custom_parameters"][0]["value"]
        assert await svc.tokens.consume(token, "v3:a") and await calls.answered("v3:a")

    async def test_a_webhook_delivered_twice_answers_once(self) -> None:
        calls = TelnyxCalls(services(), RecordingRest())
        for _ in range(2):
            await calls.on_event("call.initiated", {"call_control_id": "v3:a", "direction": "incoming"}, BASE)
        assert [a for _, a, _ in calls.rest.sent] == ["answer"]  # type: ignore[attr-defined]

    async def test_outgoing_calls_are_not_answered(self) -> None:
        calls = TelnyxCalls(services(), RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a", "direction": "outgoing"}, BASE)
        assert calls.rest.sent == []  # type: ignore[attr-defined]

    async def test_past_capacity_a_call_is_rejected_busy(self) -> None:
        svc = services(server={"max_calls": 1})
        svc.active_calls.add("v3:busy")
        calls = TelnyxCalls(svc, RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a", "direction": "incoming"}, BASE)
        assert calls.rest.sent == [("v3:a", "reject", {"cause": "USER_BUSY"})]  # type: ignore[attr-defined]

    async def test_a_stopped_stream_of_a_live_call_is_restarted_with_a_new_token(self) -> None:
        svc = services()
        calls = TelnyxCalls(svc, RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a"}, BASE)
        for event in ("streaming.stopped", "streaming.failed"):
            await calls.on_event(event, {"call_control_id": "v3:a", "stream_id": "s"}, BASE)
        actions = [(a, b["custom_parameters"][0]["value"]) for _, a, b in calls.rest.sent]  # type: ignore[attr-defined]
        assert [a for a, _ in actions] == ["answer", "streaming_start", "streaming_start"]
        assert len({token for _, token in actions}) == 3
        assert await svc.tokens.consume(actions[-1][1], "v3:a")
        assert svc.metrics.stream_status.labels("telnyx", "streaming.failed")._value.get() == 1

    async def test_no_restart_once_the_call_has_ended(self) -> None:
        svc = services()
        calls = TelnyxCalls(svc, RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a"}, BASE)
        await calls.on_event("call.initiated", {"call_control_id": "v3:b"}, BASE)
        await calls.on_event("call.hangup", {"call_control_id": "v3:a", "hangup_cause": "normal_clearing"}, BASE)
        await svc.registry.mark_ended("v3:b", "engine_unavailable")
        for call in ("v3:a", "v3:b", "v3:unknown", "v3:b"):
            await calls.on_event("streaming.stopped", {"call_control_id": call}, BASE)
        # v3:b is over for the bridge but Telnyx has not said so: hung up (once) rather than left without a stream
        assert [(c, a) for c, a, _ in calls.rest.sent[2:]] == [("v3:b", "hangup")]  # type: ignore[attr-defined]
        assert await svc.registry.ended_reason("v3:a") == "caller_hung_up:normal_clearing"

    async def test_a_stream_that_keeps_failing_ends_in_a_hang_up(self) -> None:
        svc = services()
        calls = TelnyxCalls(svc, RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a"}, BASE)
        for _ in range(MAX_STREAM_RESTARTS + 2):
            await calls.on_event("streaming.failed", {"call_control_id": "v3:a"}, BASE)
        actions = [a for _, a, _ in calls.rest.sent]  # type: ignore[attr-defined]
        assert actions == ["answer"] + ["streaming_start"] * MAX_STREAM_RESTARTS + ["hangup"]
        assert await svc.registry.ended_reason("v3:a") == "stream_restarts_exhausted"

    async def test_draining_hangs_up_instead_of_restarting(self) -> None:
        svc = services()
        calls = TelnyxCalls(svc, RecordingRest())
        await calls.on_event("call.initiated", {"call_control_id": "v3:a"}, BASE)
        svc.draining = True
        await calls.on_event("streaming.stopped", {"call_control_id": "v3:a"}, BASE)
        assert [a for _, a, _ in calls.rest.sent] == ["answer", "hangup"]  # type: ignore[attr-defined]

    async def test_a_restart_on_a_call_telnyx_has_ended_marks_it_ended(self) -> None:
        svc = services()
        rest = RecordingRest()
        calls = TelnyxCalls(svc, rest)
        await calls.on_event("call.initiated", {"call_control_id": "v3:a"}, BASE)
        rest.ended.add("v3:a")
        await calls.on_event("streaming.stopped", {"call_control_id": "v3:a"}, BASE)
        assert await svc.registry.ended_reason("v3:a") == "call_already_ended" and not await calls.answered("v3:a")

    async def test_a_failed_command_is_logged_not_raised(self) -> None:
        def refuse(request: httpx.Request) -> httpx.Response:
            return httpx.Response(500)

        rest = TelnyxRest("https://api.example", SecretStr("k"), client=http_client(transport=httpx.MockTransport(refuse)))
        svc = services()
        calls = TelnyxCalls(svc, rest)
        await calls.on_event("call.initiated", {"call_control_id": "v3:a"}, BASE)
        assert not await calls.answered("v3:a")  # the answer failed: no stream will come, Telnyx's retry answers
        await svc.registry.count("v3:b", ANSWERED, 60_000)  # answered (by this process or another)
        await calls.on_event("streaming.stopped", {"call_control_id": "v3:b"}, BASE)
        assert await svc.registry.counts("v3:b") == {ANSWERED: 1, RESTARTS: 1}


def test_time_is_seconds() -> None:
    """The signature window is against wall-clock seconds, as ``telnyx-timestamp`` is."""
    assert abs(TelnyxSignatures(PUBLIC)._clock() - time.time()) < 5
