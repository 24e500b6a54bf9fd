"""Bridge-mode barge-in end to end (``barge_in.mode = "bridge"``, #41): the real server, the embedded engine, a
simulated Twilio caller whose line echoes the agent or who says "go on" or interrupts. The agent is not stopped by
its own echo (the engine never hears it: silence, or appends marked *listen*), a backchannel pauses and resumes it
with the reply heard whole, and a real interruption is confirmed — the engine told to barge in, the caller's
words sent again from before their onset and answered whole."""

from __future__ import annotations

import pytest

from callbridge.engine.commands import AppendAudio, BargeIn
from callbridge.sim.carrier import CallerScript, CallResult
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import RecordingEngine, engine, settings, short_speech, stall_once_after_first_audio, until

BRIDGE_MODE = {"mode": "bridge"}
SPEECH = short_speech(2400)  # the bundled utterance's first 2.4 s: the agent (the echo agent) says it back
SPEECH_MS = 2400


async def call(script: CallerScript) -> tuple[CallResult, RecordingEngine]:
    result, recorder, _, _ = await call_counting(script)
    return result, recorder


async def call_counting(script: CallerScript, stall: bool = False) -> tuple[CallResult, RecordingEngine, float, list[float]]:
    """The call, the echo the bridge sent the engine as silence (``callbridge_barge_in_echo_seconds_total``), and the
    stalls: where ``stall``, the process (the bridge and the simulated carrier both) stalls 0.54 s, 2 s after the
    agent's first audio reached the carrier — late in its 2.4 s reply (at 2 s, 3 of 3 runs of the code before the fix
    paused; at 1 s, none)."""
    recorder = engine()
    async with running_bridge(settings(barge_in=BRIDGE_MODE), recorder) as bridge:
        stalls = stall_once_after_first_audio(bridge, 2.0, 0.54) if stall else []
        result = await bridge.carrier.place_call(script)
        registry = bridge.app.state.bridge.registry
        await until(lambda: registry.get_sample_value("callbridge_calls_total", {"provider": "twilio", "end": "caller_hung_up"}) == 1)
        echo_s = registry.get_sample_value("callbridge_barge_in_echo_seconds_total", {"provider": "twilio"}) or 0.0
    return result, recorder, echo_s, stalls


def commands(recorder: RecordingEngine) -> list[object]:
    (session,) = recorder.commands.values()
    return list(session)


@pytest.mark.parametrize(("echo_db", "delay_ms", "band", "stall"), [(6.0, 400, False, False), (10.0, 60, True, True)])  # the rest: bench/barge_in.py
async def test_the_agents_own_echo_never_stops_it(echo_db: float, delay_ms: int, band: bool, stall: bool) -> None:
    """The loudest and latest echo; and one through the telephone band with line noise, the bridge stalled for
    half a second while the agent speaks (CI, session 35: the caller's audio said meanwhile, read after the next
    frames went, was judged against silence, and their echo of the agent taken for their voice)."""
    script = CallerScript(
        utterances=((500, SPEECH),), echo_db=echo_db, echo_delay_ms=delay_ms, hangup_at_ms=7000, band=band, noise_db=30.0 if band else None
    )
    result, recorder, echo_s, stalls = await call_counting(script, stall)
    assert len(stalls) == stall, result.render()  # stalled once, in the reply
    sent = commands(recorder)
    assert echo_s * 1000 >= SPEECH_MS // 2, echo_s  # the echo counted as it was kept from the engine
    assert result.clears == [] and not any(isinstance(c, BargeIn) for c in sent), result.render()
    # the reply whole, once (never paused: no flush); a stall of a loaded machine may split it in two runs
    assert sum(result.agent_runs_ms) >= SPEECH_MS, result.render()
    assert any(isinstance(c, AppendAudio) and c.overlap == "listen" for c in sent)  # heard by the engine, never taken


async def test_a_backchannel_pauses_the_agent_and_it_goes_on_where_the_caller_stopped_hearing() -> None:
    """…and the pause and its resume are counted (``callbridge_barge_in_pauses_total``)."""
    script = CallerScript(utterances=((500, SPEECH),), backchannels_ms=(1000,), backchannel_ms=400, hangup_at_ms=7500)
    recorder = engine()
    async with running_bridge(settings(barge_in=BRIDGE_MODE), recorder) as bridge:
        result = await bridge.carrier.place_call(script)
        metrics = bridge.app.state.bridge.registry
        await until(lambda: metrics.get_sample_value("callbridge_barge_in_pauses_total", {"provider": "twilio", "outcome": "resumed"}) == 1)
    assert len(result.clears) == 1 and not any(isinstance(c, BargeIn) for c in commands(recorder)), result.render()
    first, then = result.agent_runs_ms
    assert first + then >= SPEECH_MS + 100, result.render()  # the reply whole: the frame it paused in, played again


async def test_a_real_interruption_is_confirmed_and_the_callers_words_answered_whole() -> None:
    script = CallerScript(utterances=((500, SPEECH),), interrupt_after_agent_ms=1000, hangup_at_ms=10_000)
    result, recorder = await call(script)
    sent = commands(recorder)
    confirmed = next(i for i, c in enumerate(sent) if isinstance(c, BargeIn))
    resent = sent[confirmed + 1]
    assert isinstance(resent, AppendAudio) and len(resent.pcm) >= 16000 * 2 * 900 // 1000  # from before the onset on
    assert len(result.clears) == 1, result.render()
    cut, answer = result.agent_runs_ms[0], result.agent_runs_ms[-1]
    assert 1000 <= cut <= 1000 + 400, result.render()  # the agent heard after the onset: the pause's 160 ms, and the wire
    assert answer >= SPEECH_MS - 200, result.render()  # the echo agent says back what the caller said over it, all of it
