"""Plivo's quirks end to end: a bridge on uvicorn and the simulated Plivo over real loopback sockets
(``callbridge.carriers.plivo.sim``) — L16 streams, the hang-up URL (Plivo says nothing on the socket), checkpoints
voided by ``clearAudio`` — and the simulator's own faithfulness."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, ClassVar

import orjson
import pytest

from callbridge.carriers.plivo.sim import PlivoStream, SimulatedPlivo, valid_extra_headers
from callbridge.codecs import AudioEncoding
from callbridge.engine.commands import AppendAudio, CloseSession, TruncateItem
from callbridge.sim.carrier import CallerScript, CallResult, SimCall
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import (
    LoopStalls,
    detached,
    engine,
    heard_of_the_interrupted_reply,
    settings,
    short_speech,
    until,
)

SPEECH_MS = 1500


@pytest.mark.parametrize("content_type", ["audio/x-l16;rate=8000", "audio/x-l16;rate=16000"])
async def test_conversation_in_l16(content_type: str) -> None:
    recorder = engine()
    async with running_bridge(settings(plivo={"content_type": content_type}), recorder, provider="plivo") as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()
    (session_id,) = recorder.opened
    assert recorder.commands[session_id][-1] == CloseSession("call_ended")


async def test_the_hang_up_url_ends_the_call_instead_of_a_drop() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="plivo") as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
        await until(lambda: recorder.session_count == 0)
        registry = bridge.app.state.bridge.services.registry
        assert await registry.ended_reason(result.call_sid) == "caller_hung_up"
    (session_id,) = recorder.opened
    assert recorder.commands[session_id][-1] == CloseSession("call_ended")


class _NoHangupUrl(SimulatedPlivo):
    calls_hangup_url: ClassVar[bool] = False


async def test_without_a_hang_up_url_the_session_waits_for_a_resume() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="plivo") as bridge:
        sim = _NoHangupUrl(bridge.carrier.bridge_url, bridge.carrier.secret)
        try:
            result = await sim.place_call(CallerScript(utterances=((300, short_speech(600)),)))
            registry = bridge.app.state.bridge.services.registry
            await until(lambda: detached(registry, result.call_sid))
            assert await registry.ended_reason(result.call_sid) is None  # a silent close is a drop: kept for the grace
        finally:
            await sim.aclose()
    assert result.warnings == [] and result.hung_up_by == "caller"
    assert not any(isinstance(c, CloseSession) and c.reason == "call_ended" for c in recorder.commands[recorder.opened[0]])


async def test_barge_in_voids_the_pending_checkpoints() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="plivo") as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        received: list[dict[str, Any]] = []
        bridge.carrier.on_message = lambda m: received.append(orjson.loads(m)) if isinstance(m, str) else None
        async with LoopStalls() as stalls:
            result = await bridge.carrier.place_call(script)
    assert result.warnings == [] and result.clears, result.render()  # a flush at each pause (the last: the barge-in's)
    clear_at = max(i for i, m in enumerate(received) if m["event"] == "clearAudio")
    sent_before = {m["name"] for m in received[:clear_at] if m["event"] == "checkpoint"}
    voided = sent_before - set(result.marks_echoed)
    assert voided  # checkpoints pending at the clear were never played back ...
    truncate = recorder.of(TruncateItem)[0]
    heard, replayed_ms = heard_of_the_interrupted_reply(result)
    assert abs(truncate.audio_end_ms - heard) <= stalls.heard_tolerance_ms + replayed_ms  # ... and the heard position is right


async def test_a_network_drop_resumes_with_the_same_call_uuid() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="plivo") as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), redirect_delay_ms=200, hangup_at_ms=3500)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and result.warnings == [], result.render()
    assert recorder.opened == recorder.resumed
    assert len(recorder.of(AppendAudio)) > 100


# ------------------------------------------------------------- the simulator


class _Conn:
    def __init__(self) -> None:
        self.sent: list[str | bytes] = []

    async def send(self, message: str | bytes) -> None:
        self.sent.append(message)


def _stream(encoding: AudioEncoding = AudioEncoding.PCMU, wire: str = "audio/x-mulaw", rate: int = 8000) -> PlivoStream:
    call = SimCall("call-1", CallResult("call-1"), lambda: 0)
    return PlivoStream(_Conn(), "stream-1", call, encoding, wire, rate)  # type: ignore[arg-type]


def _play(payload: bytes, content_type: str = "audio/x-mulaw", rate: object = 8000, **extra: object) -> str:
    media = {"contentType": content_type, "sampleRate": rate, "payload": base64.b64encode(payload).decode()}
    return orjson.dumps({"event": "playAudio", "media": media, "streamId": "stream-1", **extra}).decode()


async def test_the_simulator_plays_what_plivo_accepts() -> None:
    stream = _stream()
    stream.receive(_play(b"\xff" * 160))
    stream.receive(_play(b"\xff" * 160, rate="8000"))
    stream.receive('{"event":"checkpoint","streamId":"stream-1","name":"cp-1"}')
    assert len(stream.queue) == 640 and stream.pending_marks == [(640, "cp-1")]
    stream.receive('{"event":"clearAudio","streamId":"stream-1"}')
    await asyncio.sleep(0)
    assert stream.call.result.warnings == [] and stream.queue == bytearray() and stream.pending_marks == []
    sent = [orjson.loads(m) for m in stream.conn.sent]  # type: ignore[attr-defined]
    assert [m["event"] for m in sent] == ["clearedAudio"]  # the voided checkpoint is never acknowledged


@pytest.mark.parametrize(
    "message",
    [
        b"\x00",
        "not json",
        '{"event":"media","streamId":"stream-1"}',
        _play(b"\xff" * 160, content_type="audio/x-l16"),
        _play(b"\xff" * 160, rate=16000),
        _play(b"\xff" * 160, streamId="stream-2"),
        _play(b"\xff" * 160, extra=1),
        '{"event":"playAudio","media":{"contentType":"audio/x-mulaw","sampleRate":8000,"payload":"!!"}}',
        '{"event":"checkpoint","streamId":"stream-1"}',
        '{"event":"clear","streamId":"stream-1"}',
    ],
)
def test_the_simulator_warns_on_what_plivo_rejects(message: str | bytes) -> None:
    stream = _stream()
    stream.receive(message)
    assert len(stream.call.result.warnings) == 1 and not stream.queue


def test_the_simulator_checks_l16_payloads() -> None:
    stream = _stream(AudioEncoding.L16, "audio/x-l16", 16000)
    stream.receive(_play(b"\x01\x00" * 320, content_type="audio/x-l16", rate=16000))
    assert len(stream.queue) == 640 and stream.call.result.warnings == []
    stream.receive(_play(b"\x01\x00\x02", content_type="audio/x-l16", rate=16000))
    assert len(stream.call.result.warnings) == 1


@pytest.mark.parametrize(
    ("value", "valid"),
    [("token=abc123", True), ("a=1,b=2", True), ("token=ab-c", False), ("token", False), ("t=" + "a" * 600, False)],
)
def test_the_simulator_checks_extra_headers_as_plivo_does(value: str, valid: bool) -> None:
    assert valid_extra_headers(value) is valid
