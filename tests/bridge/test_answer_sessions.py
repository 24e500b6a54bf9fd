"""Engine sessions opened at the answer webhook (``engine.open_at_answer``): the call's stream takes the session
its answer opened, one nobody takes is closed after the TTL; with a shared registry (real Redis) the session is
parked there and the stream resumes it, and a call no engine takes is refused busy; none is opened when switched
off. Real uvicorn, real websockets, the embedded engine."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time

import orjson
import pytest

from callbridge.bridge.app import create_app
from callbridge.config import Settings
from callbridge.engine.commands import AppendAudio, CloseSession
from callbridge.sim.runner import RunningBridge, running_bridge
from tests.bridge.twilio_e2e import RawStream, detached, engine, post_answer, settings, until
from tests.redis_server import redis_url

__all__ = ["redis_url"]  # the fixture, imported for pytest


async def _answer(bridge: RunningBridge, call_sid: str, *, again: bool = False) -> str:
    """POST Twilio's signed answer webhook (``again``: as its ``<Redirect>``); the TwiML."""
    response = await post_answer(bridge, call_sid, again=again)
    assert response.status_code == 200
    return response.text


def _metric(bridge: RunningBridge, name: str, **labels: str) -> float:
    return bridge.app.state.bridge.registry.get_sample_value(name, labels) or 0.0


async def test_the_stream_takes_the_session_its_answer_opened() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        call_sid = "CA" + secrets.token_hex(16)
        assert "<Connect>" in await _answer(bridge, call_sid)
        await until(lambda: len(recorder.opened) == 1)  # before any websocket: the answer opened it
        assert _metric(bridge, "callbridge_answer_sessions") == 1
        stream = await RawStream.open(bridge, call_sid=call_sid)  # the carrier's stream (its answer, again)
        await stream.start()
        for timestamp in range(0, 200, 20):
            await stream.ws.send(stream.media(base64.b64encode(b"\xff" * 160).decode(), timestamp))  # 20 ms of μ-law
        session_id = recorder.opened[0]
        await until(lambda: any(isinstance(c, AppendAudio) for c in recorder.commands[session_id]))
        assert len(recorder.opened) == 1 and recorder.resumed == []  # that session, not a second one
        assert _metric(bridge, "callbridge_answer_sessions") == 0
        assert _metric(bridge, "callbridge_engine_sessions_total", how="opened") == 1
        assert _metric(bridge, "callbridge_first_audio_to_engine_seconds_count") == 1
        stop = {"accountSid": stream.account_sid, "callSid": call_sid}
        await stream.ws.send(orjson.dumps({"event": "stop", "sequenceNumber": "13", "streamSid": stream.sid, "stop": stop}).decode())
        await until(lambda: recorder.session_count == 0, timeout_s=10)  # the caller hung up: closed, not kept


async def test_a_session_no_stream_takes_is_closed_after_the_ttl() -> None:
    recorder = engine()
    async with running_bridge(settings(engine={"open_at_answer_ttl_s": 0.3}), recorder) as bridge:
        await _answer(bridge, "CA" + secrets.token_hex(16))  # the caller hangs up while it rings: no stream
        await until(lambda: len(recorder.opened) == 1)
        await until(lambda: recorder.session_count == 0, timeout_s=5)
        assert recorder.commands[recorder.opened[0]][-1] == CloseSession("not_claimed")
        assert _metric(bridge, "callbridge_answer_sessions") == 0


async def test_a_reconnect_resumes_and_opens_nothing_at_its_answer() -> None:
    """Twilio's ``<Redirect>`` after a drop reaches the answer webhook again: the call is known, its session is
    detached for the next stream; nothing new is opened."""
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        first = await RawStream.open(bridge)
        await first.start()
        await until(lambda: recorder.session_count == 1 and _metric(bridge, "callbridge_answer_sessions") == 0)
        assert first.ws.transport is not None
        first.ws.transport.abort()  # a network drop: the session is detached
        registry = bridge.app.state.bridge.services.registry
        await until(lambda: detached(registry, first.call_sid))
        second = await RawStream.open(bridge, call_sid=first.call_sid)
        await second.start()
        await until(lambda: recorder.resumed == recorder.opened)
        assert len(recorder.opened) == 1
        await second.ws.close()


async def test_off_or_a_shared_registry_opens_at_the_stream() -> None:
    recorder = engine()
    async with running_bridge(settings(engine={"open_at_answer": "off"}), recorder) as bridge:
        await _answer(bridge, "CA" + secrets.token_hex(16))
        await asyncio.sleep(0.2)
        assert recorder.opened == []
    shared = settings(registry={"backend": "redis", "redis_url": "redis://127.0.0.1:1"})  # never reached here
    assert create_app(shared, engine()).state.bridge.services.answer_sessions is None
    forced = settings(registry={"backend": "redis", "redis_url": "redis://127.0.0.1:1"}, engine={"open_at_answer": "on"})
    assert create_app(forced, engine()).state.bridge.services.answer_sessions is not None


async def test_a_call_hung_up_while_it_rang_closes_its_session_at_once() -> None:
    """Plivo's hangup callback for a call whose stream never came: the session its answer opened is closed then,
    not at the TTL."""
    from tests.bridge.test_plivo_http import bridge_with, call_params, post_signed

    recorder = engine()
    async with bridge_with(recorder, engine={"open_at_answer_ttl_s": 600}) as bridge:
        assert (await post_signed(bridge, "/plivo/answer", call_params("c-rang"))).status_code == 200
        await until(lambda: len(recorder.opened) == 1)
        hangup = {"CallUUID": "c-rang", "HangupCause": "NORMAL_CLEARING"}
        assert (await post_signed(bridge, "/plivo/hangup", hangup)).status_code == 204
        await until(lambda: recorder.session_count == 0)
        assert recorder.commands[recorder.opened[0]][-1] == CloseSession("call_ended")


async def test_calls_answered_and_not_yet_streaming_count_against_max_calls() -> None:
    """At ``server.max_calls = 1``, a call answered whose stream has not come yet holds the place: a second call is
    refused busy, the first call's own answer coming again (a redirect) is not."""
    recorder = engine()
    async with running_bridge(settings(server={"max_calls": 1}), recorder) as bridge:
        first = "CA" + secrets.token_hex(16)
        assert "<Connect>" in await _answer(bridge, first)
        assert 'reason="busy"' in await _answer(bridge, "CA" + secrets.token_hex(16))
        assert "<Connect>" in await _answer(bridge, first, again=True)
    assert len(recorder.opened) == 1


# ------------------------------------------------ a shared registry (Redis)


def _shared(redis_url: str, **sections: dict[str, object]) -> Settings:
    return settings(registry={"backend": "redis", "redis_url": redis_url}, **sections)  # type: ignore[arg-type]


async def test_with_a_shared_registry_the_answer_parks_the_session_and_its_stream_resumes_it(redis_url: str) -> None:
    """With Redis the stream may reach another replica: the session opened at the answer is detached and its ticket
    parked in the registry, and the stream resumes it (this replica or another: the registry is the meeting point)."""
    recorder = engine()
    async with running_bridge(_shared(redis_url), recorder) as bridge:
        call_sid = "CA" + secrets.token_hex(16)
        assert "<Connect>" in await _answer(bridge, call_sid)
        assert len(recorder.opened) == 1  # opened before the answer's TwiML went back
        registry = bridge.app.state.bridge.services.registry
        assert await detached(registry, call_sid)  # parked, for whichever replica the stream reaches
        stream = await RawStream.open(bridge, call_sid=call_sid)
        await stream.start()
        for timestamp in range(0, 200, 20):
            await stream.ws.send(stream.media(base64.b64encode(b"\xff" * 160).decode(), timestamp))
        session_id = recorder.opened[0]
        await until(lambda: any(isinstance(c, AppendAudio) for c in recorder.commands[session_id]))
        assert recorder.opened == [session_id] and recorder.resumed == [session_id]  # that session, resumed
        assert _metric(bridge, "callbridge_engine_sessions_total", how="opened") == 1  # counted as opened at the answer
        assert _metric(bridge, "callbridge_engine_sessions_total", how="resumed") == 0
        await stream.ws.close()


async def test_with_a_shared_registry_a_call_no_engine_takes_is_refused_busy(redis_url: str) -> None:
    recorder = engine(max_sessions=1)
    async with running_bridge(_shared(redis_url), recorder) as bridge:
        assert "<Connect>" in await _answer(bridge, "CA" + secrets.token_hex(16))  # its parked session holds the slot
        assert 'reason="busy"' in await _answer(bridge, "CA" + secrets.token_hex(16))  # never answered
        assert _metric(bridge, "callbridge_admission_refused_total", reason="engine") == 1
    assert len(recorder.opened) == 1


@pytest.mark.long
async def test_with_a_shared_registry_a_parked_session_no_stream_claims_is_closed(redis_url: str) -> None:
    """With the shipped ``engine.open_at_answer_ttl_s`` (15 s): kept until then, closed after."""
    recorder = engine()
    async with running_bridge(_shared(redis_url), recorder) as bridge:
        ttl_s = bridge.settings.engine.open_at_answer_ttl_s
        registry = bridge.app.state.bridge.services.registry
        call_sid = "CA" + secrets.token_hex(16)
        answered = time.monotonic()
        await _answer(bridge, call_sid)  # the caller hangs up while it rings: no stream
        await asyncio.sleep(max(0.0, answered + ttl_s - 1.0 - time.monotonic()))
        assert recorder.session_count == 1 and await detached(registry, call_sid)  # a second before the TTL: waiting
        await until(lambda: recorder.session_count == 0, timeout_s=5)
        assert time.monotonic() - answered >= ttl_s
        assert recorder.commands[recorder.opened[0]][-1] == CloseSession("not_claimed")
        assert not await detached(registry, call_sid)
