"""Bandwidth's ``playAudio`` in 16-bit PCM (``bandwidth.playback``): the agent's audio goes out at 8, 16 or 24 kHz
while the caller's comes in as μ-law 8 kHz — a conversation and a barge-in through the simulated Bandwidth, which
refuses any content type but the ones Bandwidth takes and plays the PCM on the caller's 8 kHz leg."""

from __future__ import annotations

import pytest

from callbridge.carriers.bandwidth.wire import playback_content_type
from callbridge.engine.commands import TruncateItem
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, heard_of_the_interrupted_reply, settings, short_speech, until

SPEECH_MS = 1500


@pytest.mark.parametrize("playback", ["pcm16k", "pcm24k"])
async def test_the_agent_speaks_in_wideband_pcm_and_is_heard_whole(playback: str) -> None:
    recorder = engine()
    async with running_bridge(settings(bandwidth={"playback": playback}), recorder, provider="bandwidth") as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, short_speech()),)))
        await until(lambda: recorder.session_count == 0, timeout_s=6)
        content_types = bridge.carrier.content_types
    assert result.warnings == [] and result.hung_up_by == "caller", result.render()
    assert content_types == [playback_content_type(int(playback[3:-1]) * 1000)]
    assert SPEECH_MS <= result.agent_speech_ms <= SPEECH_MS + 1000, result.render()


async def test_a_barge_in_clears_wideband_playback_and_truncates() -> None:
    recorder = engine()
    async with running_bridge(settings(bandwidth={"playback": "pcm24k"}), recorder, provider="bandwidth") as bridge:
        script = CallerScript(utterances=((300, short_speech()),), interrupt_after_agent_ms=600, hangup_at_ms=6000)
        result = await bridge.carrier.place_call(script)
    assert result.warnings == [], result.render()
    truncates = recorder.of(TruncateItem)
    assert len(truncates) == 1, result.render()
    (truncate,) = truncates
    heard, replayed_ms = heard_of_the_interrupted_reply(result)
    assert result.clears and heard < SPEECH_MS
    assert abs(truncate.audio_end_ms - heard) <= 200 + replayed_ms, (truncate, result.render())
