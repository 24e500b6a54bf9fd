"""The agent's audio of one stream, sans-I/O: the engine's deltas of a response resampled (one stateful resampler
per response: a response is an utterance, a new one starts clean), encoded for the carrier and cut into exact
frames for the playout ledger; ``finish`` drains the resampler and pads the last frame. Also the fallback tone and
the frames of a reply the last stream left unheard. ``CallSession`` composes it.
"""

from __future__ import annotations

import numpy as np

from callbridge.codecs import AudioEncoding, FrameAssembler, ResamplerQuality, StreamResampler, encode_from_pcm16
from callbridge.engine.port import UnheardAudio

__all__ = ["AgentAudio", "failure_tone"]


class AgentAudio:
    """The response whose audio is arriving, and the way from its PCM to the carrier's frames. See the module
    docstring."""

    __slots__ = ("quality", "encoding", "rate_hz", "frame_ms", "response_id", "_resampler", "_frames", "interrupted")

    def __init__(self, quality: ResamplerQuality) -> None:
        self.quality = quality
        self.encoding = AudioEncoding.PCMU
        self.rate_hz = 8000
        """What the agent's audio is sent in: the stream's own format unless its start says otherwise."""
        self.frame_ms = 20
        self.response_id: str | None = None
        """The response whose audio is arriving (None between responses)."""
        self._resampler: StreamResampler | None = None
        self._frames: FrameAssembler | None = None
        self.interrupted: set[str] = set()
        """Responses this call has flushed (their later audio is dropped)."""

    def start(self, encoding: AudioEncoding, rate_hz: int, frame_ms: int) -> None:
        """The stream's ``start``: the agent's audio goes out in ``encoding`` at ``rate_hz``, in ``frame_ms`` frames."""
        self.encoding, self.rate_hz, self.frame_ms = encoding, rate_hz, frame_ms

    @property
    def converting(self) -> bool:
        """A response's audio is arriving from the engine here (not only the last stream's rest of it)."""
        return self._resampler is not None

    def begin(self, response_id: str, rate_hz: int) -> None:
        """``response_id``'s audio begins, PCM16 at ``rate_hz``: a resampler and a frame assembler of its own."""
        self.response_id = response_id
        self._resampler = StreamResampler(rate_hz, self.rate_hz, self.quality)
        self._frames = FrameAssembler(self.rate_hz, self.encoding, self.frame_ms)

    def frames(self, pcm: bytes) -> list[bytes] | None:
        """The whole frames ``pcm`` (at the response's rate) completes, or None where nothing came of it."""
        assert self._resampler is not None
        return self._encoded(self._resampler.process(pcm))

    def _encoded(self, pcm: bytes) -> list[bytes] | None:
        assert self._frames is not None
        return self._frames.push(encode_from_pcm16(self.encoding, pcm)) if pcm else None

    def finish(self) -> tuple[list[bytes] | None, bytes | None]:
        """The response's audio is complete: what the resampler held (whole frames, or None), and the last frame,
        padded (or None). Nothing arrives after."""
        assert self._resampler is not None and self._frames is not None
        held = self._encoded(self._resampler.flush())
        tail = self._frames.flush()
        self.stop()
        return held, tail

    def stop(self) -> None:
        """No response's audio arrives any more (it ended, was cut, or the stream ends)."""
        self.response_id = self._resampler = self._frames = None

    def continue_unheard(self, response_id: str) -> None:
        """The last stream's unheard rest of ``response_id`` plays first; its later audio follows on the same
        response (``begin`` when it comes)."""
        self.response_id, self._resampler, self._frames = response_id, None, None

    def carries(self, unheard: UnheardAudio) -> bool:
        """Whether this stream sends the agent's audio as ``unheard`` was kept (so its frames play as they were)."""
        return (unheard.encoding, unheard.rate_hz, unheard.frame_ms) == (self.encoding.value, self.rate_hz, self.frame_ms)

    def unheard_frames(self, unheard: UnheardAudio, audio: bytes) -> list[bytes]:
        """``audio`` (``unheard``'s, decoded) cut into its frames."""
        frame_bytes = self.rate_hz * self.encoding.sample_bytes * unheard.frame_ms // 1000
        return [audio[i : i + frame_bytes] for i in range(0, len(audio), frame_bytes)]

    def tone(self, ms: int) -> list[bytes]:
        """The fallback tone, ``ms`` long, as frames (its last one padded)."""
        frames = FrameAssembler(self.rate_hz, self.encoding, self.frame_ms)
        whole = frames.push(encode_from_pcm16(self.encoding, failure_tone(self.rate_hz, ms)))
        tail = frames.flush()
        return whole if tail is None else [*whole, tail]


def failure_tone(rate_hz: int, ms: int) -> bytes:
    """The reorder tone (480 + 620 Hz, 250 ms on / 250 ms off), PCM16 at ``rate_hz``: "this call cannot go on"."""
    t = np.arange(rate_hz * ms // 1000) / rate_hz
    tone = (np.sin(2 * np.pi * 480 * t) + np.sin(2 * np.pi * 620 * t)) * 4000
    tone[(t % 0.5) >= 0.25] = 0
    return tone.astype("<i2").tobytes()
