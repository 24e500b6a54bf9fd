"""The vllm-omni wire client against ``engine-server`` over real websockets, and against a scripted server
for frames a healthy server never sends."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve

from callbridge.engine.commands import AckPlayback, CloseSession, CreateTextItem
from callbridge.engine.errors import EngineError
from callbridge.engine.events import (
    AudioDelta,
    EngineErrorEvent,
    EngineEvent,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionExpired,
    SessionReplaced,
    SpeechStarted,
    is_chunk_verdict,
)
from callbridge.engine.local.agents import two_note_chime
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.port import ResumeTicket, SessionConfig
from callbridge.engine.realtime import RealtimeEngine, RealtimeSession, duplex_url
from tests.engine.audio import caller_speech_16k, chunks, silence, tone
from tests.engine.serving import engine_server

NO_VAD = SessionConfig(turn_detection=None)


async def until(session: RealtimeSession, predicate: Callable[[EngineEvent], bool], timeout_s: float = 5.0) -> list[EngineEvent]:
    events: list[EngineEvent] = []

    async def run() -> None:
        async for event in session.events():
            events.append(event)
            if predicate(event):
                return

    await asyncio.wait_for(run(), timeout_s)
    return events


def test_url_forces_duplex_without_autostart() -> None:
    assert duplex_url("ws://gpu-1:8091") == "ws://gpu-1:8091/v1/realtime?duplex=1&autostart=0"
    assert duplex_url("wss://h/v1/duplex?model=m&autostart=1") == "wss://h/v1/duplex?model=m&autostart=0&duplex=1"


async def test_spoken_exchange_ack_and_barge_in() -> None:
    async with engine_server(LocalEngineOptions(chunk_ms=500, generation_speed=float("inf"))) as running:
        engine = RealtimeEngine(running.url)
        session = await engine.open(SessionConfig())
        assert session.session_id.startswith("duplex-") and session.capabilities.supports_session_resume
        for chunk in chunks(silence(200) + caller_speech_16k() + silence(700)):
            await session.append_audio(chunk, 16000)
        events = await until(session, lambda e: isinstance(e, ResponseDone))
        audio = [e for e in events if isinstance(e, AudioDelta)]
        assert 3500 <= sum(len(d.pcm) for d in audio) // 48 <= 4600
        response_id = audio[0].response_id
        await session.ack_playback(response_id, 1000)
        ack = (await until(session, lambda e: isinstance(e, PlaybackAcknowledged)))[-1]
        assert ack == PlaybackAcknowledged(response_id, 1000)
        for chunk in chunks(caller_speech_16k()[:16000]):  # the caller talks over the unheard rest
            await session.append_audio(chunk, 16000)
        events = [e for e in await until(session, lambda e: isinstance(e, OverlapDecision) and e.action == "barge_in") if not is_chunk_verdict(e)]
        assert isinstance(events[0], SpeechStarted) and isinstance(events[-1], OverlapDecision)
        await session.close()
        assert session.closed and running.engine.session_count == 0


async def test_socket_drop_resumes_transparently_exactly_once() -> None:
    async with engine_server(LocalEngineOptions(agent="tone", chunk_ms=50, generation_speed=1.0)) as running:
        engine = RealtimeEngine(running.url, ack_every_events=4)
        session = await engine.open(NO_VAD)
        token = session.resume_ticket().resume_token
        seen: list[EngineEvent] = []
        consumer = asyncio.create_task(until(session, lambda e: isinstance(e, ResponseDone)))
        await asyncio.sleep(0.2)
        session._ws.transport.abort()  # the network drops mid-response
        seen = await consumer
        audio = [e for e in seen if isinstance(e, AudioDelta)]
        assert sum(len(d.pcm) for d in audio) // 48 == 660  # the whole greeting, once
        assert b"".join(d.pcm for d in audio) == two_note_chime()  # nothing lost, doubled or reordered
        assert [type(e) for e in seen].count(ResponseCreated) == 1
        assert session.resumes == 1 and session.resume_ticket().resume_token != token
        await session.heartbeat()  # still usable on the new socket
        await session.close()


async def test_detach_and_resume_from_another_process() -> None:
    async with engine_server(LocalEngineOptions(agent="tone", chunk_ms=100, generation_speed=1.0)) as running:
        session = await RealtimeEngine(running.url).open(NO_VAD)
        first = await until(session, lambda e: isinstance(e, AudioDelta))
        await asyncio.sleep(0.25)  # more audio arrives and waits, untaken, when the session is detached
        exported = (await session.detach()).to_dict()
        assert exported["resume_token"] and exported["last_event_seq"] >= 2 and exported["endpoint"]
        await asyncio.sleep(0.3)
        other_process = RealtimeEngine("ws://unused.invalid:1")  # the ticket names the endpoint
        resumed = await other_process.resume(ResumeTicket.from_dict(exported))
        assert resumed.capabilities == session.capabilities  # session.resumed says what the session can do
        rest = await until(resumed, lambda e: isinstance(e, ResponseDone))
        audio = [e for e in first + rest if isinstance(e, AudioDelta)]
        assert sum(len(d.pcm) for d in audio) // 48 == 660  # what was received but not taken came again
        assert b"".join(d.pcm for d in audio) == two_note_chime()  # once each, in order
        await resumed.close()


@pytest.mark.parametrize("limited", [True, False])
async def test_a_ticket_taken_early_resumes_whole_while_acks_are_limited_to_it(limited: bool) -> None:
    """The registry's live ticket of a call is written now and then; should the bridge die, another process resumes
    from it. ``limit_acks`` keeps the server's replay from there (acks are what the server drops it by): that
    process gets every event since, once each. Without the limit the server has dropped them (``journal_gap``)."""
    async with engine_server(LocalEngineOptions(agent="tone", chunk_ms=50, generation_speed=float("inf"))) as running:
        session = await RealtimeEngine(running.url, ack_every_events=2).open(NO_VAD)
        early = session.resume_ticket()
        if limited:
            session.limit_acks(early.last_event_seq)
        first = await until(session, lambda e: isinstance(e, ResponseDone))  # the whole chime taken, acks sent
        await session.heartbeat()
        await asyncio.sleep(0.1)
        other_process = RealtimeEngine("ws://unused.invalid:1")
        if not limited:
            with pytest.raises(EngineError) as refused:
                await other_process.resume(early)
            assert refused.value.code == "session_resync_required"
            await session.close()
            return
        resumed = await other_process.resume(early)  # a takeover: the first client is told session.replaced
        again = await until(resumed, lambda e: isinstance(e, ResponseDone))
        chime = [e.pcm for e in first if isinstance(e, AudioDelta)]
        assert chime and [e.pcm for e in again if isinstance(e, AudioDelta)] == chime
        assert (await until(session, lambda e: isinstance(e, SessionReplaced)))[-1] == SessionReplaced(session.session_id)
        await resumed.close()


async def test_resume_after_the_grace_is_expired() -> None:
    async with engine_server(LocalEngineOptions(disconnect_grace_ms=100)) as running:
        engine = RealtimeEngine(running.url)
        ticket = await (await engine.open(NO_VAD)).detach()
        await asyncio.sleep(0.3)
        with pytest.raises(EngineError) as exc:
            await engine.resume(ticket)
        assert exc.value.code == "session_resume_expired" and not exc.value.retryable


async def test_network_back_after_the_grace_ends_the_session_as_expired() -> None:
    async with engine_server(LocalEngineOptions(disconnect_grace_ms=50)) as running:
        engine = RealtimeEngine(running.url, reconnect_backoff_s=(0.05, 0.05))
        session = await engine.open(NO_VAD)
        endpoint, session._endpoint = session._endpoint, "ws://127.0.0.1:9/v1/realtime"  # the network is down
        session._ws.transport.abort()
        await asyncio.sleep(0.3)
        session._endpoint = endpoint  # ... and back, after the engine's grace
        events = await until(session, lambda e: isinstance(e, SessionExpired | SessionClosed))
        assert events[-1] == SessionExpired(session.session_id, "session_resume_expired")
        assert session.closed
        with pytest.raises(EngineError) as exc:
            await session.heartbeat()
        assert exc.value.code == "session_closed"


async def test_network_down_past_the_resume_window_ends_the_session() -> None:
    async with engine_server() as running:
        engine = RealtimeEngine(running.url, reconnect_budget_s=0.3, reconnect_backoff_s=(0.05, 0.05))
        session = await engine.open(NO_VAD)
        session._endpoint = "ws://127.0.0.1:9/v1/realtime"
        session._ws.transport.abort()
        await asyncio.sleep(0.02)  # the loss is noticed
        await session.append_audio(tone(20), 16000)  # dropped, not queued: it would be stale
        events = await until(session, lambda e: isinstance(e, SessionClosed))
        assert events[-1] == SessionClosed(session.session_id, "connection_failed")
        assert session.dropped_audio_bytes == 640


async def test_resume_conflict_and_stale_token() -> None:
    async with engine_server() as running:
        engine = RealtimeEngine(running.url)
        session = await engine.open(NO_VAD)
        ticket = session.resume_ticket()
        with pytest.raises(EngineError) as exc:
            await engine.resume(ResumeTicket(ticket.session_id, 0, ticket.resume_token, 999, ticket.endpoint))
        assert exc.value.code == "session_resume_conflict"
        with pytest.raises(EngineError) as exc:
            await engine.resume(ResumeTicket(ticket.session_id, 0, "forged", 0, ticket.endpoint))
        assert exc.value.code == "invalid_resume_token"


async def test_takeover_ends_the_replaced_session() -> None:
    async with engine_server() as running:
        engine = RealtimeEngine(running.url)
        old = await engine.open(NO_VAD)
        new = await engine.resume(old.resume_ticket())
        events = await until(old, lambda e: isinstance(e, SessionReplaced))
        assert events[-1] == SessionReplaced(old.session_id) and old.closed
        await new.heartbeat()
        await new.close()


async def test_capacity_exhausted_is_retryable() -> None:
    async with engine_server(LocalEngineOptions(max_sessions=1)) as running:
        engine = RealtimeEngine(running.url)
        await engine.open(NO_VAD)
        with pytest.raises(EngineError) as exc:
            await engine.open(NO_VAD)
        assert exc.value.code == "resource_exhausted" and exc.value.retryable


async def test_unreachable_server() -> None:
    with pytest.raises(EngineError) as exc:
        await RealtimeEngine("ws://127.0.0.1:9", handshake_timeout_s=2).open(NO_VAD)
    assert exc.value.code == "connection_failed" and exc.value.retryable


# ----------------------------------------------------------------------------- a scripted server

CREATED = {
    "type": "session.created",
    "event_id": "event_1",
    "session": {"id": "duplex-scripted", "capabilities": {"supports_session_resume": True, "supports_barge_in": True}},
    "attachment_generation": 1,
    "resume_token": "tok",
}


def delta(seq: int, response_id: str, epoch: int, pcm: bytes = b"\x01\x00" * 240) -> dict[str, Any]:
    return {
        "type": "response.output_audio.delta",
        "server_event_seq": seq,
        "response_id": response_id,
        "item_id": f"item_{response_id}",
        "delta": base64.b64encode(pcm).decode(),
        "format": "pcm16",
        "sample_rate_hz": 24000,
        "metadata": {"epoch": epoch},
    }


@asynccontextmanager
async def scripted_server(frames: list[str | bytes]) -> AsyncIterator[str]:
    """Answers ``session.update`` with ``session.created``, then sends ``frames`` as they are."""

    async def handler(ws: ServerConnection) -> None:
        first = orjson.loads(await ws.recv())
        assert first["type"] == "session.update" and first["session"]["sample_rate_hz"] == 16000
        await ws.send(orjson.dumps(CREATED).decode())
        for frame in frames:
            await ws.send(frame)
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


def j(payload: dict[str, Any]) -> str:
    return orjson.dumps(payload).decode()


async def test_malformed_and_unknown_frames_are_skipped() -> None:
    frames: list[str | bytes] = [
        "not json at all",
        "[1, 2, 3]",
        j({"no": "type"}),
        j({"type": "response.listen", "server_event_seq": 1, "response": {"status": "listening"}}),
        j({"type": "response.output_audio.delta", "server_event_seq": 2, "response_id": "r", "delta": "@@@"}),
        j({"type": "response.created", "server_event_seq": "three"}),
        j({"type": "error", "error": "Duplex API is not available", "code": "unsupported"}),
        j({"type": "error", "server_event_seq": 3, "error": {"type": "rate_limit_error", "code": "input_backpressure", "message": "slow down"}}),
        j({"type": "response.created", "server_event_seq": 4, "response_id": "resp-1", "response": {"id": "resp-1", "metadata": {"epoch": 0}}}),
        j({"type": "response.done", "server_event_seq": 5, "response_id": "resp-1", "response": {"status": "completed"}}),
    ]
    async with scripted_server(frames) as url:
        session = await RealtimeEngine(url).open(SessionConfig())
        events = await until(session, lambda e: isinstance(e, ResponseDone))
        assert events == [
            EngineErrorEvent("unsupported", "Duplex API is not available", False, None),
            EngineErrorEvent("input_backpressure", "slow down", True, None),
            ResponseCreated("resp-1", 0),
            ResponseDone("resp-1", "completed", None, None),
        ]
        assert not session.closed


async def test_late_audio_of_a_cancelled_response_or_older_epoch_is_dropped() -> None:
    frames: list[str | bytes] = [
        j({"type": "response.created", "server_event_seq": 1, "response_id": "resp-a", "response": {"id": "resp-a", "metadata": {"epoch": 0}}}),
        j(delta(2, "resp-a", 0)),
        j({"type": "response.done", "server_event_seq": 3, "response_id": "resp-a", "response": {"status": "cancelled", "status_details": {"reason": "barge_in"}}}),
        j(delta(4, "resp-a", 0)),  # late audio of the cancelled response
        j({"type": "response.created", "server_event_seq": 5, "response_id": "resp-b", "response": {"id": "resp-b", "metadata": {"epoch": 1}}}),
        j(delta(6, "resp-old", 0)),  # an older epoch
        j(delta(6, "resp-b", 1)),  # a replayed duplicate sequence
        j(delta(7, "resp-b", 1)),
        j({"type": "response.done", "server_event_seq": 8, "response_id": "resp-b", "response": {"status": "completed"}}),
    ]
    async with scripted_server(frames) as url:
        session = await RealtimeEngine(url).open(SessionConfig())
        events = await until(session, lambda e: isinstance(e, ResponseDone) and e.response_id == "resp-b")
        audio = [(e.response_id, e.epoch) for e in events if isinstance(e, AudioDelta)]
        assert audio == [("resp-a", 0), ("resp-b", 1)]
        done = [e for e in events if isinstance(e, ResponseDone)]
        assert done[0] == ResponseDone("resp-a", "cancelled", "barge_in", None)


async def test_handshake_error_is_raised_with_its_code() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(j({"type": "error", "error": {"type": "invalid_request_error", "code": "ref_audio_required", "message": "needs a voice"}}))

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        with pytest.raises(EngineError) as exc:
            await RealtimeEngine(f"ws://127.0.0.1:{port}").open(SessionConfig())
    assert exc.value.code == "ref_audio_required" and exc.value.message == "needs a voice"



async def test_one_session_close_per_session_whoever_asks() -> None:
    """The bridge's core asks for the close (a ``CloseSession`` command at the caller's ``stop``) and the stream's
    end closes the session too: one ``session.close`` reaches the server, so it never answers ``session_closed``."""
    async with engine_server() as running:
        session = await RealtimeEngine(running.url).open(NO_VAD)
        sent: list[str] = []
        original = session._ws.send

        async def recording(message: str) -> None:  # type: ignore[override]
            sent.append(message)
            await original(message)

        session._ws.send = recording  # type: ignore[method-assign,assignment]
        await session.submit(CloseSession("call_ended"))
        await session.close("call_ended")
        assert sum('"session.close"' in m for m in sent) == 1
        assert session.closed and running.engine.session_count == 0


async def test_commands_while_the_socket_is_replaced_are_kept_and_sent_first_on_the_new_one() -> None:
    """``submit`` never waits for a reconnect: an ack and a text item submitted while the socket is down are kept
    in order (a newer ack of the response replacing the older), audio is dropped, and what was kept reaches the
    server once the session has resumed."""
    async with engine_server() as running:
        engine = RealtimeEngine(running.url, reconnect_backoff_s=(0.2, 0.2))
        session = await engine.open(NO_VAD)
        endpoint, session._endpoint = session._endpoint, "ws://127.0.0.1:9/v1/realtime"  # the network is down
        session._ws.transport.abort()
        await asyncio.sleep(0.05)  # the loss is noticed; the first reconnect is refused, the next in 0.2 s
        await asyncio.wait_for(session.submit(AckPlayback("resp-x", 100, "item_resp-x")), 0.01)  # never waits
        await session.submit(AckPlayback("resp-x", 300, "item_resp-x"))
        await session.submit(CreateTextItem("DTMF 5"))
        await session.append_audio(tone(20), 16000)
        assert list(session._backlog) == [AckPlayback("resp-x", 300, "item_resp-x"), CreateTextItem("DTMF 5")]
        session._endpoint = endpoint  # ... and back
        # the server got the ack: it answers it (here an error: it names no response of this session)
        await until(session, lambda e: isinstance(e, EngineErrorEvent | PlaybackAcknowledged))
        assert session.resumes == 1 and not session._backlog and session.dropped_audio_bytes == 640
        await session.close()


def test_a_stall_of_this_process_during_a_ping_does_not_drop_the_engine_socket() -> None:
    """This process stops (1.6 s) while its liveness ping is out, on uvloop as ``callbridge serve`` runs. After the
    stall the loop runs its timers before it reads the sockets (what made the call core take a stalled bridge's
    unread media for the carrier's silence): the pong wait's timeout fires first, but ``asyncio.wait_for`` looks at
    the pong again when it resumes, after the sockets are read, and finds it answered. The socket is kept (no
    resume) and later pings are answered on it. A guard for whoever changes that wait (``asyncio.timeout`` around
    the pong instead fails it)."""
    import uvloop

    async def scenario() -> tuple[int, float]:
        async with engine_server() as running:
            engine = RealtimeEngine(running.url)  # shipped liveness: a ping every 1 s, its pong within 1 s
            session = await engine.open(NO_VAD)
            ws = session._ws
            real_ping = ws.ping

            async def ping_then_stall(*args: Any) -> Any:
                ws.ping = real_ping  # type: ignore[method-assign]  # once
                waiter = await real_ping(*args)
                asyncio.get_running_loop().call_soon(time.sleep, 1.6)
                return waiter

            ws.ping = ping_then_stall  # type: ignore[method-assign]
            await asyncio.sleep(4.0)  # the stalled ping, then two more
            heard = session._heard_from_at
            resumes = session.resumes
            await session.close()
            return resumes, time.monotonic() - heard

    resumes, since_heard_s = uvloop.run(scenario())
    assert resumes == 0  # the socket was not dropped
    assert since_heard_s < 2.0  # and a later ping was answered on it


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_socket_lost_while_this_process_stalled_past_the_reconnect_budget_is_resumed(loop: str) -> None:
    """The socket drops and this process stops (3 s, past the shipped 2 s reconnect budget) before it notices. The
    budget counts from when the server was last heard from, and this process could not hear it while it did not
    run: the session gave up at once (``connection_failed``: the caller's failure tone and hang-up) with the server
    holding it for its grace. Now the budget counts from the stall's end: the session resumes and goes on. Both
    orders of a stalled loop's work: uvloop runs the liveness loop's late timer before the reader's socket news,
    asyncio's own loop the other way round."""
    import uvloop

    async def scenario() -> tuple[int, bool, list[EngineEvent]]:
        async with engine_server() as running:
            engine = RealtimeEngine(running.url)  # shipped: a ping every 1 s, a 2 s reconnect budget
            session = await engine.open(NO_VAD)
            await asyncio.sleep(1.2)  # a ping answered

            def drop_then_stall() -> None:
                session._ws.transport.abort()
                time.sleep(3.0)

            asyncio.get_running_loop().call_soon(drop_then_stall)
            await asyncio.sleep(0.01)  # over once the stall is
            await asyncio.sleep(1.5)
            closed = [event for event in session.take_ready_events() if isinstance(event, SessionClosed)]
            resumes, ended = session.resumes, session.closed
            if not ended:
                await session.heartbeat()  # usable on the new socket
                await session.close()
            return resumes, ended, closed

    runner = uvloop.run if loop == "uvloop" else asyncio.run
    resumes, ended, closed = runner(scenario())
    assert closed == [] and not ended
    assert resumes == 1
