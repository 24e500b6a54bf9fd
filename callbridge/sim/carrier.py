"""A simulated carrier for the demo, the tests and load tests: what every carrier shares, with each carrier's
wire in a subclass (each carrier's ``sim.py``; ``callbridge.carriers.CARRIERS`` names them all).

Shared here (``SimulatedCarrier.place_call`` and ``SimStream``):
- the caller's timeline at real time, one 20 ms tick anchored to the call's
  start: the script's speech (or silence), a barge-in over the agent, DTMF,
  network drops, hang-up;
- playback of what the bridge sends: a queue played 20 ms per tick, markers
  echoed when playback reaches them (at once if nothing is queued), flushes
  that drop the queue (and echo or void the pending markers, as the carrier
  does);
- what the caller heard, as PCM16 8 kHz; the REST server for hang-ups.

A carrier's part: ``SimStream`` subclass — how caller audio, DTMF and stop go
on the wire, how the bridge's messages are read (with a protocol warning for
anything the real carrier would reject), how a marker echo and a flush
acknowledgement look; ``SimulatedCarrier`` subclass — how a call is answered
and its media connection opened (and re-opened after a drop, if the carrier
can), its REST routes, the bridge settings that point at it, and the bad
input and forged requests the end-to-end matrix sends.
"""

from __future__ import annotations

import asyncio
import audioop
import contextlib
import math
import secrets
import socket
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import BaseRoute
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from callbridge.config import Settings
from callbridge.outbound_http import http_client
from callbridge.sim.callee import Callee
from callbridge.sim.caller import FRAME_MS, CallerScript, CallerSide, CallResult, TimelineEvent, caller_timeline

__all__ = [
    "FRAME_MS",
    "CallResult",
    "CallerScript",
    "OpenReason",
    "RingEnd",
    "SimCall",
    "SimConnection",
    "SimStream",
    "SimulatedCarrier",
    "TimelineEvent",
    "WebSocketConnection",
    "webhook_client",
]

_IDLE_REUSE_S = 1.0
"""A webhook connection idle longer than this is not reused: the bridge's server may be closing it (uvicorn
closes an idle keep-alive connection after 5 s), and a request sent on it as it closes fails."""


def webhook_client() -> httpx.AsyncClient:
    """The HTTP client a simulated carrier sends its webhooks with. A real carrier opens or keeps connections its
    own way; what matters here is never to lose a webhook (a hang-up callback 5 s after the answer was lost that
    way, and the call taken for a dropped stream) to a keep-alive connection the server is closing."""
    return http_client(timeout=10.0, limits=httpx.Limits(keepalive_expiry=_IDLE_REUSE_S))
_SILENCE_8K = bytes(320)

OpenReason = Literal["answer", "network_drop", "closed_by_bridge", "redirected"]
RingEnd = Literal["answered", "canceled", "busy", "no_answer", "fails"]
"""How a dialled call's ringing ended (``SimulatedCarrier.ring``)."""
"""Why a media connection is being opened: a new call, or the last one dropped / was closed by the bridge; or
why a webhook is being sent again: the bridge answered the last one with a redirect (a draining process)."""


@dataclass
class SimCall:
    """One call the simulated carrier is placing."""

    call_id: str
    result: CallResult
    clock: Callable[[], int]
    """ms since the call was placed."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the call is over on the carrier's side (REST hang-up, in-band hang-up)."""


class SimConnection(Protocol):
    """The carrier's side of one media connection."""

    async def send(self, message: str | bytes) -> None:
        """Raises ``ConnectionError`` once the connection is gone."""
        ...

    def messages(self) -> AsyncIterator[str | bytes]:
        """What the bridge sends, until the connection closes."""
        ...

    def abort(self) -> None:
        """Drop the connection without a goodbye, as a network failure does."""
        ...

    async def close(self) -> None: ...

    @property
    def close_code(self) -> int | None:
        """The websocket close code once closed (None while open, or for TCP)."""
        ...


class WebSocketConnection:
    """A websockets client connection as a ``SimConnection``."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, message: str | bytes) -> None:
        try:
            await self.ws.send(message)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    async def messages(self) -> AsyncIterator[str | bytes]:
        try:
            async for message in self.ws:
                yield message
        except ConnectionClosed:
            return

    def abort(self) -> None:
        if self.ws.transport is not None:
            self.ws.transport.abort()

    async def close(self) -> None:
        await self.ws.close()

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code


@dataclass(slots=True)
class _Arrival:
    """A piece of agent audio as it reached the carrier: its bytes still queued, when it came (monotonic s)."""

    left: int
    at_s: float


class SimStream(ABC):
    """One media connection of a call: the shared playback model; the subclass speaks the carrier's wire."""

    marks_echoed_on_clear: ClassVar[bool] = True
    """A flush echoes the pending markers (where the carrier does); otherwise they are void."""

    def __init__(self, conn: SimConnection, stream_id: str, rate_hz: int, call: SimCall) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.rate_hz = rate_hz
        self.call = call
        self.frame_bytes = rate_hz * FRAME_MS // 1000 * 2
        self.queue = bytearray()
        """Agent audio (PCM16 at ``rate_hz``) received and not played yet."""
        self._arrivals: deque[_Arrival] = deque()
        """``queue`` in the pieces it came in, oldest first."""
        self.pending_marks: list[tuple[int, str]] = []
        """(byte position in ``queue`` where the marker falls, name)."""
        self.played_bytes = 0
        self.next_play_s: float | None = None
        """When (monotonic s) the caller's next 20 ms is due to play: the tick after the last ``play``."""
        self.dropped = False
        """The connection is gone (a network drop, or closed by either side)."""
        self.network_drop = False
        self._to_8k: Any = None
        self.on_audio: Callable[[bytes | bytearray | memoryview], None] | None = None
        """Called with each piece of agent audio (PCM16 at ``rate_hz``) as it arrives, before it is queued (the load
        tester times clicks with it; ``queue`` then holds what plays before it)."""
        self.on_clear: Callable[[], None] | None = None
        """Called when the bridge flushes playback, before the queue is dropped."""

    # -------------------------------------------------------------- the wire

    @abstractmethod
    async def send_audio(self, pcm_8k: bytes) -> None:
        """20 ms of the caller's audio, PCM16 8 kHz: encode and send it as the carrier does."""

    async def send_audio_at_rate(self, pcm: bytes) -> None:
        """20 ms of the caller's audio already at the stream's rate (``CallerScript.wideband``): a carrier whose stream
        can be wideband sends it as it is; the others carry the caller at 8 kHz only."""
        raise NotImplementedError(f"{type(self).__name__} carries the caller at 8 kHz only")

    @abstractmethod
    async def send_dtmf(self, digit: str) -> None: ...

    @abstractmethod
    async def send_stop(self) -> None:
        """The call ends on the carrier's side: say so on the wire (or just close), then close."""

    @abstractmethod
    def receive(self, message: str | bytes) -> None:
        """One message from the bridge: ``enqueue_audio`` / ``add_mark`` / ``clear`` / ``warn``."""

    @abstractmethod
    def mark_message(self, name: str) -> str | bytes | None:
        """The carrier's echo of marker ``name``."""

    def cleared_message(self) -> str | bytes | None:
        """The carrier's acknowledgement of a flush, if it sends one."""
        return None

    # ------------------------------------------------------------ playback

    def enqueue_audio(self, pcm: bytes | bytearray | memoryview) -> None:
        if self.on_audio is not None:
            self.on_audio(pcm)
        self.queue += pcm
        self._arrivals.append(_Arrival(len(pcm), time.monotonic()))

    def add_mark(self, name: str) -> None:
        if not self.queue:
            self._echo_mark(name)
        else:
            self.pending_marks.append((len(self.queue), name))

    def clear(self) -> None:
        if self.on_clear is not None:
            self.on_clear()
        result = self.call.result
        bytes_per_ms = self.rate_hz // 500
        result.clears.append(len(self.queue) // bytes_per_ms)
        result.played_ms_at_clear.append(self.played_bytes // bytes_per_ms)
        result.cleared_at_s.append(time.monotonic())
        result.log(self.call.clock(), "bridge", f"flush: {len(self.queue) // bytes_per_ms} ms of queued agent audio dropped")
        self.queue.clear()
        self._arrivals.clear()
        pending, self.pending_marks = self.pending_marks, []
        if self.marks_echoed_on_clear:
            for _, name in pending:
                self._echo_mark(name)
        cleared = self.cleared_message()
        if cleared is not None:
            self._send_soon(cleared)

    def warn(self, text: str) -> None:
        self.call.result.warnings.append(text)

    def play(self, until_s: float = math.inf) -> tuple[bytes, bool]:
        """The next 20 ms the caller hears, as PCM16 8 kHz, and whether it was agent audio; echoes the markers
        it passes. ``until_s``: the latest arrival (monotonic s) this frame may play — a tick that runs late,
        catching up, plays what was queued by its time, not audio that came after it (a carrier plays in real time:
        what it did not have yet is silence then, and plays later)."""
        size = self.frame_bytes
        if until_s != math.inf:
            self.next_play_s = until_s
        playable, arrivals = 0, self._arrivals
        for piece in arrivals:
            if playable >= size or piece.at_s > until_s:
                break
            playable += piece.left
        consumed = min(size, playable)
        if consumed:
            frame = bytes(self.queue[:consumed]).ljust(size, b"\x00")
            del self.queue[:consumed]
            left = consumed
            while left:
                piece = arrivals[0]
                taken = min(left, piece.left)
                piece.left -= taken
                left -= taken
                if not piece.left:
                    arrivals.popleft()
        else:
            frame = b""
        self.played_bytes += consumed
        reached = [name for position, name in self.pending_marks if position <= consumed]
        self.pending_marks = [(position - consumed, name) for position, name in self.pending_marks if position > consumed]
        for name in reached:
            self._echo_mark(name)
        if not consumed:
            return _SILENCE_8K, False
        if self.rate_hz != 8000:
            frame, self._to_8k = audioop.ratecv(frame, 2, 1, self.rate_hz, 8000, self._to_8k)
            frame = frame[:320].ljust(320, b"\x00")
        return frame, True

    def overdue_ms(self, now_s: float) -> float:
        """How much this simulator owes the caller's ear at ``now_s``: its tick is that late (a busy machine delays
        it; it shares an event loop with the bridge in the tests), and plays that much of ``queue`` at once when it
        runs. Audio queued beyond it is what the bridge sent ahead of real time."""
        return 0.0 if self.next_play_s is None else max(0.0, (now_s - self.next_play_s) * 1000)

    def _echo_mark(self, name: str) -> None:
        self.call.result.marks_echoed.append(name)
        message = self.mark_message(name)
        if message is not None:
            self._send_soon(message)

    def _send_soon(self, message: str | bytes) -> None:
        asyncio.get_running_loop().create_task(self.send(message))

    async def send(self, message: str | bytes) -> None:
        if self.dropped:
            return
        try:
            await self.conn.send(message)
        except ConnectionError:
            self.dropped = True


class SimulatedCarrier(ABC):
    """A carrier's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    provider: ClassVar[str]
    stateless_rest_paths: ClassVar[frozenset[str]] = frozenset()
    """REST routes that name no call and that any instance with the account's secret answers alike (an OAuth
    token endpoint): a load test split across processes sends them to any one."""
    can_reconnect: ClassVar[bool] = True
    """After a network drop the carrier opens a new media connection on the same call."""
    says_goodbye: ClassVar[bool] = True
    """The carrier tells the bridge on the media connection when the caller hangs up (a ``stop``);
    without it the bridge cannot tell a hang-up from a drop and keeps the engine session for the grace."""
    uses_marks: ClassVar[bool] = True
    """The carrier echoes playback markers."""

    def with_answer_query(self, url: str) -> str:
        """``url`` (an answer webhook's) with the query a user put on it (``answer_query``)."""
        return f"{url}?{self.answer_query}" if self.answer_query else url

    def __init__(self, bridge_url: str, secret: str) -> None:
        self.bridge_url = bridge_url.rstrip("/")
        self.secret = secret
        """The shared secret of this simulated account (auth token, signing key…)."""
        self.calls: dict[str, SimCall] = {}
        self.on_media_sent: Callable[[bytes], None] | None = None
        """Called with each 20 ms of caller audio (PCM16 8 kHz) as it leaves (benchmarks time the bridge)."""
        self.on_message: Callable[[str | bytes], None] | None = None
        """Called with each message the bridge sends, as it arrives."""
        self.on_answered: Callable[[str, str], None] | None = None
        """A call the bridge dialled was answered (the number, the carrier's call id): whoever set this runs it (a
        load test) — the carrier's own ``Callee`` does not, and no ``completed`` report follows (the bridge frees the
        call's pacing slot on its own word, ``Dialer.call_over``); None: the ``Callee`` does."""
        self.dialled_at: list[float] = []
        """When each dial the bridge asked for was taken (``time.monotonic()``)."""
        self.callees: dict[str, Callee] = {}
        """Who answers a number the bridge dials (a number not here: ``Callee()``, a person)."""
        self.dialled: dict[str, asyncio.Task[CallResult | None]] = {}
        """The carrier's call id → each call the bridge dialled, as it goes: its ``CallResult`` once answered and over,
        None where it was never answered (or a load test ran it: ``on_answered``)."""
        self.status_reports: list[tuple[str, str]] = []
        """(call id, status) of every progress report sent to the bridge on a call it dialled, in order."""
        self._ringing: dict[str, asyncio.Event] = {}
        """A dialled call that rings → its stop (``stop_ringing``)."""
        self.route: Callable[[OpenReason], str] | None = None
        """Picks the bridge for each media connection a call opens (a load balancer in front of several bridge
        processes: a reconnect may land on another one); what it returns becomes ``bridge_url``."""
        self.answer_query = ""
        """The query string a user put on the number's answer URL (``customer_id=42``): the carrier keeps it on the
        answer webhooks it sends for the call (``with_answer_query``)."""
        self.rest_url: str | None = None
        self._rest_server: uvicorn.Server | None = None
        self._rest_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------- the carrier's part

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        """Settings overrides that point a bridge at this simulated account (secrets, REST base URL)."""
        return {}

    @classmethod
    def exported_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        """``bridge_settings`` for a bridge started separately (``loadtest --print-env``): whatever they point at
        must outlive this simulator."""
        return cls.bridge_settings(secret, rest_url)

    @classmethod
    def direct(cls, ws_url: str) -> SimulatedCarrier:
        """A simulator of this carrier that opens each call's media websocket straight at ``ws_url``, with no
        answer webhook, signatures or REST (where its spec's ``direct_protocol`` says it can)."""
        raise LookupError(f"the simulated {cls.provider} cannot call a media websocket directly")

    def reconnect_after_every_drop(self) -> None:
        """The load test drops media connections on purpose (``--drop-every-ms``): where the carrier gives up
        reconnecting after a few drops, it keeps reconnecting here."""

    def configure(self, settings: Settings) -> None:
        """The bridge's final settings (ports of listeners), before the first call."""

    def rest_routes(self) -> list[BaseRoute]:
        """The carrier's REST API as far as the bridge uses it (hang-up)."""
        return []

    def new_call_id(self) -> str:
        return "CA" + secrets.token_hex(16)

    @abstractmethod
    async def open_stream(self, call: SimCall, reason: OpenReason) -> SimStream | None:
        """Answer the call (or run the carrier's reconnect flow) and open its media connection, with the carrier's
        first messages sent; None when the bridge's answer ends the call instead (logged on ``call.result``). A
        connection that cannot be made at all may raise."""

    @abstractmethod
    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        """What a broken or hostile peer could send on ``stream``: case → (message, the ``ProtocolErrorReason``
        value the bridge must end the call with)."""

    def unknown_event(self, stream: SimStream) -> str | bytes | None:
        """A well-formed message of an event type the carrier could add tomorrow, on ``stream``: the bridge must
        ignore it (and count it), the call going on. None: the carrier's wire has no such thing (SIP)."""
        return None

    @abstractmethod
    async def forged_requests_refused(self) -> bool:
        """Try to get a call bridged without the account's credentials (forged signatures, wrong credentials);
        True when every attempt was refused."""

    # ------------------------------------------------------------------ REST

    async def start_rest(self, port: int | socket.socket) -> str:
        """Serve ``rest_routes`` on 127.0.0.1:``port`` (or on a socket already bound there); returns the base URL."""
        app = Starlette(routes=self.rest_routes())
        sock = port if isinstance(port, socket.socket) else None
        number: int = port.getsockname()[1] if isinstance(port, socket.socket) else port
        config = uvicorn.Config(app, host="127.0.0.1", port=number, log_config=None, lifespan="off", access_log=False)
        self._rest_server = uvicorn.Server(config)
        self._rest_task = asyncio.create_task(self._rest_server.serve(sockets=[sock] if sock is not None else None))
        while not self._rest_server.started:
            if self._rest_task.done():
                self._rest_task.result()
            await asyncio.sleep(0.01)
        self.rest_url = f"http://127.0.0.1:{number}"
        return self.rest_url

    def end_call(self, call_id: str) -> bool:
        """The bridge hung the call up (REST or in band). False for a call that is unknown or already over."""
        call = self.calls.get(call_id)
        if call is None or call.ended.is_set():
            return False
        call.ended.set()
        return True

    @staticmethod
    async def json_body(request: Request) -> object | None:
        """A REST request's JSON body as sent (None: not JSON); each carrier's API checks its shape its own way."""
        try:
            body: object = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return None
        return body

    def dial_taken(self, call_id: str, rings: Coroutine[Any, Any, CallResult | None]) -> None:
        """A dial the carrier's API took: ``rings`` (its ringing, then the call or its failure) runs as ``dialled[call_id]``."""
        self.dialled_at.append(time.monotonic())
        self.dialled[call_id] = asyncio.create_task(rings)

    async def ring(self, call_id: str, callee: Callee, timeout_s: float) -> RingEnd:
        """A dialled call rings until its ``Callee`` answers (or says busy, or fails) or ``timeout_s`` passes, or the
        bridge stops it (``stop_ringing``); how it ended. Each carrier tells the bridge in its own words."""
        ring_s = timeout_s if callee.outcome == "no_answer" else min(callee.ring_ms / 1000, timeout_s)
        stopped = self._ringing[call_id] = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), ring_s)
        finally:
            del self._ringing[call_id]
        if stopped.is_set():
            return "canceled"
        if callee.outcome == "answers" and callee.ring_ms <= timeout_s * 1000:
            return "answered"
        return "busy" if callee.outcome == "busy" else "fails" if callee.outcome == "fails" else "no_answer"

    async def take_answered(self, call_id: str, to: str, callee: Callee) -> CallResult | None:
        """A dialled call answered: it runs as an inbound call does (its ``Callee``'s script) — or, where a load test
        set ``on_answered``, that runs it (None)."""
        if self.on_answered is not None:
            self.on_answered(to, call_id)
            return None
        return await self.place_call(callee.script, call_id=call_id)

    def stop_ringing(self, call_id: str) -> bool:
        """The bridge gives up on a dialled call that rings (its API's cancel): False where it is not ringing."""
        ringing = self._ringing.get(call_id)
        if ringing is None:
            return False
        ringing.set()
        return True

    async def stop_dialled(self) -> None:
        """The calls the bridge dialled and still going here stop (the carrier is closing)."""
        for ringing in self.dialled.values():
            ringing.cancel()
        await asyncio.gather(*self.dialled.values(), return_exceptions=True)

    async def aclose(self) -> None:
        await self.stop_dialled()
        if self._rest_server is not None and self._rest_task is not None:
            self._rest_server.should_exit = True
            await self._rest_task

    # ------------------------------------------------------------------ call

    async def place_call(self, script: CallerScript, *, call_id: str | None = None) -> CallResult:
        """One call from answer to hang-up (``call_id``: one the bridge dialled); what happened and what was heard."""
        started = time.monotonic()

        def now_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        call_id = call_id or self.new_call_id()
        result = CallResult(call_id)
        call = self.calls[call_id] = SimCall(call_id, result, now_ms)
        interrupt = script.interruption if script.interruption is not None else script.utterances[0][1] if script.utterances else b""
        ear = CallerSide(script, caller_timeline(script), interrupt if script.interrupt_after_agent_ms is not None else b"", result, now_ms)
        drops = sorted(script.drop_stream_at_ms)
        frame_index = 0
        stream: SimStream | None = None
        receiver: asyncio.Task[None] | None = None
        try:
            while True:
                if call.ended.is_set():
                    result.hung_up_by = "bridge"
                    result.log(now_ms(), "bridge", "hung up the call")
                    if stream is not None:
                        await stream.send_stop()
                    break
                if stream is None or stream.dropped:
                    reason: OpenReason = "answer"
                    if stream is not None:
                        reason = "network_drop" if stream.network_drop else "closed_by_bridge"
                        if receiver is not None:
                            await asyncio.gather(receiver, return_exceptions=True)
                    if self.route is not None:
                        self.bridge_url = self.route(reason).rstrip("/")
                    stream = await self.open_stream(call, reason)
                    if stream is None:
                        if reason == "closed_by_bridge" or call.ended.is_set():
                            result.hung_up_by = result.hung_up_by or "bridge"  # the flow ended what the bridge closed
                        break
                    result.streams.append(stream.stream_id)
                    result.log(now_ms(), self.provider, f"stream {stream.stream_id} started on call {call_id}")
                    receiver = asyncio.create_task(self._receive(stream))
                # one 20 ms tick, anchored to the call's start so nothing drifts
                target = started + (frame_index + 1) * FRAME_MS / 1000
                await asyncio.sleep(max(0.0, target - time.monotonic()))
                t = frame_index * FRAME_MS
                frame_index += 1
                heard, agent = stream.play(target + FRAME_MS / 1000)  # a late tick plays what had come by its end
                ear.hears(t, heard, agent)
                audio = ear.says(t)
                if self.on_media_sent is not None:
                    self.on_media_sent(audio)
                if not stream.dropped:
                    await _say(stream, script, t, audio)
                for at, digit in script.dtmf:
                    if at == t and not stream.dropped:
                        await stream.send_dtmf(digit)
                        result.log(now_ms(), "caller", f"presses {digit}")
                unknown = self.unknown_event(stream) if t in script.unknown_events_at_ms and not stream.dropped else None
                if unknown is not None:
                    await stream.conn.send(unknown)
                    result.log(now_ms(), self.provider, "sends an event type it added since")
                if drops and t >= drops[0]:
                    drops.pop(0)
                    skipped = await self._drop(stream, receiver, script, result, now_ms)
                    if skipped is None:  # the caller hung up meanwhile
                        break
                    frame_index += skipped
                    continue
                if ear.done(t):
                    result.hung_up_by = "caller"
                    result.log(now_ms(), "caller", "hangs up")
                    await stream.send_stop()
                    break
        finally:
            if receiver is not None:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
            if stream is not None:
                await stream.conn.close()
            call.ended.set()
        return result

    @staticmethod
    async def _drop(
        stream: SimStream, receiver: asyncio.Task[None] | None, script: CallerScript, result: CallResult, now_ms: Callable[[], int]
    ) -> int | None:
        """The stream's connection drops with no goodbye; the carrier's redirect takes ``script.redirect_delay_ms``,
        which the caller hears as silence. The ticks that delay skips; None where the caller hangs up meanwhile
        (``hangs_up_while_dropped``: no redirect follows)."""
        result.log(now_ms(), "network", f"media connection {stream.stream_id} drops (no goodbye)")
        stream.network_drop = stream.dropped = True
        stream.conn.abort()
        if receiver is not None:
            await asyncio.gather(receiver, return_exceptions=True)
        if script.hangs_up_while_dropped:
            result.hung_up_by = "caller"
            result.log(now_ms(), "caller", "hangs up while the media connection is down")
            return None
        if not script.redirect_delay_ms:
            return 0
        await asyncio.sleep(script.redirect_delay_ms / 1000)
        skipped = script.redirect_delay_ms // FRAME_MS
        result.heard += bytes(skipped * 320)
        return skipped

    async def _receive(self, stream: SimStream) -> None:
        async for message in stream.conn.messages():
            if self.on_message is not None:
                self.on_message(message)
            stream.receive(message)
        stream.dropped = True  # closed (by the bridge, unless it was our network drop)


async def _say(stream: SimStream, script: CallerScript, t: int, audio: bytes) -> None:
    """The caller's 20 ms at ``t``: ``audio`` (8 kHz), or the script's wideband audio where the stream is at 16 kHz."""
    if script.wideband is not None and stream.rate_hz == 16000:
        await stream.send_audio_at_rate(script.wideband[t * 32 : (t + FRAME_MS) * 32].ljust(FRAME_MS * 32, b"\x00"))
    else:
        await stream.send_audio(audio)
