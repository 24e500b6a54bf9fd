"""``engine-server`` on the wire, frame by frame: handshake, journal, acks, resume, takeover, bad input."""

from __future__ import annotations

import asyncio
import base64
import contextlib

import pytest

from callbridge.engine.local.core import LocalEngineOptions
from tests.engine.audio import caller_speech_16k, chunks, silence, tone
from tests.engine.serving import RawClient, engine_server

NO_VAD = {"input_audio_format": "pcm16", "sample_rate_hz": 16000, "turn_detection": None}


async def test_handshake_announces_session_token_and_capabilities() -> None:
    async with engine_server() as running:
        client = await RawClient.connect(running.url)
        created = await client.open()
        assert created["type"] == "session.created"
        assert created["session"]["id"].startswith("duplex-")
        assert created["attachment_generation"] == 1 and len(created["resume_token"]) >= 32
        caps = created["session"]["capabilities"]
        assert caps["supports_session_resume"] and caps["supports_barge_in"] and caps["chunk_period_ms"] == 500
        assert "server_event_seq" not in created


async def test_echo_turn_is_journaled_in_sequence() -> None:
    async with engine_server() as running:
        client = await RawClient.connect(running.url)
        await client.open({"input_audio_format": "pcm16", "sample_rate_hz": 16000, "turn_detection": {"type": "server_vad"}})
        for chunk in chunks(silence(200) + caller_speech_16k() + silence(700)):
            await client.append(chunk)
        events = await client.recv_until("rate_limits.updated")
        assert client.updated is not None and client.updated["server_event_seq"] == 1
        assert [e["server_event_seq"] for e in events] == list(range(2, len(events) + 2))
        kinds = [e["type"] for e in events if e["type"] != "response.listen" and e.get("action") != "drop"]  # not the verdicts on quiet chunks
        assert kinds[:7] == [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "conversation.item.added",
            "conversation.item.created",
            "input_audio_buffer.committed",
            "conversation.item.done",
            "response.created",
        ]
        assert kinds[-2:] == ["response.done", "rate_limits.updated"]
        delta = next(e for e in events if e["type"] == "response.output_audio.delta")
        assert delta["format"] == "pcm16" and delta["sample_rate_hz"] == 24000
        assert delta["item_id"] == f"item_{delta['response_id']}" and delta["metadata"]["epoch"] == 0
        assert events[-2]["response"]["status"] == "completed"


@pytest.mark.parametrize(("declared", "expected_ms"), [({"sample_rate_hz": 8000}, (850, 1000)), ({}, (400, 500))])
async def test_8khz_mulaw_must_be_declared(declared: dict[str, int], expected_ms: tuple[int, int]) -> None:
    """vllm-omni decodes g711 at the session's 16 kHz default unless 8 kHz is declared (reference §2.1)."""
    async with engine_server(LocalEngineOptions(agent="loopback")) as running:
        client = await RawClient.connect(running.url)
        await client.open({"input_audio_format": "g711_ulaw", "turn_detection": None, **declared})
        for _ in range(50):
            await client.append(b"\x7e\x7f\xfe\xff" * 40)  # 1 s of 8 kHz μ-law in 20 ms frames
        returned_ms = 0
        with contextlib.suppress(TimeoutError):
            while True:
                event = await client.recv(timeout_s=0.5)
                if event["type"] == "response.output_audio.delta":
                    returned_ms += len(base64.b64decode(event["delta"])) // 48
        assert expected_ms[0] <= returned_ms <= expected_ms[1]


async def test_protocol_errors_keep_the_session() -> None:
    async with engine_server() as running:
        client = await RawClient.connect(running.url)
        await client.open(NO_VAD)
        await client.ws.send("{not json")
        assert (await client.recv())["error"]["code"] == "invalid_json"
        await client.ws.send(b"\x00\x01binary")
        assert (await client.recv())["error"]["code"] == "bad_event"
        await client.ws.send("[1, 2]")
        assert (await client.recv())["error"]["code"] == "bad_event"
        await client.send({"type": "push_chunk", "event_id": "evt_7"})
        error = (await client.recv())["error"]
        assert error == {"type": "invalid_request_error", "code": "unknown_event", "message": error["message"], "event_id": "evt_7"}
        await client.send({"type": "input_audio_buffer.append", "audio": "***not base64***"})
        assert (await client.recv())["error"]["code"] == "bad_audio"
        await client.send({"type": "playback.ack"})
        assert (await client.recv())["error"]["code"] in ("bad_event", "playback_item_not_found")
        await client.send({"type": "session.resume", "session_id": "x", "resume_token": "y"})
        assert (await client.recv())["error"]["code"] == "unsupported_session_resume"
        await client.send({"type": "session.event_ack", "server_event_seq": 99})
        assert (await client.recv())["error"]["code"] == "invalid_event_ack"
        await client.send({"type": "session.heartbeat"})
        assert (await client.recv())["type"] == "session.heartbeat_ack"  # still alive


async def test_first_frame_rules() -> None:
    async with engine_server(config_timeout_s=0.2) as running:
        silent = await RawClient.connect(running.url)
        assert (await silent.recv())["error"]["code"] == "config_timeout"
        bad = await RawClient.connect(running.url)
        await bad.ws.send("nope")
        assert (await bad.recv())["error"]["code"] == "invalid_json"
        # as vllm-omni: any session object it cannot open with is invalid_session_config
        unsupported = await RawClient.connect(running.url)
        await unsupported.send({"type": "session.update", "session": {"input_audio_format": "audio/pcmu"}})
        assert (await unsupported.recv())["error"]["code"] == "invalid_session_config"
        vad = await RawClient.connect(running.url)
        await vad.send({"type": "session.update", "session": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}})
        assert (await vad.recv())["error"]["code"] == "invalid_session_config"
        for refused in (silent, bad, unsupported, vad):  # as vllm-omni: no close frame after a handshake error
            await asyncio.wait_for(refused.ws.wait_closed(), 5)
            assert refused.ws.close_code == 1006
        turn_based = await RawClient.connect(running.url, "/v1/realtime?duplex=0")
        assert (await turn_based.recv())["code"] == "unsupported"  # the flat shape
        await asyncio.wait_for(turn_based.ws.wait_closed(), 5)
        assert turn_based.ws.close_code == 1000


async def test_capacity_exhausted() -> None:
    async with engine_server(LocalEngineOptions(max_sessions=1)) as running:
        await (await RawClient.connect(running.url)).open(NO_VAD)
        second = await RawClient.connect(running.url)
        error = await second.open(NO_VAD)
        assert error["error"] == {
            "type": "rate_limit_error",
            "code": "resource_exhausted",
            "message": "duplex_session_capacity_exhausted: limit=1",
        }


async def test_resume_replays_what_was_missed_and_rotates_the_token() -> None:
    async with engine_server(LocalEngineOptions(agent="tone", chunk_ms=100, generation_speed=2.0)) as running:
        first = await RawClient.connect(running.url, "/v1/duplex")
        created = await first.open(NO_VAD)
        received = [await first.recv(), await first.recv()]  # response.created, conversation.item.added
        await first.send({"type": "session.event_ack", "server_event_seq": 1})
        await first.ws.close()
        await asyncio.sleep(0.5)  # the greeting keeps coming while detached: journaled
        second = await RawClient.connect(running.url)
        await second.send(
            {"type": "session.resume", "session_id": created["session"]["id"], "resume_token": created["resume_token"], "last_received_server_event_seq": 3}
        )
        resumed = await second.recv()
        assert resumed["type"] == "session.resumed" and resumed["attachment_generation"] == 2
        assert resumed["resume_token"] != created["resume_token"]
        rest = await second.recv_until("response.done")
        seqs = [e["server_event_seq"] for e in received + rest]
        assert seqs == list(range(2, len(seqs) + 2))  # after session.updated (1): nothing lost, nothing doubled
        stale = await RawClient.connect(running.url)
        await stale.send({"type": "session.resume", "session_id": created["session"]["id"], "resume_token": created["resume_token"]})
        assert (await stale.recv())["error"]["code"] == "invalid_resume_token"


async def test_resume_errors() -> None:
    async with engine_server(LocalEngineOptions(disconnect_grace_ms=100)) as running:
        client = await RawClient.connect(running.url)
        created = await client.open(NO_VAD)
        session_id, token = created["session"]["id"], created["resume_token"]
        ahead = await RawClient.connect(running.url)
        await ahead.send({"type": "session.resume", "session_id": session_id, "resume_token": token, "last_received_server_event_seq": 50})
        assert (await ahead.recv())["error"]["code"] == "session_resume_conflict"
        malformed = await RawClient.connect(running.url)
        await malformed.send({"type": "session.resume", "session_id": session_id})
        assert (await malformed.recv())["error"]["code"] == "invalid_session_resume"
        await client.ws.close()
        await asyncio.sleep(0.3)  # past the grace
        late = await RawClient.connect(running.url)
        await late.send({"type": "session.resume", "session_id": session_id, "resume_token": token})
        assert (await late.recv())["error"]["code"] == "session_resume_expired"


async def test_takeover_tells_the_old_socket() -> None:
    async with engine_server() as running:
        old = await RawClient.connect(running.url)
        created = await old.open(NO_VAD)
        new = await RawClient.connect(running.url)
        await new.send({"type": "session.resume", "session_id": created["session"]["id"], "resume_token": created["resume_token"]})
        assert (await new.recv())["type"] == "session.resumed"
        assert (await new.recv())["type"] == "session.updated"  # replayed: it resumed from sequence 0
        replaced = await old.recv()
        assert replaced.pop("event_id").startswith("event_")
        assert replaced == {"type": "session.replaced", "session_id": created["session"]["id"], "attachment_generation": 1}
        await new.send({"type": "session.heartbeat"})
        ack = await new.recv()
        assert ack["type"] == "session.heartbeat_ack" and ack["session_id"] == created["session"]["id"]


async def test_journal_overflow_requires_resync() -> None:
    async with engine_server(LocalEngineOptions(agent="loopback"), resume_replay_max_bytes=4096) as running:
        client = await RawClient.connect(running.url)
        await client.open(NO_VAD)
        for _ in range(5):
            await client.append(tone(40))
        events = await client.recv_until("session.resync_required")
        events += [await client.recv() for _ in range(4)]
        kinds = [e["type"] for e in events]
        after = events[kinds.index("session.resync_required") + 1 :]
        assert all("server_event_seq" not in e for e in after)


async def test_close_sends_session_closed_then_closes_the_socket() -> None:
    async with engine_server() as running:
        client = await RawClient.connect(running.url)
        await client.open(NO_VAD)
        await client.send({"type": "session.close", "reason": "done"})
        closed = await client.recv()
        assert closed["type"] == "session.closed" and closed["reason"] == "done"
        await asyncio.wait_for(client.ws.wait_closed(), 5)
        assert client.ws.close_code == 1000 and client.ws.close_reason == "done"
        assert running.engine.session_count == 0

