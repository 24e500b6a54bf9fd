"""A simulated Twilio, faithful to the wire (telephony-protocols.md §1), for the demo, the tests and load tests.

It does what Twilio does for an inbound call on ``<Connect><Stream>``:
- POSTs the signed answer webhook, parses the TwiML, follows ``<Redirect>``
  when a stream ends without the call ending (and stops at ``<Hangup/>``);
- opens the media websocket with ``X-Twilio-Signature`` over the ``wss`` URL,
  sends ``connected`` and ``start`` (the ``<Parameter>`` values in
  ``customParameters``), then a 20 ms μ-law ``media`` frame every 20 ms at real
  time — the caller's speech, or silence — with string ``sequenceNumber``,
  ``chunk`` and ``timestamp`` as Twilio sends them; ``dtmf`` and ``stop``;
- plays what the bridge sends at real time, 20 ms at a time, from a queue;
  echoes each ``mark`` when playback reaches it (at once if nothing is
  queued) and, on ``clear``, drops the queue and echoes every pending mark;
  anything but ``media`` / ``mark`` / ``clear`` with the right ``streamSid``
  and no extra fields is recorded as a 31951 warning, a binary frame as 31950;
- serves the REST hang-up (``POST …/Calls/{CallSid}.json`` ``Status=completed``,
  basic auth): the call ends, the stream gets ``stop``;
- can drop the media socket mid-call (no ``stop``), as a network failure does.

What the caller heard (the played frames, and silence between) is kept as PCM16 8 kHz.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from callbridge.codecs import pcm16_to_ulaw, ulaw_to_pcm16

__all__ = ["CallResult", "CallerScript", "MediaStream", "SimulatedTwilio", "TimelineEvent", "answer_and_stream"]

FRAME_MS = 20
FRAME_BYTES = 160
_SILENCE = b"\xff" * FRAME_BYTES
_OUTBOUND_KEYS = {"media": {"event", "streamSid", "media"}, "mark": {"event", "streamSid", "mark"}, "clear": {"event", "streamSid"}}


@dataclass(frozen=True, slots=True)
class CallerScript:
    """What the caller does. Times are ms from the moment the call is placed."""

    utterances: tuple[tuple[int, bytes], ...] = ()
    """(start_ms, PCM16 8 kHz) the caller says."""
    dtmf: tuple[tuple[int, str], ...] = ()
    drop_stream_at_ms: tuple[int, ...] = ()
    """Drop the media socket at these times (no ``stop``); the call follows the TwiML ``<Redirect>``."""
    hangup_at_ms: int | None = None
    """The caller hangs up then; None: 1.5 s after the agent last finished speaking, at most ``max_call_ms``."""
    max_call_ms: int = 30_000
    interrupt_after_agent_ms: int | None = None
    """Say the first utterance again this long after the agent starts speaking (a barge-in)."""
    redirect_delay_ms: int = 0
    """How long Twilio takes, after a stream drops, to run ``<Redirect>`` and open the next one."""


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    at_ms: int
    who: str
    what: str


@dataclass
class CallResult:
    call_sid: str
    heard: bytearray = field(default_factory=bytearray)
    """PCM16 8 kHz: what the caller heard, frame by frame from the call's start."""
    timeline: list[TimelineEvent] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    marks_echoed: list[str] = field(default_factory=list)
    clears: list[int] = field(default_factory=list)
    """At each clear: how many ms of agent audio it dropped."""
    played_ms_at_clear: list[int] = field(default_factory=list)
    """At each clear: agent audio played (ms) on the stream so far."""
    hung_up_by: str | None = None
    agent_speech_ms: int = 0

    def log(self, at_ms: int, who: str, what: str) -> None:
        self.timeline.append(TimelineEvent(at_ms, who, what))

    def render(self) -> str:
        return "\n".join(f"{e.at_ms / 1000:8.3f} s  {e.who:<7} {e.what}" for e in self.timeline)


@dataclass(frozen=True, slots=True)
class MediaStream:
    """A media websocket Twilio opened for a call, after ``connected`` and ``start``."""

    ws: ClientConnection
    stream_sid: str


async def answer_and_stream(
    http: httpx.AsyncClient, validator: RequestValidator, bridge_url: str, params: dict[str, str]
) -> MediaStream | str:
    """What Twilio does when a call comes in (or a ``<Redirect>`` runs): POST the signed answer webhook, and if
    the TwiML says ``<Connect><Stream>``, open that websocket (signed over its URL, no parameters) and send
    ``connected`` and ``start`` with the ``<Parameter>`` values. Returns why not otherwise (HTTP status, verb)."""
    url = bridge_url + "/twilio/voice"
    response = await http.post(url, data=params, headers={"X-Twilio-Signature": validator.compute_signature(url, params)})
    if response.status_code != 200:
        return f"answer webhook failed: HTTP {response.status_code}"
    root = ET.fromstring(response.text)
    stream_el = root.find("./Connect/Stream")
    if stream_el is None:
        return f"TwiML <{root[0].tag if len(root) else 'nothing'}>: the call ends"
    stream_url = stream_el.attrib["url"]
    parameters = {p.attrib["name"]: p.attrib["value"] for p in stream_el.findall("Parameter")}
    signature = validator.compute_signature(stream_url, {})
    ws = await connect(stream_url, additional_headers={"X-Twilio-Signature": signature}, compression=None)
    stream_sid = "MZ" + secrets.token_hex(16)
    start = {
        "streamSid": stream_sid,
        "accountSid": params["AccountSid"],
        "callSid": params["CallSid"],
        "tracks": ["inbound"],
        "customParameters": parameters,
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    }
    await ws.send('{"event":"connected","protocol":"Call","version":"1.0.0"}')
    await ws.send(orjson.dumps({"event": "start", "sequenceNumber": "1", "start": start, "streamSid": stream_sid}).decode())
    return MediaStream(ws, stream_sid)


class _Stream:
    """One media websocket of the call: what Twilio keeps per stream."""

    def __init__(self, ws: ClientConnection, stream_sid: str) -> None:
        self.ws = ws
        self.sid = stream_sid
        self.sequence = 0
        self.chunk = 0
        self.media_ms = 0
        self.queue = bytearray()
        self.pending_marks: list[tuple[int, str]] = []
        """(byte position in ``queue`` where the mark falls, name)."""
        self.played_bytes = 0
        """Agent audio played on this stream."""
        self.dropped = False

    def next_sequence(self) -> str:
        self.sequence += 1
        return str(self.sequence)


class SimulatedTwilio:
    """Twilio's side of inbound calls, against a bridge at ``bridge_url`` (its public base URL)."""

    def __init__(self, bridge_url: str, auth_token: str, *, account_sid: str | None = None) -> None:
        self.bridge_url = bridge_url.rstrip("/")
        self.auth_token = auth_token
        self.account_sid = account_sid or "AC" + secrets.token_hex(16)
        self._validator = RequestValidator(auth_token)
        self._http = httpx.AsyncClient(timeout=10.0)
        self._hangups: dict[str, asyncio.Event] = {}
        self._network_drops: set[str] = set()
        self.on_media_sent: Callable[[bytes], None] | None = None
        """Called with each caller ``media`` payload as it leaves (benchmarks time the bridge with it)."""
        self.on_message: Callable[[str | bytes], None] | None = None
        """Called with each message the bridge sends, as it arrives."""
        self.rest_url: str | None = None
        self._rest_server: uvicorn.Server | None = None
        self._rest_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- REST

    async def start_rest(self, port: int) -> str:
        """Serve the REST API's hang-up on 127.0.0.1:``port``; returns its base URL."""
        app = Starlette(routes=[Route("/2010-04-01/Accounts/{account}/Calls/{call}.json", self._rest_call, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off", access_log=False)
        self._rest_server = uvicorn.Server(config)
        self._rest_task = asyncio.create_task(self._rest_server.serve())
        while not self._rest_server.started:
            if self._rest_task.done():
                self._rest_task.result()
            await asyncio.sleep(0.01)
        self.rest_url = f"http://127.0.0.1:{port}"
        return self.rest_url

    async def _rest_call(self, request: Request) -> Response:
        expected = "Basic " + base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if request.headers.get("authorization") != expected or request.path_params["account"] != self.account_sid:
            return JSONResponse({"code": 20003, "message": "Authenticate"}, status_code=401)
        form = await request.form()
        ended = self._hangups.get(request.path_params["call"])
        if ended is None or ended.is_set():
            return JSONResponse({"code": 20404, "message": "not found"}, status_code=404)
        if form.get("Status") != "completed":
            return JSONResponse({"code": 21220, "message": "Invalid call state"}, status_code=400)
        ended.set()
        return JSONResponse({"sid": request.path_params["call"], "status": "completed"})

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._rest_server is not None and self._rest_task is not None:
            self._rest_server.should_exit = True
            await self._rest_task

    # ----------------------------------------------------------------- call

    async def place_call(self, script: CallerScript) -> CallResult:
        """One inbound call from answer to hang-up; returns what happened and what the caller heard."""
        call_sid = "CA" + secrets.token_hex(16)
        result = CallResult(call_sid)
        ended = self._hangups[call_sid] = asyncio.Event()
        started = time.monotonic()

        def now_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        caller = self._caller_timeline(script)
        interrupt = script.utterances[0][1] if script.interrupt_after_agent_ms is not None and script.utterances else b""
        interrupt_at: int | None = None
        agent_started_at: int | None = None
        agent_last_heard_at: int | None = None
        drops = sorted(script.drop_stream_at_ms)
        frame_index = 0
        stream: _Stream | None = None
        receiver: asyncio.Task[None] | None = None
        try:
            while True:
                if ended.is_set():
                    result.hung_up_by = "bridge"
                    result.log(now_ms(), "bridge", "hung up the call (REST Status=completed)")
                    if stream is not None:
                        await self._stop(stream, call_sid)
                    break
                if stream is None or stream.dropped:
                    if stream is not None and stream.ws.close_code is not None and stream.sid not in self._network_drops:
                        result.log(now_ms(), "twilio", "the bridge closed the stream: following <Redirect>")
                    stream = await self._connect(call_sid, result, now_ms())
                    if stream is None:
                        break
                    receiver = asyncio.create_task(self._receive(stream, result, now_ms, ended))
                # one 20 ms tick, anchored to the call's start so nothing drifts
                target = started + (frame_index + 1) * FRAME_MS / 1000
                await asyncio.sleep(max(0.0, target - time.monotonic()))
                t = frame_index * FRAME_MS
                frame_index += 1
                # what the caller hears in this frame
                frame = self._play(stream, result, now_ms())
                if frame is not _SILENCE:
                    if agent_started_at is None or (agent_last_heard_at is not None and t - agent_last_heard_at > 200):
                        agent_started_at = t
                        result.log(now_ms(), "agent", "starts speaking (caller hears audio)")
                        if script.interrupt_after_agent_ms is not None and interrupt_at is None:
                            interrupt_at = t + script.interrupt_after_agent_ms
                    agent_last_heard_at = t
                    result.agent_speech_ms += FRAME_MS
                elif agent_last_heard_at is not None and t - agent_last_heard_at == 200:
                    result.log(now_ms(), "agent", "stops speaking")
                result.heard += ulaw_to_pcm16(frame)
                # what the caller says in this frame
                for start_ms, pcm in script.utterances:
                    if start_ms == t:
                        result.log(now_ms(), "caller", f"speaks ({len(pcm) // 16} ms)")
                speech = caller[t * 16 : t * 16 + 320] if t * 16 < len(caller) else b""
                if interrupt_at is not None and interrupt_at <= t < interrupt_at + len(interrupt) // 16:
                    if t == interrupt_at:
                        result.log(now_ms(), "caller", f"talks over the agent ({len(interrupt) // 16} ms)")
                    speech = interrupt[(t - interrupt_at) * 16 : (t - interrupt_at) * 16 + 320]
                payload = pcm16_to_ulaw(speech.ljust(320, b"\x00")) if speech else _SILENCE
                await self._send_media(stream, payload)
                for at, digit in script.dtmf:
                    if at == t:
                        await self._send(stream, {"event": "dtmf", "streamSid": stream.sid, "sequenceNumber": stream.next_sequence(), "dtmf": {"track": "inbound_track", "digit": digit}})
                        result.log(now_ms(), "caller", f"presses {digit}")
                if drops and t >= drops[0]:
                    drops.pop(0)
                    result.log(now_ms(), "network", f"media socket {stream.sid} drops (no stop)")
                    self._network_drops.add(stream.sid)
                    stream.dropped = True
                    if stream.ws.transport is not None:
                        stream.ws.transport.abort()
                    if receiver is not None:
                        await asyncio.gather(receiver, return_exceptions=True)
                    if script.redirect_delay_ms:
                        await asyncio.sleep(script.redirect_delay_ms / 1000)
                        skipped = script.redirect_delay_ms // FRAME_MS
                        frame_index += skipped
                        result.heard += bytes(skipped * 320)
                    continue
                caller_end = max(len(caller), (interrupt_at + len(interrupt) // 16) * 16 if interrupt_at is not None else 0)
                if self._caller_done(script, t, caller_end, agent_last_heard_at):
                    result.hung_up_by = "caller"
                    result.log(now_ms(), "caller", "hangs up (stop)")
                    await self._stop(stream, call_sid)
                    break
        finally:
            if receiver is not None:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
            if stream is not None:
                await stream.ws.close()
            ended.set()
        return result

    def _caller_done(self, script: CallerScript, t: int, caller_len: int, agent_last_heard_at: int | None) -> bool:
        if script.hangup_at_ms is not None:
            return t >= script.hangup_at_ms
        if t >= script.max_call_ms:
            return True
        return agent_last_heard_at is not None and t * 16 >= caller_len and t - agent_last_heard_at >= 1500

    @staticmethod
    def _caller_timeline(script: CallerScript) -> bytes:
        end = max((start * 16 + len(pcm) for start, pcm in script.utterances), default=0)
        timeline = bytearray(end)
        for start, pcm in script.utterances:
            timeline[start * 16 : start * 16 + len(pcm)] = pcm
        return bytes(timeline)

    async def _connect(self, call_sid: str, result: CallResult, at_ms: int) -> _Stream | None:
        """POST the answer webhook and open the stream it names; None when the TwiML ends the call."""
        params = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "CallSid": call_sid,
            "CallStatus": "in-progress" if result.streams else "ringing",
            "Direction": "inbound",
            "From": "+15005550006",
            "To": "+15005550001",
            "Called": "+15005550001",
            "Caller": "+15005550006",
        }
        opened = await answer_and_stream(self._http, self._validator, self.bridge_url, params)
        if isinstance(opened, str):
            result.log(at_ms, "twilio", opened)
            return None
        stream = _Stream(opened.ws, opened.stream_sid)
        stream.sequence = 1  # start was message 1
        result.streams.append(stream.sid)
        result.log(at_ms, "twilio", f"stream {stream.sid} started on call {call_sid}")
        return stream

    async def _send(self, stream: _Stream, payload: dict[str, Any]) -> None:
        if stream.dropped:
            return
        try:
            await stream.ws.send(orjson.dumps(payload).decode())
        except ConnectionClosed:
            stream.dropped = True

    async def _send_media(self, stream: _Stream, payload: bytes) -> None:
        stream.chunk += 1
        media = {"track": "inbound", "chunk": str(stream.chunk), "timestamp": str(stream.media_ms), "payload": base64.b64encode(payload).decode()}
        stream.media_ms += FRAME_MS
        if self.on_media_sent is not None:
            self.on_media_sent(payload)
        await self._send(stream, {"event": "media", "sequenceNumber": stream.next_sequence(), "media": media, "streamSid": stream.sid})

    async def _stop(self, stream: _Stream, call_sid: str) -> None:
        await self._send(stream, {"event": "stop", "sequenceNumber": stream.next_sequence(), "stop": {"accountSid": self.account_sid, "callSid": call_sid}, "streamSid": stream.sid})
        await stream.ws.close()

    # ------------------------------------------------------------- playback

    def _play(self, stream: _Stream, result: CallResult, at_ms: int) -> bytes:
        """Take the next 20 ms from the playback queue (silence when empty); echo the marks it passes."""
        if len(stream.queue) >= FRAME_BYTES:
            frame = bytes(stream.queue[:FRAME_BYTES])
            del stream.queue[:FRAME_BYTES]
            consumed = FRAME_BYTES
        elif stream.queue:
            frame = bytes(stream.queue).ljust(FRAME_BYTES, b"\xff")
            consumed = len(stream.queue)
            stream.queue.clear()
        else:
            frame, consumed = _SILENCE, 0
        stream.played_bytes += consumed
        reached = [name for position, name in stream.pending_marks if position <= consumed]
        stream.pending_marks = [(position - consumed, name) for position, name in stream.pending_marks if position > consumed]
        for name in reached:
            self._echo_mark(stream, result, name)
        return frame

    def _echo_mark(self, stream: _Stream, result: CallResult, name: str) -> None:
        result.marks_echoed.append(name)
        asyncio.get_running_loop().create_task(
            self._send(stream, {"event": "mark", "sequenceNumber": stream.next_sequence(), "streamSid": stream.sid, "mark": {"name": name}})
        )

    async def _receive(self, stream: _Stream, result: CallResult, now_ms: Any, ended: asyncio.Event) -> None:
        try:
            async for raw in stream.ws:
                if self.on_message is not None:
                    self.on_message(raw)
                if isinstance(raw, bytes):
                    result.warnings.append("31950 binary frame")
                    continue
                try:
                    message = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    result.warnings.append("31951 not JSON")
                    continue
                event = message.get("event") if isinstance(message, dict) else None
                if event not in _OUTBOUND_KEYS or set(message) != _OUTBOUND_KEYS[event] or message.get("streamSid") != stream.sid:
                    result.warnings.append(f"31951 invalid message {raw[:80]}")
                    continue
                if event == "media":
                    media = message["media"]
                    if set(media) != {"payload"}:
                        result.warnings.append("31951 media with fields other than payload")
                        continue
                    try:
                        stream.queue += binascii.a2b_base64(media["payload"], strict_mode=True)
                    except (binascii.Error, TypeError):
                        result.warnings.append("31951 media payload is not base64")
                elif event == "mark":
                    name = message["mark"].get("name") if isinstance(message["mark"], dict) else None
                    if not isinstance(name, str):
                        result.warnings.append("31951 mark without a name")
                    elif not stream.queue:
                        self._echo_mark(stream, result, name)
                    else:
                        stream.pending_marks.append((len(stream.queue), name))
                else:
                    dropped_ms = len(stream.queue) // 8
                    result.clears.append(dropped_ms)
                    result.played_ms_at_clear.append(stream.played_bytes // 8)
                    result.log(now_ms(), "bridge", f"clear: {dropped_ms} ms of queued agent audio dropped")
                    stream.queue.clear()
                    pending, stream.pending_marks = stream.pending_marks, []
                    for _, name in pending:
                        self._echo_mark(stream, result, name)
        except ConnectionClosed:
            pass
        if not ended.is_set() and not stream.dropped:
            stream.dropped = True  # the bridge closed the socket: <Connect> ends, the TwiML goes on
