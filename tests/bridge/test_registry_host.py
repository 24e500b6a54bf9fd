"""``serve --workers N``' group registry when something is wrong: the host gone, a stranger on its socket, a
message too large or naming what is not the registry's, a host that never answers, a link that broke; and the
counts a worker fetches from it for its level gauges. What the registry does when all is well is
``test_registry.py``'s and ``test_cross_process.py``'s (the ``hosted`` backend); a whole group on it is in
``test_fleet.py``."""

from __future__ import annotations

import asyncio
import os
import stat
import struct
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from callbridge.bridge.registry import CallSignal, RegistryUnavailable, SignalKind
from callbridge.bridge.registry_host import (
    MAX_MESSAGE_BYTES,
    HostAddress,
    HostedCallRegistry,
    HostedStreamTokens,
    RegistryHost,
    hosted_registry,
    open_host,
)
from callbridge.engine.port import ResumeTicket
from tests.bridge.twilio_e2e import until


@pytest.fixture
def host() -> Iterator[RegistryHost]:
    started = RegistryHost()
    started.start()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
async def worker(host: RegistryHost) -> AsyncIterator[tuple[HostedCallRegistry, HostedStreamTokens]]:
    registry, tokens = hosted_registry(host.address)
    try:
        yield registry, tokens
    finally:
        await registry.aclose()


async def test_the_socket_is_this_users_alone(host: RegistryHost) -> None:
    directory = Path(host.address.path).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(host.address.path).st_mode) == 0o600


async def test_a_temporary_directory_too_deep_for_a_unix_socket_puts_the_socket_under_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    host = RegistryHost()
    host.start()
    try:
        assert host.address.path.startswith("/tmp/callbridge-registry-")
        registry, _ = hosted_registry(host.address)
        assert await registry.reachable()
        await registry.aclose()
    finally:
        host.close()
    assert not Path(host.address.path).parent.exists()  # removed with the host


async def test_a_gone_host_is_registry_unavailable_at_once_for_every_operation(host: RegistryHost) -> None:
    """The supervisor gone (its worker then drains: ``workers._watch_supervisor``): each call fails as
    unavailable without waiting out the timeout, as Redis refusing connections does."""
    registry, tokens = hosted_registry(host.address)
    assert await registry.reachable()
    host.close()
    try:
        operations = {
            "get": registry.get("CA1"),
            "mark_ended": registry.mark_ended("CA1", "x"),
            "admit": registry.admit("CA1", 10, 1000),
            "mint": tokens.mint("CA1"),
            "consume": tokens.consume("t", "CA1"),
        }
        loop = asyncio.get_running_loop()
        for operation, call in operations.items():
            began = loop.time()
            with pytest.raises(RegistryUnavailable) as caught:
                await call
            assert caught.value.operation == operation and loop.time() - began < 1.9  # not the 2 s timeout: refused
        assert not await registry.reachable()
    finally:
        await registry.aclose()


async def test_a_connection_without_the_key_is_closed_unanswered_and_the_host_serves_on(
    host: RegistryHost, worker: tuple[HostedCallRegistry, HostedStreamTokens]
) -> None:
    registry, _ = worker
    stranger = HostAddress(host.address.path, bytes(32))
    impostor, _ = hosted_registry(stranger)
    try:
        with pytest.raises(RegistryUnavailable):
            await impostor.mark_ended("CA-k", "forged")
    finally:
        await impostor.aclose()
    assert await registry.get("CA-k") is None  # nothing it sent was read
    await registry.mark_ended("CA-k", "caller_hung_up")
    assert await registry.ended_reason("CA-k") == "caller_hung_up"


async def test_a_message_too_large_ends_that_connection_only(host: RegistryHost, worker: tuple[HostedCallRegistry, HostedStreamTokens]) -> None:
    registry, _ = worker
    reader, writer = await open_host(host.address)
    writer.write(struct.pack("!I", MAX_MESSAGE_BYTES + 1))  # the length alone: the host reads no further
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
    writer.close()
    assert await registry.count("CA-l", "n", 60_000) == 1


async def test_a_worker_may_call_the_registrys_methods_and_nothing_else(worker: tuple[HostedCallRegistry, HostedStreamTokens]) -> None:
    registry, _ = worker
    for method in ("_prune", "__init__", "listen_later", "aclose"):
        with pytest.raises(RegistryUnavailable, match="no method"):
            await registry._call(method)
    assert await registry.admit("CA-m", 1, 60_000) and not await registry.admit("CA-n", 1, 60_000)


async def test_a_host_that_never_answers_is_unavailable_after_the_shipped_timeout() -> None:
    """A stuck supervisor (its loop held): a call waits at most 2 s, as a Redis registry's does, and then fails."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "stuck.sock")
        server = await asyncio.start_unix_server(silent, path=path)
        registry, tokens = hosted_registry(HostAddress(path, bytes(32)))
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(RegistryUnavailable, match="did not answer within 2 s"):
                await tokens.mint("CA-s")
            assert 1.9 <= loop.time() - began < 6.0  # the shipped 2 s (a loaded machine may wake it late)
        finally:
            await registry.aclose()
            for writer in accepted:
                writer.close()
            server.close()
            await server.wait_closed()


async def test_a_broken_link_is_opened_again_by_the_next_call(host: RegistryHost, worker: tuple[HostedCallRegistry, HostedStreamTokens]) -> None:
    registry, tokens = worker
    token = await tokens.mint("CA-b")
    writer = registry._link._writer
    assert writer is not None
    writer.transport.abort()  # the connection dies under the link
    await until(lambda: writer.is_closing())
    assert await tokens.consume(token, "CA-b")  # on a new connection
    assert registry._link._writer is not writer


async def test_signals_reach_the_other_workers_and_a_listener_that_lost_the_host_tries_again(host: RegistryHost) -> None:
    """Signals reach the other workers; a listener whose host went away keeps trying (it never raises: the
    call records hold what must not be missed)."""
    (a, _), (b, _) = hosted_registry(host.address), hosted_registry(host.address)
    heard: list[CallSignal] = []

    async def listen() -> None:
        async for signal in a.listen("a"):
            heard.append(signal)

    listening = asyncio.create_task(listen())
    signal = CallSignal("CA-h", SignalKind.CALL_ENDED, "caller_hung_up", origin="b")
    try:

        async def heard_it() -> bool:  # the subscription begins when the host has it: send until then
            await b.signal(signal)
            return bool(heard)

        await until(heard_it)
        host.close()
        await asyncio.sleep(0.3)
        assert not listening.done()  # it waits and tries again
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await a.aclose()
        await b.aclose()
    assert set(heard) == {signal}


async def test_a_worker_fetches_the_hosts_counts_for_its_level_gauges(
    host: RegistryHost, worker: tuple[HostedCallRegistry, HostedStreamTokens]
) -> None:
    """Every worker reports the group's entries and detached sessions: the host's own counts, as of the last
    fetch (``refresh_levels``), whichever worker wrote them; a host gone leaves the last counts."""
    registry, _ = worker
    other, _ = hosted_registry(host.address)
    ticket = ResumeTicket("sess-1", lease_generation=1, resume_token="tok", last_event_seq=0, endpoint="ws://engine")
    assert (registry.entry_count, registry.detached_count) == (0, 0)  # nothing fetched yet
    await other.detach("CA-detached", ticket, 0, 60_000)
    await other.mark_ended("CA-ended", "stop")
    assert (registry.entry_count, registry.detached_count) == (0, 0)  # as of the last fetch
    await registry.refresh_levels()
    assert (registry.entry_count, registry.detached_count) == (2, 1)
    assert (registry.entry_count, registry.detached_count) == (host.registry.entry_count, host.registry.detached_count)
    await other.aclose()
    host.close()
    with pytest.raises(RegistryUnavailable):
        await registry.refresh_levels()
    assert (registry.entry_count, registry.detached_count) == (2, 1)
