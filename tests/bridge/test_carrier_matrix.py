"""The end-to-end matrix, for every carrier: a bridge on uvicorn, the carrier's simulator over real loopback
sockets with its quirks, and the embedded engine.

Each carrier runs: a conversation, a barge-in (the flush, and the heard position right within one frame),
DTMF, the bridge hanging up, a drop that resumes the same engine session (where the carrier reconnects),
forged credentials, and every bad input its wire allows — each ending only its own call while a good
call carries on.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from callbridge.engine.commands import (
    AckPlayback,
    CloseSession,
    CreateTextItem,
    TruncateItem,
)
from callbridge.sim.carrier import CallerScript, CallResult, SimCall, WebSocketConnection
from callbridge.sim.carriers import SIMULATED
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, settings, short_speech, until

SPEECH_MS = 1500
CARRIERS = sorted(SIMULATED)


@pytest.mark.parametrize("provider", CARRIERS)
async def test_conversation(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
        sim = bridge.carrier
        # a carrier that says nothing on the socket when the caller hangs up tells the bridge by webhook (Plivo,
        # Vonage, Telnyx) or does not come back within its reconnect window (AudioSocket): the session closes
        await until(lambda: recorder.session_count == 0, timeout_s=6)
    assert result.warnings == [] and result.hung_up_by == "caller" and len(result.streams) == 1, result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()  # the echo: prefix, speech, tail
    if sim.uses_marks:
        assert len(result.marks_echoed) >= result.agent_speech_ms // 200 - 1
    (session_id,) = recorder.opened
    acks = [c for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and acks[-1].played_ms >= result.agent_speech_ms - 100
    if sim.says_goodbye:
        assert recorder.commands[session_id][-1] == CloseSession("call_ended")  # the caller's hang-up closes it
        assert recorder.session_count == 0


@pytest.mark.parametrize("provider", CARRIERS)
async def test_barge_in_flushes_and_acks_what_was_heard(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        result = await bridge.carrier.place_call(script)
        clear_latency = bridge.app.state.bridge.registry.get_sample_value("callbridge_barge_in_clear_seconds_sum")
    assert result.warnings == [], result.render()
    truncates = recorder.of(TruncateItem)
    if SIMULATED[provider].says_goodbye:
        assert len(truncates) == 1
    # else the caller's hang-up at 6 s is a plain close, cut like a drop: the reply then playing is truncated too
    truncate = truncates[0]
    heard_acks = [a for a in recorder.of(AckPlayback) if f"item_{a.response_id}" == truncate.item_id]
    assert heard_acks[-1].played_ms == truncate.audio_end_ms
    first_run = result.agent_runs_ms[0]  # what the caller heard of the interrupted response
    assert abs(truncate.audio_end_ms - first_run) <= 20, (truncate.audio_end_ms, first_run, result.render())
    assert first_run < SPEECH_MS  # cut short, not played out
    if result.clears:  # carriers with a buffer of their own get a flush; the others just stop getting audio
        assert len(result.clears) == 1 and result.clears[0] > 0
        assert abs(truncate.audio_end_ms - result.played_ms_at_clear[0]) <= 20
    assert clear_latency is not None and clear_latency < 0.05


@pytest.mark.parametrize("provider", CARRIERS)
async def test_dtmf_reaches_the_engine(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        result = await bridge.carrier.place_call(CallerScript(dtmf=((200, "5"), (400, "#")), hangup_at_ms=700))
    assert result.warnings == [], result.render()
    assert recorder.of(CreateTextItem) == [CreateTextItem("DTMF 5"), CreateTextItem("DTMF #")]


@pytest.mark.parametrize("provider", CARRIERS)
async def test_bridge_hangs_up_when_the_engine_session_ends(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        call = asyncio.create_task(bridge.carrier.place_call(CallerScript(hangup_at_ms=5000)))
        await until(lambda: recorder.session_count == 1)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        result = await call
    assert result.hung_up_by == "bridge", result.render()
    assert result.heard_ms < 4000


@pytest.mark.parametrize("provider", CARRIERS)
async def test_drop_resumes_the_same_session(provider: str) -> None:
    if not SIMULATED[provider].can_reconnect:
        pytest.skip(f"{provider} does not reconnect a dropped media connection")
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]  # one session, resumed
    # the 660 ms greeting once, not replayed on the new stream (1320 ms); padded to the carrier's outbound chunk
    # (Exotel at 8 kHz: 200 ms)
    assert 600 <= result.agent_speech_ms <= 860, result.render()


@pytest.mark.parametrize("provider", CARRIERS)
async def test_forged_credentials_are_refused(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        assert await bridge.carrier.forged_requests_refused()
    assert recorder.opened == []


@pytest.mark.parametrize("provider", CARRIERS)
async def test_bad_input_ends_only_its_own_call(provider: str) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider=provider) as bridge:
        sim = bridge.carrier
        metrics = bridge.app.state.bridge.registry
        good_call = asyncio.create_task(sim.place_call(CallerScript(utterances=((300, short_speech()),))))
        await until(lambda: recorder.session_count == 1)
        expected: dict[str, int] = {}
        names: list[str] | None = None
        index = 0
        while names is None or index < len(names):
            call = SimCall(sim.new_call_id(), CallResult("bad_input"), lambda: 0)
            sim.calls[call.call_id] = call
            stream = await sim.open_stream(call, "answer")
            assert stream is not None
            cases = sim.bad_inputs(stream)
            if names is None:
                names = sorted(cases)
                assert len(names) >= 5
            case = names[index]
            index += 1
            await until(lambda: recorder.session_count == 2)
            message, reason = cases[case]
            await stream.conn.send(message)

            async def closed(s=stream) -> None:  # type: ignore[no-untyped-def]
                async for _ in s.conn.messages():
                    pass

            await asyncio.wait_for(closed(), 5)
            # a websocket is closed with 1008 (policy violation); a TCP carrier's connection has no close code
            expected_code = 1008 if isinstance(stream.conn, WebSocketConnection) else None
            assert stream.conn.close_code == expected_code, (case, stream.conn.close_code)
            await until(lambda: recorder.session_count == 1)
            expected[reason] = expected.get(reason, 0) + 1
            labels = {"provider": provider, "reason": reason}
            count = expected[reason]
            await until(lambda n=count, l=labels: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", l) == n)
        async with httpx.AsyncClient() as http:
            assert (await http.get(bridge.base_url + "/healthz")).status_code == 200
        result = await good_call
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000
