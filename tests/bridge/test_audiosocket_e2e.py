"""AudioSocket end to end through the simulated Asterisk (``callbridge.carriers.audiosocket.sim``): a bridge on uvicorn
with its TCP listener, real loopback sockets and the embedded engine. The quirks the matrix does not cover:
no flush and no markers on the wire, slin16, the in-band hang-up followed by the dialplan's loop, and a
close that is not a goodbye."""

from __future__ import annotations

import asyncio
import uuid

from callbridge.carriers.audiosocket.sim import (
    MAX_AHEAD_MS,
    AudioSocketStream,
    SimulatedAudioSocket,
)
from callbridge.carriers.audiosocket.wire import frame
from callbridge.engine.commands import AckPlayback, CloseSession, TruncateItem
from callbridge.sim.carrier import CallerScript, CallResult, SimCall
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import (
    LoopStalls,
    engine,
    heard_of_the_interrupted_reply,
    known,
    settings,
    short_speech,
    until,
)

SPEECH_MS = 1500


def asterisk(carrier: object) -> SimulatedAudioSocket:
    assert isinstance(carrier, SimulatedAudioSocket)
    return carrier


async def test_barge_in_stops_sending_and_acks_what_was_heard() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="audiosocket") as bridge:
        sim = asterisk(bridge.carrier)
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        async with LoopStalls() as stalls:
            result = await sim.place_call(script)
    assert result.warnings == [] and result.clears == [], result.render()  # nothing to flush at Asterisk
    truncates = recorder.of(TruncateItem)
    assert truncates, result.render()
    first = truncates[0]  # the barge-in (a later one: the caller hung up over the agent's answer)
    heard_acks = [a for a in recorder.of(AckPlayback) if f"item_{a.response_id}" == first.item_id]
    assert heard_acks[-1].played_ms == first.audio_end_ms
    heard, replayed_ms = heard_of_the_interrupted_reply(result)
    assert abs(first.audio_end_ms - heard) <= stalls.heard_tolerance_ms + replayed_ms, (first.audio_end_ms, heard, result.render())
    assert heard < SPEECH_MS
    assert sim.max_ahead_ms[result.call_sid] <= MAX_AHEAD_MS


async def test_slin16_conversation() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="audiosocket") as bridge:
        sim = asterisk(bridge.carrier)
        sim.kind = 0x12  # Dial(AudioSocket/host:port/<uuid>/c(slin16))
        result = await sim.place_call(CallerScript(utterances=((300, short_speech()),)))
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()
    (session_id,) = recorder.opened
    acks = [c for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and acks[-1].played_ms >= result.agent_speech_ms - 100
    assert sim.max_ahead_ms[result.call_sid] <= MAX_AHEAD_MS


async def test_after_an_in_band_hang_up_the_dialplan_loop_is_refused_at_once() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="audiosocket") as bridge:
        sim = asterisk(bridge.carrier)
        call = asyncio.create_task(sim.place_call(CallerScript(hangup_at_ms=5000)))
        await until(lambda: recorder.session_count == 1)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        result = await call
        assert result.hung_up_by == "bridge", result.render()
        # the dialplan runs AudioSocket() again with the same uuid: the bridge closes it without a word
        reader, writer = await asyncio.open_connection(sim.host, sim.port)
        writer.write(frame(0x01, uuid.UUID(result.call_sid).bytes) + frame(0x10, bytes(320)) * 5)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        refused = bridge.app.state.bridge.registry.get_sample_value(
            "callbridge_streams_refused_total", {"provider": "audiosocket", "reason": "call_already_ended"}
        )
    assert answer == b"" and refused == 1 and len(recorder.opened) == 1


async def test_a_close_is_not_a_goodbye_the_session_waits_for_the_loop() -> None:
    """Asterisk closes the socket both when the caller hangs up and when ``AudioSocket()`` fails: the bridge keeps
    the engine session for the grace, and ``AudioSocket()`` run again with the uuid resumes it."""
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="audiosocket") as bridge:
        sim = asterisk(bridge.carrier)
        result = await sim.place_call(CallerScript(hangup_at_ms=800))
        registry = bridge.app.state.bridge.services.registry
        await until(lambda: known(registry, result.call_sid))
        assert recorder.of(CloseSession) == [] and recorder.session_count == 1  # kept for a reconnect
        stream = await sim.open_stream(sim.calls[result.call_sid], "network_drop")
        assert stream is not None
        await until(lambda: recorder.resumed == recorder.opened)
        await stream.conn.close()
    assert result.hung_up_by == "caller" and result.warnings == [] and len(recorder.opened) == 1


async def test_a_drop_with_an_immediate_reconnect_resumes() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="audiosocket") as bridge:
        script = CallerScript(drop_stream_at_ms=(700,), hangup_at_ms=2000)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]
    assert 600 <= result.agent_speech_ms <= 720  # the greeting once, not replayed


async def test_every_bad_input_ends_only_its_own_call() -> None:
    """The matrix's bad-input run, except that closing the probe connection leaves its session detached (a close
    is not a goodbye): counts are relative to the sessions open before each case."""
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="audiosocket") as bridge:
        sim = asterisk(bridge.carrier)
        metrics = bridge.app.state.bridge.registry
        good_call = asyncio.create_task(sim.place_call(CallerScript(utterances=((300, short_speech()),))))
        await until(lambda: recorder.session_count == 1)
        probe = SimCall(sim.new_call_id(), CallResult("probe"), lambda: 0)
        first = await sim.open_stream(probe, "answer")
        assert first is not None
        await until(lambda: recorder.session_count == 2)
        cases = sim.bad_inputs(first)
        await first.conn.close()
        registry = bridge.app.state.bridge.services.registry
        await until(lambda: known(registry, probe.call_id))  # detached, kept for the grace
        assert len(cases) >= 5
        expected: dict[str, int] = {}
        for case in sorted(cases):
            before = recorder.session_count
            call = SimCall(sim.new_call_id(), CallResult(case), lambda: 0)
            sim.calls[call.call_id] = call
            stream = await sim.open_stream(call, "answer")
            assert isinstance(stream, AudioSocketStream), case
            await until(lambda n=before: recorder.session_count == n + 1)
            message, reason = sim.bad_inputs(stream)[case]
            await stream.conn.send(message)
            async for chunk in stream.conn.messages():
                stream.receive(chunk)
            assert stream.hangup_received, case  # a bound call is hung up in band, then closed
            await until(lambda n=before: recorder.session_count == n)
            expected[reason] = expected.get(reason, 0) + 1
            labels = {"provider": "audiosocket", "reason": reason}
            await until(lambda n=expected[reason], by=labels: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", by) == n)
        result = await good_call
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000
