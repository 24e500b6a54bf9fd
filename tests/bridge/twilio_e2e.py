"""Helpers for end-to-end Twilio tests: an engine that records what the bridge asks of it, short caller
audio, and a raw signed media stream for sending what a real Twilio never would."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

import httpx
import orjson
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from callbridge.bridge.registry import CallRegistry
from callbridge.config import Settings
from callbridge.engine.commands import AppendAudio, BargeIn, EngineCommand, TruncateItem
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalEngine, LocalSession
from callbridge.engine.port import ResumeTicket, SessionConfig
from callbridge.outbound_http import http_client
from callbridge.sim.carrier import CallResult, OpenReason, SimCall, SimStream
from callbridge.sim.runner import RunningBridge, load_wav_8k, sample_caller_wav


class RecordingEngine(LocalEngine):
    """The embedded engine, recording the sessions it opens and resumes and every command it receives."""

    def __init__(self, options: LocalEngineOptions) -> None:
        super().__init__(options)
        self.opened: list[str] = []
        self.resumed: list[str] = []
        self.commands: dict[str, list[EngineCommand]] = defaultdict(list)
        self.sessions: dict[str, LocalSession] = {}
        self.configs: dict[str, SessionConfig] = {}
        """session id → the config it was opened with."""
        self.truncated_at_s: list[float] = []
        """When each ``TruncateItem`` was submitted (``time.monotonic()``): the moment the bridge decided."""

    async def open(self, config: SessionConfig) -> LocalSession:
        session = await super().open(config)
        self.opened.append(session.session_id)
        self.sessions[session.session_id] = session
        self.configs[session.session_id] = config
        original = session.submit

        async def submit(command: EngineCommand) -> None:
            self.commands[session.session_id].append(command)
            if isinstance(command, TruncateItem):
                self.truncated_at_s.append(time.monotonic())
            await original(command)

        session.submit = submit  # type: ignore[method-assign]
        return session

    async def resume(self, ticket: ResumeTicket) -> LocalSession:
        session = await super().resume(ticket)
        self.resumed.append(session.session_id)
        return session

    def of(self, kind: type) -> list[Any]:
        return [c for commands in self.commands.values() for c in commands if isinstance(c, kind)]


def engine(agent: str = "echo", **options: Any) -> RecordingEngine:
    return RecordingEngine(LocalEngineOptions(agent=agent, chunk_ms=500, generation_speed=4.0, **options))


def settings(**sections: dict[str, Any]) -> Settings:
    return Settings.model_validate(sections)


def short_speech(ms: int = 1500) -> bytes:
    """The first ``ms`` of the bundled caller utterance ("Hello, I would like…"), PCM16 8 kHz."""
    return load_wav_8k(sample_caller_wav())[: ms * 16]


async def post_answer(bridge: RunningBridge, call_sid: str, *, again: bool = False, timeout_s: float = 5.0) -> httpx.Response:
    """Twilio's signed answer webhook for ``call_sid``. ``again``: as the ``<Redirect>`` the bridge's TwiML names
    (its URL carries a nonce of its own, so the request is signed as no other; the same request twice would be
    a replay, refused 403)."""
    validator = RequestValidator(bridge.settings.twilio.auth_token.get_secret_value())  # type: ignore[union-attr]
    url = bridge.base_url + "/twilio/voice" + (f"?redirect={secrets.token_hex(8)}" if again else "")
    params = {"CallSid": call_sid, "AccountSid": bridge.carrier.account_sid, "From": "+1", "To": "+2"}
    async with http_client(timeout=timeout_s) as http:
        return await http.post(url, data=params, headers={"X-Twilio-Signature": validator.compute_signature(url, params)})


class RawStream:
    """A signed Twilio media stream driven by hand."""

    def __init__(self, ws: ClientConnection, stream_sid: str, call_sid: str, token: str, account_sid: str) -> None:
        self.ws = ws
        self.account_sid = account_sid
        self.sid = stream_sid
        self.call_sid = call_sid
        self.token = token

    @classmethod
    async def open(
        cls,
        bridge: RunningBridge,
        *,
        token: str | None = None,
        signature: str | None = None,
        call_sid: str | None = None,
        streams_to: RunningBridge | None = None,
    ) -> RawStream:
        """Answer a call (``call_sid``: again, as Twilio's ``<Redirect>`` does) and open its media websocket — on
        ``streams_to`` where given (a load balancer sent it to another process)."""
        validator = RequestValidator(bridge.settings.twilio.auth_token.get_secret_value())  # type: ignore[union-attr]
        again = call_sid is not None
        call_sid = call_sid or "CA" + secrets.token_hex(16)
        answer = await post_answer(bridge, call_sid, again=again)
        minted = answer.text.split('name="token" value="')[1].split('"')[0]
        ws_url = (streams_to or bridge).base_url.replace("http://", "ws://") + "/twilio/media"
        sig = signature if signature is not None else validator.compute_signature(ws_url, {})
        ws = await connect(ws_url, additional_headers={"X-Twilio-Signature": sig})
        return cls(ws, "MZ" + secrets.token_hex(16), call_sid, token if token is not None else minted, bridge.carrier.account_sid)

    def start_message(self) -> str:
        start = {
            "streamSid": self.sid,
            "accountSid": self.account_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": {"token": self.token},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        return orjson.dumps({"event": "start", "sequenceNumber": "1", "start": start, "streamSid": self.sid}).decode()

    async def start(self) -> None:
        await self.ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
        await self.ws.send(self.start_message())

    def media(self, payload_b64: str = "/////w==", timestamp: int = 0) -> str:
        media = {"track": "inbound", "chunk": "1", "timestamp": str(timestamp), "payload": payload_b64}
        return orjson.dumps({"event": "media", "sequenceNumber": "2", "media": media, "streamSid": self.sid}).decode()

    async def closed(self, timeout_s: float = 5.0) -> int | None:
        """Wait for the bridge to close the socket; its close code."""
        async def drain() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for _ in self.ws:
                    pass

        await asyncio.wait_for(drain(), timeout_s)
        return self.ws.close_code


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` (sync, or async like the registry's lookups) every 10 ms until it holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await _holds(predicate):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def _holds(predicate: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = predicate()
    return bool(await result) if inspect.isawaitable(result) else bool(result)


async def known(registry: CallRegistry, call_id: str) -> bool:
    """The registry remembers the call (detached or ended, not expired)."""
    return await registry.get(call_id) is not None


async def detached(registry: CallRegistry, call_id: str) -> bool:
    """The call's engine session waits in the registry for its next stream."""
    record = await registry.get(call_id)
    return record is not None and record.ticket is not None


async def bound(registry: CallRegistry, call_id: str) -> bool:
    """A stream holds the call's engine session (``mark_bound``)."""
    record = await registry.get(call_id)
    return record is not None and record.bound


class LoopStalls:
    """The longest the event loop ran late while ``async with`` lasted. The bridge and the simulated carrier share
    the loop: on a loaded test machine a heard position measured against the carrier's clock can be off by that
    much on top of the frame it is allowed (``heard_tolerance_ms``)."""

    def __init__(self, every_s: float = 0.005) -> None:
        self.every_s = every_s
        self.worst_ms = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def heard_tolerance_ms(self) -> float:
        """One frame, plus the worst stall."""
        return 20 + self.worst_ms

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.every_s
            await asyncio.sleep(self.every_s)
            self.worst_ms = max(self.worst_ms, (loop.time() - due) * 1000)


def heard_of_the_interrupted_reply(result: CallResult, frame_ms: int = 20) -> tuple[int, int]:
    """What the caller heard of the reply they talked over (ms), and how far off the truncation it may be beyond
    ``LoopStalls.heard_tolerance_ms``: with the bridge deciding (``barge_in.mode = "bridge"``, the default) their
    first words may pause it and, short of a confirmation, resume it (a gap in them), each pause a flush; the
    played total at the last one is what they heard, each resume having played again the frame it paused in (the
    carrier's ``frame_ms``: Exotel's chunks are 100 ms). A carrier with no flush only stops getting audio, and plays
    on from what it was sent: every run before the answer's."""
    if result.clears:
        return result.played_ms_at_clear[-1], frame_ms * (len(result.clears) - 1)
    runs = result.agent_runs_ms[:-1] if len(result.agent_runs_ms) > 1 else result.agent_runs_ms
    return sum(runs), 0


def caller_audio_ms(commands: Sequence[object]) -> int:
    """How much of the caller's audio a session's ``commands`` carried, each piece once: a confirmed bridge-mode
    barge-in (``BargeIn``) sends again, next, what the caller said since just before their onset."""
    pairs = itertools.pairwise([None, *commands])
    return sum(len(c.pcm) * 1000 // (2 * c.rate_hz) for before, c in pairs if isinstance(c, AppendAudio) and not isinstance(before, BargeIn))


def stall_once_after_first_audio(bridge: RunningBridge, after_s: float, stall_s: float) -> list[float]:
    """The whole process (the bridge and the simulated carrier both) stalls once, ``stall_s`` long, ``after_s`` after
    the agent's first audio reaches the carrier: anchored on the call, not the test's clock, so a loaded machine's
    late start moves it with the call. The list gets the stall's loop time as it comes."""
    loop, open_stream, stalls = asyncio.get_running_loop(), bridge.carrier.open_stream, list[float]()
    waiting: list[asyncio.TimerHandle] = []

    def stall() -> None:
        stalls.append(loop.time())
        time.sleep(stall_s)

    def heard(pcm: bytes | bytearray | memoryview) -> None:
        if any(pcm) and not waiting:
            waiting.append(loop.call_later(after_s, stall))

    async def opening(call: SimCall, reason: OpenReason) -> SimStream | None:
        stream = await open_stream(call, reason)
        if stream is not None:
            stream.on_audio = heard
        return stream

    bridge.carrier.open_stream = opening  # type: ignore[method-assign]
    return stalls
