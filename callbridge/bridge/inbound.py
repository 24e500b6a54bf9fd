"""The caller's side of one stream, sans-I/O: the flood limit over the carrier's messages, and the caller's audio
from the carrier's payloads to the engine's rate.

``MessageBucket``: a token bucket over every carrier message of a stream (a burst of 1000, 150 a second sustained;
a stream sends about 60). ``InboundAudio``: decode what the stream's ``start`` announced, fill gaps in the carrier's
media timestamps with silence (at most a second, so the engine's input timeline is the carrier's media timeline) —
while its timestamps keep to the wall clock: a sender whose timestamp clock runs ahead of it (RTP sample units sent
as milliseconds: 8× fast) is not followed any more — refuse audio received far ahead of the wall clock (a flood), measure how late this process reads the carrier's
media (a backlog after a stall of ours), resample with one stateful resampler per stream, and hold the audio that
comes before the engine is bound (at most two seconds). ``CallSession`` composes them.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from callbridge.codecs import (
    PCM16_SAMPLE_BYTES,
    AudioEncoding,
    Buffer,
    ResamplerQuality,
    StreamResampler,
    decode_to_pcm16,
)

__all__ = [
    "FLOOD_TOLERANCE_MS",
    "MESSAGES_PER_S",
    "MESSAGE_BURST",
    "InboundAudio",
    "MediaAhead",
    "MessageBucket",
]

MAX_GAP_FILL_MS: Final = 1000
MAX_STARTING_BUFFER_MS: Final = 2000
FLOOD_TOLERANCE_MS: Final = 10_000
"""Media may run this far ahead of the wall clock before it is a flood: a server that stalled (overload, a
pause) reads its backlog in a burst, but never more than the stall ahead; a flood gets there in a second."""
MESSAGE_BURST: Final = 1000
MESSAGES_PER_S: Final = 150
TIMESTAMPS_AHEAD_MS: Final = 2000
"""A media timestamp this far ahead of the wall clock (since the stream's first payload) is not the carrier's media
clock: a carrier's timestamps fall behind it (a stall of ours, read late) but never run ahead of it by more than
its jitter. From then on the stream's gaps are not filled from its timestamps."""
BASELINE_RISE: Final = 0.001
"""ms per ms of media the on-time baseline of media arrival rises by (see ``InboundAudio._track_read_lag``)."""


class MessageBucket:
    """The flood limit: a token bucket over all carrier messages, a burst of 1000, 150 a second sustained (a stream
    sends about 60). Once the stream has started, a gap longer than the burst's worth (6.7 s) fills the bucket past
    1000, to what the gap earned: the backlog this process reads after a stall of its own (stopped, its VM frozen)
    is that long a stall's messages, read at once (20 s of them were 1000). A carrier's own silence that long is
    nearly the idle limit (10 s), which ends the stream first; a stream not yet started (not yet known to be the
    carrier's) never holds more than the burst."""

    __slots__ = ("tokens", "at_ms")

    def __init__(self) -> None:
        self.tokens = float(MESSAGE_BURST)
        self.at_ms: int | None = None

    def take(self, now_ms: int, *, started: bool) -> bool:
        """One message read at ``now_ms``: False where it is one too many (a flood)."""
        if self.at_ms is not None:
            earned = (now_ms - self.at_ms) * MESSAGES_PER_S / 1000
            tokens = self.tokens + earned
            if tokens > MESSAGE_BURST:  # past the burst: what was held, or what this gap earned, if more
                tokens = max(MESSAGE_BURST, self.tokens, earned) if started else MESSAGE_BURST
            self.tokens = tokens
        self.at_ms = now_ms
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class MediaAhead(Exception):
    """The carrier's media ran further ahead of the wall clock than a stall could explain: a flood."""


class InboundAudio:
    """The caller's audio of one stream, from the carrier's payloads to the engine's rate. See the module docstring."""

    __slots__ = (
        "engine_rate_hz", "quality", "encoding", "rate_hz", "stream_media_ms", "received_ms", "first_media_at_ms",
        "read_lag_ms", "pcm", "payload_ms", "timestamps_distrusted", "_resampler", "_arrival_baseline_ms", "_held",
        "_held_ms",
    )  # fmt: skip

    def __init__(self, engine_rate_hz: int, quality: ResamplerQuality) -> None:
        self.engine_rate_hz = engine_rate_hz
        self.quality = quality
        self.encoding = AudioEncoding.PCMU
        self.rate_hz = 8000
        self.stream_media_ms = 0
        """ms of caller audio this stream carried (gaps filled included)."""
        self.received_ms = 0
        """ms of caller audio this stream received (gaps filled not included): what a flood is judged on."""
        self.timestamps_distrusted: str | None = None
        """Why the stream's media timestamps are not followed (a clock ahead of the wall clock), once they are not."""
        self.first_media_at_ms: int | None = None
        """When the stream's media time 0 was, on this clock (from its first payload)."""
        self.read_lag_ms = 0
        """How far behind the carrier's media we are reading now (a backlog after a stall of ours), in ms."""
        self.pcm: Buffer = b""
        """The last payload read as PCM16 at the stream's rate, a gap before it filled with silence (the
        recording's); L16's is the received buffer itself (copied where it is kept)."""
        self.payload_ms = 0
        """The last payload's length on the carrier's media timeline, a filled gap included."""
        self._resampler: StreamResampler | None = None
        self._arrival_baseline_ms: float | None = None
        self._held: deque[tuple[bytes, bytes]] = deque()
        """The caller's audio before the engine is bound, each frame at the engine's rate and as received (PCM16 at
        the stream's rate: the recording's, from the stream's first audio, not from the bind)."""
        self._held_ms = 0

    def start(self, encoding: AudioEncoding, rate_hz: int) -> None:
        """The stream's ``start`` announced its audio: decode that, resample from its rate."""
        self.encoding, self.rate_hz = encoding, rate_hz
        self._resampler = StreamResampler(rate_hz, self.engine_rate_hz, self.quality)

    def receive(self, payload: bytes, timestamp_ms: int | None, now_ms: int) -> bytes:
        """One payload (at the carrier's media ``timestamp_ms``, where it gives one) read at ``now_ms``: the caller's
        audio at the engine's rate (may be empty: the resampler holds a few samples back); the payload as PCM at the
        stream's rate and its length are ``pcm`` and ``payload_ms`` until the next. Raises ``MediaAhead`` for audio
        received further ahead of the wall clock than ``FLOOD_TOLERANCE_MS``."""
        payload_ms = len(payload) * 1000 // (self.rate_hz * self.encoding.sample_bytes)
        if self.first_media_at_ms is None:
            self.first_media_at_ms = now_ms - (timestamp_ms or 0)
        elapsed_ms = now_ms - self.first_media_at_ms
        if self.received_ms - elapsed_ms > FLOOD_TOLERANCE_MS:
            raise MediaAhead(f"{self.received_ms} ms of audio in {elapsed_ms} ms")
        self.received_ms += payload_ms
        pcm = decode_to_pcm16(self.encoding, payload)
        if timestamp_ms is not None and timestamp_ms > self.stream_media_ms and self.timestamps_distrusted is None:
            if timestamp_ms - elapsed_ms > TIMESTAMPS_AHEAD_MS:
                self.timestamps_distrusted = f"media timestamp {timestamp_ms} ms, {elapsed_ms} ms into the stream"
            else:
                gap_ms = min(timestamp_ms - self.stream_media_ms, MAX_GAP_FILL_MS)
                pcm = bytes(self.rate_hz * gap_ms // 1000 * PCM16_SAMPLE_BYTES) + pcm
                payload_ms += gap_ms
        self.stream_media_ms += payload_ms
        self._track_read_lag(now_ms, payload_ms)
        self.pcm, self.payload_ms = pcm, payload_ms
        assert self._resampler is not None
        return self._resampler.process(pcm)

    @property
    def media_until_ms(self) -> int | None:
        """When the end of the audio received so far was said, on this clock: the on-time baseline (the earliest any
        payload's arrival puts media time 0) plus the media since — never after now. A first payload read late (a
        stall of ours before it, the rest read in a burst) puts media time 0 no later than the burst says; from the
        first payload's arrival alone, the burst would run ahead of the clock by as long as the stall. None: no
        media came."""
        baseline = self._arrival_baseline_ms
        return None if baseline is None else int(baseline) + self.stream_media_ms

    def _track_read_lag(self, now_ms: int, payload_ms: int) -> None:
        """Media comes at real time: ``now − media ms so far`` is constant but for jitter and our own lateness.
        Its lowest value (rising 1 ms a second, to follow a carrier clock a little slower than ours) is the
        on-time baseline; how far above it we are is how late we read."""
        offset = now_ms - self.stream_media_ms
        baseline = self._arrival_baseline_ms
        if baseline is None or offset < baseline:
            baseline = offset
        else:
            baseline += payload_ms * BASELINE_RISE
        self._arrival_baseline_ms = baseline
        self.read_lag_ms = int(offset - baseline)

    # ------------------------------------------------------- before the bind

    def hold(self, audio: bytes) -> None:
        """Keep the payload just read (``audio``, at the engine's rate, and ``pcm``) until the engine is bound (the
        newest ``MAX_STARTING_BUFFER_MS`` of it)."""
        self._held.append((audio, bytes(self.pcm)))  # L16's ``pcm`` is the received buffer itself
        self._held_ms += len(audio) * 500 // self.engine_rate_hz
        while self._held_ms > MAX_STARTING_BUFFER_MS:
            dropped, _ = self._held.popleft()
            self._held_ms -= len(dropped) * 500 // self.engine_rate_hz

    def held_pcm(self) -> list[bytes]:
        """What is held, as received (PCM16 at the stream's rate), oldest first."""
        return [pcm for _, pcm in self._held]

    def release(self) -> list[bytes]:
        """What is held, at the engine's rate, oldest first (empty chunks left out); nothing is held after."""
        audio = [chunk for chunk, _ in self._held if chunk]
        self.drop_held()
        return audio

    def drop_held(self) -> None:
        self._held.clear()
        self._held_ms = 0
