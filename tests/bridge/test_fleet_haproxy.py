"""The fleet of ``test_fleet.py`` behind a real load balancer: Debian's HAProxy running the shipped
``deploy/haproxy/haproxy.cfg`` unchanged, which sends each webhook and media websocket to a bridge whose
``/readyz`` says 200. Simulated Twilio knows only the load balancer's address (``server.public_url``), so every
``<Redirect>`` and ``<Stream>`` goes back through it and lands wherever it picks.

Proved here, on the default configuration otherwise: a bridge killed (SIGKILL) mid-call is taken out at the
carrier's reconnect, which reaches the other bridge and resumes the same engine session; a bridge draining
(SIGTERM) is taken out within a health check, its call moved, and new calls are answered by the other; with
the registry gone every bridge is unready, and a new call still gets the carrier's busy from a bridge (not
HAProxy's 503 page, an application error to Twilio), then is answered again once Redis is back; and the call up
through the outage, its record written anew by its bridge, resumes on the other when that bridge is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from callbridge.carriers.exotel.sim import SimulatedExotel
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import free_port
from tests.bridge.test_fleet import (
    SECRET,
    Fleet,
    Process,
    _agent_heard_after,
    _get,
    _ready,
    _stream_started_at,
    running_fleet,
)
from tests.bridge.twilio_e2e import short_speech, until
from tests.conftest import peer_binary
from tests.redis_server import redis_server, start_redis, stop_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"


@dataclass
class Haproxy:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def marked_down(self, server: str) -> bool:
        """HAProxy logged ``server`` (``bridge-a``…) down."""
        return f"Server bridges/{server} is DOWN" in self.log_path.read_text(errors="replace")

    def marked_up(self, server: str) -> bool:
        """HAProxy logged ``server`` back up (after it was down)."""
        return f"Server bridges/{server} is UP" in self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_haproxy(port: int, a: Process, b: Process, tmp_path: Path) -> Iterator[Haproxy]:
    binary = peer_binary("haproxy")
    if binary is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy; CI installs it)")
    env = {
        **os.environ,
        "CALLBRIDGE_LB_BIND": f"127.0.0.1:{port}",
        "CALLBRIDGE_BRIDGE_A": a.url.removeprefix("http://"),
        "CALLBRIDGE_BRIDGE_B": b.url.removeprefix("http://"),
    }
    log_path = tmp_path / "haproxy.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([binary, "-db", "-f", str(CONFIG)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield Haproxy(process, f"http://127.0.0.1:{port}", log_path)
    finally:
        stop_process(process, timeout_s=5)


@dataclass
class Balanced:
    fleet: Fleet
    lb: Haproxy
    redis: subprocess.Popen[bytes]
    redis_port: int

    def restart_redis(self) -> None:
        """A new, empty ``redis-server`` where the killed one was (stopped at the fixture's end)."""
        self.redis = start_redis(self.redis_port)

    async def _holding(self) -> tuple[Process, Process, str] | None:
        for bridge, other, name in ((self.fleet.a, self.fleet.b, "bridge-a"), (self.fleet.b, self.fleet.a, "bridge-b")):
            if await _ready(bridge, active_calls=1):
                return bridge, other, name
        return None

    async def one_call_up(self) -> bool:
        return await self._holding() is not None

    async def holder(self) -> tuple[Process, Process, str]:
        """(the bridge holding the one call up, the other, the holder's HAProxy server name)."""
        holding = await self._holding()
        assert holding is not None, "no bridge holds the call"
        return holding


@pytest.fixture
async def balanced(tmp_path: Path) -> AsyncIterator[Balanced]:
    """Redis of its own (a test stops it), the engine server, bridges A and B whose public URL is HAProxy's."""
    lb_port = free_port()
    with redis_server() as (redis_url, redis):
        async with running_fleet(redis_url, tmp_path, server={"public_url": f"http://127.0.0.1:{lb_port}"}) as fleet:
            with running_haproxy(lb_port, fleet.a, fleet.b, tmp_path) as lb:
                fleet.twilio.bridge_url = lb.url
                await until(lambda: _lb_ready(lb), timeout_s=10)
                port = urlsplit(redis_url).port
                assert port is not None
                balanced = Balanced(fleet, lb, redis, port)
                try:
                    yield balanced
                finally:
                    if balanced.redis is not redis:
                        stop_process(balanced.redis, timeout_s=5)


async def _lb_ready(lb: Haproxy) -> bool:
    try:
        async with http_client(timeout=2) as http:
            return (await http.get(lb.url + "/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def test_a_killed_bridge_is_taken_out_at_the_reconnect_and_the_call_resumes_on_the_other(balanced: Balanced) -> None:
    fleet = balanced.fleet
    speech = short_speech(1200)
    call = asyncio.create_task(fleet.twilio.place_call(CallerScript(utterances=((300, speech), (4500, speech)), hangup_at_ms=8000)))
    await until(balanced.one_call_up, timeout_s=10)
    holder, other, name = await balanced.holder()
    await asyncio.sleep(2.5)  # the first reply played
    holder.process.kill()
    result = await call

    assert len(result.streams) == 2 and result.hung_up_by == "caller", result.render()
    (opened,) = holder.events("call_bridged", call_id=result.call_sid)
    (resumed,) = other.events("call_bridged", call_id=result.call_sid)
    assert resumed["engine"] == "taken_over" and resumed["session_id"] == opened["session_id"], other.call_log(result.call_sid)
    assert resumed["bound_after_ms"] <= 500, resumed
    assert len(fleet.engine.events("engine_session_opened")) == 1
    assert _agent_heard_after(result, _stream_started_at(result, 1)), result.render()
    assert balanced.lb.marked_down(name)
    await until(fleet.no_engine_session_left, timeout_s=10)


async def test_a_draining_bridge_is_taken_out_its_call_moves_and_new_calls_are_answered_by_the_other(balanced: Balanced) -> None:
    """SIGTERM of the bridge holding a Twilio call, and an Exotel call that cannot move (placed at that bridge's
    own address, so that the drain lasts): ``/readyz`` 503 takes it out at HAProxy's next check, and only then
    (``LoadBalancerGate``) the Twilio call moves, in one step, to the other bridge through the load balancer; every
    new call from the signal on is answered there. (Moved at the signal, its reconnect could land on the draining
    bridge before HAProxy's check and be moved again, up to four times, each a gap the caller heard.)"""
    fleet = balanced.fleet
    speech = short_speech(1200)
    first = asyncio.create_task(fleet.twilio.place_call(CallerScript(utterances=((300, speech), (4500, speech)), hangup_at_ms=8000)))
    await until(balanced.one_call_up, timeout_s=10)
    holder, other, name = await balanced.holder()
    held = asyncio.create_task(SimulatedExotel(holder.url, SECRET).place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=7000)))
    await until(lambda: _ready(holder, active_calls=2), timeout_s=10)
    await asyncio.sleep(1.5)
    holder.process.send_signal(signal.SIGTERM)
    new_calls = []
    for _ in range(5):  # new calls from the signal on, before and after HAProxy's next check
        # each on the line until 7 s (within the first call's 8): a call bounced by the draining bridge starts its stream
        # about 2 s in, and on a loaded CI machine one's echo had not come 1.9 s after its words (hung up at 5 s)
        new_calls.append(asyncio.create_task(fleet.twilio.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=7000))))
        await asyncio.sleep(0.3)
    await until(lambda: balanced.lb.marked_down(name), timeout_s=3)

    moved, exotel, *answered = await asyncio.gather(first, held, *new_calls)
    assert await asyncio.to_thread(holder.process.wait, 15) == 0
    assert "Layer7 wrong status" in balanced.lb.log_path.read_text()  # out by its health check, while it drained
    (moving,) = holder.events("drain_moving_calls")  # only then was the call moved: its reconnect reached the other
    assert moving["because"] == "readiness_checked", moving
    assert len(moved.streams) == 2 and moved.hung_up_by == "caller", moved.render()
    assert other.events("call_bridged", call_id=moved.call_sid)[-1]["engine"] == "resumed"
    assert _agent_heard_after(moved, _stream_started_at(moved, 1)), moved.render()
    assert len(exotel.streams) == 1 and exotel.hung_up_by == "caller", exotel.render()
    for result in answered:
        assert result.hung_up_by == "caller" and result.agent_speech_ms > 0, result.render()
        assert other.events("call_bridged", call_id=result.call_sid), result.render()
    await until(fleet.no_engine_session_left, timeout_s=10)


@pytest.mark.long
async def test_with_the_registry_gone_a_new_call_is_busy_from_a_bridge_and_answered_once_it_is_back(balanced: Balanced) -> None:
    """Redis killed with a call up: both bridges' ``/readyz`` go 503 and HAProxy takes both out, yet a new call
    still reaches a bridge (the backup servers) and gets Twilio's busy, not an HTTP 503 from HAProxy. The call up
    carries on. Redis back, empty, on the same address: both bridges back in and a new call answered; the call
    that lived through the outage has its record written anew by its holder, so that when that bridge is then
    killed, the call resumes its same engine session on the other."""
    fleet = balanced.fleet
    speech = short_speech(800)
    live = asyncio.create_task(
        fleet.twilio.place_call(CallerScript(utterances=((300, speech), (6000, speech), (12_000, speech)), hangup_at_ms=14_000))
    )
    await until(balanced.one_call_up, timeout_s=10)
    holder, other, _ = await balanced.holder()
    balanced.redis.kill()
    balanced.redis.wait()
    await until(lambda: balanced.lb.marked_down("bridge-a") and balanced.lb.marked_down("bridge-b"), timeout_s=10)
    for bridge in (fleet.a, fleet.b):
        assert (await _get(bridge.url + "/readyz")).json() == {"status": "registry_unavailable"}
    refused = await fleet.twilio.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=2000))
    assert refused.streams == [] and refused.timeline[-1].what == "TwiML <Reject>: the call ends", refused.render()
    (refusal,) = fleet.a.events("call_refused", call_id=refused.call_sid) + fleet.b.events("call_refused", call_id=refused.call_sid)
    assert refusal["reason"] == "registry_unavailable" and refusal["level"] == "warning"

    balanced.restart_redis()
    await until(lambda: balanced.lb.marked_up("bridge-a") and balanced.lb.marked_up("bridge-b"), timeout_s=10)
    answered = await fleet.twilio.place_call(CallerScript(utterances=((300, speech),), hangup_at_ms=3000))
    answered_logs = [bridge.call_log(answered.call_sid) for bridge in (fleet.a, fleet.b)]
    assert answered.hung_up_by == "caller" and answered.agent_speech_ms > 0, (answered.render(), answered_logs)
    await until(lambda: bool(holder.events("registry_record_restored")), timeout_s=5)
    holder.process.kill()  # the registry had lost the call: only its restored record can resume it
    through = await live
    assert len(through.streams) == 2 and through.hung_up_by == "caller", through.render()
    (opened,) = holder.events("call_bridged", call_id=through.call_sid)
    (taken,) = other.events("call_bridged", call_id=through.call_sid)
    assert taken["engine"] == "taken_over" and taken["session_id"] == opened["session_id"], other.call_log(through.call_sid)
    assert _agent_heard_after(through, 12_000), through.render()  # its third reply, after all that
    for bridge in (fleet.a, fleet.b):
        log = bridge.log_path.read_text()
        assert "Traceback" not in log and '"level": "error"' not in log, bridge.name
    await until(fleet.no_engine_session_left, timeout_s=10)
