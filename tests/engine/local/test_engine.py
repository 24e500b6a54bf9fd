"""The embedded engine behind the port, on a real event loop: capacity, events, detach/resume, expiry."""

from __future__ import annotations

import asyncio

import pytest

from callbridge.engine.errors import EngineError
from callbridge.engine.events import (
    AudioDelta,
    EngineEvent,
    HeartbeatAck,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptDelta,
    is_chunk_verdict,
)
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalEngine, LocalSession
from callbridge.engine.port import ResumeTicket, SessionConfig
from tests.engine.audio import caller_speech_16k, chunks, silence

pytestmark = pytest.mark.core


async def collect_until(session: LocalSession, kind: type, timeout_s: float = 5.0) -> list[EngineEvent]:
    events: list[EngineEvent] = []

    async def run() -> None:
        async for event in session.events():
            events.append(event)
            if isinstance(event, kind):
                return

    await asyncio.wait_for(run(), timeout_s)
    return events


async def test_echo_conversation_with_silero_on_recorded_speech() -> None:
    engine = LocalEngine(LocalEngineOptions(agent="echo", chunk_ms=500, generation_speed=20.0))
    session = await engine.open(SessionConfig())
    consumer = asyncio.create_task(collect_until(session, ResponseDone))
    for chunk in chunks(silence(300) + caller_speech_16k() + silence(800)):
        await session.append_audio(chunk, 16000)
    events = [e for e in await consumer if not is_chunk_verdict(e)]
    kinds = [type(e) for e in events]
    assert kinds[:5] == [SessionCreated, SpeechStarted, SpeechStopped, type(events[3]), ResponseCreated]
    audio = [e for e in events if isinstance(e, AudioDelta)]
    echoed_ms = sum(len(d.pcm) for d in audio) // 48
    assert 3500 <= echoed_ms <= 4600  # the utterance, its prefix padding and trailing silence
    assert any(isinstance(e, TranscriptDelta) and e.delta.startswith("(echo") for e in events)
    assert events[-1] == ResponseDone(audio[0].response_id, "completed", None, 0)
    await engine.aclose()


async def test_capacity_is_enforced() -> None:
    engine = LocalEngine(LocalEngineOptions(max_sessions=2))
    first = await engine.open(SessionConfig(turn_detection=None))
    await engine.open(SessionConfig(turn_detection=None))
    with pytest.raises(EngineError) as exc:
        await engine.open(SessionConfig(turn_detection=None))
    assert exc.value.code == "resource_exhausted" and exc.value.retryable
    await first.close()
    assert engine.session_count == 1
    await engine.open(SessionConfig(turn_detection=None))


async def test_invalid_config_is_refused() -> None:
    engine = LocalEngine()
    with pytest.raises(EngineError) as exc:
        await engine.open(SessionConfig(input_rate_hz=4000))
    assert exc.value.code == "unsupported_audio_format"


async def test_one_consumer_at_a_time() -> None:
    session = await LocalEngine().open(SessionConfig(turn_detection=None))
    first = session.events()
    assert isinstance(await anext(first), SessionCreated)
    with pytest.raises(RuntimeError, match="already has an events"):
        await anext(session.events())
    await first.aclose()
    await session.heartbeat()
    assert isinstance(await anext(session.events()), HeartbeatAck)  # re-entrant once the first iterator ended


async def test_detach_ends_iteration_and_resume_delivers_what_came_meanwhile() -> None:
    engine = LocalEngine(LocalEngineOptions(agent="tone", chunk_ms=100, generation_speed=2.0))
    session = await engine.open(SessionConfig(turn_detection=None))
    iterator = session.events()
    assert isinstance(await anext(iterator), SessionCreated)
    assert isinstance(await anext(iterator), ResponseCreated)
    ticket = await session.detach()
    assert ticket == ResumeTicket(session.session_id, lease_generation=0)
    with pytest.raises(StopAsyncIteration):
        await anext(iterator)
    await asyncio.sleep(0.4)  # the greeting goes on being generated while detached
    resumed = await engine.resume(ResumeTicket.from_dict(ticket.to_dict()))
    assert resumed is session and session.lease_generation == 1
    events = await collect_until(session, ResponseDone)
    assert events[0] == SessionResumed(session.session_id, attachment_generation=1)
    assert isinstance(events[1], AudioDelta)  # held while detached, delivered in order
    assert sum(len(e.pcm) for e in events if isinstance(e, AudioDelta)) // 48 == 660


async def test_stale_generation_cannot_resume() -> None:
    engine = LocalEngine()
    session = await engine.open(SessionConfig(turn_detection=None))
    await session.detach()
    await engine.resume(ResumeTicket(session.session_id, 0))
    with pytest.raises(EngineError) as exc:
        await engine.resume(ResumeTicket(session.session_id, 0))
    assert exc.value.code == "session_resume_conflict"
    with pytest.raises(EngineError) as exc:
        await engine.detach_session(session.session_id, expected_generation=0)
    assert exc.value.code == "session_resume_conflict"


async def test_grace_expiry_ends_the_session() -> None:
    engine = LocalEngine(LocalEngineOptions(disconnect_grace_ms=50))
    session = await engine.open(SessionConfig(turn_detection=None))
    await session.detach()
    await asyncio.sleep(0.15)
    assert session.closed and engine.session_count == 0
    with pytest.raises(EngineError) as exc:
        await engine.resume(session.resume_ticket())
    assert exc.value.code == "session_resume_expired" and not exc.value.retryable
    events = [e async for e in session.events()]
    assert events[-1] == SessionExpired(session.session_id, "disconnect_grace_expired")


async def test_close_waits_for_the_session_to_end() -> None:
    engine = LocalEngine()
    session = await engine.open(SessionConfig(turn_detection=None))
    await session.close("call_ended")
    assert session.closed and engine.session_count == 0
    events = [e async for e in session.events()]
    assert events[-1] == SessionClosed(session.session_id, "call_ended")
    await session.close()  # idempotent
    with pytest.raises(EngineError) as exc:
        await session.heartbeat()
    assert exc.value.code == "session_closed"
