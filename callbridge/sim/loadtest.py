"""``callbridge loadtest``: many simulated calls at real time against a bridge, on any carrier, and what the bridge
did to them.

The calls are placed by the carrier's simulator (``callbridge.carriers``): its real answer flow, signatures,
wire and quirks (``SimulatedCarrier.open_stream``), and its playback model with markers and flushes
(``SimStream.play`` / ``receive``). Only the caller's timeline is the load tester's own, and it is lean: one timer
ticks every 20 ms for all calls — per tick and call, ``stream.play()`` (20 ms of what the caller hears, markers
echoed) and ``stream.send_audio(frame)`` — with no task or sleep per call per frame beyond each stream's receiver.

Two modes:
- clicks (the ``loopback`` agent: every caller frame straight back): the caller talks (``--audio``, kept below
  a level) and every second one 20 ms frame is a loud click; the time until the click comes back as agent audio
  is the round trip the bridge and engine add (as it arrives at the carrier, and as it would be heard, after what
  was queued before it). Also: the first agent audio after the first caller frame, frames and clicks that never
  came back.
- barge-in (``barge_in_every_ms``, the ``echo`` agent: each utterance said back): the caller talks, and when the
  agent answers, talks over it; the time from the first frame of the interruption to the carrier's flush (or,
  where the carrier has no flush, to the agent's audio stopping) is the barge-in latency, VAD included.

Both report failed calls, reconnects (``drop_every_ms``), protocol warnings the real carrier would have raised,
the generator's own timer lag and CPU, and — with a server PID — the server's CPU-ms per call-second and RSS.

A run's raw samples (``LoadSamples``: every latency, per-call counts, the timer's lags) are kept apart from their
statistics (``LoadSamples.report``), so that several generator processes' runs (``callbridge.sim.loadtest_pool``)
merge into one (``merge_samples``) and ``callbridge.sim.loadtest_plot`` draws them over time.
"""

from __future__ import annotations

import asyncio
import audioop
import contextlib
import os
import resource
import shlex
import time
import zlib
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import urlsplit

import numpy as np
import orjson

from callbridge.carriers import carrier_spec
from callbridge.config import Settings
from callbridge.engine.commands import EngineCommand, TruncateItem
from callbridge.engine.local.engine import LocalEngine, LocalSession
from callbridge.engine.port import ResumeTicket, SessionConfig
from callbridge.sim.carrier import (
    CallResult,
    OpenReason,
    SimCall,
    SimStream,
    SimulatedCarrier,
)
from callbridge.sim.load_probes import (
    FIRST_AUDIO_METRIC,
    first_audio_since,
    scrape_histogram,
    server_cpu_ms,
    server_rss_mb,
)
from callbridge.sim.load_samples import (
    FRAME_MS,
    CallSamples,
    LoadReport,
    LoadSamples,
    merge_samples,
    progress_line,
    report_json,
)
from callbridge.sim.loadtest_dial import Dialling
from callbridge.sim.simulators import simulator_class

__all__ = [
    "CallSamples",
    "LoadReport",
    "LoadSamples",
    "LoadTest",
    "LoadTestOptions",
    "TruncationLog",
    "bridge_env",
    "caller_frames",
    "load_test_samples",
    "merge_samples",
    "progress_line",
    "report_json",
    "run_load_test",
    "secret_from_settings",
    "shard_of",
]

_FRAME_BYTES: Final = 320
"""20 ms of PCM16 8 kHz: what ``SimStream.send_audio`` takes."""
_SILENCE: Final = bytes(_FRAME_BYTES)
_CLICK: Final = (24000 * np.sin(2 * np.pi * 1000 * np.arange(160) / 8000)).round().astype("<i2").tobytes()
"""20 ms of a 1 kHz tone at 24,000 peak: every codec carries it (a DC step, the click before session 45, was
high-passed and spread by Opus's voice mode, so its return was found a packet late on Opus calls)."""
_LOUD: Final = 12000
"""A click is audio above this; the caller's speech is kept below ``_SPEECH_PEAK``."""
_SPEECH_PEAK: Final = 6000
_PAUSE_FRAMES: Final = 50
"""1 s of silence between the caller's utterances in the clicks mode."""
_BARGE_AFTER_MS: Final = 400
"""How long the caller listens to the agent before talking over it."""
_NEW_TURN_AFTER_MS: Final = 1500
"""The caller starts a new utterance when the agent has been silent this long (barge-in mode)."""
_STOPPED_FRAMES: Final = 5
"""Where the carrier has no flush, a barge-in has stopped the agent once its audio stays off this many frames (a
late frame is a gap of one or two)."""
_END_GRACE_S: Final = 30.0
_PAIRING_S: Final = 0.25
"""A flush at the carrier and the bridge's truncation in the engine this close belong to one barge-in."""


class TruncationLog:
    """Wraps the in-process engine's sessions: when the bridge truncates a reply, and to what."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.entries: list[tuple[float, str, int]] = []
        """(monotonic time, session id, ``audio_end_ms``)."""
        original_open, original_resume = engine.open, engine.resume

        async def open_(config: SessionConfig) -> LocalSession:
            return self._wrap(await original_open(config))

        async def resume(ticket: ResumeTicket) -> LocalSession:
            return self._wrap(await original_resume(ticket))

        engine.open = open_  # type: ignore[method-assign]
        engine.resume = resume  # type: ignore[method-assign]

    def _wrap(self, session: LocalSession) -> LocalSession:
        original = session.submit

        async def submit(command: EngineCommand) -> None:
            if isinstance(command, TruncateItem):
                self.entries.append((time.monotonic(), session.session_id, command.audio_end_ms))
            await original(command)

        session.submit = submit  # type: ignore[method-assign]
        return session


@dataclass(frozen=True, slots=True)
class LoadTestOptions:
    calls: int = 10
    ramp_s: float = 5.0
    duration_s: float = 20.0
    click_every_ms: int = 1000
    audio: bytes | None = None
    """What the caller says, PCM16 8 kHz (None: silence between the clicks)."""
    barge_in_every_ms: int | None = None
    """Barge-in mode: talk over the agent at most this often (needs the ``echo`` agent; no clicks)."""
    dtmf_every_ms: int | None = None
    drop_every_ms: int | None = None
    """Drop each call's media connection this often (no goodbye); the carrier opens a new one on the same call and
    the bridge resumes its engine session. Only for carriers that reconnect."""
    server_pid: int | None = None
    metrics_url: str | None = None
    """The bridge's ``/metrics`` (its base URL): what it says about the run (first audio to the engine) is scraped
    before and after. None: not scraped."""
    progress: bool = True
    shard: int = 0
    shards: int = 1
    """One of several generator processes (``callbridge.sim.loadtest_pool``): this one places the calls whose
    index ``i < calls`` has ``i % shards == shard``, with call ids ``shard_of`` maps to it (the parent routes the
    bridge's REST requests about a call by its id)."""
    start_at: float | None = None
    """When the run starts (``time.monotonic()``, the same clock in every process of this machine); None: now."""
    outbound_token: str | None = None
    """The calls are placed (``--outbound``): each a ``POST /calls`` with this token at its time in the ramp (the
    bridge dials at its own pace: ``outbound.calls_per_second``), answered at once by the load test's caller; None:
    the carrier calls the bridge."""
    phases: int = 1
    """The calls' 20 ms clocks: 1, all in step (every call's frame sent at the same instant: a burst of one message per
    call every 20 ms, which queues behind itself — the longest waits at moderate load — but reaches a server in few
    wake-ups, its cheapest CPU); N, spread over N instants ``20 / N`` ms apart (a generator process's calls on them in
    turn), as independent calls' clocks are — each call still one frame every 20 ms. ``bench/RESULTS.md`` (session
    25) measures both."""


@dataclass
class _Call:
    index: int
    sim: SimCall
    stream: SimStream | None = None
    receiver: asyncio.Task[None] | None = None
    frames_sent: int = 0
    audio_bytes_received: int = 0
    messages_received: int = 0
    """Messages the bridge sent the carrier on the call's streams (media, marks, clears…)."""
    bytes_per_frame: int = _FRAME_BYTES
    started_at: float = 0.0
    first_audio_at: float | None = None
    clicks_sent: deque[float] = field(default_factory=deque)
    clicks_returned: int = 0
    last_loud: bool = False
    reconnects: int = 0
    reconnecting: bool = False
    failed: str | None = None
    done: bool = False
    answer_ms: float | None = None
    """The answer: from the carrier's first request (its webhook, or the socket) to the stream, or to no."""
    refused: bool = False
    """The bridge answered with no stream: busy, rejected, an HTTP error, sent elsewhere (admission past capacity);
    not a connection that failed (the simulator raises for those)."""
    # barge-in mode
    talking_from: int | None = None
    """The frame at which the caller's current utterance started (None: listening)."""
    last_talk_end: int = 0
    agent_last_heard: int | None = None
    stopped_at: tuple[float, int] | None = None
    """(when, ms heard) at the first silent tick after a barge-in, until the silence holds (carriers without a flush)."""
    agent_run_ms: int = 0
    last_barge_in: int | None = None
    barge_in_at: float | None = None
    """When the pending barge-in started (monotonic), until the flush."""
    barge_ins: int = 0
    flushes: list[tuple[float, int]] = field(default_factory=list)
    """(when, ms of the agent's reply the caller had heard) at each barge-in's flush."""


def shard_of(call_id: str, shards: int) -> int:
    """Which of ``shards`` generator processes placed the call ``call_id`` (the same in every process)."""
    return zlib.crc32(call_id.encode()) % shards if shards > 1 else 0


def caller_frames(pcm_8k: bytes | None, *, peak: int | None = _SPEECH_PEAK, pause_frames: int = _PAUSE_FRAMES) -> list[bytes]:
    """The caller's audio as 20 ms frames, followed by ``pause_frames`` of silence, scaled so that no sample is
    above ``peak`` (None: as it is). Silence alone for None or empty audio."""
    if not pcm_8k:
        return [_SILENCE]
    pcm = pcm_8k[: len(pcm_8k) // _FRAME_BYTES * _FRAME_BYTES] or pcm_8k.ljust(_FRAME_BYTES, b"\x00")
    loudest = audioop.max(pcm, 2)
    if peak is not None and loudest > peak:
        pcm = audioop.mul(pcm, 2, peak / loudest)
    return [pcm[i : i + _FRAME_BYTES] for i in range(0, len(pcm), _FRAME_BYTES)] + [_SILENCE] * pause_frames


class LoadTest:
    """N calls on ``carrier`` (ready: its REST server started and ``configure``d for the bridge)."""

    def __init__(self, carrier: SimulatedCarrier, options: LoadTestOptions, truncations: TruncationLog | None = None) -> None:
        self.carrier = carrier
        self.options = options
        self.truncations = truncations
        """The in-process engine's record of the bridge's truncations, for the heard-position error."""
        barge = options.barge_in_every_ms is not None
        self._frames = caller_frames(options.audio, peak=None if barge else _SPEECH_PEAK)
        self._speech_frames = len(self._frames) - (_PAUSE_FRAMES if options.audio else 0)
        self._click_every = 0 if barge else max(1, options.click_every_ms // FRAME_MS)
        self._barge_every = (options.barge_in_every_ms or 0) // FRAME_MS
        self._calls: list[_Call] = []
        self._lags_ms: list[float] = []
        self._round_trip_ms: list[float] = []
        self._heard_round_trip_ms: list[float] = []
        self._click_at: list[float] = []
        """When each timed click was sent (monotonic)."""
        self._barge_in_ms: list[float] = []
        self._barge_in_at: list[float] = []
        self.on_progress: Callable[[int, int, list[float], list[float]], None] | None = None
        """Called about once a second with the calls up, the frames sent so far, and the click round trips and
        barge-in → flush latencies measured since the last call (a generator process reports to its parent so)."""
        self._background: set[asyncio.Task[Any]] = set()
        if options.drop_every_ms:
            carrier.reconnect_after_every_drop()
        self._dialling = Dialling(carrier, options.outbound_token) if options.outbound_token is not None else None

    async def run(self) -> LoadReport:
        return (await self.run_samples()).report()

    async def run_samples(self) -> LoadSamples:
        """Run, and return the raw samples (what ``run`` reports; what a generator process sends its parent)."""
        options = self.options
        server_before = server_cpu_ms(options.server_pid) if options.server_pid else None
        first_audio_before = await scrape_histogram(options.metrics_url, FIRST_AUDIO_METRIC) if options.metrics_url else {}
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        started = options.start_at or time.monotonic()
        mine = [index for index in range(options.calls) if index % options.shards == options.shard]
        connecting = [
            asyncio.create_task(self._start_call(index, started + index * options.ramp_s / max(1, options.calls))) for index in mine
        ]
        await self._tick_forever(started, connecting)
        await asyncio.gather(*connecting, return_exceptions=True)
        if self._background:
            await asyncio.wait(self._background, timeout=10)
        for call in self._calls:
            if call.receiver is not None:
                call.receiver.cancel()
        await asyncio.gather(*(c.receiver for c in self._calls if c.receiver is not None), return_exceptions=True)
        elapsed = time.monotonic() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        generator_cpu = (cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime) * 1000

        def call_samples(c: _Call) -> CallSamples:
            up_from = c.started_at - started if c.started_at else None
            return CallSamples(
                index=c.index,
                up_from_s=up_from,
                up_until_s=None if up_from is None else up_from + c.frames_sent * FRAME_MS / 1000,
                frames_sent=c.frames_sent,
                frames_received=c.audio_bytes_received // c.bytes_per_frame,
                messages_received=c.messages_received,
                clicks_sent=c.clicks_returned + len(c.clicks_sent),
                clicks_returned=c.clicks_returned,
                reconnects=c.reconnects,
                barge_ins=c.barge_ins,
                first_audio_ms=(c.first_audio_at - c.started_at) * 1000 if c.first_audio_at and c.started_at else None,
                failed=c.failed,
                warnings=tuple(c.sim.result.warnings),
                answer_ms=c.answer_ms,
                refused=c.refused,
            )

        first_audio = await first_audio_since(options.metrics_url, first_audio_before) if options.metrics_url else None
        return LoadSamples(
            provider=self.carrier.provider,
            calls_planned=len(mine),
            started=started,
            duration_s=elapsed,
            calls=[call_samples(c) for c in sorted(self._calls, key=lambda c: c.index)],
            round_trip_ms=self._round_trip_ms,
            heard_round_trip_ms=self._heard_round_trip_ms,
            click_at_s=[at - started for at in self._click_at],
            barge_in_flush_ms=self._barge_in_ms,
            barge_in_at_s=[at - started for at in self._barge_in_at],
            heard_position_error_ms=self._heard_position_errors(),
            dialled_at_s=[at - started for at in self.carrier.dialled_at],
            tick_lag_ms=self._lags_ms,
            generator_cpu_ms=generator_cpu,
            server_cpu_ms=None if server_before is None or not options.server_pid else server_cpu_ms(options.server_pid) - server_before,
            server_rss_mb=server_rss_mb(options.server_pid) if options.server_pid else None,
            first_audio_buckets=first_audio,
        )

    # --------------------------------------------------------------- calls

    async def _start_call(self, index: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        if self._dialling is not None:
            try:
                call_id = await self._dialling.dial(index)
            except Exception as exc:  # noqa: BLE001 - one call's failure to be placed ends that call only, with why
                call = _Call(index, SimCall(str(index), CallResult(str(index)), lambda: 0))
                call.failed, call.done = str(exc) if isinstance(exc, RuntimeError) else repr(exc), True
                self._calls.append(call)
                return
        else:
            call_id = self.carrier.new_call_id()
            while shard_of(call_id, self.options.shards) != self.options.shard:  # ~shards tries
                call_id = self.carrier.new_call_id()
        placed = time.monotonic()

        def clock() -> int:
            return int((time.monotonic() - placed) * 1000)

        sim = self.carrier.calls[call_id] = SimCall(call_id, CallResult(call_id), clock)
        call = _Call(index, sim)
        self._calls.append(call)
        await self._open(call, "answer")

    async def _open(self, call: _Call, reason: OpenReason) -> None:
        """Answer the call (or run the carrier's reconnect flow) and start reading the new stream."""
        try:
            if self.carrier.route is not None:  # several bridges behind a balancer: each connection picks one
                self.carrier.bridge_url = self.carrier.route(reason).rstrip("/")
            asked_at = time.monotonic()
            stream = await self.carrier.open_stream(call.sim, reason)
            if reason == "answer":
                call.answer_ms = (time.monotonic() - asked_at) * 1000
                call.refused = stream is None
        except Exception as exc:  # noqa: BLE001 - any failure to connect ends this call only, with its reason
            stream = None
            call.sim.result.log(call.sim.clock(), "loadtest", f"open failed: {exc!r}")
        if stream is None:
            timeline = call.sim.result.timeline
            call.failed = call.failed or f"{reason}: {timeline[-1].what if timeline else 'no stream'}"
            call.done = True
            call.reconnecting = False
            return
        call.stream = stream
        call.bytes_per_frame = stream.frame_bytes
        stream.on_audio = lambda pcm: self._on_audio(call, stream, pcm)
        stream.on_clear = lambda: self._on_flush(call)
        call.receiver = asyncio.create_task(self._receive(call, stream))
        call.reconnecting = False

    @staticmethod
    async def _receive(call: _Call, stream: SimStream) -> None:
        async for message in stream.conn.messages():
            call.messages_received += 1
            stream.receive(message)
        stream.dropped = True  # closed (by the bridge, unless it was our drop or hang-up)

    def _on_audio(self, call: _Call, stream: SimStream, pcm: bytes | bytearray | memoryview) -> None:
        """Agent audio arrived at the carrier: the first audio, and a click's return (its rising edge)."""
        now = time.monotonic()
        call.audio_bytes_received += len(pcm)
        if call.first_audio_at is None:
            call.first_audio_at = now
        even = pcm[: len(pcm) & ~1]
        if not even or audioop.max(even, 2) <= _LOUD:
            call.last_loud = False
            return
        samples = np.frombuffer(even, dtype="<i2")
        loud = (samples > _LOUD) | (samples < -_LOUD)
        first = int(loud.argmax())
        rising = not (call.last_loud and first == 0)
        call.last_loud = bool(loud[-1])
        if rising and call.clicks_sent:
            sent = call.clicks_sent.popleft()
            bytes_per_ms = stream.rate_hz // 500
            queued_before_ms = len(stream.queue) / bytes_per_ms + first * 2 / bytes_per_ms
            call.clicks_returned += 1
            self._click_at.append(sent)
            self._round_trip_ms.append((now - sent) * 1000)
            self._heard_round_trip_ms.append((now - sent) * 1000 + queued_before_ms)

    def _on_flush(self, call: _Call, stopped: tuple[float, int] | None = None) -> None:
        """The carrier flushed playback (or, given ``stopped``, the agent's audio stopped then and stayed off)."""
        if call.barge_in_at is not None:
            now, heard_ms = stopped or (time.monotonic(), call.agent_run_ms)
            self._barge_in_at.append(call.barge_in_at)
            self._barge_in_ms.append((now - call.barge_in_at) * 1000)
            call.flushes.append((now, heard_ms))
            call.barge_in_at = None

    def _heard_position_errors(self) -> list[float]:
        """Pair each call with its engine session (the truncations that fall next to its flushes, by vote), then
        each flush with the session's nearest truncation: truncation − heard, for each flush paired."""
        if self.truncations is None or not self.truncations.entries:
            return []
        entries = self.truncations.entries
        votes: dict[tuple[str, int], int] = {}
        for call in self._calls:
            for at, _ in call.flushes:
                for when, session_id, _ in entries:
                    if abs(when - at) <= _PAIRING_S:
                        votes[session_id, call.index] = votes.get((session_id, call.index), 0) + 1
        session_of: dict[int, str] = {}
        for (session_id, index), count in sorted(votes.items(), key=lambda item: -item[1]):
            if index not in session_of and session_id not in session_of.values():
                session_of[index] = session_id
        errors: list[float] = []
        for call in self._calls:
            mine = [(when, end_ms) for when, session_id, end_ms in entries if session_id == session_of.get(call.index)]
            for at, heard_ms in call.flushes:
                nearest = min(mine, key=lambda entry: abs(entry[0] - at), default=None)
                if nearest is not None and abs(nearest[0] - at) <= _PAIRING_S:
                    errors.append(float(nearest[1] - heard_ms))
        return errors

    def _in_background(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _drop(self, call: _Call, stream: SimStream) -> None:
        """The network drops the media connection (no goodbye); the carrier's reconnect flow opens a new one."""
        call.reconnecting = True
        call.reconnects += 1
        call.clicks_sent.clear()  # in flight on the dropped connection: neither back nor lost
        call.barge_in_at = None
        stream.network_drop = stream.dropped = True
        stream.conn.abort()
        if call.receiver is not None:
            await asyncio.gather(call.receiver, return_exceptions=True)
        await self._open(call, "network_drop")

    async def _hang_up(self, stream: SimStream, call: _Call) -> None:
        """The caller hangs up: the carrier's goodbye (``stop``, webhooks, or a close), then the call is over."""
        with contextlib.suppress(Exception):
            await stream.send_stop()
        with contextlib.suppress(Exception):
            await stream.conn.close()
        call.sim.ended.set()

    # --------------------------------------------------------------- timer

    async def _tick_forever(self, started: float, connecting: list[asyncio.Task[None]]) -> None:
        """One timer for every call, every 20 ms (``phases``: every ``20 / phases`` ms, each time for the calls of that
        instant): play 20 ms, send 20 ms, key presses, drops, hang-ups."""
        options = self.options
        dtmf_every = options.dtmf_every_ms // FRAME_MS if options.dtmf_every_ms else 0
        drop_every = options.drop_every_ms // FRAME_MS if options.drop_every_ms and self.carrier.can_reconnect else 0
        duration_frames = int(options.duration_s * 1000) // FRAME_MS
        tick = 0
        last_progress = started
        reported = (0, 0)
        """How many round trips and barge-ins ``on_progress`` has been given."""
        ticks_from = started + options.shard * FRAME_MS / 1000 / options.shards  # processes' ticks interleave
        phases = options.phases
        tick_s = FRAME_MS / 1000 / phases
        end_at = started + options.ramp_s + options.duration_s + 1.0
        while True:
            now = time.monotonic()
            if now >= end_at and all(task.done() for task in connecting) and all(c.done for c in self._calls):
                break
            if now >= end_at + _END_GRACE_S:
                for call in self._calls:
                    if not call.done:
                        call.failed, call.done = "still not over long after its end", True
                break
            tick += 1
            target = ticks_from + tick * tick_s
            await asyncio.sleep(max(0.0, target - time.monotonic()))
            now = time.monotonic()
            self._lags_ms.append((now - target) * 1000)
            phase = tick % phases
            for call in self._calls:
                stream = call.stream
                if call.done or stream is None or call.reconnecting or call.index // options.shards % phases != phase:
                    continue
                if call.sim.ended.is_set() or (stream.dropped and not stream.network_drop):
                    call.failed = "the bridge hung up" if call.sim.ended.is_set() else "the bridge closed the stream"
                    call.done = True
                    continue
                if call.frames_sent >= duration_frames:
                    call.done = True
                    self._in_background(self._hang_up(stream, call))
                    continue
                _, agent = stream.play()
                frame = self._next_frame(call, agent, now)
                if not call.frames_sent:
                    call.started_at = now
                call.frames_sent += 1
                await stream.send_audio(frame)
                if dtmf_every and call.frames_sent % dtmf_every == 0 and not stream.dropped:
                    await stream.send_dtmf("5")
                if drop_every and call.frames_sent % drop_every == 0:
                    self._in_background(self._drop(call, stream))
            if self.on_progress is not None and now - last_progress >= 1:
                last_progress = now
                up = sum(not c.done and c.stream is not None for c in self._calls)
                frames = sum(c.frames_sent for c in self._calls)
                self.on_progress(up, frames, self._round_trip_ms[reported[0] :], self._barge_in_ms[reported[1] :])
                reported = (len(self._round_trip_ms), len(self._barge_in_ms))
            elif options.progress and now - last_progress >= 5:
                last_progress = now
                up = sum(not c.done and c.stream is not None for c in self._calls)
                frames = sum(c.frames_sent for c in self._calls)
                print(progress_line(now - started, up, frames, self._round_trip_ms, self._barge_in_ms), flush=True)

    def _next_frame(self, call: _Call, agent: bool, now: float) -> bytes:
        """The caller's next 20 ms: a click, or the utterance (on a loop, or — barge-in mode — as a conversation)."""
        i = call.frames_sent
        if self._click_every:
            if i % self._click_every == self._click_every // 2:
                call.clicks_sent.append(now)
                return _CLICK
            return self._frames[(i + call.index * 7) % len(self._frames)]
        # barge-in mode: talk, listen to the answer, talk over it
        if agent:
            if call.agent_last_heard is None or i - call.agent_last_heard > 10:
                call.agent_run_ms = 0
            call.agent_last_heard = i
            call.agent_run_ms += FRAME_MS
        if agent or call.barge_in_at is None:
            call.stopped_at = None
        elif call.agent_last_heard is not None:  # no flush (yet): the agent's audio stopped, if it stays off
            if call.stopped_at is None:
                call.stopped_at = (now, call.agent_run_ms)
            elif i - call.agent_last_heard > _STOPPED_FRAMES:
                self._on_flush(call, call.stopped_at)
        if call.talking_from is not None:
            spoken = i - call.talking_from
            if spoken < self._speech_frames:
                return self._frames[spoken]
            call.talking_from, call.last_talk_end = None, i
        barge_due = call.last_barge_in is None or i - call.last_barge_in >= self._barge_every
        if agent and call.agent_run_ms >= _BARGE_AFTER_MS and barge_due:
            call.talking_from = call.last_barge_in = i
            call.barge_in_at = now
            call.barge_ins += 1
            return self._frames[0]
        quiet_since = max(call.last_talk_end, call.agent_last_heard or 0)
        if not agent and (i == 15 or (i > 15 and i - quiet_since >= _NEW_TURN_AFTER_MS // FRAME_MS)):
            call.talking_from = i
            return self._frames[0]
        return _SILENCE


def secret_from_settings(provider: str, settings: Settings) -> str | None:
    """The simulated account's secret as the configuration holds it, where its carrier's spec says it is (None: not
    set; "" for a carrier without one)."""
    spec = carrier_spec(provider)
    if spec.section is None or spec.secret is None:
        return ""
    value = getattr(getattr(settings, spec.section), spec.secret)
    return value.get_secret_value() if value is not None else None


LOAD_TEST_BARGE_IN: Final[dict[str, Any]] = {"mode": "engine"}
"""A load test's bridge leaves barge-in to the engine: the ``loopback`` agent sends back every frame as it hears it,
the caller's clicks over its own "speech" included — in the bridge's mode (``barge_in.mode = "bridge"``) a click
paused it and cleared the carrier, the clicks' returns with it (15 of 18 came back in ``tests/test_loadtest.py``'s
short run); what a load test measures is the media path, as it did before the bridge's mode was the default.
``bench/barge_in.py`` measures both modes."""


def bridge_env(provider: str, secret: str, rest_url: str) -> str:
    """``export`` lines that point a separately started bridge (and a load test started from the same shell) at
    the simulated ``provider`` account with ``secret``, whose REST API is served at ``rest_url``; and give it the
    engine's barge-in (``LOAD_TEST_BARGE_IN``)."""
    overrides = simulator_class(carrier_spec(provider)).exported_settings(secret, rest_url) | {"barge_in": LOAD_TEST_BARGE_IN}
    return "".join(_export_lines("CALLBRIDGE_", overrides))


def _export_lines(prefix: str, values: dict[str, Any]) -> list[str]:
    """``export PREFIXKEY=value`` for each setting, a nested section's keys under its own and ``__``
    (``CALLBRIDGE_SIP__OUTBOUND__TRUNK``)."""
    lines = []
    for key, value in values.items():
        name = prefix + key.upper()
        if isinstance(value, dict):
            lines += _export_lines(name + "__", value)
            continue
        text = orjson.dumps(value).decode() if isinstance(value, list | bool) else str(value)
        lines.append(f"export {name}={shlex.quote(text)}\n")
    return lines


def bridge_process_env(provider: str, secret: str, rest_url: str) -> dict[str, str]:
    """The environment of a bridge process started apart (a bench's ``callbridge serve``): this one's, without
    its ``CALLBRIDGE_`` variables, and ``bridge_env``'s for the simulated ``provider``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    for line in bridge_env(provider, secret, rest_url).splitlines():
        key, value = shlex.split(line.removeprefix("export "))[0].split("=", 1)
        env[key] = value
    return env


async def run_load_test(
    settings: Settings, provider: str, options: LoadTestOptions, *, url: str | None, secret: str, rest_url: str
) -> LoadReport:
    """``load_test_samples``, reported."""
    return (await load_test_samples(settings, provider, options, url=url, secret=secret, rest_url=rest_url)).report()


async def load_test_samples(
    settings: Settings, provider: str, options: LoadTestOptions, *, url: str | None, secret: str, rest_url: str,
    ws_url: str | None = None,
) -> LoadSamples:
    """Against the bridge at ``url`` (its simulated carrier's REST API served at ``rest_url``, configured from
    ``settings`` as ``bridge_env`` printed them), or without ``url`` against a bridge started in this process
    (the ``loopback`` agent, or ``echo`` for barge-ins) — its CPU then includes the generator's. ``ws_url``: no
    bridge, but any server that speaks the carrier's media websocket there (``SimulatedCarrier.direct``: no
    webhook)."""
    if ws_url is not None:
        direct = simulator_class(carrier_spec(provider)).direct(ws_url)
        try:
            return await LoadTest(direct, options).run_samples()
        finally:
            await direct.aclose()
    if url is None:
        from callbridge.engine.server import local_engine_options
        from callbridge.sim.runner import running_bridge, with_overrides

        agent = "echo" if options.barge_in_every_ms is not None else "loopback"
        overrides: dict[str, dict[str, Any]] = {
            "local_engine": {"agent": agent}, "server": {"max_calls": max(100, options.calls)}, "barge_in": LOAD_TEST_BARGE_IN,
        }  # fmt: skip
        if options.outbound_token is not None:
            overrides["outbound"] = {"api_token": options.outbound_token}
        local = with_overrides(settings, overrides)
        truncations = TruncationLog(LocalEngine(local_engine_options(local)))
        async with running_bridge(local, truncations.engine, provider=provider) as bridge:
            in_process = replace(options, server_pid=os.getpid(), metrics_url=bridge.base_url)
            return await LoadTest(bridge.carrier, in_process, truncations).run_samples()
    carrier = simulator_class(carrier_spec(provider))(url, secret)
    try:
        if carrier.rest_routes():
            port = urlsplit(rest_url).port
            if port is None:
                raise ValueError(f"no port in {rest_url}")
            await carrier.start_rest(port)
        carrier.configure(settings)
        return await LoadTest(carrier, options).run_samples()
    finally:
        await carrier.aclose()
