"""The vllm-omni wire, fuzzed: server frames (arbitrary JSON, and every server event the client reads with its
fields broken) through ``parse_server_event``, client frames through the engine server's parsers, and a
scripted server over a real loopback websocket sending fuzzed frames to ``RealtimeSession``. Only
``EngineError`` escapes a parser; the session skips what it cannot read, ends only on a terminal event, and
``close()`` returns."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from callbridge.codecs import AudioEncoding
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import (
    TERMINAL_EVENTS,
    AudioDelta,
    SessionClosed,
    TranscriptDelta,
)
from callbridge.engine.port import SessionConfig
from callbridge.engine.realtime import RealtimeEngine
from callbridge.engine.wire import (
    InputFormat,
    parse_client_command,
    parse_server_event,
    session_config_from_wire,
)
from tests.fuzz.strategies import budget, json_values, mutated

pytestmark = pytest.mark.hot_path
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

SESSION = {
    "id": "duplex-fuzz",
    "capabilities": {"supports_session_resume": True, "supports_barge_in": True, "chunk_period_ms": 1000},
}
PCM = base64.b64encode(b"\x01\x00" * 240).decode()
SERVER_EVENTS: list[dict[str, Any]] = [
    {"type": "session.created", "session": SESSION, "resume_token": "tok", "attachment_generation": 1},
    {
        "type": "session.resumed",
        "session_id": "duplex-fuzz",
        "resume_token": "tok2",
        "attachment_generation": 2,
        "session": SESSION,
    },
    {"type": "session.closed", "session_id": "duplex-fuzz", "reason": "agent_ended_the_call"},
    {"type": "session.expired", "session_id": "duplex-fuzz", "reason": "disconnect_grace_expired"},
    {"type": "session.replaced", "session_id": "duplex-fuzz"},
    {"type": "session.heartbeat_ack"},
    {"type": "input_audio_buffer.speech_started", "server_event_seq": 3, "audio_start_ms": 120, "item_id": "item_1"},
    {"type": "input_audio_buffer.speech_stopped", "server_event_seq": 4, "audio_end_ms": 900, "item_id": "item_1"},
    {"type": "input_audio_buffer.committed", "item_id": "item_1"},
    {
        "type": "response.created",
        "server_event_seq": 5,
        "response_id": "resp-1",
        "response": {"id": "resp-1", "metadata": {"epoch": 0}},
    },
    {
        "type": "response.output_audio.delta",
        "server_event_seq": 6,
        "response_id": "resp-1",
        "item_id": "item_resp-1",
        "delta": PCM,
        "format": "pcm16",
        "sample_rate_hz": 24000,
        "metadata": {"epoch": 0},
    },
    {"type": "response.output_audio_transcript.delta", "response_id": "resp-1", "delta": "Hello"},
    {
        "type": "response.done",
        "server_event_seq": 7,
        "response_id": "resp-1",
        "response": {
            "id": "resp-1",
            "status": "cancelled",
            "status_details": {"reason": "barge_in"},
            "metadata": {"epoch": 0},
        },
    },
    {"type": "output_audio_buffer.cleared", "response_id": "resp-1"},
    {"type": "overlap.decision", "action": "barge_in", "reason": "speech", "epoch": 1},
    {"type": "playback.acknowledged", "event": {"item_id": "item_resp-1", "played_ms": 400}},
    {"type": "conversation.item.truncated", "item_id": "item_resp-1", "audio_end_ms": 400},
    {
        "type": "response.output_item.done",
        "response_id": "resp-1",
        "item": {"type": "function_call", "name": "end_call", "call_id": "call-1", "arguments": '{"reason": "done"}'},
    },
    {
        "type": "error",
        "error": {"type": "rate_limit_error", "code": "input_backpressure", "message": "slow down", "event_id": "e1"},
    },
    {"type": "error", "error": "Duplex API is not available", "code": "unsupported"},
    {"type": "response.listen", "server_event_seq": 8},
]

_objects = st.dictionaries(
    st.sampled_from(["type", "server_event_seq", "session", "response", "event", "item"]) | st.text(max_size=8),
    json_values,
)
_server_frames = st.one_of(
    st.sampled_from(SERVER_EVENTS).flatmap(mutated).filter(lambda p: isinstance(p, dict)), _objects
)


@given(payload=_server_frames)
@example(payload={"type": "session.created", "session": []})  # .get on a list: AttributeError, not EngineError
@example(payload={"type": "playback.acknowledged", "event": "x"})
@example(payload={"type": "response.created", "response": "resp-1", "response_id": "resp-1"})
@example(payload={"type": "response.output_audio.delta", "response_id": "r", "delta": "////\u00ff"})
@example(
    payload={
        "type": "response.output_item.done",
        "item": {"type": "function_call", "name": "f", "call_id": "c", "arguments": "[" * 100_000},
    }
)
def test_server_frames_parse_or_raise_protocol_error(payload: dict[str, Any]) -> None:
    try:
        parsed = parse_server_event(payload)
    except EngineError as exc:
        assert exc.code == ErrorCode.PROTOCOL_ERROR
        return
    assert parsed.server_event_seq is None or parsed.server_event_seq >= 0
    if isinstance(parsed.event, AudioDelta):
        assert len(parsed.event.pcm) % 2 == 0 and 1 <= parsed.event.rate_hz <= 384_000, parsed.event


CLIENT_EVENTS: list[dict[str, Any]] = [
    {"type": "input_audio_buffer.append", "audio": PCM},
    {"type": "input_audio_buffer.append", "audio": PCM, "format": "g711_ulaw", "sample_rate_hz": 8000},
    {"type": "input_audio_buffer.commit", "response_create": True},
    {"type": "input.commit"},
    {"type": "response.create"},
    {"type": "response.cancel", "response_id": "resp-1"},
    {"type": "barge_in"},
    {"type": "output_audio_buffer.clear", "response_id": "resp-1"},
    {"type": "playback.ack", "response_id": "resp-1", "item_id": "item_resp-1", "played_ms": 400},
    {"type": "conversation.item.truncate", "item_id": "item_resp-1", "audio_end_ms": 400},
    {
        "type": "conversation.item.create",
        "item": {"type": "message", "content": [{"type": "input_text", "text": "DTMF 5"}]},
    },
    {"type": "session.heartbeat"},
    {"type": "session.close", "reason": "call_ended"},
]
SESSION_UPDATE: dict[str, Any] = {
    "model": "m",
    "modalities": ["text", "audio"],
    "input_audio_format": "pcm16",
    "sample_rate_hz": 16000,
    "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500},
    "extra_body": {"a": 1},
}


@given(
    payload=st.one_of(st.sampled_from(CLIENT_EVENTS).flatmap(mutated).filter(lambda p: isinstance(p, dict)), _objects)
)
@example(payload={"type": "input_audio_buffer.append", "audio": "////\u00ff"})  # non-ASCII base64: ValueError
@example(payload={"type": "conversation.item.create", "item": {"content": "text"}})
def test_client_frames_parse_or_raise_engine_error(payload: dict[str, Any]) -> None:
    with contextlib.suppress(EngineError):
        parse_client_command(payload, InputFormat(AudioEncoding.L16, 16000))


@given(
    session=st.one_of(
        mutated(SESSION_UPDATE).filter(lambda s: isinstance(s, dict)),
        st.dictionaries(st.text(max_size=12), json_values),
    )
)
def test_session_update_parses_or_raises_engine_error(session: dict[str, Any]) -> None:
    with contextlib.suppress(EngineError):
        session_config_from_wire(session)


# --------------------------------------------------------------------- the client over a real websocket

_SENTINEL = {"type": "response.output_audio_transcript.delta", "response_id": "fuzz-end", "delta": "end"}
_frame_text = st.one_of(
    _server_frames.map(lambda p: orjson.dumps(p).decode() if _dumpable(p) else "{}"),
    st.text(max_size=40),
    st.binary(max_size=40),
)


def _dumpable(payload: Any) -> bool:
    try:
        orjson.dumps(payload)
    except TypeError:  # integers past 64 bits: send them another way (the text strategy)
        return False
    return True


@contextlib.asynccontextmanager
async def _scripted(before: list[str | bytes], after: list[str | bytes]) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A server that sends ``before`` ahead of ``session.created`` and ``after`` it, then a sentinel the client
    will see unless a terminal event ended the session, and answers ``session.close``; a resume gets the answer
    of a server that lost the session."""
    closed = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        try:
            first = orjson.loads(await ws.recv())
            if first.get("type") == "session.resume":
                await ws.send(
                    orjson.dumps(
                        {"type": "error", "error": {"code": "session_resume_expired", "message": "gone"}}
                    ).decode()
                )
                return
            for frame in before:
                await ws.send(frame)
            await ws.send(orjson.dumps({"type": "session.created", "session": SESSION, "resume_token": "tok"}).decode())
            for frame in after:
                await ws.send(frame)
            await ws.send(orjson.dumps(_SENTINEL).decode())
            async for message in ws:  # answer the client's close as a server does
                if orjson.loads(message).get("type") == "session.close":
                    await ws.send(
                        orjson.dumps(
                            {"type": "session.closed", "session_id": "duplex-fuzz", "reason": "client_close"}
                        ).decode()
                    )
        except ConnectionClosed:
            pass
        finally:
            closed.set()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}", closed


@budget(0.1)
@given(before=st.lists(_frame_text, max_size=3), after=st.lists(_frame_text, max_size=8))
@example(
    before=[], after=[orjson.dumps({"type": "playback.acknowledged", "event": "x"}).decode()]
)  # used to end the session
async def test_realtime_session_skips_what_it_cannot_read_and_closes(
    before: list[str | bytes], after: list[str | bytes]
) -> None:
    async with _scripted(before, after) as (url, server_saw_close):
        engine = RealtimeEngine(url, handshake_timeout_s=2.0, reconnect_budget_s=0.5, reconnect_backoff_s=(0.01, 0.05))
        try:
            session = await asyncio.wait_for(engine.open(SessionConfig()), 5)
        except EngineError:
            return  # the handshake refused, typed (an error frame, or a frame that is not session.created)
        seen: list[object] = []

        async def read() -> None:
            async for event in session.events():
                seen.append(event)
                if event == TranscriptDelta("fuzz-end", "end"):
                    return

        await asyncio.wait_for(read(), 5)  # the sentinel, or the end of the stream after a terminal event
        assert not any(isinstance(e, SessionClosed) and e.reason == "client_error" for e in seen), (
            seen
        )  # the reader crashed
        if seen and isinstance(seen[-1], TERMINAL_EVENTS):
            assert session.closed
        await asyncio.wait_for(session.close(), 5)
        await asyncio.wait_for(server_saw_close.wait(), 5)  # the socket is closed, not left to the garbage collector
