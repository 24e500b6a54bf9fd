"""The in-process adapter against a faithful fake of ``DuplexOmni`` using vllm-omni's real commands and events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from callbridge.engine.errors import EngineError
from callbridge.engine.events import (
    AudioDelta,
    HeartbeatAck,
    PlaybackAcknowledged,
    ResponseCreated,
    ResponseDone,
    SessionClosed,
    SessionCreated,
    SessionExpired,
)
from callbridge.engine.inline import InlineEngine, InlineSession
from callbridge.engine.port import SessionConfig
from tests.engine.audio import tone


@pytest.fixture
def omni() -> Any:
    from tests.engine import fake_duplex_omni

    fake_duplex_omni.install()
    return fake_duplex_omni.DuplexOmni(max_sessions=2)


async def next_of(session: InlineSession, kind: type, timeout_s: float = 2.0) -> Any:
    async def find() -> Any:
        async for event in session.events():
            if isinstance(event, kind):
                return event
        raise AssertionError(f"stream ended before {kind.__name__}")

    return await asyncio.wait_for(find(), timeout_s)


async def test_opens_with_a_realtime_mapping_and_gets_pcm(omni: Any) -> None:
    session = await InlineEngine(omni).open(SessionConfig(input_rate_hz=8000, turn_detection=None))
    assert isinstance(omni.opened_with[0], dict)  # never a bare DuplexSessionConfig: that would be WAV chunks
    assert omni.get_session(session.session_id).public_session["response_format"] == "pcm"
    assert session.capabilities.supports_barge_in and session.capabilities.supports_session_resume
    assert isinstance(await next_of(session, SessionCreated), SessionCreated)


async def test_audio_is_converted_by_vllm_omnis_translator(omni: Any) -> None:
    session = await InlineEngine(omni).open(SessionConfig(input_rate_hz=8000, turn_detection=None))
    for _ in range(25):
        await session.append_audio(tone(20, rate_hz=8000), 8000)  # 500 ms of PCM16 at 8 kHz
    handle = omni.get_session(session.session_id)
    appended = [c for c in handle.commands if type(c).__name__ == "AppendAudio"]
    assert sum(len(c.audio) for c in appended) == 8000 * 4  # 500 ms of float32 at 16 kHz
    await session.commit(create_response=True)
    delta = await next_of(session, AudioDelta)
    assert delta.rate_hz == 24000 and abs(len(delta.pcm) // 48 - 500) <= 2


async def test_ack_heartbeat_close(omni: Any) -> None:
    session = await InlineEngine(omni).open(SessionConfig(turn_detection=None))
    await session.ack_playback("resp-x", 320)
    ack = await next_of(session, PlaybackAcknowledged)
    assert ack == PlaybackAcknowledged("resp-x", 320)
    await session.heartbeat()
    assert isinstance(await next_of(session, HeartbeatAck), HeartbeatAck)
    await session.close("call_ended")
    assert session.closed
    assert await next_of(session, SessionClosed) == SessionClosed(session.session_id, "call_ended")
    with pytest.raises(EngineError) as exc:
        await session.heartbeat()
    assert exc.value.code == "session_closed"


async def test_single_events_consumer(omni: Any) -> None:
    session = await InlineEngine(omni).open(SessionConfig(turn_detection=None))
    first = session.events()
    await anext(first)
    with pytest.raises(RuntimeError, match="already has an active events"):
        await anext(session.events())
    await first.aclose()


async def test_detach_and_resume_are_fenced_on_the_lease_generation(omni: Any) -> None:
    engine = InlineEngine(omni)
    session = await engine.open(SessionConfig(turn_detection=None))
    assert isinstance(await next_of(session, SessionCreated), SessionCreated)

    async def consume() -> list[Any]:
        return [event async for event in session.events()]

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    ticket = await session.detach()
    assert ticket.lease_generation == 0
    assert await asyncio.wait_for(consumer, 1) == []  # detach ended the iteration
    from vllm_omni.engine.duplex.commands import Heartbeat

    await omni.get_session(session.session_id).submit(Heartbeat())  # the engine goes on while detached
    with pytest.raises(EngineError) as exc:
        await engine.resume(type(ticket)(ticket.session_id, lease_generation=7))
    assert exc.value.code == "session_resume_conflict"
    resumed = await engine.resume(ticket)
    assert resumed is session and resumed.resume_ticket().lease_generation == 1
    assert isinstance(await next_of(resumed, HeartbeatAck), HeartbeatAck)  # produced while detached, kept
    with pytest.raises(EngineError) as exc:
        await engine.resume(ticket)  # generation 0 is stale now
    assert exc.value.code == "session_resume_conflict"


async def test_expiry_closes_the_handle(omni: Any) -> None:
    engine = InlineEngine(omni)
    session = await engine.open(SessionConfig(turn_detection=None))
    omni.expire(session.session_id)
    assert await next_of(session, SessionExpired) == SessionExpired(session.session_id, "disconnect_grace_expired")
    assert session.closed
    with pytest.raises(EngineError) as exc:
        await engine.resume(session.resume_ticket())
    assert exc.value.code == "session_resume_expired"


async def test_capacity(omni: Any) -> None:
    engine = InlineEngine(omni)
    await engine.open(SessionConfig(turn_detection=None))
    await engine.open(SessionConfig(turn_detection=None))
    with pytest.raises(EngineError) as exc:
        await engine.open(SessionConfig(turn_detection=None))
    assert exc.value.code == "resource_exhausted" and exc.value.retryable


async def test_late_audio_after_barge_in_is_dropped(omni: Any) -> None:
    session = await InlineEngine(omni).open(SessionConfig(turn_detection=None))
    await session.append_audio(tone(100), 16000)
    await session.commit(create_response=True)
    await session.barge_in()
    events = []
    async for event in session.events():
        events.append(event)
        if isinstance(event, ResponseDone):
            break
    await session.heartbeat()
    after = await next_of(session, HeartbeatAck)
    assert isinstance(after, HeartbeatAck)
    created = [e for e in events if isinstance(e, ResponseCreated)][0]
    assert [type(e) for e in events if isinstance(e, AudioDelta)] == [AudioDelta]  # the one before the cancel
    assert events[-1] == ResponseDone(created.response_id, "cancelled", "barge_in", None)


def test_package_import_does_not_import_vllm_omni() -> None:
    import subprocess
    import sys

    code = "import sys, callbridge, callbridge.engine.inline, callbridge.cli; assert 'vllm_omni' not in sys.modules and 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
