"""Stateful streaming resampling of PCM16 mono, one object per call per direction.

Plan: wrap ``soxr.ResampleStream`` (a polyphase filter with state carried
between chunks), feed it whatever chunk sizes arrive, and never reset it while
the call lives — a reset mid-utterance is an audible click and a lost
filter tail (pipecat resets on a wall-clock gap; we do not). ``flush()`` is
explicit and final: it drains the filter's tail once, at the end of a stream.

soxr aligns its output with the input (the filter delay is compensated), so
the stream's output equals one-shot resampling of the whole signal; the price
is that it holds back samples until it has a block to process. How many it
holds depends on the quality and the rate pair (``held_samples`` tells;
``bench/codecs.py`` records them): a lower quality holds less.

soxr requantizes to int16 with TPDF dither (libsoxr's default for int16
output), so the last one or two bits differ from run to run; working in
float32 instead would avoid that at about three times the cost per frame.
"""

from __future__ import annotations

import enum
from typing import Final

import numpy as np
import soxr

from callbridge.codecs.g711 import PCM16_SAMPLE_BYTES, Buffer
from callbridge.codecs.lowdelay import LowDelayResampler

__all__ = ["ResamplerQuality", "StreamResampler"]

_EMPTY: Final = np.zeros(0, dtype=np.int16)


class ResamplerQuality(enum.Enum):
    """``LD``: our low-delay polyphase FIR (``lowdelay.py``; about 3 ms of delay, ≥ 60 dB stopband).
    The others are soxr's recipes, cheapest first; soxr holds 20–170 ms back when fed 20 ms chunks."""

    LD = "LD"
    QQ = "QQ"  # cubic interpolation: no anti-alias filter, next to no delay
    LQ = "LQ"
    MQ = "MQ"
    HQ = "HQ"
    VHQ = "VHQ"


class StreamResampler:
    """PCM16 in at ``in_rate_hz`` → PCM16 out at ``out_rate_hz``, chunk by chunk.

    Call ``process()`` with each chunk as it arrives (any number of whole
    samples, empty included) and send what it returns; call ``flush()`` once
    when the stream ends to get the filter's tail. Equal rates pass audio
    through untouched.
    """

    __slots__ = ("_flushed", "_in_samples", "_low_delay", "_out_samples", "_stream", "in_rate_hz", "out_rate_hz", "quality")

    def __init__(
        self,
        in_rate_hz: int,
        out_rate_hz: int,
        quality: ResamplerQuality = ResamplerQuality.HQ,
    ) -> None:
        if in_rate_hz <= 0 or out_rate_hz <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate_hz} → {out_rate_hz}")
        self.in_rate_hz: Final = in_rate_hz
        self.out_rate_hz: Final = out_rate_hz
        self.quality: Final = quality
        same_rate = in_rate_hz == out_rate_hz
        self._low_delay = LowDelayResampler(in_rate_hz, out_rate_hz) if quality is ResamplerQuality.LD and not same_rate else None
        self._stream = (
            None
            if same_rate or self._low_delay is not None
            else soxr.ResampleStream(in_rate_hz, out_rate_hz, 1, dtype="int16", quality=quality.value)
        )
        self._in_samples = 0
        self._out_samples = 0
        self._flushed = False

    @property
    def in_samples(self) -> int:
        """Samples taken in so far."""
        return self._in_samples

    @property
    def out_samples(self) -> int:
        """Samples handed out so far."""
        return self._out_samples

    @property
    def held_samples(self) -> float:
        """Output samples owed for the input so far and not yet handed out (≥ 0 up to rounding)."""
        return self._in_samples * self.out_rate_hz / self.in_rate_hz - self._out_samples

    def process(self, pcm: Buffer) -> bytes:
        """Resample one chunk of PCM16; returns the output samples ready now (may be empty).

        Raises ``ValueError`` for a chunk of odd byte length or after ``flush()``.
        """
        if self._flushed:
            raise ValueError("StreamResampler.process() after flush()")
        if len(pcm) % PCM16_SAMPLE_BYTES:
            raise ValueError(f"PCM16 chunk of {len(pcm)} bytes is not whole samples")
        self._in_samples += len(pcm) // PCM16_SAMPLE_BYTES
        out: bytes
        if self._low_delay is not None:
            out = self._low_delay.process(pcm)
        elif self._stream is None:
            out = pcm if isinstance(pcm, bytes) else bytes(pcm)  # equal rates: no copy of bytes
        else:
            out = self._stream.resample_chunk(np.frombuffer(pcm, dtype=np.int16)).tobytes()
        self._out_samples += len(out) // PCM16_SAMPLE_BYTES
        return out

    def flush(self) -> bytes:
        """End the stream: return the remaining tail. Later ``process()`` calls raise."""
        if self._flushed:
            return b""
        self._flushed = True
        if self._low_delay is not None:
            tail = self._low_delay.flush()
            self._out_samples += len(tail) // PCM16_SAMPLE_BYTES
            return tail
        if self._stream is None:
            return b""
        out: bytes = self._stream.resample_chunk(_EMPTY, last=True).tobytes()
        self._out_samples += len(out) // PCM16_SAMPLE_BYTES
        return out
