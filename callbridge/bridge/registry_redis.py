"""The call registry and stream tokens in Redis, shared by every bridge process that serves a number.

Layout (one key per call, one per token; Redis expires both, so nothing is swept by hand):

- ``callbridge:call:{call_id}``: a hash — ``ticket`` (the ``ResumeTicket`` as a JSON object, keys
  sorted, so two processes write the same bytes for the same ticket), ``input_ms``, ``ended`` (the
  reason), ``bound`` and ``live`` (the bound stream's ``LiveCall``, JSON) with ``holder`` (its stream) beside it;
  its TTL is the disconnect grace after a detach, ``ENDED_KEPT_MS`` after the end.
- ``callbridge:token:{token}``: the call id it was minted for, TTL ``TOKEN_TTL_MS``; consumed with
  ``GETDEL``, so a token lets in one stream even when two processes race for it.
- ``callbridge:counts:{call_id}``: a hash of the call's counters (``HINCRBY``: atomic), TTL the ``keep_ms`` of
  the last count.
- ``callbridge:signals``: the pub/sub channel of ``CallSignal`` (JSON), one subscription per process; beside it on
  the same connection ``callbridge:process:{process_id}``, on which nothing is sent: its subscriber count says
  whether that process is alive (``listening``).
- ``callbridge:admitted``: with ``server.max_calls_fleet``, the calls the fleet holds (a sorted set, each scored
  with until when it counts: kept by the process holding it, released at its end, lapsed when that one died).
- ``callbridge:dial_turn:{carrier}``: when (Redis's clock, ms) the fleet's next dial through that carrier may go:
  each dial reserves its turn and moves it on by the carrier's interval (``reserve_dial``, one script); it expires a
  second after the last turn.

A claim is one Lua script (read, compare, delete the ticket), so of two processes resuming one call only
one gets the engine session; Redis runs scripts atomically. A new stream's first look at its call is one too
(``claim_call``: the ended reason, the ticket taken, else the record's holder: one round trip where it was three). So are a live ticket's update (only by its holder)
and its claim (from a holder that will never detach).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from callbridge.bridge.registry import (
    ENDED_KEPT_MS,
    TOKEN_TTL_MS,
    CallClaim,
    CallRecord,
    CallRegistry,
    CallSignal,
    LiveCall,
    RegistryUnavailable,
    SignalKind,
    StreamTokens,
)
from callbridge.bridge.registry_journal import JOURNAL_ENTRIES, JournalPage
from callbridge.config import Settings
from callbridge.engine.port import ResumeTicket
from callbridge.logging import get_logger

__all__ = ["RedisCallRegistry", "RedisStreamTokens", "redis_registry"]

log = get_logger(__name__)

_PREFIX = "callbridge:"
_SIGNALS = _PREFIX + "signals"
_ADMITTED = _PREFIX + "admitted"
_JOURNAL_LIVE = _PREFIX + "journal_live"
_BRIDGES = _PREFIX + "bridges"
_JOURNAL_FINISHED = _PREFIX + "journal_finished"
_LISTEN_POLL_S = 1.0
"""How long one wait for a signal blocks (below the client's socket timeout, which would end it as an error)."""
_LISTEN_RETRY_S = 1.0
_TIMEOUT_S = 2.0
"""A registry call that takes longer fails (``RegistryUnavailable``) rather than hold up a call's start. A command
is tried again once, at once, only where its connection was refused or closed (not where it timed out: that would
double a stall): a pooled connection Redis closed as it restarted fails its next command, and the retry's fresh
connection answers it (without, the first calls after Redis came back could be refused busy)."""

_CLAIM = """
local ticket = redis.call('HGET', KEYS[1], 'ticket')
local input_ms = redis.call('HGET', KEYS[1], 'input_ms') or '0'
if not ticket then return {'', input_ms} end
if ARGV[1] ~= '' and ticket ~= ARGV[1] then return {'', input_ms} end
redis.call('HDEL', KEYS[1], 'ticket')
return {ticket, input_ms}
"""
"""KEYS[1] the call's hash; ARGV[1] the expected ticket's JSON or ''. Returns {ticket JSON or '', input_ms}."""

_CLAIM_CALL = """
local ended = redis.call('HGET', KEYS[1], 'ended') or ''
local input_ms = redis.call('HGET', KEYS[1], 'input_ms') or '0'
if ended ~= '' and ARGV[1] == '1' then return {ended, '', input_ms, '', ''} end
local ticket = redis.call('HGET', KEYS[1], 'ticket')
if ticket then
  redis.call('HDEL', KEYS[1], 'ticket')
  return {ended, ticket, input_ms, '', ''}
end
local bound = redis.call('HGET', KEYS[1], 'bound') or ''
local live = redis.call('HGET', KEYS[1], 'live') or ''
return {ended, '', input_ms, bound, live}
"""
"""KEYS[1] the call's hash; ARGV[1] '1' where a call known over is not looked into. Returns {ended reason or '',
the ticket's JSON or '' (taken), input_ms, bound ('1' or ''), the live ticket's JSON or ''}."""

_DETACH = """
local holder = redis.call('HGET', KEYS[1], 'holder')
if ARGV[4] ~= '' and holder and holder ~= ARGV[4] then return 0 end
redis.call('HSET', KEYS[1], 'ticket', ARGV[1], 'input_ms', ARGV[2])
redis.call('HDEL', KEYS[1], 'bound', 'live', 'holder')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
"""KEYS[1] the call's hash; ARGV the ticket's JSON, input_ms, the grace (ms), the detaching holder or ''. Returns 1
when stored, 0 when another stream holds the call."""

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""
"""KEYS[1] the admitted calls (a sorted set: call id → until when, Redis's clock); ARGV the call, the limit, the
hold (ms). Returns 1 when admitted."""

_RESERVE_DIAL = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local turn = math.max(now, tonumber(redis.call('GET', KEYS[1]) or '0'))
if turn - now > tonumber(ARGV[2]) then return -1 end
local following = turn + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%.3f', following), 'PX', math.ceil(following - now) + 1000)
return math.ceil(turn - now)
"""
"""KEYS[1] the carrier's next turn to dial (ms, Redis's clock); ARGV the interval (ms), the most a turn may be
away (ms). Returns how many ms from now the turn reserved is, -1 where none was (too far away)."""

_HOLD = """
local t = redis.call('TIME')
local kept_until = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], kept_until, ARGV[i]) end
return 0
"""
"""KEYS[1] the admitted calls; ARGV the hold (ms), then the calls kept."""

_CHECKPOINT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'bound', '1', 'live', ARGV[2], 'holder', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 2
end
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'bound') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'live', ARGV[2])
return 1
"""
"""KEYS[1] the call's hash; ARGV[1] the holder, ARGV[2] its ``LiveCall`` JSON, ARGV[3] how long a record written
anew is kept (ms). Returns 1 when written, 2 when written anew (the record was lost), 0 when not the holder's."""

_CLAIM_LIVE = """
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then return '' end
local live = redis.call('HGET', KEYS[1], 'live') or ''
redis.call('HDEL', KEYS[1], 'live', 'bound')
redis.call('HSET', KEYS[1], 'holder', ARGV[2])
return live
"""
"""KEYS[1] the call's hash; ARGV[1] the holder it is taken from, ARGV[2] the stream that takes it. Returns the
``LiveCall`` JSON, or ''."""


def _process_channel(process_id: str) -> str:
    """A channel only ``process_id`` subscribes to, as long as it listens: nothing is sent on it, but Redis counts
    its subscriber (``listening``) and drops it the moment the process's connection closes."""
    return f"{_PREFIX}process:{process_id}"


@contextmanager
def _unavailable(operation: str) -> Iterator[None]:
    """Redis's errors (connection refused or lost, timeouts) as ``RegistryUnavailable``."""
    try:
        yield
    except RedisError as exc:
        raise RegistryUnavailable(operation, repr(exc)) from exc


def _ticket_json(ticket: ResumeTicket) -> str:
    return orjson.dumps(ticket.to_dict(), option=orjson.OPT_SORT_KEYS).decode()


def _ticket(text: str) -> ResumeTicket:
    return ResumeTicket.from_dict(orjson.loads(text))


def _live_json(live: LiveCall) -> str:
    return orjson.dumps(live.to_dict(), option=orjson.OPT_SORT_KEYS).decode()


def _signal(message: dict[str, Any]) -> CallSignal | None:
    """A pub/sub message as a ``CallSignal``; None (logged) for one that is not (another writer on the channel)."""
    try:
        fields = orjson.loads(message["data"])
        return CallSignal(str(fields["call_id"]), SignalKind(fields["kind"]), str(fields["detail"]), str(fields["origin"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        log.warning("registry_signal_invalid", data=repr(message.get("data"))[:200])
        return None


class RedisCallRegistry(CallRegistry):
    """``CallRegistry`` on a ``redis.asyncio`` client (``decode_responses=True``), which it closes in ``aclose``."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._claim: Any = client.register_script(_CLAIM)
        self._claim_call: Any = client.register_script(_CLAIM_CALL)
        self._checkpoint: Any = client.register_script(_CHECKPOINT)
        self._detach: Any = client.register_script(_DETACH)
        self._admit: Any = client.register_script(_ADMIT)
        self._reserve_dial: Any = client.register_script(_RESERVE_DIAL)
        self._hold: Any = client.register_script(_HOLD)
        self._claim_live: Any = client.register_script(_CLAIM_LIVE)

    @staticmethod
    def _key(call_id: str) -> str:
        return f"{_PREFIX}call:{call_id}"

    async def get(self, call_id: str) -> CallRecord | None:
        with _unavailable("get"):
            fields = cast(dict[str, str], await self._redis.hgetall(self._key(call_id)))
        if not fields:
            return None
        ticket, live = fields.get("ticket"), fields.get("live")
        return CallRecord(
            call_id,
            ticket=_ticket(ticket) if ticket else None,
            input_ms=int(fields.get("input_ms", 0)),
            ended_reason=fields.get("ended"),
            bound="bound" in fields,
            live=LiveCall.from_dict(orjson.loads(live)) if live else None,
            holder=fields.get("holder"),
        )

    async def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int, holder: str | None = None) -> bool:
        args = [_ticket_json(ticket), input_ms, max(1, grace_ms), holder or ""]
        with _unavailable("detach"):
            return bool(await self._detach(keys=[self._key(call_id)], args=args))

    async def claim_ticket(self, call_id: str, expected: ResumeTicket | None = None) -> tuple[ResumeTicket | None, int]:
        wanted = _ticket_json(expected) if expected is not None else ""
        with _unavailable("claim_ticket"):
            ticket, input_ms = await self._claim(keys=[self._key(call_id)], args=[wanted])
        return (_ticket(ticket) if ticket else None), int(input_ms)

    async def claim_call(self, call_id: str, unless_ended: bool) -> CallClaim:
        with _unavailable("claim_call"):
            ended, ticket, input_ms, bound, live = await self._claim_call(keys=[self._key(call_id)], args=["1" if unless_ended else ""])
        holder = LiveCall.from_dict(orjson.loads(live)).holder if live else None
        return CallClaim(ended or None, _ticket(ticket) if ticket else None, int(input_ms), bool(bound), holder)

    async def mark_bound(self, call_id: str, keep_ms: int, live: LiveCall) -> None:
        key = self._key(call_id)
        with _unavailable("mark_bound"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"bound": "1", "live": _live_json(live), "holder": live.holder})
                pipe.hdel(key, "ticket")
                pipe.pexpire(key, max(1, keep_ms), gt=True)  # never shortens a longer expiry
                pipe.pexpire(key, max(1, keep_ms), nx=True)  # sets one where there was none
                await pipe.execute()

    async def checkpoint(self, call_id: str, live: LiveCall, keep_ms: int) -> bool:
        with _unavailable("checkpoint"):
            written = int(await self._checkpoint(keys=[self._key(call_id)], args=[live.holder, _live_json(live), max(1, keep_ms)]))
        if written == 2:
            log.warning("registry_record_restored", call_id=call_id, holder=live.holder)
        return written > 0

    async def claim_live(self, call_id: str, holder: str, by: str) -> LiveCall | None:
        with _unavailable("claim_live"):
            live = await self._claim_live(keys=[self._key(call_id)], args=[holder, by])
        return LiveCall.from_dict(orjson.loads(live)) if live else None

    async def mark_ended(self, call_id: str, reason: str, keep_ms: int = ENDED_KEPT_MS) -> None:
        key = self._key(call_id)
        with _unavailable("mark_ended"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, "ended", reason)
                pipe.hdel(key, "ticket", "bound", "live", "holder")
                pipe.pexpire(key, max(1, keep_ms))
                await pipe.execute()

    async def ended_reason(self, call_id: str) -> str | None:
        with _unavailable("ended_reason"):
            return cast(str | None, await self._redis.hget(self._key(call_id), "ended"))

    async def count(self, call_id: str, counter: str, keep_ms: int, by: int = 1) -> int:
        key = f"{_PREFIX}counts:{call_id}"
        with _unavailable("count"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(key, counter, by)
                pipe.pexpire(key, max(1, keep_ms))
                total, _ = await pipe.execute()
        return int(total)

    async def counts(self, call_id: str) -> dict[str, int]:
        with _unavailable("counts"):
            fields = cast(dict[str, str], await self._redis.hgetall(f"{_PREFIX}counts:{call_id}"))
        return {name: int(value) for name, value in fields.items()}

    async def keep_note(self, call_id: str, kind: str, text: str, keep_ms: int) -> None:
        with _unavailable("keep_note"):
            await self._redis.set(f"{_PREFIX}note:{kind}:{call_id}", text, px=max(1, keep_ms))

    async def note(self, call_id: str, kind: str) -> str | None:
        with _unavailable("note"):
            return cast(str | None, await self._redis.get(f"{_PREFIX}note:{kind}:{call_id}"))

    async def journal(
        self, call_id: str, entries: list[str], keep_ms: int, header: str | None = None, opened_at: float | None = None,
        ended_at: float | None = None, calls_kept: int = 2000, writer: str | None = None,
    ) -> None:  # fmt: skip
        events, head, keep_ms = f"{_PREFIX}journal:{call_id}", f"{_PREFIX}journal_head:{call_id}", max(1, keep_ms)
        with _unavailable("journal"):
            async with self._redis.pipeline(transaction=True) as pipe:
                if entries:
                    pipe.rpush(events, *entries)
                    pipe.ltrim(events, -JOURNAL_ENTRIES, -1)
                pipe.pexpire(events, keep_ms)
                if header is not None:
                    pipe.set(head, header, px=keep_ms)
                else:
                    pipe.pexpire(head, keep_ms)
                if writer is not None:
                    pipe.set(f"{_PREFIX}journal_writer:{call_id}", writer, px=keep_ms)
                if opened_at is not None:
                    pipe.zadd(_JOURNAL_LIVE, {call_id: opened_at}, nx=True)
                    pipe.zremrangebyscore(_JOURNAL_LIVE, "-inf", opened_at - keep_ms / 1000)  # calls of a process that died
                if ended_at is not None:
                    pipe.zrem(_JOURNAL_LIVE, call_id)
                    pipe.zadd(_JOURNAL_FINISHED, {call_id: ended_at})
                    pipe.zremrangebyrank(_JOURNAL_FINISHED, 0, -calls_kept - 1)
                await pipe.execute()

    async def journal_of(self, call_id: str) -> JournalPage:
        with _unavailable("journal_of"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(f"{_PREFIX}journal_head:{call_id}")
                pipe.lrange(f"{_PREFIX}journal:{call_id}", 0, -1)
                pipe.get(f"{_PREFIX}journal_writer:{call_id}")
                header, entries, writer = await pipe.execute()
        return JournalPage(cast(str | None, header), list(entries), cast(str | None, writer))

    async def journaled(self, live: bool, limit: int, offset: int = 0) -> list[str]:
        if limit < 1:
            return []
        with _unavailable("journaled"):
            return cast(list[str], await self._redis.zrevrange(_JOURNAL_LIVE if live else _JOURNAL_FINISHED, offset, offset + limit - 1))

    async def announce(self, process_id: str, status: str, keep_ms: int) -> None:
        with _unavailable("announce"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(f"{_PREFIX}bridge:{process_id}", status, px=max(1, keep_ms))
                pipe.sadd(_BRIDGES, process_id)
                await pipe.execute()

    async def announced(self) -> list[str]:
        with _unavailable("announced"):
            process_ids = sorted(cast(set[str], await self._redis.smembers(_BRIDGES)))
            if not process_ids:
                return []
            statuses = cast(list[str | None], await self._redis.mget([f"{_PREFIX}bridge:{p}" for p in process_ids]))
            lapsed = [p for p, status in zip(process_ids, statuses, strict=True) if status is None]
            if lapsed:
                await self._redis.srem(_BRIDGES, *lapsed)
        return [status for status in statuses if status is not None]

    async def remember_once(self, key: str, keep_ms: int) -> bool:
        with _unavailable("remember_once"):
            return bool(await self._redis.set(f"{_PREFIX}seen:{key}", "1", px=keep_ms, nx=True))

    async def forget(self, key: str) -> None:
        with _unavailable("forget"):
            await self._redis.delete(f"{_PREFIX}seen:{key}")

    async def admit(self, call_id: str, limit: int, hold_ms: int) -> bool:
        with _unavailable("admit"):
            return bool(await self._admit(keys=[_ADMITTED], args=[call_id, limit, hold_ms]))

    async def reserve_dial(self, carrier: str, interval_ms: float, max_wait_ms: int) -> int | None:
        with _unavailable("reserve_dial"):
            wait_ms = int(await self._reserve_dial(keys=[f"{_PREFIX}dial_turn:{carrier}"], args=[interval_ms, max_wait_ms]))
        return None if wait_ms < 0 else wait_ms

    async def hold(self, call_ids: list[str], hold_ms: int) -> None:
        if call_ids:
            with _unavailable("hold"):
                await self._hold(keys=[_ADMITTED], args=[hold_ms, *call_ids])

    async def release(self, call_id: str) -> None:
        with _unavailable("release"):
            await self._redis.zrem(_ADMITTED, call_id)

    async def signal(self, signal: CallSignal) -> None:
        message = orjson.dumps({"call_id": signal.call_id, "kind": signal.kind.value, "detail": signal.detail, "origin": signal.origin})
        with _unavailable("signal"):
            await self._redis.publish(_SIGNALS, message)

    async def listening(self, process_id: str) -> bool:
        with _unavailable("listening"):
            ((_, subscribers),) = await self._redis.pubsub_numsub(_process_channel(process_id))
        return int(subscribers) > 0

    async def listen(self, process_id: str) -> AsyncIterator[CallSignal]:
        """One subscription to ``callbridge:signals``; when Redis drops it, subscribe again (what was sent
        meanwhile is missed: the call records hold what must not be)."""
        lost = False
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(_SIGNALS, _process_channel(process_id))  # the second: that it listens
                if lost:
                    log.info("registry_signals_restored")
                    lost = False
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_LISTEN_POLL_S)
                    signal = _signal(message) if message is not None else None
                    if signal is not None and signal.origin != process_id:
                        yield signal
            except (RedisError, OSError) as exc:
                if not lost:  # once per outage; the subscription is retried every _LISTEN_RETRY_S
                    log.warning("registry_unavailable", operation="listen", detail=repr(exc))
                lost = True
            finally:
                with suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
            await asyncio.sleep(_LISTEN_RETRY_S)

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def reachable(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False


class RedisStreamTokens(StreamTokens):
    """``StreamTokens`` on the registry's client (it does not close it)."""

    def __init__(self, client: aioredis.Redis, *, ttl_ms: int = TOKEN_TTL_MS) -> None:
        self._redis = client
        self._ttl_ms = ttl_ms

    async def mint(self, call_id: str) -> str:
        token = secrets.token_urlsafe(24)
        with _unavailable("mint"):
            await self._redis.set(f"{_PREFIX}token:{token}", call_id, px=self._ttl_ms)
        return token

    async def consume(self, token: str | None, call_id: str) -> bool:
        if not token:
            return False
        with _unavailable("consume"):
            minted_for = cast(str | None, await self._redis.getdel(f"{_PREFIX}token:{token}"))
        return minted_for is not None and hmac.compare_digest(minted_for, call_id)


def redis_registry(settings: Settings) -> tuple[RedisCallRegistry, RedisStreamTokens]:
    """Both on one connection pool to ``registry.redis_url`` (connected lazily, on first use)."""
    url = settings.registry.redis_url
    assert url is not None, "RegistrySettings validates that redis has a URL"
    client = aioredis.Redis.from_url(
        url.get_secret_value(), decode_responses=True, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
    return RedisCallRegistry(client), RedisStreamTokens(client)
