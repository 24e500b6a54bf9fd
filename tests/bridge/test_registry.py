"""The call registry and stream tokens: one body of tests, run on the in-memory backend (a fake clock), on
``serve --workers``' group registry (the memory registry held by a ``RegistryHost``, each view a worker's link to it
over its Unix socket) and on a real ``redis-server`` (real TTLs, kept short; two clients stand for two bridge
processes)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

import pytest
import redis.asyncio as aioredis

from callbridge.bridge.registry import (
    CallClaim,
    CallRegistry,
    LiveCall,
    MemoryCallRegistry,
    MemoryStreamTokens,
    RegistryUnavailable,
    StreamTokens,
)
from callbridge.bridge.registry_backend import build_registry
from callbridge.bridge.registry_host import RegistryHost, hosted_registry
from callbridge.bridge.registry_journal import JournalPage
from callbridge.bridge.registry_redis import RedisCallRegistry, RedisStreamTokens
from callbridge.config import ConfigError, load_settings
from callbridge.engine.commands import AppendAudio, CloseSession
from callbridge.engine.port import ResumeTicket, UnheardAudio
from callbridge.sim.carrier import CallerScript
from callbridge.sim.runner import free_port, running_bridge
from tests.bridge.twilio_e2e import engine, settings, short_speech, until
from tests.redis_server import redis_server, redis_url, start_redis, stop_process

__all__ = ["redis_url"]  # the fixture, imported for pytest

GRACE_MS = 300
TOKEN_TTL_MS = 2000
TICKET = ResumeTicket(
    "sess-1", lease_generation=3, resume_token="tok-a", last_event_seq=41, endpoint="ws://engine-2:8091/v1/realtime",
    heard_ms=(("resp-1", 1292),),  # the bridge's note of a reply a drop cut off: kept as written, both backends
    unheard=UnheardAudio("resp-1", "pcmu", 8000, 20, base64.b64encode(b"\x7f" * 1600).decode(), False, 190),  # its rest
)


@dataclass
class Backend:
    """Views of one shared store, as the processes of one bridge fleet see it."""

    name: str
    open_view: Callable[[], Awaitable[tuple[CallRegistry, StreamTokens]]]
    advance: Callable[[int], Awaitable[None]]
    """Let ``ms`` pass: the memory backend's fake clock, real time for Redis."""
    views: list[tuple[CallRegistry, StreamTokens]] = field(default_factory=list)

    async def view(self) -> tuple[CallRegistry, StreamTokens]:
        opened = await self.open_view()
        self.views.append(opened)
        return opened

    async def close_views(self) -> None:
        for registry, _ in self.views:
            await registry.aclose()


@pytest.fixture(params=["memory", "hosted", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param in ("memory", "hosted"):
        now = [1_000_000]

        async def advance_clock(ms: int) -> None:
            now[0] += ms

        registry, tokens = MemoryCallRegistry(clock=lambda: now[0]), MemoryStreamTokens(ttl_ms=TOKEN_TTL_MS, clock=lambda: now[0])
        if request.param == "memory":

            async def same_process() -> tuple[CallRegistry, StreamTokens]:
                return registry, tokens

            yield Backend("memory", same_process, advance_clock)
            return
        # ``serve --workers``' group registry: the supervisor holds the memory registry, each view is a worker's
        host = RegistryHost(registry, tokens)
        host.start()

        async def new_worker() -> tuple[CallRegistry, StreamTokens]:
            return hosted_registry(host.address)

        backend = Backend("hosted", new_worker, advance_clock)
        try:
            yield backend
        finally:
            await backend.close_views()
            host.close()
        return
    url: str = request.getfixturevalue("redis_url")
    admin = aioredis.Redis.from_url(url)
    await admin.flushdb()

    async def new_process() -> tuple[CallRegistry, StreamTokens]:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        return RedisCallRegistry(client), RedisStreamTokens(client, ttl_ms=TOKEN_TTL_MS)

    async def real_time(ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    backend = Backend("redis", new_process, real_time)
    try:
        yield backend
    finally:
        await backend.close_views()
        await admin.aclose()


# ------------------------------------------------------------------ registry


async def test_an_unknown_call_has_no_record_no_ticket_and_no_end(backend: Backend) -> None:
    registry, _ = await backend.view()
    assert await registry.get("CA-unknown") is None
    assert await registry.ended_reason("CA-unknown") is None
    assert await registry.claim_ticket("CA-unknown") == (None, 0)


async def test_a_detached_ticket_is_claimed_once_whole_by_any_process(backend: Backend) -> None:
    a, _ = await backend.view()
    b, _ = await backend.view()
    await a.detach("CA1", TICKET, 12_340, GRACE_MS)
    record = await b.get("CA1")
    assert record is not None and record.ticket == TICKET and record.input_ms == 12_340 and record.ended_reason is None
    assert await b.claim_ticket("CA1") == (TICKET, 12_340)
    assert await a.claim_ticket("CA1") == (None, 12_340)  # taken: the timeline offset stays for the record's life


async def test_of_concurrent_claims_exactly_one_gets_the_ticket(backend: Backend) -> None:
    views = [(await backend.view())[0] for _ in range(4)]
    await views[0].detach("CA2", TICKET, 500, 60_000)  # a grace no loaded machine outlasts: only the race counts
    claims = await asyncio.gather(*(views[i % 4].claim_ticket("CA2") for i in range(20)))
    assert [ticket for ticket, _ in claims].count(TICKET) == 1
    assert all(ticket is None for ticket, _ in claims if ticket != TICKET)


async def test_a_claim_for_an_expected_ticket_leaves_a_newer_one_alone(backend: Backend) -> None:
    registry, _ = await backend.view()
    newer = ResumeTicket("sess-1", lease_generation=4, resume_token="tok-b", last_event_seq=57, endpoint=TICKET.endpoint)
    await registry.detach("CA3", newer, 900, GRACE_MS)
    assert await registry.claim_ticket("CA3", TICKET) == (None, 900)
    assert await registry.claim_ticket("CA3", newer) == (newer, 900)


async def test_a_detached_call_expires_with_the_grace(backend: Backend) -> None:
    registry, _ = await backend.view()
    await registry.detach("CA4", TICKET, 100, GRACE_MS)
    await backend.advance(GRACE_MS // 3)
    assert await registry.get("CA4") is not None
    await backend.advance(GRACE_MS)
    assert await registry.get("CA4") is None
    assert await registry.claim_ticket("CA4") == (None, 0)


async def test_an_ended_call_drops_its_ticket_and_is_remembered_for_keep_ms(backend: Backend) -> None:
    a, _ = await backend.view()
    b, _ = await backend.view()
    await a.detach("CA5", TICKET, 100, GRACE_MS)
    await b.mark_ended("CA5", "caller_hung_up", keep_ms=GRACE_MS)
    assert await a.ended_reason("CA5") == "caller_hung_up"
    assert await a.claim_ticket("CA5") == (None, 100)
    await backend.advance(GRACE_MS + GRACE_MS // 3)
    assert await a.ended_reason("CA5") is None and await a.get("CA5") is None


async def test_a_detach_after_the_end_keeps_the_end(backend: Backend) -> None:
    registry, _ = await backend.view()
    await registry.mark_ended("CA6", "engine_unavailable:capacity")
    await registry.detach("CA6", TICKET, 0, GRACE_MS)
    assert await registry.ended_reason("CA6") == "engine_unavailable:capacity"


async def test_the_console_s_journal_is_one_for_every_process_live_then_finished(backend: Backend) -> None:
    """Two processes write one call's journal (its stream moved): every view reads it whole, in order; the call is
    among the live ones until its end, then among the finished, where only the newest ``calls_kept`` stay; a
    journal expires ``keep_ms`` after its last write."""
    one, _ = await backend.view()
    two, _ = await backend.view()
    await one.journal("CA1", ['{"n": 1}'], 60_000, header='{"call_id": "CA1"}', opened_at=100.0)
    await one.journal("CA2", ['{"n": 1}'], 60_000, header='{"call_id": "CA2"}', opened_at=101.0)
    await two.journal("CA1", ['{"n": 2}', '{"n": 3}'], 60_000, opened_at=105.0)  # a second process: its opened_at changes nothing
    assert await two.journaled(True, 10) == ["CA2", "CA1"] and await one.journaled(False, 10) == []
    assert await two.journaled(True, 10, 1) == ["CA1"] and await two.journaled(True, 1, 2) == []  # a page further on
    assert await two.journal_of("CA1") == JournalPage('{"call_id": "CA1"}', ['{"n": 1}', '{"n": 2}', '{"n": 3}'])
    await two.journal("CA1", ['{"end": 1}'], 60_000, ended_at=110.0, calls_kept=1)
    await one.journal("CA2", ['{"end": 1}'], 60_000, ended_at=111.0, calls_kept=1)
    assert await one.journaled(True, 10) == [] and await two.journaled(False, 10) == ["CA2"]
    assert (await one.journal_of("CA2")).entries == ['{"n": 1}', '{"end": 1}']
    await one.journal("CA2", [], 60_000, writer="p1")
    await two.journal("CA2", [], 60_000, writer="p2")
    assert (await one.journal_of("CA2")).writer == "p2"  # the process that wrote of it last
    await one.journal("CA3", ["{}"], 200, header="{}", opened_at=120.0)
    await backend.advance(400)
    assert await two.journal_of("CA3") == JournalPage(None, [])
    assert await one.journal_of("nobody") == JournalPage(None, [])


async def test_every_process_sees_every_bridge_s_announcement_until_it_lapses(backend: Backend) -> None:
    one, _ = await backend.view()
    two, _ = await backend.view()
    await one.announce("p1", '{"p": 1}', 300)
    await two.announce("p2", '{"p": 2}', 60_000)
    assert await two.announced() == ['{"p": 1}', '{"p": 2}']
    await backend.advance(400)
    assert await one.announced() == ['{"p": 2}']


# -------------------------------------------------------------------- tokens


async def test_a_token_lets_one_stream_in_for_its_call_only(backend: Backend) -> None:
    _, a = await backend.view()
    _, b = await backend.view()
    token = await a.mint("CA7")
    assert token and token != await a.mint("CA7")
    assert await b.consume(token, "CA7")  # minted by one process, consumed by another
    assert not await a.consume(token, "CA7")  # single use
    other = await a.mint("CA8")
    assert not await b.consume(other, "CA7")  # minted for another call: refused, and spent
    assert not await b.consume(other, "CA8")
    assert not await b.consume(None, "CA7") and not await b.consume("", "CA7") and not await b.consume("forged", "CA7")


async def test_of_concurrent_consumers_one_gets_in(backend: Backend) -> None:
    views = [(await backend.view())[1] for _ in range(3)]
    token = await views[0].mint("CA9")
    results = await asyncio.gather(*(views[i % 3].consume(token, "CA9") for i in range(12)))
    assert results.count(True) == 1


async def test_a_token_expires(backend: Backend) -> None:
    _, tokens = await backend.view()
    token = await tokens.mint("CA10")
    await backend.advance(TOKEN_TTL_MS + TOKEN_TTL_MS // 3)
    assert not await tokens.consume(token, "CA10")


# -------------------------------------------------------------- selection


def test_memory_is_the_default_backend() -> None:
    registry, tokens = build_registry(load_settings(None, {}))
    assert isinstance(registry, MemoryCallRegistry) and isinstance(tokens, MemoryStreamTokens)


async def test_registry_backend_redis_shares_one_connection_pool(redis_url: str) -> None:
    settings = load_settings(None, {"registry": {"backend": "redis", "redis_url": redis_url}})
    registry, tokens = build_registry(settings)
    try:
        assert isinstance(registry, RedisCallRegistry) and isinstance(tokens, RedisStreamTokens)
        token = await tokens.mint("CA11")
        await registry.mark_ended("CA11", "done")
        assert await tokens.consume(token, "CA11") and await registry.ended_reason("CA11") == "done"
    finally:
        await registry.aclose()


def test_redis_without_a_url_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"registry": {"backend": "redis"}})
    assert any(problem.key.startswith("registry") for problem in caught.value.problems)


# ---------------------------------------------------------- Redis unreachable


async def test_an_unreachable_redis_is_registry_unavailable() -> None:
    settings = load_settings(None, {"registry": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"}})
    registry, tokens = build_registry(settings)
    try:
        operations = {
            "get": registry.get("CA1"),
            "detach": registry.detach("CA1", TICKET, 0, GRACE_MS),
            "claim_ticket": registry.claim_ticket("CA1"),
            "claim_call": registry.claim_call("CA1", unless_ended=True),
            "mark_ended": registry.mark_ended("CA1", "x"),
            "ended_reason": registry.ended_reason("CA1"),
            "mint": tokens.mint("CA1"),
            "consume": tokens.consume("t", "CA1"),
        }
        for operation, call in operations.items():
            with pytest.raises(RegistryUnavailable) as caught:
                await call
            assert caught.value.operation == operation
    finally:
        await registry.aclose()


async def test_redis_lost_mid_call_leaves_no_engine_session_behind() -> None:
    """Redis dies during a call, then the call's stream drops: its engine session cannot be parked for a resume,
    so it is closed (not left to the grace); the reconnect's webhook is refused busy (not an HTTP 500: the
    registry cannot say what the call is) and the call ends."""
    recorder = engine()
    with redis_server() as (url, redis_process):
        config = settings(registry={"backend": "redis", "redis_url": url})
        async with running_bridge(config, recorder) as bridge:
            call = asyncio.create_task(
                bridge.carrier.place_call(CallerScript(utterances=((300, short_speech(800)),), drop_stream_at_ms=(2500,), hangup_at_ms=5000))
            )
            # mid-call: the stream bound and the caller's audio flowing (the answer opened the session before)
            await until(lambda: any(isinstance(c, AppendAudio) for s in recorder.opened for c in recorder.commands.get(s, ())), timeout_s=5)
            redis_process.kill()
            redis_process.wait()
            result = await call
            await until(lambda: recorder.session_count == 0, timeout_s=5)
    assert len(result.streams) == 1 and any("TwiML <Reject>" in e.what for e in result.timeline), result.render()
    (session_id,) = recorder.opened
    assert recorder.commands[session_id][-1] == CloseSession("registry_unavailable")


async def test_a_bound_mark_lasts_until_the_detach_or_the_end(backend: Backend) -> None:
    a, _ = await backend.view()
    b, _ = await backend.view()
    await a.mark_bound("CA-bound", 60_000, LIVE)
    record = await b.get("CA-bound")
    assert record is not None and record.bound and record.ticket is None and record.live == LIVE  # a stream holds it
    await a.detach("CA-bound", TICKET, 1200, grace_ms=60_000)
    record = await b.get("CA-bound")
    assert record is not None and not record.bound and record.ticket == TICKET and record.live is None
    await b.mark_bound("CA-bound", 60_000, replace(LIVE, holder="proc-b:MZ2"))
    await b.mark_ended("CA-bound", "caller_hung_up")
    record = await a.get("CA-bound")
    assert record is not None and not record.bound and record.ended_reason == "caller_hung_up" and record.live is None


LIVE = LiveCall("proc-a:MZ1", replace(TICKET, unheard=None), input_ms=3400)


async def test_a_live_ticket_is_kept_current_by_its_holder_only(backend: Backend) -> None:
    a, _ = await backend.view()
    b, _ = await backend.view()
    await a.mark_bound("CA-live", 60_000, LIVE)
    newer = replace(LIVE, ticket=replace(LIVE.ticket, resume_token="tok-b", last_event_seq=57), input_ms=4400)
    assert await a.checkpoint("CA-live", newer, 60_000)
    assert await b.checkpoint("CA-live", replace(newer, holder="proc-b:MZ2"), 60_000) is False  # not its holder: nothing written
    record = await b.get("CA-live")
    assert record is not None and record.live == newer
    await a.detach("CA-live", TICKET, 4400, grace_ms=60_000)
    assert await a.checkpoint("CA-live", newer, 60_000) is False  # a checkpoint after the detach does not re-mark the call
    record = await b.get("CA-live")
    assert record is not None and not record.bound and record.live is None and record.ticket == TICKET


async def test_a_live_ticket_the_registry_no_longer_has_is_written_anew_by_its_holder(backend: Backend) -> None:
    """The registry lost the call's record (Redis restarted empty; here, its expiry lapsed): the holder's next
    checkpoint writes it again, so that another process can take the call over from it, as before the loss."""
    a, _ = await backend.view()
    b, _ = await backend.view()
    await a.mark_bound("CA-lost", 50, LIVE)
    await backend.advance(200)
    assert await b.get("CA-lost") is None
    newer = replace(LIVE, input_ms=5400)
    assert await a.checkpoint("CA-lost", newer, 60_000)
    record = await b.get("CA-lost")
    assert record is not None and record.bound and record.live == newer and record.holder == LIVE.holder
    await backend.advance(200)
    assert await b.get("CA-lost") is not None  # kept as long as a bound mark
    assert await b.claim_live("CA-lost", LIVE.holder, by="proc-b:MZ2") == newer
    assert await a.checkpoint("CA-lost", newer, 60_000) is False  # taken: not written again


async def test_a_live_ticket_is_taken_once_from_the_holder_it_names(backend: Backend) -> None:
    """A stream of a process that died never detaches: another process takes its live ticket. Of two claims one
    wins; a claim that names someone else than the holder gets nothing; after the claim the old holder can no
    longer write or detach (it was taken for dead: the call's session is the claiming stream's now)."""
    a, _ = await backend.view()
    b, _ = await backend.view()
    c, _ = await backend.view()
    await a.mark_bound("CA-crash", 60_000, LIVE)
    assert await b.claim_live("CA-crash", "proc-x:MZ9", by="proc-b:MZ2") is None
    claims = await asyncio.gather(b.claim_live("CA-crash", LIVE.holder, by="proc-b:MZ2"), c.claim_live("CA-crash", LIVE.holder, by="proc-c:MZ3"))
    assert sorted(claims, key=lambda live: live is None) == [LIVE, None]
    winner = "proc-b:MZ2" if claims[0] is not None else "proc-c:MZ3"
    assert await a.checkpoint("CA-crash", LIVE, 60_000) is False
    assert await a.detach("CA-crash", TICKET, 3400, 60_000, holder=LIVE.holder) is False  # it woke up, too late
    record = await c.get("CA-crash")
    assert record is not None and not record.bound and record.live is None and record.ticket is None and record.holder == winner
    await b.mark_bound("CA-crash", 60_000, replace(LIVE, holder=winner))
    record = await a.get("CA-crash")
    assert record is not None and record.bound and record.holder == winner


async def test_a_new_streams_one_claim_takes_the_ticket_or_names_the_holder(backend: Backend) -> None:
    """``claim_call``: a stream's look at its call in one round trip — nothing for a call unknown; the ticket taken
    once, with the call's timeline; no ticket: whether a stream holds the session, and whose live ticket it left."""
    a, _ = await backend.view()
    b, _ = await backend.view()
    assert await a.claim_call("CA-one", unless_ended=True) == CallClaim()
    await a.detach("CA-one", TICKET, 1_200, 60_000)
    claims = await asyncio.gather(a.claim_call("CA-one", unless_ended=True), b.claim_call("CA-one", unless_ended=True))
    assert sorted(claims, key=lambda claim: claim.ticket is None) == [CallClaim(None, TICKET, 1_200), CallClaim(None, None, 1_200)]
    await a.mark_bound("CA-one", 60_000, LIVE)
    assert await b.claim_call("CA-one", unless_ended=False) == CallClaim(None, None, 1_200, bound=True, live_holder=LIVE.holder)
    assert await b.claim_live("CA-one", LIVE.holder, by="proc-b:MZ2") == LIVE
    assert await a.claim_call("CA-one", unless_ended=False) == CallClaim(None, None, 1_200)  # taken: no holder left


async def test_a_claim_of_a_call_known_over_takes_nothing_unless_asked_to(backend: Backend) -> None:
    """The first look (``unless_ended``) stops at the end; a later one (a stream already waiting) still takes a
    ticket parked after the end, as ``claim_ticket`` does, and sees the end beside it."""
    registry, _ = await backend.view()
    await registry.mark_ended("CA-over", "caller_hung_up")
    await registry.detach("CA-over", TICKET, 700, 60_000)  # a late park: the end is kept
    assert await registry.claim_call("CA-over", unless_ended=True) == CallClaim("caller_hung_up", input_ms=700)
    assert await registry.claim_call("CA-over", unless_ended=False) == CallClaim("caller_hung_up", TICKET, 700)
    assert await registry.claim_call("CA-over", unless_ended=False) == CallClaim("caller_hung_up", None, 700)


async def test_a_bind_drops_a_ticket_left_from_before(backend: Backend) -> None:
    a, _ = await backend.view()
    await a.detach("CA-stale", TICKET, 100, 60_000)
    await a.mark_bound("CA-stale", 60_000, LIVE)  # bound: whatever ticket the record held resumes nothing now
    record = await a.get("CA-stale")
    assert record is not None and record.ticket is None and record.live == LIVE
    assert await a.detach("CA-stale", TICKET, 100, 60_000, holder=LIVE.holder)  # its holder may detach it


async def test_the_fleet_admits_exactly_its_limit_at_once_and_lets_go_of_what_is_not_kept(backend: Backend) -> None:
    """``admit`` from four processes at once against a limit of 2: two calls counted; one counted already is
    admitted again; a released call frees its place; one nobody keeps (its process died) lapses with its hold."""
    views = [(await backend.view())[0] for _ in range(4)]
    calls = [f"CA-fleet-{i}" for i in range(8)]
    admitted = await asyncio.gather(*(views[i % 4].admit(call, 2, 60_000) for i, call in enumerate(calls)))
    assert sum(admitted) == 2
    first, second = (call for call, ok in zip(calls, admitted, strict=True) if ok)
    assert await views[3].admit(first, 2, 60_000) and not await views[3].admit("CA-fleet-new", 2, 60_000)
    await views[0].release(first)
    assert await views[1].admit("CA-fleet-new", 2, GRACE_MS)
    await views[0].hold([second], GRACE_MS)
    await backend.advance(GRACE_MS + 200)  # neither is kept past its hold
    assert await views[2].admit("CA-fleet-a", 2, 60_000) and await views[2].admit("CA-fleet-b", 2, 60_000)


async def test_the_fleets_dials_through_one_carrier_take_turns_an_interval_apart(backend: Backend) -> None:
    """``reserve_dial`` from three processes at once, six dials through one carrier at 100 ms: turns 0, 100, …, 500 ms
    from now, one each (the fleet's dials keep the carrier's rate together); another carrier's turns are its own; a
    turn further than the most a dial may wait is not reserved, and takes nothing from the next; once the turns are
    past, the next dial goes at once."""
    views = [(await backend.view())[0] for _ in range(3)]
    waits = await asyncio.gather(*(views[i % 3].reserve_dial("twilio", 100.0, 10_000) for i in range(6)))
    assert all(wait is not None for wait in waits)
    assert sorted(waits) == pytest.approx([0, 100, 200, 300, 400, 500], abs=40), waits  # Redis's clock runs meanwhile
    assert await views[1].reserve_dial("telnyx", 100.0, 10_000) == 0
    assert await views[2].reserve_dial("twilio", 100.0, 450) is None  # 600 ms away
    assert await views[0].reserve_dial("twilio", 100.0, 10_000) == pytest.approx(600, abs=40)
    await backend.advance(800)
    assert await views[1].reserve_dial("twilio", 100.0, 10_000) == 0


async def test_every_pooled_connection_works_again_the_moment_redis_is_back() -> None:
    """Redis restarted while the client's pool held several connections (calls answered at once) and nothing used
    them meanwhile: the first operations after its return each succeed, none on a connection Redis closed. Before,
    one of them failed (no retry): a call answered then was refused busy (a CI run's HAProxy fleet test)."""
    with redis_server() as (url, process):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        registry, tokens = build_registry(load_settings(None, {"registry": {"backend": "redis", "redis_url": url}}))
        try:
            minted = await asyncio.gather(*(tokens.mint(f"CA{i}") for i in range(8)))  # 8 connections in the pool
            stop_process(process, timeout_s=10)
            restarted = start_redis(port)
            try:
                found = await asyncio.gather(*(registry.ended_reason(f"CA{i}") for i in range(8)))
                assert found == [None] * 8
                assert not any(await asyncio.gather(*(tokens.consume(token, f"CA{i}") for i, token in enumerate(minted))))
            finally:
                stop_process(restarted, timeout_s=10)
        finally:
            await registry.aclose()
