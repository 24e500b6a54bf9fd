"""The same exchange, over a real websocket, against vllm-omni 0.30's own server and against ``callbridge engine-server``.

vllm-omni's side is its whole serving stack from the wheel — websocket
handler, ``DuplexOmni``, session manager, runner, lease, journal, Silero
server VAD and the Qwen3-Omni plugin — on a stand-in model
(``tests/engine/vllm_omni_stack.py``), in a process of its own. Ours is the
real ``engine-server`` app (uvicorn, loopback) on the embedded engine.

Each exchange is one script of client frames, each step waiting for a named
event rather than a time. What is compared is the event types in order, each
run of streamed deltas (audio and transcript, whose interleaving follows the
model's timing) read as one ``<deltas>``, and, per type, the keys the event
carries (issue #13 item 7).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import difflib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from callbridge.engine.local.core import LocalEngineOptions
from tests.conftest import free_port
from tests.engine.audio import caller_speech_16k, chunks, silence
from tests.engine.serving import engine_server
from tests.engine.vllm_omni_stack import VllmOmniProcess
from tests.engine.vllm_omni_wheel import require_wheel

pytestmark = pytest.mark.processes  # vllm-omni's serving stack beside our engine server, at real time

#: Keys that only an event shaped by the model's timing carries: a transcript delta of text that ran ahead
#: of its audio (the stand-in's thinker text, like Qwen3-Omni's, comes before the first audio chunk) carries
#: the reply's ``metadata``; one paired with an audio chunk does not. Our echo agent never runs text ahead.
_MODEL_TIMING_KEYS = {"response.output_audio_transcript.delta": {"metadata"}}
_DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta"}


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vllm-omni's serving stack on the stand-in model, as a process; its ``ws://`` address."""
    require_wheel()
    process = VllmOmniProcess(free_port(), tmp_path_factory.mktemp("vllm_omni") / "stack.log").start()
    try:
        yield process.url
    finally:
        process.kill()


class Peer:
    """One websocket to a server: every event kept in arrival order, steps waiting on them."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()
        self._cursor = 0
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, query: str = "duplex=1&autostart=0") -> Peer:
        return cls(await connect(f"{url}/v1/realtime?{query}", max_size=2**24))

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                self.events.append(orjson.loads(frame))
                self._arrived.set()
        except ConnectionClosed:
            pass
        self.events.append({"type": "<closed>", "code": self.ws.close_code})
        self._arrived.set()

    async def send(self, payload: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(payload).decode())

    async def until(self, event_type: str, timeout_s: float = 15.0) -> dict[str, Any]:
        """The next event of ``event_type`` after the last one waited for."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            for index in range(self._cursor, len(self.events)):
                if self.events[index]["type"] == event_type:
                    self._cursor = index + 1
                    return self.events[index]
            self._arrived.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or (self.events and self.events[-1]["type"] == "<closed>" and event_type != "<closed>"):
                raise AssertionError(f"no {event_type} after {[e['type'] for e in self.events[self._cursor:]]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def speak_until(self, pcm: bytes, event_type: str, *, rate_hz: int = 16000, **hints: Any) -> None:
        """Append ``pcm`` in 20 ms frames, paced, each carrying ``hints``, stopping at the frame after which
        ``event_type`` arrives."""
        start = len(self.events)
        for frame in chunks(pcm, rate_hz):
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode(), **hints})
            await asyncio.sleep(0.02)
            if any(e["type"] == event_type for e in self.events[start:]):
                return
        raise AssertionError(f"no {event_type} while speaking")

    async def speak(self, pcm: bytes, *, rate_hz: int = 16000, **hints: Any) -> None:
        """Append ``pcm`` in 20 ms frames, paced, each carrying ``hints`` (``overlap_action="listen"``)."""
        for frame in chunks(pcm, rate_hz):
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode(), **hints})
            await asyncio.sleep(0.02)

    async def send_silence(self, ms: int, rate_hz: int = 16000) -> None:
        for frame in chunks(silence(ms, rate_hz), rate_hz):
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()})
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


def is_verdict(event: dict[str, Any]) -> bool:
    """An answer to one input chunk that changes nothing: ``response.listen`` while idle, an ``overlap.decision``
    to ``drop`` or ``listen`` during a reply (a ``barge_in`` is part of the conversation)."""
    return event["type"] == "response.listen" or (event["type"] == "overlap.decision" and event.get("action") != "barge_in")


def shape(events: list[dict[str, Any]]) -> list[str]:
    """Event types in order, verdicts on chunks left out: repeats of a type read once, a run of streamed
    deltas as one ``<deltas>``.

    ``response.speak`` (the first audio of a reply) is read at the start of the run of deltas it falls in:
    Qwen3-Omni's thinker text can run ahead of its first audio chunk, by as much as the model's timing
    says, so where the marker lands among the deltas is not part of the protocol.
    """
    out: list[str] = []
    for event in events:
        if is_verdict(event):
            continue
        kind = "<deltas>" if event["type"] in _DELTAS else event["type"]
        if kind == "response.speak" and out and out[-1] == "<deltas>":
            out[-1] = kind
            kind = "<deltas>"
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def verdicts(events: list[dict[str, Any]]) -> list[str]:
    """The verdicts on chunks in order, repeats read once: a stream of their own, one per chunk, which
    interleaves with the reply's events as the chunks' arrival and the model's timing fall."""
    out: list[str] = []
    for event in filter(is_verdict, events):
        kind = f"{event['type']}:{event.get('reason')}" if event["type"] == "overlap.decision" else event["type"]
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def facts(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """What a client decides on, in order: error codes, how responses end, barge-ins, the overlap policy
    announced, and the websocket's close code."""
    out: list[tuple[str, Any]] = []
    for event in events:
        match event["type"]:
            case "error":
                error = event["error"]
                out.append(("error", error["code"] if isinstance(error, dict) else event.get("code")))
            case "response.done":
                out.append(("response.done", event["response"]["status"]))
            case "overlap.decision" if event["action"] == "barge_in":
                out.append(("barge_in", (event["policy"], event["reason"])))
            case "session.created" | "session.updated" | "session.resumed":
                out.append((event["type"], event["session"].get("overlap_policy")))
            case "<closed>":
                out.append(("<closed>", event["code"]))
    return out


def keys_by_type(events: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per event type, the keys its events carry, and those of the object each carries (``session.id`` …)."""
    keys: dict[str, set[str]] = {}
    for event in events:
        seen = keys.setdefault(event["type"], set())
        seen.update(event)
        for name in ("session", "response", "item", "part", "error"):
            if isinstance(event.get(name), dict):
                seen.update(f"{name}.{key}" for key in event[name])
    return keys


Exchange = Callable[[str], Awaitable[list[dict[str, Any]]]]
PCM16_VAD = {"input_audio_format": "pcm16", "sample_rate_hz": 16000, "output_audio_format": "pcm16", "turn_detection": {"type": "server_vad"}}


COMMIT_MODE = {**PCM16_VAD, "turn_detection": None}


async def opened(url: str, session: dict[str, Any] = PCM16_VAD) -> Peer:
    """A connection whose session is open and configured (``session.updated`` read)."""
    peer = await Peer.connect(url)
    await peer.send({"type": "session.update", "session": session})
    await peer.until("session.updated")
    return peer


async def commit_a_turn(peer: Peer) -> None:
    """Commit mode: two seconds of the caller's speech, appended at once, committed, a reply asked for."""
    for frame in chunks(caller_speech_16k()[: 16000 * 2 * 2]):
        await peer.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()})
    await peer.send({"type": "input_audio_buffer.commit"})
    await peer.send({"type": "response.create"})


async def closed(peer: Peer) -> list[dict[str, Any]]:
    """``session.close``, then every event until the socket closed."""
    await peer.send({"type": "session.close"})
    await peer.until("<closed>")
    return peer.events


async def spoken_turn(url: str) -> list[dict[str, Any]]:
    """Server VAD: a spoken turn, its reply played out and acknowledged, a heartbeat, the close."""
    peer = await opened(url)
    await peer.speak_until(caller_speech_16k() + silence(1500), "input_audio_buffer.speech_stopped")
    created = await peer.until("response.created")
    await peer.send_silence(200)  # during the reply: each chunk dropped
    done = await peer.until("response.done")
    response_id = created["response"]["id"]
    played_ms = sum(len(base64.b64decode(e["delta"])) * 500 // e["sample_rate_hz"] for e in peer.events if e["type"] == "response.output_audio.delta")
    await peer.send({"type": "playback.ack", "response_id": response_id, "played_ms": played_ms})
    await peer.until("playback.acknowledged")
    await peer.send_silence(200)  # the reply heard out: nothing to answer
    await peer.until("response.listen")
    await peer.send({"type": "session.heartbeat"})
    await peer.until("session.heartbeat_ack")
    assert done["response"]["status"] == "completed"
    return await closed(peer)


async def barge_in(url: str) -> list[dict[str, Any]]:
    """Server VAD: the caller talks over the reply while it is being played (nothing acknowledged), then the next reply."""
    peer = await opened(url)
    await peer.speak_until(caller_speech_16k() + silence(1500), "input_audio_buffer.speech_stopped")
    await peer.until("response.output_audio.delta")
    await peer.speak_until(caller_speech_16k() + silence(1500), "input_audio_buffer.speech_stopped")
    await peer.until("response.done")
    await peer.until("response.done")
    return await closed(peer)


async def listen_over_the_reply(url: str) -> list[dict[str, Any]]:
    """Server VAD, bridge-mode barge-in (#41): the caller talks over the reply with every append marked
    ``overlap_action: "listen"`` (the bridge deciding, not the engine), then the bridge confirms a barge-in itself."""
    peer = await opened(url)
    await peer.speak(caller_speech_16k())
    # the silence after it marked *listen* too: the frames sent before the turn's end reached us may be judged
    # after the reply began (a busy machine: vllm-omni's server judged them silence_or_noise, ours not yet) — each
    # then gets the verdict of the *listen* frames after it, or the idle one of those before, on either server
    await peer.speak_until(silence(1500), "input_audio_buffer.speech_stopped", overlap_action="listen")
    await peer.until("response.output_audio.delta")
    await peer.speak(caller_speech_16k()[: 16000 * 2] + silence(800), overlap_action="listen")
    await peer.send({"type": "barge_in"})
    await peer.until("response.done")
    await peer.send_silence(400)
    return await closed(peer)


async def cancel_then_next_turn(url: str) -> list[dict[str, Any]]:
    """Commit mode: a reply cancelled by the client mid-way, then the next committed turn is answered."""
    peer = await opened(url, COMMIT_MODE)
    for turn in range(2):
        await commit_a_turn(peer)
        await peer.until("input_audio_buffer.committed")
        await peer.until("response.output_audio.delta")
        if turn == 0:
            await peer.send({"type": "response.cancel"})
        done = await peer.until("response.done")
        assert done["response"]["status"] == ("cancelled" if turn == 0 else "completed")
    return await closed(peer)


async def talk_over_in_commit_mode(url: str) -> list[dict[str, Any]]:
    """Commit mode: the caller's audio keeps coming while the reply is generated (nothing acknowledged)."""
    peer = await opened(url, COMMIT_MODE)
    await commit_a_turn(peer)
    await peer.until("response.output_audio.delta")
    await peer.speak_until(caller_speech_16k(), "response.done")
    return await closed(peer)


async def text_item(url: str) -> list[dict[str, Any]]:
    """A text message from the client, a heartbeat, a session.update mid-session, input cleared, the close."""
    peer = await opened(url, COMMIT_MODE)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}
    await peer.send({"type": "conversation.item.create", "item": item})
    await peer.until("conversation.item.done")
    await peer.send({"type": "session.update", "session": {"instructions": "Be brief."}})
    await peer.until("session.updated")
    await peer.send({"type": "input_audio_buffer.clear"})
    await peer.until("input_audio_buffer.cleared")
    return await closed(peer)


async def resume_after_drop(url: str) -> list[dict[str, Any]]:
    """The socket drops mid-reply; a new one resumes the session and gets what it missed, then the close."""
    first = await opened(url, COMMIT_MODE)
    created = next(e for e in first.events if e["type"] == "session.created")
    await commit_a_turn(first)
    delta = await first.until("response.output_audio.delta")
    await first.close()
    second = await Peer.connect(url)
    resume = {"type": "session.resume", "session_id": created["session"]["id"], "resume_token": created["resume_token"], "last_received_server_event_seq": delta["server_event_seq"]}
    await second.send(resume)
    await second.until("session.resumed")
    await second.until("response.done")
    return [*first.events, *await closed(second)]


async def refused_handshakes(url: str) -> list[dict[str, Any]]:
    """What a client sees when the handshake is refused: an audio format the server does not take, a resume of no
    session, and ``?duplex=0`` (answered by ``api_server.realtime_websocket``'s branch, as the stand-in's route
    copies it: a duplex deployment has no ``openai_serving_realtime``)."""
    events: list[dict[str, Any]] = []
    peer = await Peer.connect(url)
    await peer.send({"type": "session.update", "session": {**PCM16_VAD, "input_audio_format": "audio/pcmu"}})
    await peer.until("<closed>")
    events += peer.events
    peer = await Peer.connect(url)
    await peer.send({"type": "session.resume", "session_id": "duplex-0000", "resume_token": "x" * 43})
    await peer.until("<closed>")
    events += peer.events
    peer = await Peer.connect(url, "duplex=0")  # the non-duplex Realtime API, which a duplex deployment does not serve
    await peer.until("<closed>")
    return [*events, *peer.events]


EXCHANGES: dict[str, Exchange] = {
    "spoken_turn": spoken_turn,
    "barge_in": barge_in,
    "listen_over_the_reply": listen_over_the_reply,
    "cancel_then_next_turn": cancel_then_next_turn,
    "text_item": text_item,
    "talk_over_in_commit_mode": talk_over_in_commit_mode,
    "resume_after_drop": resume_after_drop,
    "refused_handshakes": refused_handshakes,
}


@pytest.fixture
async def ours() -> AsyncIterator[str]:
    async with engine_server(LocalEngineOptions(generation_speed=4.0, chunk_ms=80)) as running:
        yield running.url


@pytest.mark.long
@pytest.mark.parametrize("exchange", sorted(EXCHANGES))
async def test_same_events_as_vllm_omni(exchange: str, real_server: str, ours: str) -> None:
    theirs_events = await EXCHANGES[exchange](real_server)
    ours_events = await EXCHANGES[exchange](ours)
    theirs_shape, ours_shape = shape(theirs_events), shape(ours_events)
    assert ours_shape == theirs_shape, "\n".join(difflib.unified_diff(theirs_shape, ours_shape, "vllm-omni", "callbridge", lineterm=""))
    assert verdicts(ours_events) == verdicts(theirs_events)
    assert facts(ours_events) == facts(theirs_events)
    theirs_keys, ours_keys = keys_by_type(theirs_events), keys_by_type(ours_events)
    for event_type, keys in _MODEL_TIMING_KEYS.items():
        theirs_keys.get(event_type, set()).difference_update(keys)
    differing = {t: {"vllm-omni only": sorted(theirs_keys[t] - ours_keys[t]), "callbridge only": sorted(ours_keys[t] - theirs_keys[t])} for t in ours_keys if ours_keys[t] != theirs_keys[t]}
    assert not differing, differing
