"""SIP under a flood (issue #15 item 6), end to end: the bridge's SIP listener on its shipped budgets over real UDP
on loopback, a simulated trunk's call up, and OPTIONS from another source at 1,000 a second. What the flood may
not cost: the call's RTP (one packet every 20 ms, silence included), a new call's answer. What it does cost is
bounded: beyond its source's budget it is dropped unread, and counted. (The gaps are measured in
``bench/sip_flood.py``; here only counts are asserted.)"""

from __future__ import annotations

import asyncio
import time

from callbridge.carriers.sip.sim import SimulatedSip
from callbridge.sim.carrier import CallerScript
from callbridge.sim.hostile import options_flood
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import engine, settings, short_speech


class _Packets:
    """How many RTP packets (bytes: SIP is text) reached the trunk."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, message: str | bytes) -> None:
        self.count += isinstance(message, bytes)


async def test_silence_keeps_the_20_ms_cadence() -> None:
    """A call on which the agent says nothing still gets a packet every 20 ms (SBCs and jitter buffers expect
    one); before, the cadence sent one every 40 ms."""
    async with running_bridge(settings(), engine(), provider="sip") as bridge:
        packets = _Packets()
        bridge.carrier.on_message = packets
        result = await bridge.carrier.place_call(CallerScript(hangup_at_ms=3000))
    assert result.hung_up_by == "caller", result.render()
    assert packets.count >= 0.75 * 3000 / 20, packets.count  # about 150; at a 40 ms cadence, 75


async def test_an_options_flood_is_dropped_beyond_its_budget_and_calls_go_on() -> None:
    async with running_bridge(settings(), engine(), provider="sip") as bridge:
        trunk = bridge.carrier
        assert isinstance(trunk, SimulatedSip)
        packets = _Packets()
        trunk.on_message = packets
        call = asyncio.create_task(trunk.place_call(CallerScript(utterances=((300, short_speech(1000)),), hangup_at_ms=4000)))
        await asyncio.sleep(0.5)
        flood_started = time.monotonic()
        flood = asyncio.create_task(asyncio.to_thread(options_flood, (trunk.host, trunk.port), 1000, 2.0))
        await asyncio.sleep(1.0)
        late = SimulatedSip(bridge.base_url, trunk.secret)  # a second call from the trunk, mid-flood
        late.configure(bridge.settings)
        # on the line until the echo of its 800 ms has played whole, however late the reply comes (0.62 s once, loaded;
        # 0.63 s in a CI run of session 43, when it hung up at 3.5 s with 380 ms heard)
        answered = await late.place_call(CallerScript(utterances=((300, short_speech(800)),), hangup_at_ms=5000))
        sent, answers = await flood
        flood_s = time.monotonic() - flood_started  # its 2 s, and until the bridge's last answer (a loaded one is late)
        result = await call
        dropped = bridge.app.state.bridge.registry.get_sample_value("callbridge_sip_dropped_total", {"reason": "source_rate"})
    assert result.hung_up_by == "caller" and result.agent_speech_ms >= 1000, result.render()
    assert packets.count >= 0.75 * 4000 / 20, packets.count  # the call's RTP kept coming through the flood
    assert answered.streams and answered.agent_speech_ms >= 800, answered.render()
    # 2 s at 1,000/s from one source against a budget of 200/s and a burst of 400: about 800 answered, and never more
    # than the burst and the rate over the flood's time (the budget is spent as the bridge reads, which a loaded machine
    # delays); everything else dropped and counted
    assert sent >= 1500 and answers <= 400 + flood_s * 200 and dropped is not None and dropped >= sent - answers - 50, (sent, answers, dropped, flood_s)
