"""A call's webhooks and its media socket on different bridge processes: what the carriers' webhooks keep about a
call lives in the registry (counters), and what a webhook says about a socket on another process reaches it
(signals).

The registry's counters and signals run on both backends (two views of one store stand for two processes). The
carriers' cases run two bridges on uvicorn sharing a real ``redis-server`` (and one embedded engine, as two
processes share one engine server): Telnyx's ``call.initiated`` reaches A and its ``streaming.stopped`` reaches
B; Vonage's ``completed`` and ``disconnected`` reach B while the socket is on A.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
import orjson
import redis.asyncio as aioredis

from callbridge.bridge.app import create_app
from callbridge.bridge.registry import CallRegistry, CallSignal, SignalKind
from callbridge.bridge.registry_redis import RedisCallRegistry
from callbridge.carriers.telnyx.sim import SimulatedTelnyx
from callbridge.carriers.vonage.sim import SimulatedVonage, sign_webhook
from callbridge.engine.commands import CloseSession
from callbridge.engine.port import DuplexEngine
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallerScript, SimCall
from callbridge.sim.runner import RunningBridge, free_port, running_bridge, serving, with_overrides
from tests.bridge.test_registry import Backend, backend
from tests.bridge.twilio_e2e import (
    RawStream,
    RecordingEngine,
    bound,
    engine,
    post_answer,
    settings,
    short_speech,
    until,
)
from tests.redis_server import redis_url

__all__ = ["backend", "redis_url"]  # the fixtures, imported for pytest

KEEP_MS = 600


# ------------------------------------------------------------------ counters


async def test_counts_are_shared_and_each_count_is_atomic(backend: Backend) -> None:
    a, _ = await backend.view()
    b, _ = await backend.view()
    sums = await asyncio.gather(*(view.count("CA-c", "restarts", KEEP_MS) for view in [a, b] * 10))
    assert sorted(sums) == list(range(1, 21))  # of two processes counting at once, each sees its own sum
    assert await a.count("CA-c", "answered", KEEP_MS) == 1
    assert await b.count("CA-c", "answered", KEEP_MS, by=-1) == 0
    assert await b.counts("CA-c") == {"restarts": 20, "answered": 0}
    assert await a.counts("CA-unknown") == {}


async def test_counts_are_kept_from_their_last_change(backend: Backend) -> None:
    a, _ = await backend.view()
    b, _ = await backend.view()
    await a.count("CA-k", "n", KEEP_MS)
    await backend.advance(KEEP_MS // 2)
    await b.count("CA-k", "n", KEEP_MS)  # keeps them another KEEP_MS
    await backend.advance(KEEP_MS // 3)
    assert await a.counts("CA-k") == {"n": 2}
    await backend.advance(KEEP_MS + 100)
    assert await a.counts("CA-k") == {}
    assert await b.count("CA-k", "n", KEEP_MS) == 1  # counted afresh


async def test_counts_are_apart_from_the_call_record(backend: Backend) -> None:
    a, _ = await backend.view()
    await a.count("CA-r", "n", KEEP_MS)
    assert await a.get("CA-r") is None  # a count makes no record (no ticket, not ended, not bound)
    await a.mark_ended("CA-r", "caller_hung_up", keep_ms=KEEP_MS)
    assert await a.counts("CA-r") == {"n": 1}


# ------------------------------------------------------------------- signals


async def _listening(views: dict[str, CallRegistry]) -> tuple[dict[str, list[CallSignal]], list[asyncio.Task[None]]]:
    heard: dict[str, list[CallSignal]] = {name: [] for name in views}

    async def listen(name: str, view: CallRegistry) -> None:
        async for signal in view.listen(name):
            heard[name].append(signal)

    return heard, [asyncio.create_task(listen(name, view)) for name, view in views.items()]


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_signal_reaches_every_other_process_and_not_its_sender(backend: Backend) -> None:
    views = {name: (await backend.view())[0] for name in ("a", "b", "c")}
    heard, tasks = await _listening(views)
    signal = CallSignal("CA-s", SignalKind.STREAM_DROPPED, "token-1", origin="a")
    try:

        async def both_heard() -> bool:  # a subscription begins when its listener first waits: send until then
            await views["a"].signal(signal)
            return bool(heard["b"] and heard["c"])

        await until(both_heard)
        await views["c"].signal(ended := CallSignal("CA-s", SignalKind.CALL_ENDED, "caller_hung_up", origin="c"))
        await until(lambda: ended in heard["a"] and ended in heard["b"])
    finally:
        await _stop(tasks)
    assert set(heard["b"]) == {signal, ended} and set(heard["c"]) == {signal}
    assert heard["a"] == [ended]


async def test_a_process_is_listening_while_its_listener_runs_and_not_after(backend: Backend) -> None:
    """``listening``: how a new stream knows that the process holding its call is gone (killed: its connection to
    the registry closed with it), so that it takes the call over at once rather than wait for a detach."""
    a, _ = await backend.view()
    b, _ = await backend.view()
    assert not await a.listening("b")
    _, tasks = await _listening({"b": b})
    try:
        await until(lambda: a.listening("b"))  # a subscription begins when its listener first waits
        assert not await a.listening("c")
    finally:
        await _stop(tasks)
    await until(lambda: _not(a.listening("b")))


async def _not(answer: Awaitable[bool]) -> bool:
    return not await answer


async def test_a_stranger_on_the_channel_is_skipped(redis_url: str) -> None:
    admin = aioredis.Redis.from_url(redis_url)
    view = RedisCallRegistry(aioredis.Redis.from_url(redis_url, decode_responses=True))
    heard, tasks = await _listening({"a": view})
    signal = CallSignal("CA-x", SignalKind.CALL_ENDED, "caller_hung_up", origin="b")
    try:

        async def heard_after_garbage() -> bool:
            for garbage in (
                b"not json",
                b'{"call_id": "CA-x"}',
                b'{"call_id":"CA-x","kind":"nope","detail":"","origin":"b"}',
            ):
                await admin.publish("callbridge:signals", garbage)
            await view.signal(signal)
            return bool(heard["a"])

        await until(heard_after_garbage)
    finally:
        await _stop(tasks)
        await view.aclose()
        await admin.aclose()
    assert set(heard["a"]) == {signal}


# -------------------------------------------------------- two bridges, one Redis


@contextlib.asynccontextmanager
async def another_bridge(first: RunningBridge, shared_engine: DuplexEngine) -> AsyncIterator[RunningBridge]:
    """A second bridge process on its own port and public URL, with ``first``'s configuration (the same Redis,
    carrier secrets) and its engine."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = with_overrides(first.settings, {"server": {"port": port, "public_url": url}})
    app = create_app(config, shared_engine)
    async with serving(app, port):
        yield RunningBridge(config, app, url, first.carrier)


def _metric(bridge: RunningBridge, name: str, **labels: str) -> float:
    return bridge.app.state.bridge.registry.get_sample_value(name, labels) or 0.0


async def test_telnyx_streaming_stopped_on_another_process_restarts_the_stream_and_resumes(redis_url: str) -> None:
    """``call.initiated`` reaches A (which answers: the stream is on A), the stream drops, and ``streaming.stopped``
    reaches B: B knows the call is answered and not over (registry counters), restarts streaming to itself, and
    the new stream on B resumes the engine session A detached."""
    recorder = engine(agent="tone")
    config = settings(registry={"backend": "redis", "redis_url": redis_url})
    async with running_bridge(config, recorder, provider="telnyx") as a, another_bridge(a, recorder) as b:
        carrier = a.carrier
        assert isinstance(carrier, SimulatedTelnyx)
        post = carrier.post_webhook

        async def routed(event_type: str, call: SimCall, **payload: Any) -> int:
            carrier.bridge_url = a.base_url if event_type == "call.initiated" else b.base_url
            return await post(event_type, call, **payload)

        carrier.post_webhook = routed  # type: ignore[method-assign]
        script = CallerScript(utterances=((1500, short_speech(800)),), drop_stream_at_ms=(1000,), hangup_at_ms=3500)
        result = await carrier.place_call(script)
        commands = [action for call_id, action, _ in carrier.commands if call_id == result.call_sid]
        await until(lambda: recorder.session_count == 0)
        streams_a = _metric(a, "callbridge_calls_total", provider="telnyx", end="transport_lost")
        stopped_on_b = _metric(b, "callbridge_stream_status_total", provider="telnyx", event="streaming.stopped")
        stopped_on_a = _metric(a, "callbridge_stream_status_total", provider="telnyx", event="streaming.stopped")
    assert result.warnings == [] and len(set(result.streams)) == 2, result.render()
    assert commands == ["answer", "streaming_start"]
    assert streams_a == 1 and stopped_on_b >= 1 and stopped_on_a == 0
    assert len(recorder.opened) == 1 and recorder.resumed == recorder.opened * 2  # one session: parked at the answer, resumed on A, then on B
    assert result.agent_speech_ms > 0


async def test_a_twilio_reconnect_on_b_supersedes_the_half_open_stream_on_a(redis_url: str) -> None:
    """The drop never reached A (its socket looks open), and Twilio's reconnect reaches B: B finds the call bound
    and no ticket, and signals; A ends its stream as lost (closed 1001) and detaches; B resumes that session
    rather than wait out the detach and open a second one."""
    recorder = engine()
    config = settings(registry={"backend": "redis", "redis_url": redis_url})
    async with running_bridge(config, recorder) as a, another_bridge(a, recorder) as b:
        old = await RawStream.open(a)
        await old.start()
        await until(lambda: bound(a.app.state.bridge.services.registry, old.call_sid))
        new = await RawStream.open(b, call_sid=old.call_sid)
        await new.start()
        assert await old.closed() == 1001
        # resumed twice: by A's stream (parked at the answer, ``engine.open_at_answer`` auto with Redis), then by B
        await until(lambda: recorder.resumed == recorder.opened * 2)
        assert len(recorder.opened) == 1 and recorder.session_count == 1
        await until(lambda: _metric(a, "callbridge_calls_total", provider="twilio", end="transport_lost") == 1)
        await new.ws.close()


async def test_a_call_answered_on_a_and_bridged_on_b_is_counted_on_b_alone(redis_url: str) -> None:
    """The answer webhook reaches A, which admits the call and holds a slot for its stream; the media socket reaches
    B. Once B binds it, A lets the slot go at once (a ``stream_bound`` signal) — not at ``engine.open_at_answer_ttl_s``
    (15 s), counting the call against its ``server.max_calls`` and CPU budget all that while: ``serve --workers 2``
    refused calls at about half their capacity. With ``max_calls`` 1, A then answers the next call."""
    recorder = engine()
    # max_calls alone (no CPU budget: with max_calls 1 its guess of a call's cost is the whole budget)
    config = settings(registry={"backend": "redis", "redis_url": redis_url}, server={"max_calls": 1, "cpu_budget_percent": 0})
    async with running_bridge(config, recorder) as a, another_bridge(a, recorder) as b:
        book_a, book_b = (bridge.app.state.bridge.services.admission for bridge in (a, b))
        assert config.engine.open_at_answer_ttl_s == 15  # the shipped hold, not shortened here
        stream = await RawStream.open(a, streams_to=b)
        assert book_a.held(time.monotonic()) == 1 and "<Reject reason=\"busy\"/>" in (await post_answer(a, "CA" + secrets.token_hex(16))).text
        await stream.start()
        await until(lambda: book_b.bridged == {stream.call_sid})
        await until(lambda: book_a.held(time.monotonic()) == 0, timeout_s=2)
        assert "<Stream" in (await post_answer(a, "CA" + secrets.token_hex(16))).text
        await stream.ws.close()


class TwoVonageBridges:
    """Vonage's webhooks and websocket by hand: the answer and the socket on A, the events to whichever is named."""

    def __init__(self, a: RunningBridge, b: RunningBridge) -> None:
        assert isinstance(a.carrier, SimulatedVonage)
        self.a, self.b, self.carrier = a, b, a.carrier
        self.http = http_client(timeout=10.0)

    def _sign(self, body: bytes | None = None) -> str:
        return sign_webhook(self.carrier.secret, self.carrier.application_id, body)

    async def answer(self, call_id: str) -> list[dict[str, Any]]:
        params = {"uuid": call_id, "conversation_uuid": f"CON-{call_id}", "from": "447700900001", "to": "447700900000"}
        response = await self.http.get(
            self.a.base_url + "/vonage/answer", params=params, headers={"Authorization": self._sign()}
        )
        ncco: list[dict[str, Any]] = response.json()
        return ncco

    async def event(self, bridge: RunningBridge, event: dict[str, Any]) -> httpx.Response:
        body = orjson.dumps(event)
        return await self.http.post(
            bridge.base_url + "/vonage/events", content=body, headers={"Authorization": self._sign(body)}
        )

    async def connect(self, ncco: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
        from websockets.asyncio.client import connect

        endpoint = ncco[0]["endpoint"][0]
        ws = await connect(endpoint["uri"], compression=None)
        await ws.send(
            orjson.dumps(
                {"event": "websocket:connected", "content-type": endpoint["content-type"], **endpoint["headers"]}
            ).decode()
        )
        return ws, endpoint["headers"]


@contextlib.asynccontextmanager
async def two_vonage_bridges(redis_url: str, recorder: RecordingEngine) -> AsyncIterator[TwoVonageBridges]:
    config = settings(registry={"backend": "redis", "redis_url": redis_url})
    async with running_bridge(config, recorder, provider="vonage") as a, another_bridge(a, recorder) as b:
        both = TwoVonageBridges(a, b)
        try:
            yield both
        finally:
            await both.http.aclose()


async def _closed(ws: Any, timeout_s: float = 5.0) -> int | None:
    """Read until the bridge closes the socket; its close code."""
    from websockets.exceptions import ConnectionClosed

    async def read() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for _ in ws:
                pass

    await asyncio.wait_for(read(), timeout_s)
    code: int | None = ws.close_code
    return code


async def test_vonage_completed_on_another_process_ends_the_call_live_there(redis_url: str) -> None:
    recorder = engine()
    async with two_vonage_bridges(redis_url, recorder) as vonage:
        call_id = str(uuid.uuid4())
        ws, _ = await vonage.connect(await vonage.answer(call_id))
        await until(lambda: recorder.session_count == 1)
        await ws.send(bytes(640))
        response = await vonage.event(
            vonage.b, {"uuid": call_id, "conversation_uuid": f"CON-{call_id}", "status": "completed"}
        )
        assert response.status_code == 204
        assert await _closed(ws) == 1000  # A ended the stream as on a stop: the socket open there is closed
        await until(lambda: recorder.session_count == 0)
        (session_id,) = recorder.opened
        assert recorder.commands[session_id][-1] == CloseSession("call_ended")
        assert await vonage.a.app.state.bridge.services.registry.ended_reason(call_id) == "caller_hung_up"
        await until(lambda: _metric(vonage.a, "callbridge_calls_total", provider="vonage", end="caller_hung_up") == 1)


async def test_vonage_websocket_leg_completed_on_another_process_ends_only_the_socket_it_names(redis_url: str) -> None:
    recorder = engine()
    async with two_vonage_bridges(redis_url, recorder) as vonage:
        call_id = str(uuid.uuid4())
        ws, headers = await vonage.connect(await vonage.answer(call_id))
        await until(lambda: recorder.session_count == 1)
        older = {"call_uuid": call_id, "token": "some-older-socket"}
        assert (
            await vonage.event(vonage.b, {"uuid": "leg-old", "status": "completed", "headers": older})
        ).status_code == 204
        assert (
            await vonage.event(vonage.b, {"uuid": "leg-1", "status": "completed", "headers": headers})
        ).status_code == 204
        assert await _closed(ws) == 1000
        await until(lambda: recorder.session_count == 0)
        assert recorder.commands[recorder.opened[0]][-1] == CloseSession("call_ended")
        # the older socket's word reached A first, and ended nothing: the call ended by its own socket's
        await until(lambda: _metric(vonage.a, "callbridge_calls_total", provider="vonage", end="caller_hung_up") == 1)


async def test_vonage_disconnected_on_another_process_lets_the_socket_go_and_the_new_one_resumes(
    redis_url: str,
) -> None:
    """The socket on A looks open to A (the drop is Vonage's word only), ``disconnected`` reaches B: A detaches the
    engine session at once (without the signal it would hold it, and the new socket would open a second one)."""
    recorder = engine()
    async with two_vonage_bridges(redis_url, recorder) as vonage:
        call_id = str(uuid.uuid4())
        ws, headers = await vonage.connect(await vonage.answer(call_id))
        await until(lambda: recorder.session_count == 1)
        response = await vonage.event(vonage.b, {"uuid": "leg-1", "status": "disconnected", "headers": headers})
        ncco = response.json()
        assert ncco[0]["endpoint"][0]["uri"].startswith(
            vonage.b.base_url.replace("http", "ws", 1)
        )  # B's own socket URL
        ws2, _ = await vonage.connect(ncco)
        await until(lambda: recorder.resumed == recorder.opened)
        assert len(recorder.opened) == 1
        await until(lambda: _metric(vonage.a, "callbridge_calls_total", provider="vonage", end="transport_lost") == 1)
        await ws.close()
        await ws2.close()


async def test_a_listener_subscribes_again_after_redis_comes_back() -> None:
    import shutil

    from tests.redis_server import redis_server

    with redis_server() as (url, first):
        view = RedisCallRegistry(aioredis.Redis.from_url(url, decode_responses=True))
        heard, tasks = await _listening({"a": view})
        try:
            before = CallSignal("CA-r", SignalKind.CALL_ENDED, "before", origin="b")

            async def heard_it(signal: CallSignal) -> bool:
                with contextlib.suppress(Exception):  # Redis is on its way back
                    await view.signal(signal)
                return signal in heard["a"]

            await until(lambda: heard_it(before))
            first.kill()
            first.wait()
            port = url.rsplit(":", 1)[1].split("/")[0]
            binary = shutil.which("redis-server")
            assert binary is not None
            second = await asyncio.create_subprocess_exec(
                binary, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            try:
                after = CallSignal("CA-r", SignalKind.CALL_ENDED, "after", origin="b")
                await until(lambda: heard_it(after), timeout_s=10)
            finally:
                second.terminate()
                await asyncio.wait_for(second.wait(), 10)
        finally:
            await _stop(tasks)
            await view.aclose()
    assert {s.detail for s in heard["a"]} == {"before", "after"}
