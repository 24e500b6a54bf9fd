"""The engine pool: its choosing core (``EndpointSet``) under a clock moved by hand, then ``EnginePool`` against
real ``engine-server``\\ s over loopback websockets (in this process; the bridge-level failover with separate
processes is ``tests/bridge/test_engine_pool_e2e.py``)."""

from __future__ import annotations

import asyncio

import pytest

from callbridge.engine.endpoints import EndpointHealth, EndpointSet, OpenOutcome
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import SessionClosed
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.pool import EnginePool, health_url
from callbridge.engine.port import ResumeTicket, SessionConfig, TurnDetection
from callbridge.engine.realtime import duplex_url
from tests.bridge.twilio_e2e import until
from tests.conftest import free_port
from tests.engine.serving import engine_server

A, B, C = "ws://gpu-a:8091", "ws://gpu-b:8091", "ws://gpu-c:8091"
NO_VAD = SessionConfig(turn_detection=None)


def endpoint_set(*urls: str, eject_after: int = 3) -> EndpointSet:
    return EndpointSet(
        urls or (A, B, C), eject_after_failures=eject_after, probe_interval_ms=1000, probe_backoff_max_ms=8000
    )


def opened(endpoints: EndpointSet, now_ms: int = 0) -> str:
    """Open one session where the core says, as the pool does; the endpoint it went to."""
    url = endpoints.candidates(now_ms)[0]
    endpoints.reserve(url)
    endpoints.opened(url)
    return url


def health(endpoints: EndpointSet, url: str) -> EndpointHealth:
    return endpoints.status(url)[0].health


class TestChoosing:
    def test_new_sessions_go_to_the_least_loaded_endpoint(self) -> None:
        endpoints = endpoint_set()
        assert [opened(endpoints) for _ in range(3)] == [A, B, C]  # ties: configured order, then round robin
        endpoints.release(B)
        assert opened(endpoints) == B  # B has the fewest now
        assert [s.sessions for s in endpoints.status()] == [1, 1, 1]
        assert [opened(endpoints) for _ in range(3)] == [A, C, B]  # ties again: the least recently picked first

    def test_an_open_in_progress_counts_as_load(self) -> None:
        endpoints = endpoint_set(A, B)
        endpoints.reserve(endpoints.candidates(0)[0])  # A connecting, not yet open
        assert endpoints.candidates(0) == [B, A]

    def test_resource_exhausted_moves_on_and_keeps_the_full_endpoint_last_for_a_while(self) -> None:
        endpoints = endpoint_set(A, B)
        endpoints.reserve(A)
        assert endpoints.open_failed(A, ErrorCode.RESOURCE_EXHAUSTED, 100) is OpenOutcome.BUSY
        assert endpoints.status(A)[0].sessions == 0 and health(endpoints, A) is EndpointHealth.HEALTHY
        assert endpoints.failovers == {(A, ErrorCode.RESOURCE_EXHAUSTED): 1}
        assert opened(endpoints, 100) == B
        assert endpoints.candidates(500) == [B, A]  # A is still taken as full, though B has more sessions
        assert endpoints.candidates(1100) == [A, B]  # a probe interval later: A is tried first again
        endpoints.reserve(A)
        endpoints.open_failed(A, ErrorCode.RESOURCE_EXHAUSTED, 1100)
        endpoints.release(B)  # one of our sessions there ended: not full any more
        endpoints.reserve(A)
        endpoints.opened(A)
        endpoints.release(A)
        assert endpoints.candidates(1200) == [B, A]  # equal load; B picked least recently


class TestHealth:
    def test_consecutive_failures_eject_and_a_success_in_between_resets_the_count(self) -> None:
        endpoints = endpoint_set(A, B, eject_after=3)
        for now_ms in (0, 10):
            endpoints.reserve(A)
            assert endpoints.open_failed(A, ErrorCode.CONNECTION_FAILED, now_ms) is OpenOutcome.FAILED
        endpoints.reserve(A)
        endpoints.opened(A)  # worked after all
        assert endpoints.status(A)[0].failures_in_a_row == 0
        for now_ms in (20, 30, 40):
            endpoints.reserve(A)
            endpoints.open_failed(A, ErrorCode.TIMEOUT, now_ms)
        status = endpoints.status(A)[0]
        assert status.health is EndpointHealth.EJECTED and status.ejections == 1 and status.state == "ejected"
        assert endpoints.candidates(50) == [B]

    def test_an_ejected_endpoint_is_probed_with_backoff_and_a_passing_probe_brings_it_back(self) -> None:
        endpoints = endpoint_set(A, B, eject_after=1)
        assert endpoints.due_probes(999) == [] and endpoints.next_deadline_ms() == 1000
        assert endpoints.due_probes(1000) == [A, B]  # routine health checks of both
        endpoints.probe_done(A, True, 1000)
        endpoints.reserve(A)
        endpoints.open_failed(A, ErrorCode.CONNECTION_FAILED, 1500)
        assert health(endpoints, A) is EndpointHealth.EJECTED
        assert endpoints.next_deadline_ms() == 2500  # B's check is in flight; A's first probe 1 s after ejection
        now_ms = 2500
        for gap_ms in (2000, 4000, 8000, 8000):  # A keeps failing: the interval doubles up to the cap
            assert endpoints.due_probes(now_ms) == [A]
            assert endpoints.probe_done(A, False, now_ms) is False
            assert endpoints.next_deadline_ms() == now_ms + gap_ms and endpoints.due_probes(now_ms + gap_ms - 1) == []
            now_ms += gap_ms
        assert endpoints.due_probes(now_ms) == [A]
        assert endpoints.probe_done(A, True, now_ms, server_sessions=2) is True  # back in
        status = endpoints.status(A)[0]
        assert status.health is EndpointHealth.HEALTHY and status.failures_in_a_row == 0 and status.server_sessions == 2
        assert endpoints.candidates(now_ms) == [B, A]  # in again; B was picked less recently
        assert endpoints.next_deadline_ms() == now_ms + 1000  # back to routine checks

    def test_a_pool_that_starts_probes_at_once_and_finds_a_dead_endpoint_two_intervals_later(self) -> None:
        """#40: the first probe waited an interval, so a dead engine was found three intervals after the start."""
        endpoints = endpoint_set(A, eject_after=3)
        endpoints.probe_all_now(0)
        for now_ms in (0, 1000, 2000):
            assert endpoints.due_probes(now_ms) == [A]
            endpoints.probe_done(A, False, now_ms)
        assert health(endpoints, A) is EndpointHealth.EJECTED

    def test_failed_health_checks_eject_a_healthy_endpoint_nobody_calls(self) -> None:
        endpoints = endpoint_set(A, eject_after=2)
        endpoints.due_probes(1000)
        assert endpoints.probe_done(A, False, 1000) is False and health(endpoints, A) is EndpointHealth.HEALTHY
        endpoints.due_probes(2000)
        endpoints.probe_done(A, False, 2000)
        assert health(endpoints, A) is EndpointHealth.EJECTED and endpoints.next_deadline_ms() == 3000

    def test_an_endpoint_that_just_failed_is_tried_last_until_an_open_or_a_probe_passes(self) -> None:
        endpoints = endpoint_set(A, B, eject_after=3)
        endpoints.due_probes(1000)
        endpoints.probe_done(A, False, 1000)  # a server that swallows packets: its probe timed out
        endpoints.probe_done(B, True, 1000)
        assert health(endpoints, A) is EndpointHealth.HEALTHY
        assert [opened(endpoints, 1100) for _ in range(2)] == [B, B]  # not A, though emptier
        endpoints.due_probes(2000)
        endpoints.probe_done(A, True, 2000)
        assert endpoints.candidates(2100) == [A, B]
        endpoints.reserve(A)
        endpoints.open_failed(A, ErrorCode.CONNECTION_FAILED, 2200)
        assert endpoints.candidates(2300) == [B, A]
        endpoints.reserve(A)  # tried anyway (B full, say), and it worked
        endpoints.opened(A)
        endpoints.release(A)
        assert endpoints.candidates(2400) == [A, B]

    def test_a_passing_health_check_does_not_clear_failed_opens(self) -> None:
        """``/health`` answers but the duplex socket does not (a wrong path, a turn-based server): still ejected."""
        endpoints = endpoint_set(A, B, eject_after=2)
        endpoints.reserve(A)
        endpoints.open_failed(A, ErrorCode.PROTOCOL_ERROR, 10)
        endpoints.due_probes(1000)
        endpoints.probe_done(A, True, 1000)
        endpoints.reserve(A)
        endpoints.open_failed(A, ErrorCode.PROTOCOL_ERROR, 1010)
        assert health(endpoints, A) is EndpointHealth.EJECTED

    def test_a_session_lost_past_resume_ejects_at_once(self) -> None:
        endpoints = endpoint_set(A, B, eject_after=3)
        opened(endpoints)
        assert endpoints.lost(A, 500) is True and health(endpoints, A) is EndpointHealth.EJECTED
        endpoints.release(A)
        assert (
            endpoints.candidates(600) == [B] and endpoints.next_deadline_ms() == 1000
        )  # B's check; A's probe at 1.5 s
        assert endpoints.lost(A, 700) is False  # a second loss on an ejected endpoint changes nothing

    def test_with_every_endpoint_ejected_they_are_tried_anyway_and_a_success_restores_one(self) -> None:
        endpoints = endpoint_set(A, B, eject_after=1)
        for url in (A, B):
            endpoints.reserve(url)
            endpoints.open_failed(url, ErrorCode.CONNECTION_FAILED, 0)
        assert endpoints.candidates(10) == [A, B]  # least recently picked first
        endpoints.reserve(A)
        assert endpoints.opened(A) is True and health(endpoints, A) is EndpointHealth.HEALTHY
        assert endpoints.candidates(20) == [A]


class TestDrain:
    def test_a_draining_endpoint_gets_no_new_session_and_keeps_its_own(self) -> None:
        endpoints = endpoint_set(A, B)
        assert opened(endpoints) == A
        endpoints.drain(A)
        assert endpoints.status(A)[0].state == "draining" and endpoints.status(A)[0].sessions == 1
        assert endpoints.candidates(0) == [B]
        endpoints.reserve(A)  # a resume of A's session still goes to A
        endpoints.opened(A)
        assert endpoints.status(A)[0].sessions == 2
        endpoints.undrain(A)
        assert endpoints.candidates(0) == [B, A]

    def test_with_everything_draining_there_is_nowhere_to_go(self) -> None:
        endpoints = endpoint_set(A, B)
        endpoints.drain(A)
        endpoints.drain(B)
        assert endpoints.candidates(0) == []

    def test_unknown_endpoints_are_key_errors(self) -> None:
        endpoints = endpoint_set(A)
        with pytest.raises(KeyError):
            endpoints.drain(B)


def test_health_url() -> None:
    assert health_url("ws://gpu-1:8091") == "http://gpu-1:8091/health"
    assert health_url(duplex_url("wss://h:443/omni/")) == "https://h:443/omni/health"
    assert health_url("wss://h/omni/v1/duplex?x=1") == "https://h/omni/health"


# ----------------------------------------------------------------- the pool over real engine servers


async def test_the_pool_spreads_sessions_and_moves_on_from_a_full_server() -> None:
    one_slot = LocalEngineOptions(generation_speed=20.0, chunk_ms=500, max_sessions=1)
    async with engine_server(one_slot) as a, engine_server(one_slot) as b:
        pool = EnginePool([a.url, b.url], probe_interval_s=60)
        outsider = await EnginePool([a.url]).open(NO_VAD)  # another bridge process took A's only slot
        try:
            session = await pool.open(NO_VAD)  # A looks empty from here: refused, then B
            assert pool.where(session) == b.url and b.engine.session_count == 1
            assert pool.endpoints.failovers == {(a.url, ErrorCode.RESOURCE_EXHAUSTED): 1}
            with pytest.raises(EngineError) as refused:  # both full
                await pool.open(NO_VAD)
            assert refused.value.code == ErrorCode.RESOURCE_EXHAUSTED and refused.value.retryable
            assert [s.sessions for s in pool.status()] == [0, 1]
            await session.close()
            assert [s.sessions for s in pool.status()] == [0, 0]
        finally:
            await outsider.close()
            await pool.aclose()


async def test_resume_goes_to_the_server_that_holds_the_session() -> None:
    async with engine_server() as a, engine_server() as b:
        pool = EnginePool([a.url, b.url], probe_interval_s=60)
        try:
            first, second = await pool.open(NO_VAD), await pool.open(NO_VAD)
            assert (pool.where(first), pool.where(second)) == (a.url, b.url)
            ticket = await second.detach()
            assert ticket.endpoint == duplex_url(b.url) and [s.sessions for s in pool.status()] == [1, 0]
            other_process = EnginePool([b.url, a.url], probe_interval_s=60)  # however its pool is ordered
            resumed = await other_process.resume(ticket)
            assert other_process.where(resumed) == b.url and resumed.session_id == second.session_id
            assert [s.sessions for s in other_process.status()] == [1, 0]
            await resumed.close()
            await first.close()
            await other_process.aclose()
            with pytest.raises(EngineError) as nowhere:
                await pool.resume(ResumeTicket(second.session_id, resume_token="t"))  # which of two? refused
            assert nowhere.value.code == ErrorCode.INVALID_SESSION_RESUME
        finally:
            await pool.aclose()


async def test_an_unreachable_server_is_skipped_ejected_and_probed_back_in() -> None:
    port = free_port()
    dead = f"ws://127.0.0.1:{port}"
    async with engine_server() as b:
        pool = EnginePool([dead, b.url], eject_after_failures=2, probe_interval_s=0.1, probe_backoff_max_s=0.2)
        try:
            sessions = [await pool.open(NO_VAD) for _ in range(3)]
            assert [pool.where(s) for s in sessions] == [b.url] * 3
            # tried at most once: after a failure it comes last; the probes eject it
            assert pool.endpoints.failovers.get((dead, ErrorCode.CONNECTION_FAILED), 0) <= 1
            await until(lambda: pool.status()[0].state == "ejected", timeout_s=5)
            async with engine_server(port=port) as revived:  # the server comes back on its address
                await until(lambda: pool.status()[0].state == "healthy", timeout_s=5)
                assert pool.status()[0].server_sessions == 0
                session = await pool.open(NO_VAD)  # the least loaded again
                assert pool.where(session) == dead and revived.engine.session_count == 1
                await session.close()
            for s in sessions:
                await s.close()
        finally:
            await pool.aclose()


async def test_a_session_lost_with_its_server_ejects_the_endpoint() -> None:
    async with engine_server() as b:
        async with engine_server() as a:
            pool = EnginePool([a.url, b.url], reconnect_budget_s=0.3, probe_interval_s=60)
            session = await pool.open(NO_VAD)
            assert pool.where(session) == a.url
        # A has shut down; the session tries to resume for 0.3 s, then ends
        ending = [event async for event in session.events()]
        try:
            assert isinstance(ending[-1], SessionClosed) and ending[-1].reason == ErrorCode.CONNECTION_FAILED
            assert pool.status()[0].state == "ejected" and pool.status()[0].sessions == 0
            replacement = await pool.open(NO_VAD)
            assert pool.where(replacement) == b.url
            await replacement.close()
        finally:
            await pool.aclose()


async def test_drain_through_the_pool_accepts_the_wire_url_too() -> None:
    pool = EnginePool([A, B], probe_interval_s=60)
    assert pool.drain(duplex_url(A)).state == "draining"
    assert pool.find("ws://gpu-z:1") is None
    with pytest.raises(KeyError):
        pool.undrain("ws://gpu-z:1")
    assert pool.undrain(A).state == "healthy"
    pool.drain(A)
    pool.drain(B)
    with pytest.raises(EngineError) as refused:  # nothing in service: refused without a connect
        await asyncio.wait_for(pool.open(NO_VAD), 5)
    assert refused.value.code == ErrorCode.RESOURCE_EXHAUSTED and "draining" in refused.value.message
    await pool.aclose()


async def test_a_session_config_error_is_raised_at_once_and_is_no_servers_fault() -> None:
    async with engine_server() as a, engine_server() as b:
        pool = EnginePool([a.url, b.url], eject_after_failures=1, probe_interval_s=60)
        try:
            with pytest.raises(EngineError) as refused:
                await pool.open(SessionConfig(turn_detection=TurnDetection(threshold=1.5)))
            assert refused.value.code == ErrorCode.INVALID_SESSION_CONFIG  # as vllm-omni answers any bad session object
            assert pool.endpoints.failovers == {} and [s.state for s in pool.status()] == ["healthy", "healthy"]
            assert [s.sessions for s in pool.status()] == [0, 0]
        finally:
            await pool.aclose()


def test_the_engine_settings_reach_every_member_of_the_pool() -> None:
    """``engine.heartbeat_interval_s`` (and the liveness keys beside it) configure each server's connection."""
    from callbridge.bridge.engine_factory import build_engine
    from callbridge.config import Settings

    settings = Settings.model_validate(
        {"engine": {"kind": "realtime", "urls": ["ws://a:8091", "ws://b:8091"], "heartbeat_interval_s": 7.5, "liveness_timeout_s": 2.5}}
    )
    pool = build_engine(settings)
    assert isinstance(pool, EnginePool)
    members = list(pool._members.values())
    assert len(members) == 2
    assert all(m.heartbeat_interval_s == 7.5 and m.liveness_timeout_s == 2.5 for m in members)
