"""Telnyx end to end, its quirks: the bridge on uvicorn, the simulated Telnyx (Call Control webhooks signed with
ed25519, media frames not always in order) over real loopback sockets, and the embedded engine."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import callbridge.carriers.telnyx.http as telnyx_bridge
from callbridge.carriers.telnyx.sim import SimulatedTelnyx, TelnyxStream
from callbridge.carriers.telnyx.wire import TelnyxCodec
from callbridge.engine.commands import CloseSession
from callbridge.sim.carrier import CallerScript, CallResult, SimCall
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, settings, short_speech, until

SPEECH_MS = 1500


@pytest.fixture
def codecs(monkeypatch: pytest.MonkeyPatch) -> list[TelnyxCodec]:
    """Every ``TelnyxCodec`` the bridge's Telnyx media endpoint makes, to read its counters."""
    made: list[TelnyxCodec] = []

    def recording(*args: Any, **kwargs: Any) -> TelnyxCodec:  # not a subclass: the compiled build's codec has none
        codec = TelnyxCodec(*args, **kwargs)
        made.append(codec)
        return codec

    monkeypatch.setattr(telnyx_bridge, "TelnyxCodec", recording)
    return made


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[TelnyxStream]:
    """Every media connection the simulated Telnyx opens."""
    opened: list[TelnyxStream] = []
    original = SimulatedTelnyx.open_stream

    async def open_stream(self: SimulatedTelnyx, *args: Any) -> TelnyxStream | None:
        stream = await original(self, *args)
        if stream is not None:
            opened.append(stream)
        return stream

    monkeypatch.setattr(SimulatedTelnyx, "open_stream", open_stream)
    return opened


def correlation(heard: bytes, said: bytes) -> float:
    """The peak normalised cross-correlation of what the caller heard with what they said (the echo)."""
    a = np.frombuffer(heard, dtype="<i2").astype(np.float64)
    b = np.frombuffer(said, dtype="<i2").astype(np.float64)
    size = 1 << int(np.ceil(np.log2(len(a) + len(b))))
    cross = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)
    energy = np.sqrt(np.sum(b * b) * np.max(np.convolve(a * a, np.ones(len(b)), mode="valid")))
    return float(np.max(cross) / energy)


async def test_frames_out_of_order_reach_the_engine_in_order(codecs: list[TelnyxCodec], streams: list[TelnyxStream]) -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="telnyx") as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),), dtmf=((700, "3"),)))
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    ((codec,), (stream,)) = codecs, streams
    assert stream.swapped >= 20  # every 7th of the call's frames went out late
    assert stream.swapped - 1 <= codec.reordered <= stream.swapped  # the last may have been flushed by stop
    assert codec.duplicates_dropped == codec.late_dropped == codec.gaps == 0
    core = recorder.sessions[recorder.opened[0]]._core
    assert core._input_ms >= stream.media_ms - 100  # nothing lost, less what the resampler still held
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000
    assert correlation(bytes(result.heard), short_speech()) > 0.85  # the echo is the caller's speech, in order


async def test_a_pcma_call(streams: list[TelnyxStream]) -> None:
    recorder = engine()
    async with running_bridge(settings(telnyx={"codec": "PCMA"}), recorder, provider="telnyx") as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
        commands = [(action, body) for call_id, action, body in bridge.carrier.commands if call_id == result.call_sid]  # type: ignore[attr-defined]
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    ((action, body),) = commands
    assert action == "answer" and body["stream_codec"] == body["stream_bidirectional_codec"] == "PCMA"
    assert streams[0].encoding.value == "pcma"
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000
    assert correlation(bytes(result.heard), short_speech()) > 0.85  # decoded and encoded as A-law both ways


async def test_pcmu_heard_as_pcma_would_not_correlate() -> None:
    """The check above can fail: μ-law bytes decoded as A-law do not sound like the caller."""
    from callbridge.codecs import AudioEncoding, decode_to_pcm16, encode_from_pcm16

    speech = short_speech()
    garbled = decode_to_pcm16(AudioEncoding.PCMA, encode_from_pcm16(AudioEncoding.PCMU, speech))
    assert correlation(bytes(garbled), speech) < 0.75
    assert correlation(speech, speech) > 0.99


async def test_a_drop_restarts_streaming_with_a_new_token_on_the_same_call() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder, provider="telnyx") as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await bridge.carrier.place_call(script)
        sim: SimulatedTelnyx = bridge.carrier  # type: ignore[assignment]
        commands = [(action, body) for call_id, action, body in sim.commands if call_id == result.call_sid]
        status = bridge.app.state.bridge.registry.get_sample_value
        stopped = status("callbridge_stream_status_total", {"provider": "telnyx", "event": "streaming.stopped"})
        ended = await bridge.app.state.bridge.services.registry.ended_reason(result.call_sid)
    assert result.warnings == [] and len(set(result.streams)) == 2, result.render()
    assert [action for action, _ in commands] == ["answer", "streaming_start"]
    tokens = [body["custom_parameters"][0]["value"] for _, body in commands]
    assert tokens[0] != tokens[1]
    assert recorder.opened == recorder.resumed  # the new stream resumed the call's engine session
    assert stopped is not None and stopped >= 2  # the drop, then the hang-up
    assert ended is not None  # call.hangup (or the stream's stop) ended it: no more restarts


async def test_past_capacity_a_call_is_rejected_busy() -> None:
    recorder = engine()
    async with running_bridge(settings(server={"max_calls": 1}), recorder, provider="telnyx") as bridge:
        first = asyncio.create_task(bridge.carrier.place_call(CallerScript(hangup_at_ms=1500)))
        await until(lambda: recorder.session_count == 1)
        second = await bridge.carrier.place_call(CallerScript(hangup_at_ms=500))
        await first
        sim: SimulatedTelnyx = bridge.carrier  # type: ignore[assignment]
        commands = [(action, body) for call_id, action, body in sim.commands if call_id == second.call_sid]
    assert second.streams == [] and commands == [("reject", {"cause": "USER_BUSY", "command_id": commands[0][1]["command_id"]})]
    assert len(recorder.opened) == 1


async def test_the_bridge_never_sends_what_telnyx_rejects() -> None:
    """Every message the bridge sent on a call with a barge-in was a valid rtp-mode frame (the simulator warns and
    answers with an ``error`` frame otherwise); and the marks queued at the flush came back."""
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="telnyx") as bridge:
        sent: list[str | bytes] = []
        bridge.carrier.on_message = sent.append
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=5000)
        result = await bridge.carrier.place_call(script)
    assert result.warnings == [] and result.clears, result.render()  # a flush at each pause
    kinds = {message[:40].split('"event":"')[1].split('"')[0] for message in sent if isinstance(message, str)}
    assert kinds == {"media", "mark", "clear"} and all(isinstance(m, str) for m in sent)


async def test_call_hangup_webhook_ends_a_stream_that_got_no_stop() -> None:
    """Telnyx's ``call.hangup`` ends the call even if its socket never says ``stop``: the engine session is closed
    (not kept for a resume) and the socket closed."""
    recorder = engine()
    async with running_bridge(settings(), recorder, provider="telnyx") as bridge:
        sim: SimulatedTelnyx = bridge.carrier  # type: ignore[assignment]
        call = SimCall(sim.new_call_id(), CallResult("hangup-webhook"), lambda: 0)
        sim.calls[call.call_id] = call
        stream = await sim.open_stream(call, "answer")
        assert stream is not None
        await stream.send_audio(bytes(320))
        await until(lambda: recorder.session_count == 1)
        call.ended.set()  # over on Telnyx's side
        assert await sim.post_webhook("call.hangup", call, hangup_cause="normal_clearing", hangup_source="caller") == 200

        async def closed() -> None:
            async for _ in stream.conn.messages():
                pass

        await asyncio.wait_for(closed(), 5)
        await until(lambda: recorder.session_count == 0)
        ended = await bridge.app.state.bridge.services.registry.ended_reason(call.call_id)
    assert stream.conn.close_code == 1000
    assert ended == "caller_hung_up:normal_clearing"
    (session_id,) = recorder.opened
    assert any(isinstance(c, CloseSession) for c in recorder.commands[session_id]) and recorder.resumed == []
