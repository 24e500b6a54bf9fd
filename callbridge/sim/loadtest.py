"""``callbridge loadtest``: many simulated Twilio calls at real time against a bridge, and what it did to them.

Run it against a bridge whose engine is the ``loopback`` agent (each frame of
the caller's audio straight back): every second each call sends a click (a
20 ms loud frame) and the time until the click comes back as agent audio is
the round trip the bridge and engine add. Also measured: the first agent
audio after the first caller frame, frames and clicks that never came back,
failed calls, and — with ``--server-pid`` — the server's CPU-ms per
call-second and RSS.

The generator must not be the bottleneck: one timer ticks every 20 ms for all
calls (no task or sleep per call per frame), the media messages are
pre-encoded, and the generator reports its own tick lag and CPU.
Playback is simulated as Twilio does it (a queue drained at real time, marks
echoed when reached, all pending marks echoed on ``clear``), so the bridge's
pacing and marks behave as on a real call.
"""

from __future__ import annotations

import asyncio
import base64
import os
import resource
import secrets
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from callbridge.codecs import pcm16_to_ulaw, ulaw_to_pcm16
from callbridge.sim.twilio import answer_and_stream

__all__ = ["LoadReport", "LoadTest", "LoadTestOptions"]

FRAME_MS = 20
_CLICK_PCM = (20000).to_bytes(2, "little", signed=True) * 160
_LOUD = 8000


@dataclass(frozen=True, slots=True)
class LoadTestOptions:
    url: str
    """The bridge's public base URL (``server.public_url``)."""
    auth_token: str
    calls: int = 10
    ramp_s: float = 5.0
    duration_s: float = 20.0
    click_every_ms: int = 1000
    dtmf_every_ms: int | None = None
    drop_every_ms: int | None = None
    """Drop each call's media socket this often (no ``stop``); the call comes back through its webhook and the
    bridge resumes its engine session."""
    server_pid: int | None = None
    progress: bool = True


@dataclass
class _Call:
    index: int
    call_sid: str
    ws: ClientConnection | None = None
    stream_sid: str = ""
    sequence: int = 0
    frames_sent: int = 0
    stream_frames: int = 0
    """Frames sent on the current stream: Twilio's chunk and timestamp restart with each stream."""
    frames_received: int = 0
    started_at: float = 0.0
    first_audio_at: float | None = None
    clicks_sent: deque[float] = field(default_factory=deque)
    clicks_returned: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    queued_bytes: int = 0
    played_bytes: int = 0
    pending_marks: deque[tuple[int, str]] = field(default_factory=deque)
    """(position in played bytes where the mark falls, name)."""
    last_loud: bool = False
    reconnects: int = 0
    reconnecting: bool = False
    failed: str | None = None
    done: bool = False


@dataclass
class LoadReport:
    calls: int
    failed_calls: int
    duration_s: float
    round_trip_ms: dict[str, float]
    first_audio_ms: dict[str, float]
    clicks_sent: int
    clicks_returned: int
    frames_sent: int
    frames_received: int
    reconnects: int
    generator_tick_lag_ms: dict[str, float]
    generator_cpu_ms_per_call_second: float
    server_cpu_ms_per_call_second: float | None
    server_rss_mb: float | None
    failures: list[str]

    def render(self) -> str:
        def q(stats: dict[str, float]) -> str:
            return " ".join(f"{k} {v:.1f}" for k, v in stats.items()) if stats else "n/a"

        lines = [
            f"calls: {self.calls} ({self.failed_calls} failed), {self.duration_s:.1f} s",
            f"round trip, click sent → click back (ms): {q(self.round_trip_ms)}",
            f"first agent audio after the first caller frame (ms): {q(self.first_audio_ms)}",
            f"clicks: {self.clicks_returned}/{self.clicks_sent} came back; frames: {self.frames_received}/{self.frames_sent}; "
            f"reconnects: {self.reconnects}",
            f"generator: tick lag (ms) {q(self.generator_tick_lag_ms)}; CPU {self.generator_cpu_ms_per_call_second:.2f} ms per call-second",
        ]
        if self.server_cpu_ms_per_call_second is not None:
            lines.append(f"server: CPU {self.server_cpu_ms_per_call_second:.2f} ms per call-second, RSS {self.server_rss_mb:.1f} MB")
        lines += [f"  failed: {failure}" for failure in self.failures[:10]]
        return "\n".join(lines)


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]

    return {"p50": statistics.median(ordered), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def _server_cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _server_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class LoadTest:
    def __init__(self, options: LoadTestOptions) -> None:
        self.options = options
        self.base = options.url.rstrip("/")
        self._validator = RequestValidator(options.auth_token)
        self._account_sid = "AC" + secrets.token_hex(16)
        self._calls: list[_Call] = []
        self._silence_b64 = base64.b64encode(b"\xff" * 160).decode()
        self._click_b64 = base64.b64encode(pcm16_to_ulaw(_CLICK_PCM)).decode()
        self._lags_ms: list[float] = []
        self._receivers: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient

    async def run(self) -> LoadReport:
        options = self.options
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        server_before = _server_cpu_ms(options.server_pid) if options.server_pid else None
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=10.0) as http:
            connecting = [
                asyncio.create_task(self._start_call(http, index, started + index * options.ramp_s / max(1, options.calls)))
                for index in range(options.calls)
            ]
            ticker = asyncio.create_task(self._tick_forever(started))
            await asyncio.gather(*connecting)
            await ticker
        elapsed = time.monotonic() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        call_seconds = max(1e-9, sum(min(options.duration_s, elapsed) for c in self._calls if c.failed is None))
        generator_cpu = (cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime) * 1000
        server_cpu = None
        rss = None
        if options.server_pid and server_before is not None:
            server_cpu = (_server_cpu_ms(options.server_pid) - server_before) / call_seconds
            rss = _server_rss_mb(options.server_pid)
        return LoadReport(
            calls=options.calls,
            failed_calls=sum(c.failed is not None for c in self._calls),
            duration_s=elapsed,
            round_trip_ms=_quantiles([lat for c in self._calls for lat in c.latencies_ms]),
            first_audio_ms=_quantiles([(c.first_audio_at - c.started_at) * 1000 for c in self._calls if c.first_audio_at]),
            clicks_sent=sum(c.clicks_returned + len(c.clicks_sent) for c in self._calls),
            reconnects=sum(c.reconnects for c in self._calls),
            clicks_returned=sum(c.clicks_returned for c in self._calls),
            frames_sent=sum(c.frames_sent for c in self._calls),
            frames_received=sum(c.frames_received for c in self._calls),
            generator_tick_lag_ms=_quantiles(self._lags_ms),
            generator_cpu_ms_per_call_second=generator_cpu / call_seconds,
            server_cpu_ms_per_call_second=server_cpu,
            server_rss_mb=rss,
            failures=[f"call {c.index}: {c.failed}" for c in self._calls if c.failed],
        )

    # --------------------------------------------------------------- calls

    async def _start_call(self, http: httpx.AsyncClient, index: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        call = _Call(index, "CA" + secrets.token_hex(16))
        self._calls.append(call)
        self._http = http
        await self._connect(call)
        call.started_at = time.monotonic()

    async def _connect(self, call: _Call) -> None:
        """The answer webhook, the signed media socket, ``connected`` and ``start``: a new stream of the call."""
        try:
            params = {"AccountSid": self._account_sid, "CallSid": call.call_sid, "From": "+15005550006", "To": "+15005550001"}
            opened = await answer_and_stream(self._http, self._validator, self.base, params)
            if isinstance(opened, str):
                raise RuntimeError(opened)
            call.ws, call.stream_sid = opened.ws, opened.stream_sid
            call.sequence = 1
            call.stream_frames = 0
            call.queued_bytes = 0
            call.pending_marks.clear()
            receiver = asyncio.create_task(self._receive(call, call.ws))
            self._receivers.add(receiver)
            receiver.add_done_callback(self._receivers.discard)
        except (httpx.HTTPError, OSError, RuntimeError, ConnectionClosed, TimeoutError) as exc:
            call.failed = f"setup: {exc!r}"
            call.done = True
        finally:
            call.reconnecting = False

    async def _drop(self, call: _Call) -> None:
        """The network drops the media socket (no ``stop``); the call's TwiML redirect opens a new stream."""
        assert call.ws is not None
        call.reconnecting = True
        call.reconnects += 1
        call.clicks_sent.clear()  # in flight on the dropped socket: neither back nor lost
        if call.ws.transport is not None:
            call.ws.transport.abort()
        task = asyncio.create_task(self._connect(call))
        self._receivers.add(task)
        task.add_done_callback(self._receivers.discard)

    async def _receive(self, call: _Call, ws: ClientConnection) -> None:
        try:
            async for raw in ws:
                if isinstance(raw, bytes):
                    continue
                message = orjson.loads(raw)
                event = message.get("event")
                if event == "media":
                    payload = base64.b64decode(message["media"]["payload"])
                    now = time.monotonic()
                    call.frames_received += 1
                    call.queued_bytes += len(payload)
                    if call.first_audio_at is None:
                        call.first_audio_at = now
                    loud = _is_loud(payload)
                    if loud and not call.last_loud and call.clicks_sent:
                        call.latencies_ms.append((now - call.clicks_sent.popleft()) * 1000)
                        call.clicks_returned += 1
                    call.last_loud = loud
                elif event == "mark":
                    name = message["mark"]["name"]
                    if call.queued_bytes == 0:
                        await self._echo(call, name)
                    else:
                        call.pending_marks.append((call.played_bytes + call.queued_bytes, name))
                elif event == "clear":
                    call.queued_bytes = 0
                    while call.pending_marks:
                        await self._echo(call, call.pending_marks.popleft()[1])
        except ConnectionClosed:
            pass
        if not call.done and not call.reconnecting and ws is call.ws:
            call.failed = call.failed or "the bridge closed the stream"
            call.done = True

    async def _echo(self, call: _Call, name: str) -> None:
        assert call.ws is not None
        call.sequence += 1
        payload = {"event": "mark", "sequenceNumber": str(call.sequence), "streamSid": call.stream_sid, "mark": {"name": name}}
        try:
            await call.ws.send(orjson.dumps(payload).decode())
        except ConnectionClosed:
            pass

    # --------------------------------------------------------------- timer

    async def _tick_forever(self, started: float) -> None:
        """One 20 ms timer for every call: send a frame, play 20 ms, echo reached marks, end calls due."""
        options = self.options
        click_every = max(1, options.click_every_ms // FRAME_MS)
        dtmf_every = options.dtmf_every_ms // FRAME_MS if options.dtmf_every_ms else 0
        drop_every = options.drop_every_ms // FRAME_MS if options.drop_every_ms else 0
        tick = 0
        last_progress = started
        end_at = started + options.ramp_s + options.duration_s + 1.0
        while time.monotonic() < end_at or any(not c.done for c in self._calls):
            tick += 1
            target = started + tick * FRAME_MS / 1000
            await asyncio.sleep(max(0.0, target - time.monotonic()))
            now = time.monotonic()
            self._lags_ms.append((now - target) * 1000)
            for call in self._calls:
                if call.done or call.ws is None or call.reconnecting:
                    continue
                if now - call.started_at >= options.duration_s:
                    await self._hang_up(call)
                    continue
                await self._play(call)
                click = call.frames_sent % click_every == click_every // 2
                await self._send_frame(call, click, now)
                if dtmf_every and call.frames_sent % dtmf_every == 0:
                    await self._send_dtmf(call)
                if drop_every and call.frames_sent % drop_every == 0:
                    await self._drop(call)
            if options.progress and now - last_progress >= 5:
                last_progress = now
                up = sum(not c.done and c.ws is not None for c in self._calls)
                rt = _quantiles([lat for c in self._calls for lat in c.latencies_ms])
                print(f"  {now - started:6.1f} s: {up} calls up, round trip p50 {rt.get('p50', 0):.1f} ms p99 {rt.get('p99', 0):.1f} ms", flush=True)

    async def _send_frame(self, call: _Call, click: bool, now: float) -> None:
        assert call.ws is not None
        call.sequence += 1
        timestamp = call.stream_frames * FRAME_MS
        call.frames_sent += 1
        call.stream_frames += 1
        payload = self._click_b64 if click else self._silence_b64
        message = (
            f'{{"event":"media","sequenceNumber":"{call.sequence}","media":{{"track":"inbound","chunk":"{call.stream_frames}",'
            f'"timestamp":"{timestamp}","payload":"{payload}"}},"streamSid":"{call.stream_sid}"}}'
        )
        try:
            await call.ws.send(message)
            if click:
                call.clicks_sent.append(now)
        except ConnectionClosed:
            call.failed = call.failed or "stream closed while sending"
            call.done = True

    async def _send_dtmf(self, call: _Call) -> None:
        assert call.ws is not None
        call.sequence += 1
        message = {"event": "dtmf", "streamSid": call.stream_sid, "sequenceNumber": str(call.sequence), "dtmf": {"track": "inbound_track", "digit": "5"}}
        try:
            await call.ws.send(orjson.dumps(message).decode())
        except ConnectionClosed:
            pass

    async def _play(self, call: _Call) -> None:
        played = min(call.queued_bytes, 160)
        call.queued_bytes -= played
        call.played_bytes += played
        while call.pending_marks and call.pending_marks[0][0] <= call.played_bytes:
            await self._echo(call, call.pending_marks.popleft()[1])

    async def _hang_up(self, call: _Call) -> None:
        assert call.ws is not None
        call.done = True
        call.sequence += 1
        stop = {"event": "stop", "sequenceNumber": str(call.sequence), "stop": {"accountSid": self._account_sid, "callSid": call.call_sid}, "streamSid": call.stream_sid}
        try:
            await call.ws.send(orjson.dumps(stop).decode())
            await call.ws.close()
        except ConnectionClosed:
            pass


_LOUD_CODES = bytes(code for code in range(256) if abs(int.from_bytes(ulaw_to_pcm16(bytes([code])), "little", signed=True)) > _LOUD)


def _is_loud(payload: bytes) -> bool:
    """Any μ-law code in the frame louder than the threshold (no Python loop over samples)."""
    return len(payload.translate(None, _LOUD_CODES)) < len(payload)


def report_json(report: LoadReport) -> bytes:
    data: dict[str, Any] = asdict(report)
    return orjson.dumps(data, option=orjson.OPT_INDENT_2)
