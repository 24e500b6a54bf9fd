"""The engine pool end to end: a bridge (``create_app`` on uvicorn, as ``callbridge serve`` runs it) with
``engine.kind = "realtime"`` over two real ``callbridge engine-server`` processes (the embedded engine behind
vllm-omni's duplex protocol), and simulated Twilio calls over loopback.

Proved here: a call finds the server with room when the other answers ``resource_exhausted``, and is refused
busy at its answer (``<Reject reason="busy"/>``, never answered) when neither has room; a server killed mid-call fails that call (the reorder tone, then the
hang-up) while new calls go to the survivor, and the server is probed back in when it returns; a drained
server takes no new call while its running call goes on to its end; the admin routes need the token.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from callbridge.config import Settings
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript, CallResult
from callbridge.sim.runner import RunningBridge, free_port, running_bridge
from tests.bridge.twilio_e2e import short_speech, until
from tests.conftest import wait_http_ok

pytestmark = [pytest.mark.timeout(90), pytest.mark.processes]

TOKEN = "admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class EngineProcess:
    """One ``callbridge engine-server`` child process."""

    port: int
    max_sessions: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> EngineProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
        args = ["engine-server", "--port", str(self.port), "--log-format", "json"]
        args += ["--set", f"local_engine.max_sessions={self.max_sessions}", "--set", "local_engine.chunk_ms=500"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "callbridge", *args], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        wait_http_ok(f"http://127.0.0.1:{self.port}/health", self.process, timeout_s=60)  # type: ignore[arg-type]
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    async def sessions(self) -> int:
        """Sessions the server holds, whoever opened them (its own ``/health``)."""
        async with http_client(timeout=5) as http:
            return int((await http.get(f"http://127.0.0.1:{self.port}/health")).json()["sessions"])


@pytest.fixture
async def engines(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[EngineProcess, EngineProcess]]:
    max_sessions = getattr(request, "param", 1000)
    pair = (
        EngineProcess(free_port(), max_sessions, tmp_path / "engine-a.log"),
        EngineProcess(free_port(), max_sessions, tmp_path / "engine-b.log"),
    )
    try:
        await asyncio.gather(*(asyncio.to_thread(engine.start) for engine in pair))
        yield pair
    finally:
        for engine in pair:
            engine.kill()


def pool_settings(*urls: str, **engine: Any) -> Settings:
    return Settings.model_validate(
        {
            "engine": {
                "kind": "realtime",
                "urls": list(urls),
                "failure_tone_ms": 600,
                "eject_after_failures": 2,
                "probe_interval_s": 0.2,
                "probe_backoff_max_s": 0.4,
                **engine,
            },
            "server": {"admin_token": TOKEN},
        }
    )


async def admin(
    bridge: RunningBridge, method: str, path: str, *, headers: dict[str, str] | None = AUTH, **body: str
) -> httpx.Response:
    async with http_client(timeout=5) as http:
        return await http.request(method, bridge.base_url + path, headers=headers, json=body or None)


async def endpoint_states(bridge: RunningBridge) -> dict[str, tuple[str, int]]:
    """url → (state, sessions this bridge holds there), from ``GET /admin/engines``."""
    listing = (await admin(bridge, "GET", "/admin/engines")).json()["endpoints"]
    return {entry["url"]: (entry["state"], entry["sessions"]) for entry in listing}


def metric(bridge: RunningBridge, name: str, **labels: str) -> float:
    return bridge.app.state.bridge.registry.get_sample_value(name, labels) or 0.0


def place(bridge: RunningBridge, script: CallerScript) -> asyncio.Task[CallResult]:
    return asyncio.create_task(bridge.carrier.place_call(script))


def talks(hangup_at_ms: int, *utterances_at_ms: int) -> CallerScript:
    speech = short_speech(800)
    return CallerScript(utterances=tuple((at_ms, speech) for at_ms in utterances_at_ms), hangup_at_ms=hangup_at_ms)


async def holds(engine: EngineProcess, count: int) -> bool:
    """The server holds exactly ``count`` sessions."""
    return await engine.sessions() == count


def agent_spoke_after(result: CallResult, at_ms: int) -> bool:
    return any(e.who == "agent" and e.what.startswith("starts speaking") and e.at_ms > at_ms for e in result.timeline)


@pytest.mark.parametrize("engines", [1], indirect=True)  # each server has one session slot
async def test_a_call_finds_the_server_with_room_and_is_refused_when_none_has(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    # another bridge process holds A's only slot: from here A looks empty, and comes first
    outsider = await connect(a.url + "/v1/realtime?duplex=1&autostart=0")
    await outsider.send('{"type":"session.update","session":{"input_audio_format":"pcm16","sample_rate_hz":16000}}')
    assert '"session.created"' in str(await outsider.recv())
    try:
        async with running_bridge(pool_settings(a.url, b.url)) as bridge:
            first = place(bridge, talks(4000, 300))
            await until(lambda: holds(b, 1), timeout_s=10)  # A said resource_exhausted; B took it
            assert await endpoint_states(bridge) == {a.url: ("healthy", 0), b.url: ("healthy", 1)}
            assert metric(bridge, "callbridge_engine_failovers_total", endpoint=a.url, reason="resource_exhausted") == 1

            second = await bridge.carrier.place_call(talks(3000, 300))  # both full: busy, never answered
            assert second.streams == [] and "TwiML <Reject>: the call ends" in second.render(), second.render()
            assert metric(bridge, "callbridge_admission_refused_total", reason="engine") == 1
            assert metric(bridge, "callbridge_streams_refused_total", provider="twilio", reason="engine_unavailable") == 0
            # tried at the answer (engine.open_at_answer): full, so no stream was ever opened to try again
            assert metric(bridge, "callbridge_engine_failovers_total", endpoint=b.url, reason="resource_exhausted") == 1

            result = await first
            assert result.hung_up_by == "caller" and result.warnings == [] and result.agent_speech_ms > 0, (
                result.render()
            )
            await until(lambda: holds(b, 0), timeout_s=10)  # closed on the server, and counted off here
            await until(lambda: metric(bridge, "callbridge_engine_endpoint_sessions", endpoint=b.url) == 0)
    finally:
        await outsider.close()


async def test_a_server_killed_mid_call_fails_that_call_and_new_calls_go_to_the_survivor(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    async with running_bridge(pool_settings(a.url, b.url)) as bridge:
        on_a = place(bridge, talks(9000, 300, 4000))
        await until(lambda: holds(a, 1), timeout_s=10)
        on_b = place(bridge, talks(10_000, 300, 3000))  # the least loaded: B; still up when the third call
        # comes, however long A's call takes to fail (up to 8 s, below)
        await until(lambda: holds(b, 1), timeout_s=10)
        await asyncio.sleep(1.0)  # both mid-conversation

        a.kill()
        lost = await on_a  # resumes are tried for engine.reconnect_budget_s, then the reorder tone and the hang-up
        assert lost.hung_up_by == "bridge" and lost.warnings == [], lost.render()
        assert lost.timeline[-1].at_ms < 8000, lost.render()  # well before the caller's own hang-up at 9 s
        await until(lambda: metric(bridge, "callbridge_engine_failures_total", provider="twilio", reason="connection_failed") == 1)
        assert (await endpoint_states(bridge))[a.url] == ("ejected", 0)
        assert metric(bridge, "callbridge_engine_endpoint_state", endpoint=a.url, state="ejected") == 1

        third = place(bridge, talks(2500, 300))  # a new call: the survivor, though it has a call and A none
        await until(lambda: holds(b, 2), timeout_s=10)
        for result in (await third, await on_b):
            assert result.hung_up_by == "caller" and result.warnings == [] and result.agent_speech_ms > 0, (
                result.render()
            )
        assert metric(bridge, "callbridge_engine_failovers_total", endpoint=a.url, reason="connection_failed") == 0

        await asyncio.to_thread(a.start)  # back on its address: probed back in
        await until(lambda: _state_is(bridge, a.url, "healthy"), timeout_s=10)
        fourth = place(bridge, talks(1500, 300))  # equal load (none): A, picked less recently than B
        await until(lambda: holds(a, 1), timeout_s=10)
        assert (await fourth).hung_up_by == "caller"
        assert metric(bridge, "callbridge_engine_endpoint_ejections_total", endpoint=a.url) == 1


async def _state_is(bridge: RunningBridge, url: str, state: str) -> bool:
    return (await endpoint_states(bridge))[url][0] == state


async def _listed_as(bridge: RunningBridge, url: str, listed: tuple[str, int]) -> bool:
    return (await endpoint_states(bridge))[url] == listed


async def test_a_drained_server_takes_no_new_calls_while_its_call_runs_on(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    async with running_bridge(pool_settings(a.url, b.url)) as bridge:
        running = place(bridge, talks(6000, 300, 3500))
        await until(lambda: holds(a, 1), timeout_s=10)

        assert (await admin(bridge, "POST", "/admin/engines/drain", headers=None, url=a.url)).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await admin(bridge, "POST", "/admin/engines/drain", headers=wrong, url=a.url)).status_code == 401
        assert (await admin(bridge, "POST", "/admin/engines/drain", url="ws://127.0.0.1:1")).status_code == 404
        drained = await admin(bridge, "POST", "/admin/engines/drain", url=a.url)
        assert drained.status_code == 200 and drained.json()["state"] == "draining" and drained.json()["sessions"] == 1

        new_calls = [place(bridge, talks(2500, 300)) for _ in range(2)]  # A has fewer, but is draining
        await until(lambda: holds(b, 2), timeout_s=10)
        assert await a.sessions() == 1
        for result in await asyncio.gather(*new_calls):
            assert result.hung_up_by == "caller" and result.agent_speech_ms > 0, result.render()

        result = await running  # the call on A went on: the agent answered what was said after the drain
        assert result.hung_up_by == "caller" and result.warnings == [] and agent_spoke_after(result, 3500), (
            result.render()
        )
        await until(lambda: holds(a, 0), timeout_s=10)  # safe to stop now; this bridge counts it off too:
        await until(lambda: _listed_as(bridge, a.url, ("draining", 0)))
        assert metric(bridge, "callbridge_engine_endpoint_state", endpoint=a.url, state="draining") == 1

        undrained = await admin(bridge, "POST", "/admin/engines/undrain", url=a.url + "/v1/realtime")
        assert undrained.status_code == 200 and undrained.json()["state"] == "healthy"


async def test_the_admin_routes_are_off_without_a_token_or_a_pool() -> None:
    no_token = Settings.model_validate({"engine": {"kind": "realtime", "urls": ["ws://127.0.0.1:1"]}})
    async with running_bridge(no_token) as bridge:
        assert (await admin(bridge, "GET", "/admin/engines")).status_code == 404
        assert metric(bridge, "callbridge_engine_endpoint_state", endpoint="ws://127.0.0.1:1", state="healthy") == 1
    local = Settings.model_validate({"server": {"admin_token": TOKEN}})  # the embedded engine: nothing to drain
    async with running_bridge(local) as bridge:
        assert (await admin(bridge, "GET", "/admin/engines")).status_code == 404


async def test_the_probes_start_with_the_bridge_and_eject_a_dead_server_before_any_call() -> None:
    dead = f"ws://127.0.0.1:{free_port()}"
    async with running_bridge(pool_settings(dead)) as bridge:
        await until(lambda: _state_is(bridge, dead, "ejected"), timeout_s=5)  # two failed probes, 0.2 s apart
        assert metric(bridge, "callbridge_engine_endpoint_ejections_total", endpoint=dead) == 1
        assert metric(bridge, "callbridge_engine_failovers_total", endpoint=dead, reason="connection_failed") == 0
