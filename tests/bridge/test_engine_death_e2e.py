"""An engine server that dies mid-call, with the shipped defaults (``engine.disconnect_grace_s`` 30 s,
``engine.reconnect_budget_s`` 2 s): a bridge (``create_app`` on uvicorn) with ``engine.kind = "realtime"`` over a
real ``callbridge engine-server`` process, and a simulated Twilio call over loopback.

Every way the server can go — SIGKILL, SIGTERM, a frozen process that keeps its socket (SIGSTOP), a server that
accepts the reconnect and closes it — ends the same for the caller: the reorder tone within 3 s of the death,
then the carrier's hang-up within 4 s, counted in ``callbridge_engine_failures_total``. The caller hanging up
while the engine is gone ends the call at once (the carrier's ``stop`` is read whatever the engine does).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve

from callbridge.config import Settings
from callbridge.sim.carrier import CallerScript, CallResult
from callbridge.sim.runner import RunningBridge, free_port, running_bridge
from tests.bridge.test_engine_pool_e2e import EngineProcess, holds
from tests.bridge.twilio_e2e import short_speech, until

pytestmark = pytest.mark.timeout(90)

TONE_AFTER_DEATH_MS = 3000
HANG_UP_AFTER_DEATH_MS = 4000


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[EngineProcess]:
    process = await asyncio.to_thread(EngineProcess(free_port(), 1000, tmp_path / "engine.log").start)
    try:
        yield process
    finally:
        if process.process is not None and process.process.poll() is None:
            os.kill(process.process.pid, signal.SIGCONT)
        process.kill()


def defaults(url: str) -> Settings:
    """The shipped configuration, but for the engine's address."""
    return Settings.model_validate({"engine": {"kind": "realtime", "urls": [url]}})


def failures(bridge: RunningBridge) -> dict[str, float]:
    """``callbridge_engine_failures_total`` by reason."""
    counted: dict[str, float] = {}
    for family in bridge.app.state.bridge.registry.collect():
        if family.name == "callbridge_engine_failures":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    counted[sample.labels["reason"]] = sample.value
    return counted


def metric(bridge: RunningBridge, name: str, **labels: str) -> float:
    return bridge.app.state.bridge.registry.get_sample_value(name, labels) or 0.0


async def a_call_mid_reply(bridge: RunningBridge, engine: EngineProcess) -> tuple[asyncio.Task[CallResult], float]:
    """A call whose agent is answering (the echo of 1.5 s of speech); returns it and when it was placed."""
    placed = time.monotonic()
    script = CallerScript(utterances=((300, short_speech(1500)),), hangup_at_ms=20_000)
    call = asyncio.create_task(bridge.carrier.place_call(script))
    await until(lambda: holds(engine, 1), timeout_s=10)
    await asyncio.sleep(max(0.0, placed + 3.0 - time.monotonic()))  # the caller spoke; the agent answers
    return call, placed


async def close_at_once(ws: ServerConnection) -> None:
    await ws.close(1011)


@pytest.mark.parametrize("death", ["SIGKILL", "SIGTERM", "SIGSTOP", "reconnect_accepted_then_closed"])
async def test_an_engine_server_that_dies_mid_call_is_heard_within_3_s_and_the_call_hung_up(
    engine: EngineProcess, death: str
) -> None:
    async with running_bridge(defaults(engine.url)) as bridge:
        call, placed = await a_call_mid_reply(bridge, engine)
        assert engine.process is not None
        pid = engine.process.pid
        died_at_ms = (time.monotonic() - placed) * 1000
        if death == "reconnect_accepted_then_closed":
            engine.kill()  # and something else takes its port: it accepts every websocket, then closes it
            async with serve(close_at_once, "127.0.0.1", engine.port):
                result = await call
        else:
            os.kill(pid, getattr(signal, death))
            result = await call

    assert_heard_then_hung_up(result, died_at_ms, bridge)


def assert_heard_then_hung_up(result: CallResult, died_at_ms: float, bridge: RunningBridge) -> None:
    """The caller heard the reorder tone within 3 s of the engine's death, the call was hung up within 4 s, and
    the failure was counted once."""
    tone_ms = result.failure_tone_at_ms()
    # the bridge's REST hang-up, or its closing the stream first and answering the <Redirect> with <Hangup/>
    ended_ms = result.timeline[-1].at_ms
    assert result.hung_up_by == "bridge" and result.warnings == [], result.render()
    assert tone_ms is not None and died_at_ms < tone_ms <= died_at_ms + TONE_AFTER_DEATH_MS, (tone_ms, died_at_ms)
    assert ended_ms <= died_at_ms + HANG_UP_AFTER_DEATH_MS, (ended_ms, died_at_ms, result.render())
    counted = failures(bridge)
    assert sum(counted.values()) == 1 and set(counted) <= {"connection_failed", "shutdown"}, counted


async def test_a_refused_reconnect_ejects_the_endpoint_at_once(engine: EngineProcess) -> None:
    """A server whose port refuses connections is down: the first refused reconnect of a live call ejects it
    (new calls go to other servers), while that call is still within its reconnect budget."""
    async with running_bridge(defaults(engine.url)) as bridge:
        call, _ = await a_call_mid_reply(bridge, engine)
        engine.kill()
        await until(lambda: metric(bridge, "callbridge_engine_endpoint_state", endpoint=engine.url, state="ejected") == 1,
                    timeout_s=1.5)  # fmt: skip
        assert not call.done()  # ejected while the call still tries its reconnect budget
        assert (await call).hung_up_by == "bridge"


@pytest.mark.parametrize("death", ["SIGKILL", "SIGSTOP"])
async def test_the_caller_hanging_up_while_the_engine_is_gone_ends_the_call_at_once(
    engine: EngineProcess, death: str
) -> None:
    async with running_bridge(defaults(engine.url)) as bridge:
        placed = time.monotonic()
        script = CallerScript(utterances=((300, short_speech(1500)),), hangup_at_ms=3500)
        call = asyncio.create_task(bridge.carrier.place_call(script))
        await until(lambda: holds(engine, 1), timeout_s=10)
        await asyncio.sleep(max(0.0, placed + 3.0 - time.monotonic()))
        assert engine.process is not None
        os.kill(engine.process.pid, getattr(signal, death))  # 500 ms before the caller hangs up
        result = await call
        stopped = time.monotonic()
        await until(lambda: metric(bridge, "callbridge_calls_total", provider="twilio", end="caller_hung_up") == 1,
                    timeout_s=10)  # fmt: skip
        ended_after_s = time.monotonic() - stopped
    assert result.hung_up_by == "caller", result.render()
    assert ended_after_s < 1.0, ended_after_s  # read and honoured, not after the engine's reconnect budget
    assert failures(bridge) == {}


async def test_an_engine_gone_when_the_next_stream_comes_is_heard_then_the_call_hung_up(engine: EngineProcess) -> None:
    """The stream drops (its session parked), the engine server dies before the carrier's reconnect: the next
    stream's resume fails, no engine opens a new session — the caller hears the reorder tone on that stream, not
    silence, then the call is hung up the carrier's way."""
    async with running_bridge(defaults(engine.url)) as bridge:
        placed = time.monotonic()
        script = CallerScript(utterances=((300, short_speech(800)),), drop_stream_at_ms=(2000,), redirect_delay_ms=1500, hangup_at_ms=20_000)
        call = asyncio.create_task(bridge.carrier.place_call(script))
        await until(lambda: holds(engine, 1), timeout_s=10)
        await asyncio.sleep(max(0.0, placed + 2.6 - time.monotonic()))  # dropped at 2 s, back at 3.5 s
        engine.kill()
        result = await call
    assert len(result.streams) == 2 and result.hung_up_by == "bridge", result.render()
    tone_ms = result.failure_tone_at_ms()
    assert tone_ms is not None and tone_ms >= 3500, (tone_ms, result.render())  # on the second stream
    assert metric(bridge, "callbridge_streams_refused_total", provider="twilio", reason="engine_unavailable") == 1
