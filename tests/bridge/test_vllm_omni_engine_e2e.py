"""Calls through the bridge on vllm-omni 0.30's own serving stack, with the shipped defaults.

The engine is the wheel's websocket handler, session manager, runner, lease, journal and Silero VAD with the
Qwen3-Omni plugin, on a stand-in model, as a process of its own (``tests/engine/vllm_omni_stack.py``); the
bridge is ``create_app`` on uvicorn with ``engine.kind = "realtime"`` and nothing else changed; the carrier is
simulated Twilio over loopback. What ``test_engine_death_e2e.py`` shows against ``callbridge engine-server``
holds against the real server's code: a conversation, one ``session.close`` per session, a dropped stream
resumed on the same session, and a server that dies mid-call heard within 3 s and hung up within 4 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from callbridge.sim.carrier import CallerScript, CallResult
from callbridge.sim.runner import free_port, running_bridge
from tests.bridge.test_engine_death_e2e import assert_heard_then_hung_up, defaults, failures, metric
from tests.bridge.twilio_e2e import short_speech, until
from tests.engine.vllm_omni_stack import VllmOmniProcess
from tests.engine.vllm_omni_wheel import require_wheel

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


@pytest.fixture
async def omni(tmp_path: Path) -> AsyncIterator[VllmOmniProcess]:
    require_wheel()
    process = await asyncio.to_thread(VllmOmniProcess(free_port(), tmp_path / "vllm-omni.log").start)
    try:
        yield process
    finally:
        if process.process is not None and process.process.poll() is None:
            os.kill(process.process.pid, signal.SIGCONT)
        process.kill()


async def holds(omni: VllmOmniProcess, count: int) -> bool:
    return await omni.sessions() == count


def agent_spoke(result: CallResult) -> bool:
    return any(e.who == "agent" and e.what.startswith("starts speaking") for e in result.timeline)


async def test_a_conversation_then_the_hang_up_closes_the_session_once(omni: VllmOmniProcess) -> None:
    async with running_bridge(defaults(omni.url)) as bridge:
        script = CallerScript(utterances=((300, short_speech(1500)),), hangup_at_ms=6000)
        result = await bridge.carrier.place_call(script)
        await until(lambda: holds(omni, 0), timeout_s=10)
    assert result.hung_up_by == "caller" and result.warnings == [], result.render()
    assert agent_spoke(result), result.render()
    assert metric(bridge, "callbridge_engine_sessions_total", how="opened") == 1
    assert failures(bridge) == {}
    assert await omni.tally() == {"sessions": 0, "close_frames": 1, "errors": []}  # one session.close, no error


async def test_a_dropped_stream_resumes_the_same_session(omni: VllmOmniProcess) -> None:
    async with running_bridge(defaults(omni.url)) as bridge:
        script = CallerScript(utterances=((300, short_speech(1500)), (6000, short_speech(800))), drop_stream_at_ms=(3000,), redirect_delay_ms=300, hangup_at_ms=10_000)
        result = await bridge.carrier.place_call(script)
        await until(lambda: holds(omni, 0), timeout_s=10)
    assert len(result.streams) == 2 and result.hung_up_by == "caller", result.render()
    assert metric(bridge, "callbridge_engine_sessions_total", how="opened") == 1
    assert metric(bridge, "callbridge_engine_sessions_total", how="resumed") == 1
    assert failures(bridge) == {}
    assert await omni.tally() == {"sessions": 0, "close_frames": 1, "errors": []}


@pytest.mark.parametrize("death", ["SIGKILL", "SIGTERM", "SIGSTOP"])
async def test_a_server_that_dies_mid_call_is_heard_within_3_s_and_the_call_hung_up(omni: VllmOmniProcess, death: str) -> None:
    async with running_bridge(defaults(omni.url)) as bridge:
        placed = time.monotonic()
        script = CallerScript(utterances=((300, short_speech(1500)),), hangup_at_ms=20_000)
        call = asyncio.create_task(bridge.carrier.place_call(script))
        await until(lambda: holds(omni, 1), timeout_s=10)
        await asyncio.sleep(max(0.0, placed + 3.0 - time.monotonic()))  # the caller spoke; the agent answers
        assert omni.process is not None
        died_at_ms = (time.monotonic() - placed) * 1000
        os.kill(omni.process.pid, getattr(signal, death))
        result = await call
    assert_heard_then_hung_up(result, died_at_ms, bridge)
