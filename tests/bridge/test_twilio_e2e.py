"""Twilio-specific end-to-end cases (the matrix every carrier runs is ``test_carrier_matrix.py``): a bridge on
uvicorn and a simulated Twilio over real loopback sockets, with the embedded engine."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time

import numpy as np
import orjson
import pytest
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from callbridge.bridge.call import CallSession
from callbridge.engine.commands import AckPlayback, TruncateItem
from callbridge.engine.events import AudioDelta, EngineEvent
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalSession
from callbridge.engine.port import SessionConfig
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import (
    LoopStalls,
    RawStream,
    RecordingEngine,
    bound,
    detached,
    engine,
    heard_of_the_interrupted_reply,
    settings,
    short_speech,
    until,
)
from tests.conftest import PATCHES_A_COMPILED_METHOD

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

SPEECH_MS = 1500


async def test_drop_past_the_grace_gets_a_new_session() -> None:
    recorder = engine(disconnect_grace_ms=200)
    async with running_bridge(settings(engine={"disconnect_grace_s": 0.2}), recorder) as bridge:
        script = CallerScript(drop_stream_at_ms=(500,), redirect_delay_ms=600, hangup_at_ms=1800)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2
    assert len(recorder.opened) == 2 and recorder.resumed == []


async def test_heard_positions_of_a_reply_cut_by_a_drop_continue_on_the_next_stream() -> None:
    """The media socket drops mid-reply while the engine is still generating it; the next stream resumes the
    session and plays the rest. What the engine is told of that reply (acks, read off what it was sent) continues
    from what the caller heard before the drop — it never restarts at 0 on the new stream — and at the end says
    what the caller heard of it over both streams."""
    recorder = RecordingEngine(LocalEngineOptions(agent="echo", chunk_ms=500, generation_speed=1.0))  # still coming at the drop
    async with running_bridge(settings(), recorder) as bridge:
        script = CallerScript(
            utterances=((300, short_speech(3000)),), drop_stream_at_ms=(4700,), redirect_delay_ms=200, hangup_at_ms=11_000
        )
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and len(recorder.opened) == 1 and len(recorder.resumed) == 1, result.render()
    acks = recorder.of(AckPlayback)
    reply = acks[0].response_id
    heard = [a.played_ms for a in acks if a.response_id == reply]
    assert heard == sorted(heard), heard  # never decreasing, across the two streams
    assert recorder.of(TruncateItem) == [], recorder.of(TruncateItem)  # not cut: its rest was played
    assert len(result.agent_runs_ms) >= 2, result.render()  # heard before the drop, and after the resume
    assert abs(heard[-1] - sum(result.agent_runs_ms)) <= 100, (heard, result.agent_runs_ms)  # all the caller heard


async def test_a_drop_while_the_stream_waits_for_its_engine_is_not_the_end_of_the_call() -> None:
    """The socket drops while its stream is still binding (here: an engine slow to open). The call is not over:
    Twilio's ``<Redirect>`` brings the next stream, which gets the call's session and the conversation goes on.
    (Before, that drop marked the call ended, and the redirect was answered with a hang-up.)"""

    class SlowToOpen(RecordingEngine):
        async def open(self, config: SessionConfig) -> LocalSession:
            await asyncio.sleep(0.8)
            return await super().open(config)

    recorder = SlowToOpen(LocalEngineOptions(agent="echo", chunk_ms=500, generation_speed=4.0))
    async with running_bridge(settings(engine={"open_at_answer": "off"}), recorder) as bridge:  # the stream opens it
        script = CallerScript(utterances=((1500, short_speech()),), drop_stream_at_ms=(200,), redirect_delay_ms=100, hangup_at_ms=5000)
        result = await bridge.carrier.place_call(script)
        assert len(result.streams) == 2 and result.hung_up_by == "caller", result.render()
        assert result.agent_speech_ms > 500, result.render()  # the echo came back on the second stream
        assert len(recorder.opened) == 1, recorder.opened  # one session for the call
        assert await bridge.app.state.bridge.services.registry.ended_reason(result.call_sid) == "caller_hung_up"


async def test_a_reply_the_caller_had_not_heard_all_of_at_a_drop_plays_on_from_there_on_the_next_stream() -> None:
    """The engine generates four times faster than real time, so when the media socket drops mid-reply the whole
    reply is already with the bridge: what Twilio held unplayed, and what the bridge still queued. The next
    stream plays that rest, from where the caller stopped hearing it (before: it was flushed, and the caller
    heard the agent stop mid-sentence). What the engine is told goes on from the heard position to the reply's
    end; its turn is not cut."""
    recorder = engine()  # generation_speed 4: all generated long before it is played
    async with running_bridge(settings(), recorder) as bridge:
        script = CallerScript(utterances=((300, short_speech(3000)),), drop_stream_at_ms=(4700,), redirect_delay_ms=200, hangup_at_ms=11_000)
        result = await bridge.carrier.place_call(script)
    assert len(result.streams) == 2 and len(recorder.opened) == 1 and len(recorder.resumed) == 1, result.render()
    acks = recorder.of(AckPlayback)
    reply = acks[0].response_id
    heard = [a.played_ms for a in acks if a.response_id == reply]
    assert heard == sorted(heard), heard
    assert recorder.of(TruncateItem) == [], recorder.of(TruncateItem)
    assert len(result.agent_runs_ms) >= 2, result.render()  # heard before the drop, and the rest after the resume
    assert abs(heard[-1] - sum(result.agent_runs_ms)) <= 100, (heard, result.agent_runs_ms)  # told all that was heard
    assert heard[-1] >= 2900, (heard, result.agent_runs_ms)  # the whole ~3 s echo was heard, over the two streams


class TestSecurity:
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
            assert streams_bound(bridge) == 0
        assert recorder.session_count == 0  # the sessions the answers opened closed with the bridge

    async def test_a_stop_behind_someone_elses_token_does_not_end_their_call(self) -> None:
        """Anyone holding one upgrade signature (Twilio signs the media URL alone, so it never changes) can open a
        socket, name a live call in its ``start`` with a made-up token and send ``stop`` at once, before the
        token is checked. That stream's end says nothing of the call: the call is not marked over, and it goes on."""
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            victim = await bridged(bridge, recorder)
            forged = RawStream(victim.ws, "MZ" + "0" * 32, victim.call_sid, "made-up", victim.account_sid)
            ws_url = bridge.base_url.replace("http://", "ws://") + "/twilio/media"
            signature = RequestValidator(bridge.settings.twilio.auth_token.get_secret_value()).compute_signature(ws_url, {})
            async with connect(ws_url, additional_headers={"X-Twilio-Signature": signature}) as ws:
                stop = orjson.dumps({"event": "stop", "sequenceNumber": "2", "streamSid": forged.sid, "stop": {"callSid": victim.call_sid}})
                await ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
                await ws.send(forged.start_message())
                await ws.send(stop.decode())
                with contextlib.suppress(ConnectionClosed):
                    async for _ in ws:
                        pass
            services = bridge.app.state.bridge.services
            assert await services.registry.ended_reason(victim.call_sid) is None
            await victim.ws.send(victim.media())
            assert recorder.session_count == 1 and victim.ws.close_code is None  # the real call goes on


def streams_bound(bridge: object) -> float:
    """Streams that bound an engine session (the sessions answers open are not counted until one does)."""
    metrics = bridge.app.state.bridge.registry  # type: ignore[attr-defined]
    return sum(metrics.get_sample_value("callbridge_engine_sessions_total", {"how": how}) or 0.0 for how in ("opened", "resumed"))


async def bridged(bridge: object, recorder: object) -> RawStream:
    stream = await RawStream.open(bridge)  # type: ignore[arg-type]
    await stream.start()
    await until(lambda: recorder.session_count == 1)  # type: ignore[attr-defined]
    return stream


class TestBadInput:
    async def test_media_before_start(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            stream = await RawStream.open(bridge)
            await stream.ws.send(stream.media())
            assert await stream.closed() == 1008
            assert streams_bound(bridge) == 0
        assert recorder.session_count == 0

    async def test_a_flood_faster_than_real_time(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            stream = await bridged(bridge, recorder)
            payload = base64.b64encode(b"\xff" * 160).decode()
            for i in range(900):  # 18 s of audio as fast as the socket takes it
                try:
                    await stream.ws.send(stream.media(payload, timestamp=20 * i))
                except ConnectionClosed:
                    break
            assert await stream.closed() == 1008
            await until(lambda: recorder.session_count == 0)


async def test_signalwire_l16_24k_both_ways() -> None:
    """``<Stream codec="L16@24000h">``: PCM16 24 kHz in and out; the conversation and a barge-in work the same."""
    recorder = engine()
    async with running_bridge(settings(signalwire={"codec": "L16@24000h"}), recorder, provider="signalwire") as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=5000)
        async with LoopStalls() as stalls:
            result = await bridge.carrier.place_call(script)
    assert result.warnings == [], result.render()
    (truncate,) = recorder.of(TruncateItem)
    heard, replayed_ms = heard_of_the_interrupted_reply(result)
    assert result.clears and abs(truncate.audio_end_ms - heard) <= stalls.heard_tolerance_ms + replayed_ms
    heard = np.frombuffer(bytes(result.heard), dtype="<i2")
    assert np.abs(heard).max() > 1000  # the echo came back through 24 kHz L16, not silence or noise


async def test_a_reconnect_while_the_old_socket_looks_open_supersedes_it_and_resumes() -> None:
    """The carrier opens the call's next stream while the old socket still looks open to the bridge (a half-open
    connection: the drop never reached it). The old stream is ended as lost at once (closed 1001, its engine
    session detached) and the new one resumes that session: one session, not a second one opened after a wait."""
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        registry = bridge.app.state.bridge.services.registry
        first = await RawStream.open(bridge)
        await first.start()
        await until(lambda: bound(registry, first.call_sid))
        second = await RawStream.open(bridge, call_sid=first.call_sid)
        await second.start()
        assert await first.closed() == 1001
        await until(lambda: recorder.resumed == recorder.opened)
        assert recorder.session_count == 1 and len(recorder.opened) == 1
        await second.ws.close()


async def test_an_engine_failure_mid_call_plays_the_fallback_then_hangs_up() -> None:
    recorder = engine()
    async with running_bridge(settings(engine={"failure_tone_ms": 600}), recorder) as bridge:
        call = asyncio.create_task(bridge.carrier.place_call(CallerScript(hangup_at_ms=6000)))
        await until(lambda: recorder.session_count == 1)
        await recorder.sessions[recorder.opened[0]].close("connection_failed")  # as a lost engine server ends it
        result = await call
        metrics = bridge.app.state.bridge.registry
        labels = {"provider": "twilio", "reason": "connection_failed"}
        await until(lambda: metrics.get_sample_value("callbridge_engine_failures_total", labels) is not None)
        failures = metrics.get_sample_value("callbridge_engine_failures_total", labels)
        hangups = metrics.get_sample_value("callbridge_hangups_total", {"provider": "twilio", "result": "ok"})
    assert result.hung_up_by == "bridge" and result.warnings == [], result.render()
    assert 560 <= result.agent_speech_ms <= 640, result.render()  # the reorder tone: 600 ms, then the hang-up
    assert result.heard_ms < 3000 and failures == 1 and hangups == 1


@PATCHES_A_COMPILED_METHOD
async def test_an_engine_event_the_call_cannot_take_plays_the_fallback_then_hangs_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in handling an engine event (here: every audio delta raises) ends that call the engine-failure way,
    whether the event came with a command (the embedded engine answers at once) or on its own."""
    original = CallSession.receive_engine_event

    def failing(call: CallSession, event: EngineEvent, now_ms: int) -> None:
        if isinstance(event, AudioDelta):
            raise RuntimeError("a bug")
        original(call, event, now_ms)

    monkeypatch.setattr(CallSession, "receive_engine_event", failing)
    recorder = engine("loopback")
    async with running_bridge(settings(engine={"failure_tone_ms": 400}), recorder) as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((200, short_speech(800)),), hangup_at_ms=5000))
        labels = {"provider": "twilio", "reason": "engine_stream_failed"}
        registry = bridge.app.state.bridge.registry
        # counted as the stream ends, which may be a moment after the hang-up reached the carrier
        await until(lambda: registry.get_sample_value("callbridge_engine_failures_total", labels) is not None)
        failures = registry.get_sample_value("callbridge_engine_failures_total", labels)
    assert result.hung_up_by == "bridge" and result.warnings == [], result.render()
    assert 360 <= result.agent_speech_ms <= 440 and failures == 1, result.render()  # only the tone was heard


class TestLimits:
    """With the shipped limits (10 s to the first message, 10 s idle): each test waits them out for real. The
    longest call (4 h shipped) is run shortened here, as an operator would set it; the core's tests run all three
    at the shipped values under a fake clock (``tests/bridge/test_call.py::TestLimits``)."""

    async def test_a_connection_that_never_starts_is_closed(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            assert bridge.settings.server.first_message_timeout_s == 10
            stream = await RawStream.open(bridge)
            opened = time.monotonic()
            assert await stream.closed(timeout_s=20) is not None  # nothing sent: closed by the bridge
            assert time.monotonic() - opened >= 9.5  # not before the limit
            assert streams_bound(bridge) == 0
        assert recorder.session_count == 0

    async def test_a_stream_gone_quiet_is_taken_as_dropped(self) -> None:
        recorder = engine()
        async with running_bridge(settings(), recorder) as bridge:
            assert bridge.settings.server.idle_timeout_s == 10
            stream = await bridged(bridge, recorder)  # started, then silent (a half-open socket)
            quiet = time.monotonic()
            assert await stream.closed(timeout_s=20) is not None
            assert time.monotonic() - quiet >= 9.5
            registry = bridge.app.state.bridge.services.registry
            await until(lambda: detached(registry, stream.call_sid))  # the session waits for the next stream
            ends = bridge.app.state.bridge.registry.get_sample_value("callbridge_calls_total", {"provider": "twilio", "end": "idle_timeout"})
        assert ends == 1 and recorder.resumed == []

    async def test_a_call_past_the_longest_duration_is_hung_up(self) -> None:
        recorder = engine()
        async with running_bridge(settings(server={"max_call_duration_s": 1.0}), recorder) as bridge:
            result = await bridge.carrier.place_call(CallerScript(hangup_at_ms=5000))
        assert result.hung_up_by == "bridge" and result.heard_ms < 2500, result.render()
        assert recorder.session_count == 0


async def test_a_calls_totals_reach_the_metrics_when_its_stream_ends() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=5000)
        result = await bridge.carrier.place_call(script)
        await until(lambda: recorder.session_count == 0)
        metrics = bridge.app.state.bridge.registry

        def value(name: str, **labels: str) -> float:
            return metrics.get_sample_value(name, labels) or 0.0

        await until(lambda: value("callbridge_barge_ins_total", provider="twilio") == 1)
        heard_in = value("callbridge_audio_seconds_total", provider="twilio", direction="in")
        sent_out = value("callbridge_audio_seconds_total", provider="twilio", direction="out")
        flushed = value("callbridge_frames_flushed_total", provider="twilio")
        lag_samples = value("callbridge_event_loop_lag_seconds_count")
        echoes = value("callbridge_mark_lag_seconds_count")
        timed_messages = value("callbridge_carrier_message_seconds_count")
        corrections = value("callbridge_heard_corrections_total", provider="twilio")
        counted = metrics.get_sample_value("callbridge_heard_corrections_total", {"provider": "twilio"}) is not None
    assert 4.5 <= heard_in <= 5.2  # the caller's 5 s
    assert result.agent_speech_ms / 1000 - 0.1 <= sent_out <= result.agent_speech_ms / 1000 + 0.5  # less what the flush dropped
    assert flushed > 0 and lag_samples >= 5
    assert echoes >= len(result.marks_echoed) - 2 * len(result.clears)  # every echo of a marker the bridge still tracked (a flush's echoes aside: each pause is one)
    assert 4 <= timed_messages <= 7  # one inbound message in 50: 5 s of 20 ms frames, and the markers' echoes
    assert counted and corrections <= echoes  # counted as the stream ended; only an echo corrects the model


async def test_a_signalwire_upgrade_needs_no_signature_but_its_stream_needs_the_token() -> None:
    """SignalWire documents no signature on its media upgrade (``callbridge/carriers/signalwire/http.py``): an unsigned
    upgrade is accepted and the stream must show the single-use token (a made-up one: closed 1008, nothing bound);
    a forged signature is still refused 403, and Twilio's unsigned upgrade too."""
    from websockets.exceptions import InvalidStatus

    recorder = engine()
    async with running_bridge(settings(), recorder, provider="signalwire") as bridge:
        base = bridge.base_url.replace("http://", "ws://")
        async with connect(base + "/signalwire/media") as ws:
            stream = RawStream(ws, "MZ" + "1" * 32, "CA" + "2" * 32, "made-up", "project-1")
            await ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
            await ws.send(stream.start_message())
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
        assert ws.close_code == 1008 and streams_bound(bridge) == 0
        for path, headers in (("/signalwire/media", {"X-SignalWire-Signature": "forged"}), ("/twilio/media", {})):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(base + path, additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 403, path
    assert recorder.opened == []
