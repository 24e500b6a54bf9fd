"""What a bridge process holds, and that it gives it back: the level gauges on ``/metrics``, the memory registry's
pruning, and a hang-up whose ``stop`` is still unread when the next send fails (taken for a drop before, which kept
the engine session detached for a resume nobody makes)."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from callbridge.bridge.app import BridgeState
from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.registry import ENDED_KEPT_MS, MemoryCallRegistry
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.engine.port import ResumeTicket
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import running_bridge
from tests.bridge.twilio_e2e import RawStream, engine, settings, short_speech, until

LEVELS = (
    "callbridge_live_streams",
    "callbridge_detached_sessions",
    "callbridge_engine_sessions_open",
    "callbridge_local_engine_sessions",
)


async def _levels(base_url: str) -> dict[str, float]:
    async with http_client() as http:
        text = (await http.get(base_url + "/metrics")).text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


async def test_the_level_gauges_follow_a_call_and_come_back_to_zero() -> None:
    recorded = engine("echo")
    async with running_bridge(settings(), recorded) as bridge:
        idle = await _levels(bridge.base_url)
        assert all(idle[name] == 0 for name in LEVELS)
        assert idle["callbridge_asyncio_tasks"] >= 1
        assert idle["callbridge_background_tasks"] == 1  # the loop-lag sampler
        stream = await RawStream.open(bridge)
        await stream.start()

        async def live() -> bool:
            levels = await _levels(bridge.base_url)
            return levels["callbridge_live_streams"] == 1 and levels["callbridge_local_engine_sessions"] == 1

        await until(live)
        during = await _levels(bridge.base_url)
        assert during["callbridge_engine_sessions_open"] == 1
        assert during["callbridge_registry_entries"] == 1
        assert during["callbridge_asyncio_tasks"] > idle["callbridge_asyncio_tasks"]
        await stream.ws.send(f'{{"event":"stop","sequenceNumber":"3","streamSid":"{stream.sid}","stop":{{}}}}')
        await stream.closed()

        async def back() -> bool:
            levels = await _levels(bridge.base_url)
            return (
                all(levels[name] == 0 for name in LEVELS)
                and levels["callbridge_asyncio_tasks"] <= idle["callbridge_asyncio_tasks"]
            )

        await until(back)


async def test_a_dropped_stream_shows_as_detached_until_the_call_comes_back() -> None:
    recorded = engine("echo")
    async with running_bridge(settings(engine={"disconnect_grace_s": 30}), recorded) as bridge:
        call = asyncio.create_task(
            bridge.carrier.place_call(
                CallerScript(
                    utterances=((100, short_speech(400)),),
                    drop_stream_at_ms=(800,),
                    redirect_delay_ms=1500,
                    hangup_at_ms=3000,
                )
            )
        )

        async def detached() -> bool:
            levels = await _levels(bridge.base_url)
            return levels["callbridge_detached_sessions"] == 1 and levels["callbridge_live_streams"] == 0

        await until(detached)
        assert (await _levels(bridge.base_url))["callbridge_engine_sessions_open"] == 1
        result = await call
        assert len(result.streams) == 2  # it came back, and hung up
        levels = await _levels(bridge.base_url)
        assert all(levels[name] == 0 for name in LEVELS)


async def test_the_memory_registry_forgets_calls_nobody_asks_about_again() -> None:
    now = [1_000_000]
    registry = MemoryCallRegistry(clock=lambda: now[0])
    for index in range(100):
        await registry.mark_ended(f"CA{index}", "stop")
    await registry.detach("CAd", ResumeTicket("sess-1", lease_generation=1), 0, 5_000)
    assert registry.entry_count == 101
    assert registry.detached_count == 1
    now[0] += 6_000
    assert registry.detached_count == 0  # its grace is over, pruned or not
    now[0] += ENDED_KEPT_MS
    await registry.mark_ended("CAnew", "stop")  # a write prunes what has expired
    assert registry.entry_count == 1
    assert await registry.get("CA1") is None


class _HangUpRacingSend:
    """A carrier that says ``stop`` and closes while the bridge is sending: the bridge's next send fails before
    its reader has read the ``stop``."""

    def __init__(self, stream: RawStream) -> None:
        self.stream = stream
        self.incoming: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.sends = 0
        self.closed = asyncio.Event()
        for message in ('{"event":"connected","protocol":"Call","version":"1.0.0"}', stream.start_message()):
            self.incoming.put_nowait(message)

    async def receive(self) -> str | bytes | None:
        return await self.incoming.get()

    async def send(self, message: str | bytes) -> None:
        self.sends += 1
        if self.sends == 3:  # the carrier hung up just now: its stop is on the way, its socket already gone
            self.incoming.put_nowait(
                f'{{"event":"stop","sequenceNumber":"3","streamSid":"{self.stream.sid}","stop":{{}}}}'
            )
            self.incoming.put_nowait(None)
        if self.sends >= 3:
            raise ConnectionError("closed by the carrier")

    async def close(self, code: int) -> None:
        self.closed.set()


async def test_a_stop_read_after_a_failed_send_still_ends_the_call() -> None:
    recorded = engine("tone")  # speaks at once: the bridge sends audio without waiting for the caller
    state = BridgeState(settings(), recorded, None)
    services = state.services
    transport = _HangUpRacingSend(RawStream(None, "MZ" + "1" * 32, "CA" + "2" * 32, "", "AC" + "3" * 32))  # type: ignore[arg-type]
    await asyncio.wait_for(MediaStreamDriver(transport, TwilioCodec(), services, check_token=False).run(), 5)
    assert transport.sends >= 3
    assert await services.registry.ended_reason("CA" + "2" * 32) is not None  # a hang-up, not a drop
    record = await services.registry.get("CA" + "2" * 32)
    assert record is not None and record.ticket is None
    assert recorded.session_count == 0  # the engine session is closed, not detached for a grace
    await services.aclose_background()
    await recorded.aclose()


class _SilentAfterSendFails(_HangUpRacingSend):
    """A carrier whose socket fails on send but whose receive never sees the close (no ``stop`` either)."""

    async def send(self, message: str | bytes) -> None:
        self.sends += 1
        if self.sends >= 3:
            raise ConnectionError("broken pipe")

    async def close(self, code: int) -> None:
        self.closed.set()
        self.incoming.put_nowait(None)


async def test_a_failed_send_the_reader_never_hears_about_is_a_lost_stream() -> None:
    recorded = engine("tone")
    state = BridgeState(settings(), recorded, None)
    services = state.services
    transport = _SilentAfterSendFails(RawStream(None, "MZ" + "4" * 32, "CA" + "5" * 32, "", "AC" + "3" * 32))  # type: ignore[arg-type]
    await asyncio.wait_for(MediaStreamDriver(transport, TwilioCodec(), services, check_token=False).run(), 5)
    assert transport.closed.is_set()
    record = await services.registry.get("CA" + "5" * 32)
    assert record is not None and record.ticket is not None  # detached for the call's next stream, as a drop
    assert await services.registry.ended_reason("CA" + "5" * 32) is None
    assert recorded.session_count == 1
    await services.aclose_background()
    await recorded.aclose()
