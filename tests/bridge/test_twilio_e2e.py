"""A bridge on uvicorn and a simulated Twilio over real loopback sockets, with the embedded engine."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from callbridge.engine.commands import AckPlayback, CloseSession, CreateTextItem, TruncateItem
from callbridge.sim.runner import running_bridge
from callbridge.sim.twilio import CallerScript
from tests.bridge.twilio_e2e import RawStream, engine, settings, short_speech, until

SPEECH_MS = 1500


async def test_conversation_with_the_echo_agent() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        result = await bridge.twilio.place_call(CallerScript(utterances=((300, short_speech()),)))
    assert result.warnings == [] and result.hung_up_by == "caller" and len(result.streams) == 1
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000  # the echo: 300 ms prefix, speech, ~500 ms tail
    assert len(result.marks_echoed) >= result.agent_speech_ms // 100 - 1
    (session_id,) = recorder.opened
    acks = [c for c in recorder.commands[session_id] if isinstance(c, AckPlayback)]
    assert acks and acks[-1].played_ms >= result.agent_speech_ms - 100
    assert recorder.commands[session_id][-1] == CloseSession("call_ended")  # the caller's stop closes it
    assert recorder.session_count == 0


async def test_barge_in_clears_and_acks_what_was_heard() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        result = await bridge.twilio.place_call(script)
        clear_latency = bridge.app.state.bridge.registry.get_sample_value("callbridge_barge_in_clear_seconds_sum")
    assert result.warnings == [] and len(result.clears) == 1
    (truncate,) = recorder.of(TruncateItem)
    heard_acks = [a for a in recorder.of(AckPlayback) if f"item_{a.response_id}" == truncate.item_id]
    assert heard_acks[-1].played_ms == truncate.audio_end_ms
    played = result.played_ms_at_clear[0]
    assert abs(truncate.audio_end_ms - played) <= 20, (truncate.audio_end_ms, played)  # within one frame
    assert result.clears[0] > 0  # queued audio was dropped at the carrier
    assert clear_latency is not None and clear_latency < 0.05


async def test_dtmf_reaches_the_engine() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        await bridge.twilio.place_call(CallerScript(dtmf=((200, "5"), (400, "#")), hangup_at_ms=700))
    assert recorder.of(CreateTextItem) == [CreateTextItem("DTMF 5"), CreateTextItem("DTMF #")]


async def test_socket_drop_resumes_the_same_session() -> None:
    recorder = engine(agent="tone")
    async with running_bridge(settings(), recorder) as bridge:
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await bridge.twilio.place_call(script)
    assert len(result.streams) == 2 and result.warnings == []
    assert recorder.opened == recorder.resumed == [recorder.opened[0]]  # one session, resumed
    assert 600 <= result.agent_speech_ms <= 720  # the greeting once, not replayed on the new stream
    core = recorder.sessions[recorder.opened[0]]._core
    assert core._input_ms >= 3500 - 300  # both streams, less what each stream's resampler still held


async def test_drop_past_the_grace_gets_a_new_session() -> None:
    recorder = engine(disconnect_grace_ms=200)
    async with running_bridge(settings(engine={"disconnect_grace_s": 0.2}), recorder) as bridge:
        script = CallerScript(drop_stream_at_ms=(500,), redirect_delay_ms=600, hangup_at_ms=1800)
        result = await bridge.twilio.place_call(script)
    assert len(result.streams) == 2
    assert len(recorder.opened) == 2 and recorder.resumed == []


async def test_bridge_hangs_up_when_the_engine_session_ends() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        call = asyncio.create_task(bridge.twilio.place_call(CallerScript(hangup_at_ms=5000)))
        await until(lambda: recorder.session_count == 1)
        await recorder.sessions[recorder.opened[0]].close("agent_ended_the_call")
        result = await call
        hangups = bridge.app.state.bridge.registry.get_sample_value("callbridge_hangups_total", {"provider": "twilio", "result": "ok"})
    assert result.hung_up_by == "bridge" and hangups == 1
    assert len(result.heard) < 5000 * 16


class TestSecurity:
    async def test_bad_webhook_signature_is_403(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            async with httpx.AsyncClient() as http:
                response = await http.post(bridge.base_url + "/twilio/voice", data={"CallSid": "CA1"}, headers={"X-Twilio-Signature": "forged"})
                unsigned = await http.post(bridge.base_url + "/twilio/voice", data={"CallSid": "CA1"})
        assert response.status_code == 403 and unsigned.status_code == 403 and recorder.opened == []

    async def test_bad_upgrade_signature_is_403(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            with pytest.raises(InvalidStatus) as exc:
                await RawStream.open(bridge, signature="forged")
        assert exc.value.response.status_code == 403 and recorder.opened == []

    async def test_bad_token_in_start_closes_the_socket_without_a_session(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            stream = await RawStream.open(bridge, token="not-the-minted-one")
            await stream.start()
            assert await stream.closed() == 1008
            reused = await RawStream.open(bridge)
            reused.token = stream.token  # a token works once, for its own call
            await reused.start()
            assert await reused.closed() == 1008
        assert recorder.opened == []


def oversized() -> str:
    return '{"event":"media","pad":"' + "x" * 300_000 + '"}'


BAD_INPUT = {
    "non_json_text": lambda s: "{this is not json",
    "binary_frame": lambda s: b"\x00\x01\x02",
    "wrong_stream_sid": lambda s: s.media().replace(s.sid, "MZ" + "0" * 32),
    "invalid_base64": lambda s: s.media(payload_b64="%%%not-base64%%%"),
    "oversized_message": lambda s: oversized(),
    "unknown_event": lambda s: f'{{"event":"teleport","streamSid":"{s.sid}"}}',
}


REASONS = {
    "non_json_text": "not_json",
    "binary_frame": "binary_frame",
    "wrong_stream_sid": "wrong_stream",
    "invalid_base64": "bad_base64",
    "oversized_message": "oversized",
    "unknown_event": "unknown_event",
}


async def bridged(bridge: object, recorder: object) -> RawStream:
    stream = await RawStream.open(bridge)  # type: ignore[arg-type]
    await stream.start()
    await until(lambda: recorder.session_count == 1)  # type: ignore[attr-defined]
    return stream


class TestBadInput:
    @pytest.mark.parametrize("case", sorted(BAD_INPUT))
    async def test_ends_that_call_cleanly(self, case: str) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            await stream.ws.send(BAD_INPUT[case](stream))
            assert await stream.closed() == 1008
            await until(lambda: recorder.session_count == 0)
            reason = REASONS[case]
            labels = {"provider": "twilio", "reason": reason}
            metrics = bridge.app.state.bridge.registry
            await until(lambda: metrics.get_sample_value("callbridge_carrier_protocol_errors_total", labels) == 1)
            async with httpx.AsyncClient() as http:
                assert (await http.get(bridge.base_url + "/healthz")).status_code == 200

    async def test_media_before_start(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            stream = await RawStream.open(bridge)
            await stream.ws.send(stream.media())
            assert await stream.closed() == 1008
        assert recorder.opened == []

    async def test_a_flood_faster_than_real_time(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            payload = base64.b64encode(b"\xff" * 160).decode()
            for i in range(900):  # 18 s of audio as fast as the socket takes it
                try:
                    await stream.ws.send(stream.media(payload, timestamp=20 * i))
                except Exception:
                    break
            assert await stream.closed() == 1008
            await until(lambda: recorder.session_count == 0)

    async def test_other_calls_carry_on_unharmed(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            good_call = asyncio.create_task(bridge.twilio.place_call(CallerScript(utterances=((300, short_speech()),))))
            await until(lambda: recorder.session_count == 1)
            for case in sorted(BAD_INPUT):
                stream = await RawStream.open(bridge)
                await stream.start()
                await until(lambda: recorder.session_count == 2)
                await stream.ws.send(BAD_INPUT[case](stream))
                assert await stream.closed() == 1008, case
                await until(lambda: recorder.session_count == 1)
            result = await good_call
        assert result.warnings == [] and result.hung_up_by == "caller"
        assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000
