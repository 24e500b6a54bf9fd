"""``serve --workers N`` without Redis: the supervisor holds one in-memory registry, the workers reach it over a
Unix socket.

Why: a call's answer webhook, its media socket and a later stream may each reach a different worker (the kernel
spreads connections over them), so the workers of one host need one registry — and on one host that need not be a
Redis server to install, run and secure. The supervisor (``RegistryHost``) runs a ``MemoryCallRegistry`` and
``MemoryStreamTokens`` on an event loop of its own, in a thread, and serves their methods; each worker's
``HostedCallRegistry`` and ``HostedStreamTokens`` forward every call to it. The host runs each call to its end
before it reads the next (the memory registry's methods never wait on anything), so what the memory registry does
atomically within one process — a ticket's claim, an admission, a token's single use — is atomic across workers.

What the workers share is what a fleet shares in Redis (``CallRegistry``): a stream that reaches another worker
resumes the call's engine session, and a worker that dies has its calls taken over by another from their live
tickets. What they do not: another host. The registry lives and dies with the supervisor, so a drain (the whole
group drains at once) serves calls in place, as a lone process does (``CallRegistry.spans_hosts``).

The wire: each message is a 4-byte length and a pickle of a tuple. Pickle is read only from a peer that has shown
the group's key (32 random bytes, handed to each worker as it is spawned, through multiprocessing's pipe: never on
a command line or in an environment) as its first bytes; the socket sits in a directory only this user may open; a message is at most
``MAX_MESSAGE_BYTES``. Requests are ``(id, target, method, args)`` — ``target`` the registry or the tokens, ``method``
one of theirs (``_METHODS``); replies ``(id, ok, value)``. A connection that asks to ``listen`` gets its signals, one
message each, for as long as it is open. Besides them, ``ping`` and ``levels`` (the registry's counts for the level
gauges, which every worker fetches each second: ``HostedCallRegistry.refresh_levels``).

What the caller hears when it fails: the supervisor gone, a worker drains and exits (``workers._watch_supervisor``);
a call to a host that does not answer within ``_TIMEOUT_S`` (or whose connection broke) raises
``RegistryUnavailable``, as Redis's client does, so new calls are refused busy and calls up carry on. A broken link is
opened again by the next call.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import os
import pickle
import secrets
import struct
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from callbridge.bridge.registry import (
    ENDED_KEPT_MS,
    CallClaim,
    CallRecord,
    CallRegistry,
    CallSignal,
    LiveCall,
    MemoryCallRegistry,
    MemoryStreamTokens,
    RegistryUnavailable,
    StreamTokens,
)
from callbridge.bridge.registry_journal import JournalPage
from callbridge.engine.port import ResumeTicket
from callbridge.logging import get_logger

__all__ = ["MAX_MESSAGE_BYTES", "HostAddress", "HostedCallRegistry", "HostedStreamTokens", "RegistryHost", "hosted_registry"]

log = get_logger(__name__)

MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
"""The largest message either side reads: a resume ticket carries at most 256 KiB of unheard reply (base64: ~350 KB)."""
_LENGTH: Final = struct.Struct("!I")
_KEY_BYTES: Final = 32
_LONGEST_PARENT: Final = 64
_AUTH_TIMEOUT_S: Final = 2.0
"""How long the host waits for a new connection's key."""
_TIMEOUT_S: Final = 2.0
"""A call that takes longer fails (``RegistryUnavailable``), as a Redis registry's does: a call's start is not held
up on a stuck host."""
_LISTEN_RETRY_S: Final = 1.0
_REGISTRY: Final = "registry"
_TOKENS: Final = "tokens"
_PING: Final = "ping"
_LEVELS: Final = "levels"
"""The host's counts for the level gauges: its registry's entries and detached sessions (``refresh_levels``)."""
_LISTEN: Final = "listen"
_METHODS: Final = {
    _REGISTRY: frozenset({
        "get", "detach", "claim_ticket", "claim_call", "mark_bound", "checkpoint", "claim_live", "mark_ended", "count", "counts",
        "keep_note", "note", "journal", "journal_of", "journaled", "announce", "announced", "signal", "listening", "admit", "reserve_dial", "remember_once", "forget", "hold", "release",
    }),
    _TOKENS: frozenset({"mint", "consume"}),
}  # fmt: skip
"""What a worker may call: the registry's and the tokens' methods, nothing else of theirs."""


@dataclass(frozen=True, slots=True)
class HostAddress:
    """Where a worker finds its group's registry: the host's socket and the key it must show."""

    path: str
    key: bytes


def _socket_parent() -> str | None:
    """Where the socket's directory goes: the temporary directory (``TMPDIR``), unless its path is too long for a Unix
    socket's (108 bytes on Linux, the socket's own name included): then ``/tmp``."""
    return None if len(tempfile.gettempdir()) <= _LONGEST_PARENT else "/tmp"  # noqa: S108  # a 0700 directory of our own


def _message(value: object) -> bytes:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


async def _read_message(reader: asyncio.StreamReader) -> Any:
    """The next message (raises ``asyncio.IncompleteReadError`` at the end, ``ValueError`` for one too large)."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_MESSAGE_BYTES:
        raise ValueError(f"a registry message of {length} bytes (at most {MAX_MESSAGE_BYTES})")
    return pickle.loads(await reader.readexactly(length))  # noqa: S301  # only from a peer that showed the key


# ------------------------------------------------------------------ the supervisor's side


class RegistryHost:
    """The registry of one ``serve --workers N`` group, served from the supervisor (``start`` … ``close``)."""

    def __init__(self, registry: MemoryCallRegistry | None = None, tokens: MemoryStreamTokens | None = None) -> None:
        self._directory = Path(tempfile.mkdtemp(prefix="callbridge-registry-", dir=_socket_parent()))  # mode 0700: this user's alone
        self.address = HostAddress(str(self._directory / "registry.sock"), secrets.token_bytes(_KEY_BYTES))
        self.registry = registry or MemoryCallRegistry()
        self.tokens = tokens or MemoryStreamTokens()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Serve on a thread of its own; returns once the socket listens (raises what kept it from listening)."""
        started = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._serve(started))
            except BaseException as exc:  # noqa: BLE001  # handed to start(), or logged if it came later
                if started.is_set():
                    log.error("registry_host_failed", detail=repr(exc))
                failed.append(exc)
                started.set()

        self._thread = threading.Thread(target=run, name="registry-host", daemon=True)
        self._thread.start()
        started.wait()
        if failed:
            raise failed[0]

    def close(self) -> None:
        """Stop serving (workers' calls then fail as unavailable) and remove the socket's directory."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout=5)
        with suppress(OSError):
            os.unlink(self.address.path)
        with suppress(OSError):
            self._directory.rmdir()

    async def _serve(self, started: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_unix_server(self._accepted, path=self.address.path, limit=MAX_MESSAGE_BYTES)
        os.chmod(self.address.path, 0o600)
        log.info("registry_host_started", path=self.address.path)
        started.set()
        async with server:
            await self._stop.wait()
            for task in list(self._connections):
                task.cancel()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            key = await asyncio.wait_for(reader.readexactly(_KEY_BYTES), _AUTH_TIMEOUT_S)
            if not hmac.compare_digest(key, self.address.key):
                log.warning("registry_host_refused", reason="wrong_key")
                return
            while True:
                request_id, target, method, args = await _read_message(reader)
                if method == _LISTEN and target == _REGISTRY:
                    await self._send_signals(request_id, str(args[0]), reader, writer)
                    return
                writer.write(_message((request_id, *await self._answer(target, method, args))))
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # a worker that went away, or never showed a key
        except (ValueError, TypeError, pickle.UnpicklingError) as exc:
            log.warning("registry_host_refused", reason="bad_message", detail=repr(exc))
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, target: str, method: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
        if method == _PING:
            return True, True
        if method == _LEVELS and target == _REGISTRY:
            return True, (self.registry.entry_count, self.registry.detached_count)
        if method not in _METHODS.get(target, ()):
            return False, f"no method {target}.{method}"
        bound: Callable[..., Awaitable[Any]] = getattr(self.registry if target == _REGISTRY else self.tokens, method)
        try:
            return True, await bound(*args)
        except Exception as exc:  # noqa: BLE001  # the worker's call fails (unavailable); the host serves on
            log.error("registry_host_call_failed", method=f"{target}.{method}", detail=repr(exc))
            return False, repr(exc)

    async def _send_signals(
        self, request_id: int, process_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Every signal another worker sends, to this listener, until it goes away."""
        closed = asyncio.ensure_future(reader.read(1))  # a listener sends nothing more: this ends as it goes away
        signals = aiter(self.registry.listen(process_id))
        received: asyncio.Future[CallSignal] | None = None
        try:
            while True:
                received = asyncio.ensure_future(anext(signals))
                done, _ = await asyncio.wait((received, closed), return_when=asyncio.FIRST_COMPLETED)
                if received not in done:
                    return
                writer.write(_message((request_id, True, received.result())))
                await writer.drain()
        finally:
            closed.cancel()
            if received is not None and not received.done():
                received.cancel()  # ends the registry's listen (it stops counting this listener)
                with suppress(asyncio.CancelledError):
                    await received


# ------------------------------------------------------------------ a worker's side


class _HostLink:
    """One connection to the host, opened on first use and again after it broke; replies matched by id."""

    def __init__(self, address: HostAddress) -> None:
        self.address = address
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._opening = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()

    async def call(self, target: str, method: str, *args: object) -> Any:
        try:
            return await asyncio.wait_for(self._call(target, method, args), _TIMEOUT_S)
        except TimeoutError:
            raise RegistryUnavailable(method, f"the supervisor's registry did not answer within {_TIMEOUT_S:g} s") from None
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            raise RegistryUnavailable(method, repr(exc)) from None

    async def _call(self, target: str, method: str, args: tuple[object, ...]) -> Any:
        writer = await self._open()
        request_id = next(self._ids)
        reply = self._pending[request_id] = asyncio.get_running_loop().create_future()
        try:
            writer.write(_message((request_id, target, method, args)))
            ok, value = await reply
        finally:
            self._pending.pop(request_id, None)
        if not ok:
            raise RegistryUnavailable(method, f"the supervisor's registry failed it: {value}")
        return value

    async def _open(self) -> asyncio.StreamWriter:
        async with self._opening:
            if self._writer is None or self._writer.is_closing():
                reader, self._writer = await open_host(self.address)
                self._reading = asyncio.create_task(self._read(reader, self._writer), name="registry-host-replies")
            return self._writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        problem: BaseException = EOFError("the supervisor's registry closed the connection")
        try:
            while True:
                request_id, ok, value = await _read_message(reader)
                reply = self._pending.get(request_id)
                if reply is not None and not reply.done():
                    reply.set_result((ok, value))
        except (asyncio.IncompleteReadError, OSError, ValueError, pickle.UnpicklingError) as exc:
            problem = exc if isinstance(exc, OSError) else EOFError(repr(exc))
        finally:
            writer.close()
            for reply in self._pending.values():
                if not reply.done():
                    reply.set_exception(problem)

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            with suppress(asyncio.CancelledError):
                await self._reading


async def open_host(address: HostAddress) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the host that has shown the key."""
    reader, writer = await asyncio.open_unix_connection(address.path, limit=MAX_MESSAGE_BYTES)
    writer.write(address.key)
    return reader, writer


class HostedCallRegistry(CallRegistry):
    """A worker's view of its group's registry (``RegistryHost``): every method one round trip to the supervisor."""

    shared: ClassVar[bool] = True
    spans_hosts: ClassVar[bool] = False
    levels_fetched: ClassVar[bool] = True

    def __init__(self, link: _HostLink) -> None:
        self._link = link
        self._levels = (0, 0)
        """The host's entries and detached sessions, as last fetched (``refresh_levels``)."""

    async def _call(self, method: str, *args: object) -> Any:
        return await self._link.call(_REGISTRY, method, *args)

    @property
    def entry_count(self) -> int:
        """The group's registry's entries, as of the last ``refresh_levels`` (0 before it)."""
        return self._levels[0]

    @property
    def detached_count(self) -> int:
        """The group's detached sessions, as of the last ``refresh_levels`` (0 before it)."""
        return self._levels[1]

    async def refresh_levels(self) -> None:
        entries, detached = await self._link.call(_REGISTRY, _LEVELS)
        self._levels = (int(entries), int(detached))

    async def get(self, call_id: str) -> CallRecord | None:
        record: CallRecord | None = await self._call("get", call_id)
        return record

    async def detach(self, call_id: str, ticket: ResumeTicket, input_ms: int, grace_ms: int, holder: str | None = None) -> bool:
        return bool(await self._call("detach", call_id, ticket, input_ms, grace_ms, holder))

    async def claim_ticket(self, call_id: str, expected: ResumeTicket | None = None) -> tuple[ResumeTicket | None, int]:
        claimed: tuple[ResumeTicket | None, int] = await self._call("claim_ticket", call_id, expected)
        return claimed

    async def claim_call(self, call_id: str, unless_ended: bool) -> CallClaim:
        claim: CallClaim = await self._call("claim_call", call_id, unless_ended)
        return claim

    async def mark_bound(self, call_id: str, keep_ms: int, live: LiveCall) -> None:
        await self._call("mark_bound", call_id, keep_ms, live)

    async def checkpoint(self, call_id: str, live: LiveCall, keep_ms: int) -> bool:
        return bool(await self._call("checkpoint", call_id, live, keep_ms))

    async def claim_live(self, call_id: str, holder: str, by: str) -> LiveCall | None:
        live: LiveCall | None = await self._call("claim_live", call_id, holder, by)
        return live

    async def mark_ended(self, call_id: str, reason: str, keep_ms: int = ENDED_KEPT_MS) -> None:
        await self._call("mark_ended", call_id, reason, keep_ms)

    async def count(self, call_id: str, counter: str, keep_ms: int, by: int = 1) -> int:
        return int(await self._call("count", call_id, counter, keep_ms, by))

    async def counts(self, call_id: str) -> dict[str, int]:
        counters: dict[str, int] = await self._call("counts", call_id)
        return counters

    async def keep_note(self, call_id: str, kind: str, text: str, keep_ms: int) -> None:
        await self._call("keep_note", call_id, kind, text, keep_ms)

    async def note(self, call_id: str, kind: str) -> str | None:
        text: str | None = await self._call("note", call_id, kind)
        return text

    async def journal(
        self, call_id: str, entries: list[str], keep_ms: int, header: str | None = None, opened_at: float | None = None,
        ended_at: float | None = None, calls_kept: int = 2000, writer: str | None = None,
    ) -> None:  # fmt: skip
        await self._call("journal", call_id, entries, keep_ms, header, opened_at, ended_at, calls_kept, writer)

    async def journal_of(self, call_id: str) -> JournalPage:
        page: JournalPage = await self._call("journal_of", call_id)
        return page

    async def journaled(self, live: bool, limit: int, offset: int = 0) -> list[str]:
        calls: list[str] = await self._call("journaled", live, limit, offset)
        return calls

    async def announce(self, process_id: str, status: str, keep_ms: int) -> None:
        await self._call("announce", process_id, status, keep_ms)

    async def announced(self) -> list[str]:
        statuses: list[str] = await self._call("announced")
        return statuses

    async def signal(self, signal: CallSignal) -> None:
        await self._call("signal", signal)

    async def listening(self, process_id: str) -> bool:
        return bool(await self._call("listening", process_id))

    async def admit(self, call_id: str, limit: int, hold_ms: int) -> bool:
        return bool(await self._call("admit", call_id, limit, hold_ms))

    async def reserve_dial(self, carrier: str, interval_ms: float, max_wait_ms: int) -> int | None:
        wait_ms = await self._call("reserve_dial", carrier, interval_ms, max_wait_ms)
        return None if wait_ms is None else int(wait_ms)

    async def remember_once(self, key: str, keep_ms: int) -> bool:
        return bool(await self._call("remember_once", key, keep_ms))

    async def forget(self, key: str) -> None:
        await self._call("forget", key)

    async def hold(self, call_ids: list[str], hold_ms: int) -> None:
        await self._call("hold", call_ids, hold_ms)

    async def release(self, call_id: str) -> None:
        await self._call("release", call_id)

    async def listen(self, process_id: str) -> AsyncIterator[CallSignal]:
        """A connection of its own to the host; when it breaks, connect again (what was sent meanwhile is missed:
        the call records hold what must not be)."""
        lost = False
        while True:
            writer: asyncio.StreamWriter | None = None
            try:
                reader, writer = await open_host(self._link.address)
                writer.write(_message((0, _REGISTRY, _LISTEN, (process_id,))))
                if lost:
                    log.info("registry_signals_restored")
                    lost = False
                while True:
                    _, _, signal = await _read_message(reader)
                    yield signal
            except (OSError, asyncio.IncompleteReadError, ValueError, pickle.UnpicklingError) as exc:
                if not lost:  # once per outage; tried again every _LISTEN_RETRY_S
                    log.warning("registry_unavailable", operation="listen", detail=repr(exc))
                lost = True
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(_LISTEN_RETRY_S)

    async def aclose(self) -> None:
        await self._link.aclose()

    async def reachable(self) -> bool:
        try:
            return bool(await self._link.call(_REGISTRY, _PING))
        except RegistryUnavailable:
            return False


class HostedStreamTokens(StreamTokens):
    """A worker's view of its group's stream tokens, on the registry's connection (it does not close it)."""

    def __init__(self, link: _HostLink) -> None:
        self._link = link

    async def mint(self, call_id: str) -> str:
        return str(await self._link.call(_TOKENS, "mint", call_id))

    async def consume(self, token: str | None, call_id: str) -> bool:
        if not token:
            return False
        return bool(await self._link.call(_TOKENS, "consume", token, call_id))


def hosted_registry(address: HostAddress) -> tuple[HostedCallRegistry, HostedStreamTokens]:
    """Both on one connection to the host (opened on first use)."""
    link = _HostLink(address)
    return HostedCallRegistry(link), HostedStreamTokens(link)
