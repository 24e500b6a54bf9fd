"""A low-delay streaming resampler: a polyphase FIR that hands out every sample it can at once.

Why: soxr's stream resampler compensates its filter delay by holding audio
until it has a block: 60–115 ms at HQ on 8k→16k, fed 20 ms chunks
(bench/RESULTS.md). On a phone call that is latency the caller hears. This
filter is linear-phase and short, and releases each output as soon as its
newest input sample has arrived, so the audio is late only by the filter's
group delay: about 1–3 ms at telephony rates (``delay_ms``).

Plan: resample by L/M (reduced). One Kaiser-windowed sinc prototype at
L·f_in, cut off halfway between the passband edge (``passband`` × the lower
Nyquist; 3.4 kHz for 8 kHz) and the lower Nyquist, where it reaches
``attenuation_db``: on 24k→8k, content above 4 kHz is attenuated by at least
that before it can fold back. Split into L phases of Q taps. Output m needs
input i = ⌊mM/L⌋ and the Q−1 before it; ``process`` computes every output
whose i has arrived.

How, cheaply: outputs go in blocks of B (a multiple of L), and a block's
outputs read one window of W inputs in the same pattern whatever the block,
given where the first one falls among the L phases. So each of the L
patterns is one (W × B) matrix, shared by every resampler of the same rates,
and a chunk's outputs are one matrix product: (blocks × W windows, B·M/L
inputs apart) @ (W × B). The windows overlap, so numpy gathers them into one
small contiguous array (W·blocks floats, where one window per output would
be Q·outputs: 8 times more on 24k→8k); the rest is BLAS.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from callbridge.codecs.g711 import PCM16_SAMPLE_BYTES, Buffer

__all__ = ["LowDelayResampler"]

_PASSBAND: Final = 0.85
_ATTENUATION_DB: Final = 60.0
_BLOCK_OUTPUTS: Final = 16
"""About how many outputs one window of the block product computes (rounded up to a multiple of L)."""
_MAX_BLOCK_FLOATS: Final = 1 << 16
"""Past this, the L block matrices are not built (rates with a large L, such as 22.05k → 8k: L = 160): each
output's window is gathered instead, slower but bounded in memory."""


def _kaiser_lowpass(taps: int, cutoff: float, beta: float) -> np.ndarray:
    """A lowpass FIR with ``cutoff`` as a fraction of the sample rate (0 … 0.5), unit DC gain."""
    n = np.arange(taps) - (taps - 1) / 2
    h: np.ndarray = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, beta)
    normalized: np.ndarray = h / h.sum()
    return normalized


@dataclass(frozen=True, slots=True)
class _Filter:
    """What every resampler of one rate pair shares: the phases and the block matrices."""

    up: int
    down: int
    taps_per_phase: int
    block: int
    """B: outputs per block (a multiple of ``up``)."""
    phases: np.ndarray
    """(up × taps_per_phase): phase p in time order."""
    blocks: tuple[np.ndarray, ...]
    """Per first phase r (the block's first output m has m mod up = r): the (W × B) matrix, W the inputs one block
    reads; empty past ``_MAX_BLOCK_FLOATS``."""
    offsets: tuple[np.ndarray, ...]
    """Per first phase r: where each of the block's outputs starts reading, from the block's first input."""


@functools.lru_cache(maxsize=32)
def _filter(in_rate_hz: int, out_rate_hz: int, passband: float, attenuation_db: float) -> _Filter:
    common = math.gcd(in_rate_hz, out_rate_hz)
    up, down = out_rate_hz // common, in_rate_hz // common
    upsampled_hz = in_rate_hz * up
    nyquist_hz = min(in_rate_hz, out_rate_hz) / 2
    edge_hz = passband * nyquist_hz
    transition = (nyquist_hz - edge_hz) / upsampled_hz
    taps = int(math.ceil((attenuation_db - 8) / (2.285 * 2 * math.pi * transition))) + 1
    taps = up * math.ceil(taps / up)  # whole phases
    beta = 0.1102 * (attenuation_db - 8.7)
    prototype = _kaiser_lowpass(taps, (edge_hz + nyquist_hz) / 2 / upsampled_hz, beta) * up
    per_phase = taps // up
    # phase p holds h[p], h[p+L], …; reversed so it lines up with a window of inputs in time order
    phases = np.ascontiguousarray(prototype.reshape(per_phase, up).T[:, ::-1], dtype=np.float32)
    block = up * math.ceil(_BLOCK_OUTPUTS / up)
    window = (block - 1) * down // up + per_phase
    blocks: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    for first in range(up if up * (window + 1) * block <= _MAX_BLOCK_FLOATS else 0):
        starts = np.array([(first + k) * down // up - first * down // up for k in range(block)])
        matrix = np.zeros((window + down, block), dtype=np.float32)  # + down: room for any first phase
        for k, start in enumerate(starts):
            matrix[start : start + per_phase, k] = phases[(first + k) * down % up]
        width = int(starts[-1]) + per_phase
        blocks.append(np.ascontiguousarray(matrix[:width]))
        offsets.append(starts)
    return _Filter(up, down, per_phase, block, phases, tuple(blocks), tuple(offsets))


class LowDelayResampler:
    """PCM16 mono at ``in_rate_hz`` → ``out_rate_hz``, chunk by chunk, with only the filter's group delay."""

    __slots__ = ("_buffer", "_filter", "_in_count", "_next_out", "delay_samples", "down", "in_rate_hz", "out_rate_hz", "taps_per_phase", "up")

    def __init__(
        self,
        in_rate_hz: int,
        out_rate_hz: int,
        *,
        passband: float = _PASSBAND,
        attenuation_db: float = _ATTENUATION_DB,
    ) -> None:
        self._filter = _filter(in_rate_hz, out_rate_hz, passband, attenuation_db)
        self.in_rate_hz = in_rate_hz
        self.out_rate_hz = out_rate_hz
        self.up = self._filter.up
        self.down = self._filter.down
        self.taps_per_phase = self._filter.taps_per_phase
        self.delay_samples = (self.taps_per_phase * self.up - 1) / 2 / self.down
        """Group delay, in output samples."""
        self._buffer = np.zeros(self.taps_per_phase - 1 + in_rate_hz // 50, dtype=np.float32)
        """The last taps_per_phase − 1 inputs, then the current chunk."""
        self._next_out = 0
        self._in_count = 0

    @property
    def delay_ms(self) -> float:
        return self.delay_samples * 1000 / self.out_rate_hz

    def process(self, pcm: Buffer) -> bytes:
        """Resample one chunk (whole samples); returns every output sample its inputs complete."""
        if len(pcm) % PCM16_SAMPLE_BYTES:
            raise ValueError(f"PCM16 chunk of {len(pcm)} bytes is not whole samples")
        x = np.frombuffer(pcm, dtype="<i2")
        n_in = len(x)
        if not n_in:
            return b""
        taps = self.taps_per_phase
        keep = taps - 1
        if len(self._buffer) < keep + n_in:
            grown = np.zeros(keep + n_in, dtype=np.float32)
            grown[:keep] = self._buffer[:keep]
            self._buffer = grown
        buffer = self._buffer
        buffer[keep : keep + n_in] = x  # history stays in buffer[:keep]
        up, down = self.up, self.down
        first_out, in_count = self._next_out, self._in_count
        total_in = in_count + n_in
        end_out = -(-total_in * up // down)  # outputs whose newest input has arrived
        count = end_out - first_out
        out = np.empty(count, dtype=np.float32)
        shared = self._filter
        if count and not shared.blocks:
            outputs = np.arange(first_out, end_out)
            windows = buffer[(outputs * down // up - in_count)[:, None] + np.arange(taps)]
            np.einsum("ij,ij->i", windows, shared.phases[outputs * down % up], out=out)
        elif count:
            # output m reads the window buffer[⌊m·down/up⌋ − in_count :][: taps]
            phase, block, item = first_out % up, shared.block, buffer.itemsize
            matrix = shared.blocks[phase]
            start = first_out * down // up - in_count
            blocks, rest = divmod(count, block)
            if blocks:
                step = block * down // up
                windows = np.ndarray((blocks, matrix.shape[0]), np.float32, buffer, start * item, (step * item, item))
                np.dot(windows, matrix, out=out[: blocks * block].reshape(blocks, block))  # dot: less overhead than matmul
            if rest:
                tail = start + blocks * block * down // up
                width = int(shared.offsets[phase][rest - 1]) + taps
                np.dot(buffer[tail : tail + width], matrix[:width, :rest], out=out[blocks * block :])
        buffer[:keep] = buffer[n_in : n_in + keep]
        self._next_out = end_out
        self._in_count = total_in
        np.rint(out, out=out)
        np.minimum(out, 32767, out=out)  # ufuncs: np.clip's wrapper costs more than the work here
        np.maximum(out, -32768, out=out)
        return out.astype("<i2").tobytes()

    def flush(self) -> bytes:
        """The filter's tail: the last ``delay_samples`` of output, fed with silence."""
        tail_in = int(math.ceil((self.delay_samples + 1) * self.down / self.up))
        return self.process(bytes(tail_in * PCM16_SAMPLE_BYTES))
