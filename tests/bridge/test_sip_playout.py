"""What a SIP caller's phone holds when the agent speaks again: the bridge sends the agent's audio up to 60 ms ahead
(its lead) and keeps a 20 ms cadence of silence between replies. Silence sent while a reply's lead still played
queued behind it, and a phone plays RTP in order: the far end stayed that much behind for good, every later reply
heard later than sent — and than the playout ledger, which places the recording and the heard position of a
barge-in, took it to be (CI's recording test found a SIP reply 66 ms off). End to end over real UDP on loopback:
the simulated trunk's queue when the agent's second reply arrives."""

from __future__ import annotations

import asyncio

import pytest

from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, settings, short_speech, until

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

FRAME_BYTES = 320
"""20 ms of the trunk's PCM16 at 8 kHz."""


async def test_the_phone_holds_at_most_a_packet_of_silence_when_the_agent_speaks_again() -> None:
    speech = short_speech(800)
    async with running_bridge(settings(), engine(), provider="sip") as bridge:
        trunk = bridge.carrier
        assert isinstance(trunk, SimulatedSip)
        queued_at_reply_ms: list[int] = []
        """The audio the phone held, ahead of it, as each reply's first frame arrived (after silence)."""
        call = asyncio.create_task(trunk.place_call(CallerScript(utterances=((300, speech), (3300, speech)), hangup_at_ms=6500)))
        await until(lambda: bool(trunk.streams), timeout_s=5)
        (stream,) = trunk.streams.values()
        after_silence = [True]

        def arrived(pcm: bytes | bytearray | memoryview) -> None:
            silent = not any(bytes(pcm))
            if after_silence[0] and not silent:
                queued_at_reply_ms.append(len(stream.queue) // FRAME_BYTES * 20)
            after_silence[0] = silent

        stream.on_audio = arrived
        result = await call
    assert result.hung_up_by == "caller" and len(result.agent_runs_ms) == 2, result.render()
    assert len(queued_at_reply_ms) == 2, queued_at_reply_ms
    # the first reply follows silence the phone does not keep (before any agent audio); the second, the cadence's
    # silence after the first: one packet of it at most (it was two or three: 40-60 ms, before)
    assert queued_at_reply_ms[1] <= 20, queued_at_reply_ms
