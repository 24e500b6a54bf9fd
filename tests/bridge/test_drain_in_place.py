"""A lone process (the memory registry: the quick start, one container) drains in place: at SIGTERM it refuses
new calls (busy) and serves the calls it has to their end — a call whose socket drops meanwhile reconnects to it
— and ends only those still up when ``server.drain_timeout_s`` runs out, with the closing tone and the carrier's
hang-up. Before, it closed every Twilio stream at once (going away), Twilio's ``<Redirect>`` came back to the
same process, was refused busy, and every call was hung up about 120 ms after the signal."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.lone_bridge import served
from tests.bridge.twilio_e2e import engine, settings, short_speech, until

pytestmark = pytest.mark.timeout(90)


async def test_sigterm_serves_three_live_calls_to_their_end() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        assert bridge.settings.server.drain_timeout_s == 30  # shipped
        state = bridge.app.state.bridge
        speech = short_speech(1200)
        scripts = [CallerScript(utterances=((300, speech), (3000, speech)), hangup_at_ms=7000 + 500 * i) for i in range(3)]
        placed = time.monotonic()
        calls = [asyncio.create_task(bridge.carrier.place_call(script)) for script in scripts]
        await until(lambda: len(state.services.active_calls) == 3)
        await asyncio.sleep(1.0)
        drained = asyncio.create_task(state.drain())  # SIGTERM's first step in ``callbridge serve``
        began = time.monotonic()
        signal_ms = (began - placed) * 1000
        await until(lambda: state.services.draining)
        late = await bridge.carrier.place_call(CallerScript(hangup_at_ms=500))  # a new call: busy
        results = await asyncio.gather(*calls)
        await asyncio.wait_for(drained, 10)
        took_s = time.monotonic() - began
        ends = bridge.app.state.bridge.registry.get_sample_value("callbridge_calls_total", {"provider": "twilio", "end": "caller_hung_up"})
    assert late.streams == [] and any("<Reject>" in e.what for e in late.timeline), late.render()
    for result in results:
        assert result.hung_up_by == "caller" and len(result.streams) == 1, result.render()
        # the reply to what the caller said after the signal is heard whole (the first may be cut short by the
        # second utterance where a loaded machine's loop stalls: that is barge-in, not the drain)
        replies_at_ms = [e.at_ms for e in result.timeline if e.who == "agent" and e.what.startswith("starts speaking")]
        assert replies_at_ms[-1] > signal_ms and result.agent_runs_ms[-1] > 1000, result.render()
    assert ends == 3 and took_s < 10  # done when the last call ended, not at the timeout


@pytest.mark.long
async def test_a_call_still_up_when_the_drain_runs_out_hears_the_tone_then_is_hung_up() -> None:
    """The shipped 30 s drain; the call would go on for 40 s."""
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        state = bridge.app.state.bridge
        call = asyncio.create_task(bridge.carrier.place_call(CallerScript(utterances=((300, short_speech(1200)),), hangup_at_ms=40_000)))
        await until(lambda: len(state.services.active_calls) == 1)
        await asyncio.sleep(0.5)
        began = time.monotonic()
        await state.drain()
        drained_s = time.monotonic() - began
        result = await call
        metrics = bridge.app.state.bridge.registry
        ends = metrics.get_sample_value("callbridge_calls_total", {"provider": "twilio", "end": "bridge_shutdown"})
        failures = sum(s.value for f in metrics.collect() if f.name == "callbridge_engine_failures" for s in f.samples if s.name.endswith("_total"))
        ended = await state.services.registry.ended_reason(result.call_sid)
    assert result.hung_up_by == "bridge" and 30_000 <= result.heard_ms < 35_000, result.render()
    assert 30 <= drained_s < 34  # the drain's 30 s, then the tone and the hang-up
    assert ends == 1 and failures == 0 and ended == "bridge_shutdown"  # not counted as the engine's failure
    assert recorder.session_count == 0  # its engine session closed


async def test_a_call_whose_socket_drops_during_the_drain_comes_back_to_it() -> None:
    recorder = engine()
    async with running_bridge(settings(), recorder) as bridge:
        state = bridge.app.state.bridge
        script = CallerScript(utterances=((300, short_speech(1200)), (3500, short_speech(1200))), drop_stream_at_ms=(2500,),
                              redirect_delay_ms=200, hangup_at_ms=7000)  # fmt: skip
        call = asyncio.create_task(bridge.carrier.place_call(script))
        await until(lambda: len(state.services.active_calls) == 1)
        await asyncio.sleep(1.0)
        drained = asyncio.create_task(state.drain())
        result = await call
        await asyncio.wait_for(drained, 10)
    assert len(result.streams) == 2 and result.hung_up_by == "caller", result.render()
    assert len(recorder.opened) == 1 and len(recorder.resumed) == 1  # the same session, resumed here


async def test_sigterm_to_a_lone_callbridge_serve_lets_its_three_calls_finish(tmp_path: Path) -> None:
    """The real process, shipped settings but the simulated Twilio's credentials: SIGTERM with three calls up."""
    async with served(tmp_path) as server:
        bridge, twilio = server.bridge, server.twilio
        speech = short_speech(1200)
        calls = [
            asyncio.create_task(twilio.place_call(CallerScript(utterances=((300, speech), (3000, speech)), hangup_at_ms=6000 + 500 * i)))
            for i in range(3)
        ]
        await asyncio.sleep(1.5)
        bridge.process.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*calls)
        assert await asyncio.to_thread(bridge.process.wait, 30) == 0
    for result in results:
        assert result.hung_up_by == "caller" and len(result.streams) == 1, result.render()
        assert result.agent_speech_ms > 1500, result.render()
    assert bridge.events("bridge_draining")[0]["in_place"] is True and bridge.events("bridge_drained")
