"""Exotel's quirks end to end, with the simulated Exotel (``callbridge.carriers.exotel.sim``) over loopback: the applet's
sample rates (100 ms in, chunks of ≥ 3.2 kB and ≥ 100 ms out), mark echoes on clear or not (undocumented), the
handshake retry, and a resumed call at 16 kHz. The shared scenarios are in ``test_carrier_matrix.py``."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from callbridge.carriers.exotel.sim import ExotelStream, SimulatedExotel
from callbridge.engine.commands import AckPlayback, CloseSession, TruncateItem
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import LoopStalls, engine, heard_of_the_interrupted_reply, settings, short_speech

SPEECH_MS = 1500


def exotel(bridge: object) -> SimulatedExotel:
    carrier = bridge.carrier  # type: ignore[attr-defined]
    assert isinstance(carrier, SimulatedExotel)
    return carrier


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
async def test_conversation_at_each_applet_rate(rate: int) -> None:
    recorder = engine()
    messages: list[str | bytes] = []
    async with running_bridge(settings(), recorder, provider="exotel") as bridge:
        sim = exotel(bridge)
        sim.rate_hz = rate
        sim.on_message = messages.append
        result = await sim.place_call(CallerScript(utterances=((300, short_speech()),)))
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()  # every chunk was one Exotel plays whole
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()
    media = [m for m in messages if isinstance(m, str) and m.startswith('{"event":"media"')]
    assert media, "the agent spoke"
    (session_id,) = recorder.opened
    assert recorder.commands[session_id][-1] == CloseSession("call_ended")
    acks = [c for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and acks[-1].played_ms >= result.agent_speech_ms - 200


EXOTEL_FRAME_MS = 100


class _NoEchoOnClear(ExotelStream):
    marks_echoed_on_clear: ClassVar[bool] = False


@pytest.mark.parametrize("echoed", [True, False], ids=["marks_echoed_on_clear", "marks_voided_on_clear"])
async def test_barge_in_whether_or_not_exotel_echoes_marks_on_clear(echoed: bool) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="exotel") as bridge:
        sim = exotel(bridge)
        if not echoed:
            sim.stream_class = _NoEchoOnClear  # type: ignore[misc]
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        async with LoopStalls() as stalls:
            result = await sim.place_call(script)
    assert result.warnings == [], result.render()
    assert result.clears and result.clears[-1] > 0
    (truncate,) = recorder.of(TruncateItem)
    # what the carrier played, less at most the padding of the reply's last 100 ms frame (and a 100 ms frame played
    # again by each resumed pause): the engine is never told more was heard than it generated
    played, replayed_ms = heard_of_the_interrupted_reply(result, EXOTEL_FRAME_MS)
    error = truncate.audio_end_ms - played
    assert -EXOTEL_FRAME_MS - replayed_ms - stalls.heard_tolerance_ms <= error <= stalls.heard_tolerance_ms, (truncate, result.render())
    heard = [a.played_ms for a in recorder.of(AckPlayback) if f"item_{a.response_id}" == truncate.item_id]
    assert heard[-1] == truncate.audio_end_ms  # echoes of flushed marks (if any) did not move it


async def test_drop_resumes_the_same_session_at_16_khz() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="exotel") as bridge:
        sim = exotel(bridge)
        sim.rate_hz = 16000
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await sim.place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]
    assert 600 <= result.agent_speech_ms <= 720  # the 660 ms chime once, in 100 ms chunks


async def test_drop_resumes_at_8_khz_with_the_greeting_padded_to_200_ms_chunks() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="exotel") as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await exotel(bridge).place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]
    assert result.agent_speech_ms == 800  # 660 ms of chime in four 200 ms chunks, not replayed


async def test_a_refused_handshake_is_retried_once_then_the_flow_moves_on() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="exotel") as bridge:
        sim = exotel(bridge)
        sim.api_token = "not-the-token"
        result = await sim.place_call(CallerScript(hangup_at_ms=500))
        refused = bridge.app.state.bridge.registry.get_sample_value(
            "callbridge_streams_refused_total", {"provider": "exotel", "reason": "bad_credentials"}
        )
    assert refused == 2 and result.streams == [] and recorder.opened == []
    assert [e.what for e in result.timeline if "handshake failed" in e.what][1].startswith("handshake failed (attempt 2)")


async def test_bridge_closing_the_socket_ends_the_call() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="exotel") as bridge:
        sim = exotel(bridge)
        script = CallerScript(utterances=((300, short_speech()),), hangup_at_ms=8000)
        task = asyncio.create_task(sim.place_call(script))
        while recorder.session_count == 0:
            await asyncio.sleep(0.01)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        result = await task
    assert result.hung_up_by == "bridge" and len(result.streams) == 1, result.render()
    assert any("next applet, Hangup" in e.what for e in result.timeline)
    assert await bridge.app.state.bridge.services.registry.ended_reason(result.call_sid) is not None
