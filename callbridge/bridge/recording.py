"""A call's stereo recording as the caller lived it: left the caller as received, right the agent as the caller
heard it — each frame where the playout model says it played (``PlayoutLedger``), what a barge-in's clear dropped
never, the frame playing at the clear cut there.

Sans-I/O: the call appends the caller's decoded audio (``caller``) and the ledger the frames it sends with the
time each starts to play (``agent``) and what each of its markers' echoes said of that (``echoed``); ``take(now_ms)`` hands
out, about once a ``chunk_ms``, interleaved PCM16 for the file up to where both channels are final (the caller's
audio received, the agent's played and placed). Per frame only a buffered append; decoding, mixing and
resampling happen once per chunk."""

from __future__ import annotations

from collections import deque
from typing import Final

import numpy as np

from callbridge.codecs.g711 import PCM16_SAMPLE_BYTES, AudioEncoding, Buffer, decode_to_pcm16
from callbridge.codecs.resample import ResamplerQuality, StreamResampler

__all__ = ["CHANNELS", "StereoRecorder"]

CHANNELS: Final = 2
_CHUNK_MS: Final = 500
"""How often the file is written: a crash loses at most this and ``_SETTLE_MS``."""
_SETTLE_MS: Final = 500
"""How far behind the clock the file is written: a run of agent audio is placed by the first markers' echoes
(``echoed``), which come within this."""
_RUN_TOLERANCE_MS: Final = 5
"""A frame this close to the end of the last (before or after it) continues its run."""
_HOLD_MS: Final = 250
"""How long the recording waits before it follows an echo that moved the model later: it follows the earliest place
that the echoes of the last ``_HOLD_MS``, and the run's last two echoes, put the run at. An echo read late (the
bridge's own stall, which also sends the model on) looks the same as a carrier playing later; the next echo, read on
time, takes it back. A carrier that plays later for good is followed once a second echo says so and this has
passed (well within ``_SETTLE_MS``); a run's first echo (where the carrier started it) once this has passed."""
_MAX_CALLER_AHEAD_MS: Final = 5000
"""Caller audio kept ahead of the clock (a backlog read at once): beyond it the oldest is written regardless."""


class StereoRecorder:
    """See the module docstring. ``rate_hz``: the recording's (the caller's audio, as received); the agent's frames
    are ``agent_encoding`` at ``agent_rate_hz``, resampled where that differs. ``started_ms``: the clock at the
    recording's first sample (the caller's audio is taken to arrive in real time from then on)."""

    def __init__(
        self,
        *,
        rate_hz: int,
        agent_rate_hz: int,
        agent_encoding: AudioEncoding,
        started_ms: int,
        chunk_ms: int = _CHUNK_MS,
    ) -> None:
        self.rate_hz = rate_hz
        self.agent_rate_hz = agent_rate_hz
        self.agent_encoding = agent_encoding
        self.started_ms = started_ms
        self.chunk_ms = chunk_ms
        self.agent_frames: deque[tuple[int, bytes]] = deque()
        """(the sample at ``agent_rate_hz`` it starts playing at, the encoded frame), in send order (``agent``)."""
        self._agent_next: int | None = None
        """Where the last frame placed ends: the next frame of the same run plays from there."""
        self._run_start: int | None = None
        """Where the run of frames playing (back to back since the last gap) starts."""
        self._unplaced = 0
        """Samples of echo corrections the run playing did not take (it was partly written): the ledger's times for
        its next frames include them, so a frame they move is still the run's next (not a new run after a gap)."""
        self._model_shift = 0
        """Samples the markers' echoes have moved the ledger's model by (``echoed``), all told."""
        self._followed = 0
        """How much of ``_model_shift`` the recording follows: the rest is held (``_HOLD_MS``); the ledger's times
        for the frames sent since include it."""
        self._echoes: deque[tuple[int, int, bool]] = deque([(started_ms, 0, False)])
        """(when, ``_model_shift`` then, whether an echo) since the run started (not an echo), as ``_HOLD_MS``
        keeps them."""
        self._run_floor = 0
        """Where what came before the run ends (the last run's last frame; a clear's moment): the run plays after
        it, whatever an echo says (the carrier plays its buffer in order)."""
        self._agent_tolerance = agent_rate_hz * _RUN_TOLERANCE_MS // 1000
        self._caller = bytearray()
        self._written_at_ms = started_ms
        self._agent_out = bytearray()
        """The agent's channel at ``rate_hz``, resampled and not yet written."""
        self._agent_samples = 0
        """Agent samples (at ``agent_rate_hz``) handed to the resampler: the channel's position."""
        self._resampler = (
            StreamResampler(agent_rate_hz, rate_hz, ResamplerQuality.HQ) if agent_rate_hz != rate_hz else None
        )
        self.samples_written = 0
        """Sample frames (one per channel) handed out so far."""

    @property
    def duration_ms(self) -> int:
        return self.samples_written * 1000 // self.rate_hz

    def caller(self, pcm: Buffer) -> None:
        """The caller's audio as received (PCM16 at ``rate_hz``, gaps filled): a buffered append."""
        self._caller += pcm

    def agent(self, start_ms: int, frame: bytes, sent_ms: int) -> None:
        """A frame sent to the carrier at ``sent_ms``, to start playing at ``start_ms`` (the playout model's clock):
        a buffered append. A frame that follows the last within ``_RUN_TOLERANCE_MS`` plays right after it (the
        carrier plays its buffer back to back; the model only moves when a marker's echo corrects it), else where it
        starts — as it does where the run placed so far had played out before it was sent (the bridge stalled
        longer than the carrier's buffer: the echoes it then read late moved the model on to it, held here)."""
        at = (start_ms - self.started_ms) * self.agent_rate_hz // 1000
        following = self._agent_next
        sent = (sent_ms - self.started_ms) * self.agent_rate_hz // 1000
        if (
            following is not None
            and at - self._unplaced - self._held - following < self._agent_tolerance
            and sent - following < self._agent_tolerance
        ):
            at = following
        else:  # a new run, where the model says it plays: nothing held for it
            self._run_start, self._unplaced = at, 0
            self._restart_echoes(start_ms)
            if following is not None:
                self._run_floor = following
        self._agent_next = at + len(frame) // self.agent_encoding.sample_bytes
        self.agent_frames.append((at, frame))

    @property
    def _held(self) -> int:
        return self._model_shift - self._followed

    def echoed(self, delay_ms: int, now_ms: int) -> None:
        """A marker's echo of the run playing came ``delay_ms`` after (or, negative, before) the playout model said,
        and the ledger moved the model by that. The run follows the earliest place the echoes kept (``_HOLD_MS``)
        gave it: earlier at once, later once no echo since has taken it back (an echo is never early, but the
        bridge can read it late)."""
        self._model_shift += delay_ms * self.agent_rate_hz // 1000
        echoes = self._echoes
        if echoes[-1][0] == now_ms and echoes[-1][2]:  # read together (after a stall): the last says the most
            echoes.pop()
        echoes.append((now_ms, self._model_shift, True))
        self._follow(now_ms)

    def _follow(self, now_ms: int) -> None:
        echoes = self._echoes
        # the one in effect ``_HOLD_MS`` ago stays, and the latest echo's last before it
        while len(echoes) > 1 and echoes[1][0] <= now_ms - _HOLD_MS and not (len(echoes) == 2 and echoes[0][2]):
            echoes.popleft()
        target = min(shift for _, shift, _ in echoes)
        if target != self._followed:
            self._move(target - self._followed)
            self._followed = target

    def _restart_echoes(self, now_ms: int) -> None:
        """A new run (or a clear): placed by the model as it stands, nothing held over."""
        self._followed = self._model_shift
        self._echoes.clear()
        self._echoes.append((now_ms, self._model_shift, False))

    def _move(self, delay: int) -> None:
        """The run playing plays ``delay`` samples later (or earlier) than placed: it moves with it while none of
        it is written yet (the first echoes come within ``_SETTLE_MS``); after that its frames stay back to back,
        the later ones too, which the ledger now times by the moved model (``_unplaced``): a correction of a few ms
        is the echo's jitter as often as the carrier's, and a run the carrier plays does not break where an echo
        came late."""
        run = self._run_start
        if run is None or run < self._agent_samples or self._agent_next is None:
            self._unplaced += delay
            return
        moved = max(delay, self._agent_samples - run, self._run_floor - run)  # never back into what is written or played before
        self._unplaced += delay - moved
        frames = self.agent_frames
        for i, (at, frame) in enumerate(frames):
            if at >= run:
                frames[i] = (at + moved, frame)
        self._run_start, self._agent_next = run + moved, self._agent_next + moved

    def cut(self, now_ms: int) -> None:
        """The carrier's buffer was cleared at ``now_ms``: frames not yet playing are never heard, the one playing
        is heard up to now."""
        now = (now_ms - self.started_ms) * self.agent_rate_hz // 1000
        frames, width = self.agent_frames, self.agent_encoding.sample_bytes
        while frames and frames[-1][0] >= now:
            frames.pop()
        self._agent_next = self._run_start = None
        self._run_floor, self._unplaced = now, 0
        self._restart_echoes(now_ms)
        if frames:
            at, frame = frames[-1]
            if at + len(frame) // width > now:
                frames[-1] = (at, frame[: (now - at) * width])

    def take(self, now_ms: int, *, final: bool = False) -> bytes | None:
        """Interleaved stereo PCM16 for the file, once a chunk is due (``final``: everything up to ``now_ms``, the
        call's end), else None."""
        if not final and now_ms - self._written_at_ms < self.chunk_ms:
            return None
        self._written_at_ms = now_ms
        self._follow(now_ms)
        clock_ms = now_ms - self.started_ms
        caller_ms = (self.samples_written + len(self._caller) // PCM16_SAMPLE_BYTES) * 1000 // self.rate_hz
        if final:
            until_ms = max(clock_ms, caller_ms)
        else:  # both channels final: the caller's audio received, the agent's played and settled (a backlog not waited on)
            settled_ms = clock_ms - _SETTLE_MS
            until_ms = min(settled_ms, caller_ms) if caller_ms - settled_ms <= _MAX_CALLER_AHEAD_MS else caller_ms
        if until_ms * self.rate_hz // 1000 <= self.samples_written:
            return None
        return self._mix(until_ms, final=final)

    def _mix(self, until_ms: int, *, final: bool) -> bytes | None:
        target = until_ms * self.rate_hz // 1000 - self.samples_written
        out = self._agent_out
        self._place_agent(until_ms, final=final)
        # a resampler holds a little back: the chunk ends where the agent's channel does (at the end, silence)
        samples = target if final else min(target, len(out) // PCM16_SAMPLE_BYTES)
        if samples <= 0:
            return None
        stereo = np.zeros(samples * CHANNELS, dtype=np.int16)
        for channel, buffer in enumerate((self._caller, out)):
            have = min(samples, len(buffer) // PCM16_SAMPLE_BYTES)
            stereo[channel : have * CHANNELS : CHANNELS] = np.frombuffer(buffer, dtype=np.int16, count=have)
            del buffer[: have * PCM16_SAMPLE_BYTES]
        self.samples_written += samples
        return stereo.tobytes()

    def _place_agent(self, until_ms: int, *, final: bool) -> None:
        """The agent's channel up to ``until_ms`` onto ``_agent_out``: the frames played by then at their places,
        silence between."""
        rate = self.agent_rate_hz
        begin, end = self._agent_samples, until_ms * rate // 1000
        span = np.zeros(max(0, end - begin), dtype=np.int16)
        frames = self.agent_frames
        kept: list[tuple[int, bytes]] = []
        while frames:
            first, frame = frames[0]
            if first >= end:
                break
            frames.popleft()
            pcm = np.frombuffer(decode_to_pcm16(self.agent_encoding, frame), dtype=np.int16)
            lo, hi = max(first, begin), min(first + len(pcm), end)
            if hi > lo:
                span[lo - begin : hi - begin] = pcm[lo - first : hi - first]
            if first + len(pcm) > end:  # playing on past this chunk: the rest goes in the next
                kept.append((first, frame))
        frames.extendleft(reversed(kept))
        self._agent_samples = max(begin, end)
        if self._resampler is None:
            self._agent_out += span.tobytes()
        else:
            self._agent_out += self._resampler.process(span.tobytes())
            if final:
                self._agent_out += self._resampler.flush()
