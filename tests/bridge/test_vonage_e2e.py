"""Vonage end to end: a bridge on uvicorn, the simulated Vonage (``callbridge.carriers.vonage.sim``) and raw Vonage
clients over real loopback sockets, with the embedded engine (telephony-protocols.md §2, §7)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from callbridge.bridge.ws_protocol import PRE_AUTH_MAX_MESSAGE_BYTES
from callbridge.carriers.vonage.http import (
    VonageRest,
    VonageSignatures,
    VonageTransport,
    ncco_connect,
)
from callbridge.carriers.vonage.sim import SimulatedVonage, sign_webhook
from callbridge.engine.commands import (
    AckPlayback,
    CloseSession,
    CreateTextItem,
    TruncateItem,
)
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import RunningBridge, running_bridge
from callbridge.sim.simulators import simulated
from tests.bridge.twilio_e2e import (
    LoopStalls,
    bound,
    detached,
    engine,
    heard_of_the_interrupted_reply,
    settings,
    short_speech,
    until,
)

SIMULATED = simulated()

SPEECH_MS = 1500
SECRET = "a-signature-secret-of-32-bytes-or-more"


def test_the_simulator_is_registered() -> None:
    assert SIMULATED["vonage"] is SimulatedVonage


def sim(bridge: RunningBridge) -> SimulatedVonage:
    assert isinstance(bridge.carrier, SimulatedVonage)
    return bridge.carrier


class RawVonage:
    """Vonage's webhooks and websocket driven by hand, signed with the simulated account's secret."""

    def __init__(self, bridge: RunningBridge) -> None:
        self.bridge = bridge
        self.carrier = sim(bridge)
        self.http = http_client(timeout=10.0)

    def sign(self, body: bytes | None = None, **kwargs: Any) -> str:
        return sign_webhook(self.carrier.secret, self.carrier.application_id, body, **kwargs)

    async def answer(self, call_id: str, *, method: str = "GET", authorization: str | None = None) -> httpx.Response:
        params = {"uuid": call_id, "conversation_uuid": f"CON-{call_id}", "from": "447700900001", "to": "447700900000"}
        url = self.bridge.base_url + "/vonage/answer"
        if method == "GET":
            return await self.http.get(url, params=params, headers={"Authorization": authorization or self.sign()})
        body = orjson.dumps(params)
        return await self.http.post(url, content=body, headers={"Authorization": authorization or self.sign(body)})

    async def event(self, event: dict[str, Any]) -> httpx.Response:
        body = orjson.dumps(event)
        return await self.http.post(self.bridge.base_url + "/vonage/events", content=body, headers={"Authorization": self.sign(body)})

    async def connect(self, ncco: list[dict[str, Any]]) -> tuple[ClientConnection, dict[str, Any]]:
        endpoint = ncco[0]["endpoint"][0]
        ws = await connect(endpoint["uri"], compression=None)
        await ws.send(orjson.dumps({"event": "websocket:connected", "content-type": endpoint["content-type"], **endpoint["headers"]}).decode())
        return ws, endpoint["headers"]

    async def aclose(self) -> None:
        await self.http.aclose()


@contextlib.asynccontextmanager
async def raw(bridge: RunningBridge) -> Any:
    client = RawVonage(bridge)
    try:
        yield client
    finally:
        await client.aclose()


async def drain(ws: ClientConnection, timeout_s: float = 5.0) -> list[str | bytes]:
    received: list[str | bytes] = []

    async def read() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                received.append(message)

    await asyncio.wait_for(read(), timeout_s)
    return received


# ----------------------------------------------------------- the simulated Vonage


async def test_conversation_ends_cleanly_when_the_caller_hangs_up() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
        await until(lambda: recorder.session_count == 0)
        ended = await bridge.app.state.bridge.services.registry.ended_reason(result.call_sid)
    assert result.warnings == [] and result.hung_up_by == "caller" and len(result.streams) == 1, result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()
    assert len(result.marks_echoed) >= result.agent_speech_ms // 200 - 1
    (session_id,) = recorder.opened
    acks = [c for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and acks[-1].played_ms >= result.agent_speech_ms - 100
    # the socket closed before the `completed` webhook came: the bridge waited for it and closed the session
    assert recorder.commands[session_id][-1] == CloseSession("call_ended")
    assert ended == "caller_hung_up"


async def test_conversation_at_8_khz() -> None:
    recorder = engine()
    async with running_bridge(settings(vonage={"audio_rate_hz": 8000}), recorder, provider="vonage") as bridge:
        frames: list[int] = []
        bridge.carrier.on_message = lambda m: frames.append(len(m)) if isinstance(m, bytes) else None
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert frames and set(frames) == {320}
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000
    heard = np.frombuffer(bytes(result.heard), dtype="<i2")
    assert np.abs(heard).max() > 1000  # the echo came back, not silence


async def test_barge_in_clears_and_acks_what_was_heard() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        async with LoopStalls() as stalls:
            result = await bridge.carrier.place_call(script)
    assert result.warnings == [], result.render()
    (truncate,) = recorder.of(TruncateItem)
    heard_acks = [a for a in recorder.of(AckPlayback) if f"item_{a.response_id}" == truncate.item_id]
    assert heard_acks[-1].played_ms == truncate.audio_end_ms
    heard, replayed_ms = heard_of_the_interrupted_reply(result)
    assert abs(truncate.audio_end_ms - heard) <= stalls.heard_tolerance_ms + replayed_ms, result.render()
    assert result.clears and result.clears[-1] > 0


async def test_dtmf_reaches_the_engine() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        result = await bridge.carrier.place_call(CallerScript(dtmf=((200, "5"), (400, "#")), hangup_at_ms=700))
    assert result.warnings == []
    assert recorder.of(CreateTextItem) == [CreateTextItem("DTMF 5"), CreateTextItem("DTMF #")]


async def test_bridge_hangs_up_through_the_rest_api() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        call = asyncio.create_task(bridge.carrier.place_call(CallerScript(hangup_at_ms=5000)))
        await until(lambda: recorder.session_count == 1)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        result = await call
        hangups, refusals = sim(bridge).hangups, sim(bridge).rest_refusals
    assert result.hung_up_by == "bridge", result.render()
    assert hangups == [result.call_sid] and refusals == []  # the RS256 JWT checked out
    assert result.heard_ms < 4000


async def test_drop_reconnects_and_resumes_the_same_session() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]
    assert 600 <= result.agent_speech_ms <= 720  # the greeting once, not replayed on the new socket


async def test_forged_requests_are_refused() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        assert await sim(bridge).forged_requests_refused()
    assert recorder.opened == []


async def test_bad_input_ends_only_its_own_call() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        carrier = sim(bridge)
        metrics = bridge.app.state.bridge.registry
        good_call = asyncio.create_task(carrier.place_call(CallerScript(utterances=((300, short_speech()),))))
        await until(lambda: recorder.session_count == 1)
        from callbridge.sim.carrier import CallResult, SimCall

        expected: dict[str, int] = {}
        probe = SimCall(carrier.new_call_id(), CallResult("probe"), lambda: 0)
        carrier.calls[probe.call_id] = probe
        first = await carrier.open_stream(probe, "answer")
        assert first is not None
        cases = carrier.bad_inputs(first)
        await until(lambda: recorder.session_count == 2)
        await first.conn.send(cases["non_json_text"][0])
        await drain(first.conn.ws)  # type: ignore[attr-defined]
        expected["not_json"] = 1
        await until(lambda: recorder.session_count == 1)
        assert len(cases) >= 8
        for case in sorted(cases):
            if case == "non_json_text":
                continue
            call = SimCall(carrier.new_call_id(), CallResult(case), lambda: 0)
            carrier.calls[call.call_id] = call
            stream = await carrier.open_stream(call, "answer")
            assert stream is not None, case
            await until(lambda: recorder.session_count == 2)
            message, reason = carrier.bad_inputs(stream)[case]
            await stream.conn.send(message)
            await drain(stream.conn.ws)  # type: ignore[attr-defined]
            too_big = len(message) > PRE_AUTH_MAX_MESSAGE_BYTES  # refused unread by the websocket: 1009
            assert stream.conn.close_code == (1009 if too_big else 1008), (case, stream.conn.close_code)
            await until(lambda: recorder.session_count == 1)
            expected[reason] = expected.get(reason, 0) + 1
            labels = {"provider": "vonage", "reason": reason}
            count = expected[reason]
            await until(lambda: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", labels) == count)  # noqa: B023
            assert call.ended.is_set(), case  # the bridge hung the call up through the REST API
        result = await good_call
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000


# ---------------------------------------------------------------- by hand


async def test_answer_ncco_shape_for_get_and_post() -> None:
    async with running_bridge(settings(vonage={"audio_rate_hz": 8000}), engine(), provider="vonage") as bridge, raw(bridge) as client:
        for method in ("GET", "POST"):
            call_id = str(uuid.uuid4())
            response = await client.answer(call_id, method=method)
            assert response.status_code == 200 and response.headers["content-type"] == "application/json"
            (action,) = response.json()
            assert action["action"] == "connect" and action["eventType"] == "synchronous"
            assert action["eventUrl"] == [bridge.base_url + "/vonage/events"] and action["from"] == "447700900001"
            (endpoint,) = action["endpoint"]
            assert endpoint["type"] == "websocket" and endpoint["uri"] == bridge.base_url.replace("http", "ws") + "/vonage/media"
            assert endpoint["content-type"] == "audio/l16;rate=8000"
            assert set(endpoint["headers"]) == {"call_uuid", "token"} and endpoint["headers"]["call_uuid"] == call_id
            assert len(orjson.dumps(endpoint["headers"])) < 512


async def test_webhook_signatures() -> None:
    async with running_bridge(settings(), engine(), provider="vonage") as bridge, raw(bridge) as client:
        call_id = str(uuid.uuid4())
        assert (await client.answer(call_id, authorization="Bearer not-a-jwt")).status_code == 403
        assert (await client.answer(call_id, authorization=client.sign(issued_at=time.time() - 600))).status_code == 403
        assert (await client.answer(call_id, method="POST", authorization=client.sign(b"other body"))).status_code == 403
        assert (await client.answer(call_id, authorization=client.sign())).status_code == 200
        body = orjson.dumps({"uuid": call_id, "status": "answered"})
        unsigned = await client.http.post(bridge.base_url + "/vonage/events", content=body)
        assert unsigned.status_code == 403
        assert (await client.event({"uuid": call_id, "status": "answered"})).status_code == 204


def test_signature_checks() -> None:
    from pydantic import SecretStr

    checks = VonageSignatures(SecretStr(SECRET), application_id="app-1")
    body = b'{"status":"completed"}'
    assert checks.valid(sign_webhook(SECRET, "app-1", body), body)
    assert checks.valid(sign_webhook(SECRET, "app-1"), b"")  # a GET: no body, no payload_hash
    assert checks.valid(sign_webhook(SECRET, "app-1").replace("Bearer", "bearer"), b"")
    assert not checks.valid(sign_webhook("other-" + SECRET, "app-1", body), body)
    assert not checks.valid(sign_webhook(SECRET, "app-1", body), body + b" ")
    assert not checks.valid(sign_webhook(SECRET, "app-1"), body)  # a body the JWT does not cover
    assert not checks.valid(sign_webhook(SECRET, "app-2", body), body)
    assert not checks.valid(sign_webhook(SECRET, "app-1", body, issued_at=time.time() - 301), body)
    assert not checks.valid(sign_webhook(SECRET, "app-1", body).replace("Bearer ", "Basic "), body)
    assert not checks.valid(None, body) and not checks.valid("Bearer ", body)
    assert VonageSignatures(None, enabled=False).valid(None, b"x")
    assert not VonageSignatures(None).valid(sign_webhook(SECRET, "app-1"), b"")


async def test_completed_while_the_socket_is_open_ends_the_stream() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge, raw(bridge) as client:
        call_id = str(uuid.uuid4())
        ws, _ = await client.connect((await client.answer(call_id)).json())
        await until(lambda: recorder.session_count == 1)
        for _ in range(10):
            await ws.send(bytes(640))
        response = await client.event({"uuid": call_id, "conversation_uuid": f"CON-{call_id}", "status": "completed"})
        assert response.status_code == 204
        await drain(ws)
        assert ws.close_code == 1000
        await until(lambda: recorder.session_count == 0)
        (session_id,) = recorder.opened
        assert recorder.commands[session_id][-1] == CloseSession("call_ended")
        # a late `disconnected` for the finished call gets no new socket, nor does a new answer
        late = await client.event({"uuid": "ws-leg", "status": "disconnected", "headers": {"call_uuid": call_id}})
        assert late.status_code == 204 and late.content == b""
        assert (await client.answer(call_id)).json() == []


async def test_websocket_leg_completed_ends_only_the_socket_it_names() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge, raw(bridge) as client:
        call_id = str(uuid.uuid4())
        ws, headers = await client.connect((await client.answer(call_id)).json())
        await until(lambda: recorder.session_count == 1)
        other = {"call_uuid": call_id, "token": "some-older-socket"}
        response = await client.event({"uuid": "leg-old", "status": "completed", "headers": other})
        assert response.status_code == 204
        await ws.send(bytes(640))
        await asyncio.sleep(0.2)
        assert recorder.session_count == 1 and ws.close_code is None  # not this socket
        await client.event({"uuid": "leg-1", "status": "completed", "headers": headers})
        await drain(ws)
        assert ws.close_code == 1000
        await until(lambda: recorder.session_count == 0)
        assert recorder.commands[recorder.opened[0]][-1] == CloseSession("call_ended")


async def test_disconnected_while_our_side_still_sees_the_socket_open() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge, raw(bridge) as client:
        call_id = str(uuid.uuid4())
        ws, headers = await client.connect((await client.answer(call_id)).json())
        registry = bridge.app.state.bridge.services.registry
        await until(lambda: bound(registry, call_id))  # its stream has the session opened at the answer
        response = await client.event({"uuid": "leg-1", "status": "disconnected", "headers": headers})
        again = response.json()
        await until(lambda: detached(registry, call_id))  # the stale socket was let go: its session detached
        ws2, _ = await client.connect(again)
        await until(lambda: recorder.resumed == recorder.opened)
        await ws.close()
        await ws2.close()


async def test_completed_after_a_silent_close_closes_the_detached_session() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge, raw(bridge) as client:
        VonageTransport.verdict_wait_s = 0.1
        try:
            call_id = str(uuid.uuid4())
            ws, _ = await client.connect((await client.answer(call_id)).json())
            await until(lambda: recorder.session_count == 1)
            await ws.close()
            registry = bridge.app.state.bridge.services.registry
            await until(lambda: detached(registry, call_id))
            assert (await client.event({"uuid": call_id, "status": "completed"})).status_code == 204
            await until(lambda: recorder.session_count == 0)
            assert await registry.ended_reason(call_id) == "caller_hung_up"
        finally:
            VonageTransport.verdict_wait_s = 2.0


async def test_disconnected_gets_a_new_socket_that_resumes_and_the_reconnects_are_capped() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge, raw(bridge) as client:
        call_id = str(uuid.uuid4())
        ncco = (await client.answer(call_id)).json()
        tokens = {ncco[0]["endpoint"][0]["headers"]["token"]}
        ws, headers = await client.connect(ncco)
        await until(lambda: recorder.session_count == 1)
        await ws.close()
        event = {"uuid": "leg-1", "conversation_uuid": f"CON-{call_id}", "status": "disconnected", "headers": headers}
        response = await client.event(event)  # answered once the old socket has detached its session
        again = response.json()
        assert again[0]["endpoint"][0]["headers"]["call_uuid"] == call_id
        tokens.add(again[0]["endpoint"][0]["headers"]["token"])
        ws2, _ = await client.connect(again)
        await until(lambda: len(recorder.resumed) == 1)
        assert recorder.resumed == recorder.opened
        await ws2.close()
        for _ in range(9):  # without headers: found by the conversation
            response = await client.event({"uuid": "leg-n", "conversation_uuid": f"CON-{call_id}", "status": "disconnected"})
            tokens.add(response.json()[0]["endpoint"][0]["headers"]["token"])
        assert len(tokens) == 11  # a fresh single-use token each time
        capped = await client.event({"uuid": "leg-x", "status": "disconnected", "headers": headers})
        assert capped.status_code == 204


async def test_a_used_token_is_not_accepted_twice() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge, raw(bridge) as client:
        ncco = (await client.answer(str(uuid.uuid4()))).json()
        ws, _ = await client.connect(ncco)
        await until(lambda: recorder.session_count == 1)
        replay, _ = await client.connect(ncco)
        await drain(replay)
        assert replay.close_code == 1008 and len(recorder.opened) == 1
        await ws.close()


async def test_media_before_connected_ends_the_socket() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="vonage") as bridge:
        async with connect(bridge.base_url.replace("http", "ws") + "/vonage/media") as ws:
            await ws.send(bytes(640))
            await drain(ws)
            assert ws.close_code == 1008
        metrics = bridge.app.state.bridge.registry
        assert metrics.get_sample_value("callbridge_carrier_protocol_errors_total", {"provider": "vonage", "reason": "out_of_order"}) == 1
    assert recorder.opened == []


async def test_answer_refused_while_draining_and_with_a_bad_uuid() -> None:
    async with running_bridge(settings(), engine(), provider="vonage") as bridge, raw(bridge) as client:
        assert (await client.answer("not a uuid")).status_code == 400
        bridge.app.state.bridge.draining = True
        assert (await client.answer(str(uuid.uuid4()))).json() == []


# ---------------------------------------------------------------- pieces


def test_ncco_headers_stay_under_the_limit() -> None:
    with pytest.raises(ValueError):
        ncco_connect("https://b.example", "x" * 600, "t", 16000)
    (action,) = ncco_connect("https://b.example", "c", "t", 16000)
    assert "from" not in action and action["endpoint"][0]["uri"] == "wss://b.example/vonage/media"


async def test_rest_client_outcomes(tmp_path: Path) -> None:
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "private.key"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    seen: list[httpx.Request] = []
    statuses = iter([(204, ""), (404, "{}"), (400, '{"title":"Bad Request","detail":"call already completed"}'), (500, "oops")])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, text = next(statuses)
        return httpx.Response(status, text=text)

    rest = VonageRest("https://api.example/", "app-1", path, client=http_client(transport=httpx.MockTransport(handler)))
    for _ in range(3):
        await rest.hang_up("call-1", None)
    with pytest.raises(httpx.HTTPStatusError):
        await rest.hang_up("call-1", None)
    await rest.aclose()
    request = seen[0]
    assert request.method == "PUT" and str(request.url) == "https://api.example/v1/calls/call-1"
    assert orjson.loads(request.content) == {"action": "hangup"}
    claims = jwt.decode(request.headers["authorization"].removeprefix("Bearer "), key.public_key(), algorithms=["RS256"])
    assert claims["application_id"] == "app-1" and claims["exp"] > claims["iat"] and claims["jti"]
    assert len({r.headers["authorization"] for r in seen}) == 4  # a fresh jti each time
    with pytest.raises(RuntimeError):
        await VonageRest("https://api.example", None, None).hang_up("c", None)
