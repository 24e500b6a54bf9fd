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
whose i has arrived, as one matrix product per phase over a sliding-window
view of (history + chunk). The row selections depend only on the chunk
length and the phase offset, which cycle: they are cached, so a steady
stream of equal chunks allocates only its input and output arrays.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from callbridge.codecs.g711 import PCM16_SAMPLE_BYTES, Buffer

__all__ = ["LowDelayResampler"]

_PASSBAND: Final = 0.85
_ATTENUATION_DB: Final = 60.0


def _kaiser_lowpass(taps: int, cutoff: float, beta: float) -> np.ndarray:
    """A lowpass FIR with ``cutoff`` as a fraction of the sample rate (0 … 0.5), unit DC gain."""
    n = np.arange(taps) - (taps - 1) / 2
    h: np.ndarray = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, beta)
    normalized: np.ndarray = h / h.sum()
    return normalized


class LowDelayResampler:
    """PCM16 mono at ``in_rate_hz`` → ``out_rate_hz``, chunk by chunk, with only the filter's group delay."""

    __slots__ = (
        "_buffer",
        "_in_count",
        "_next_out",
        "_phases",
        "_phases_by_column",
        "_plans",
        "delay_samples",
        "down",
        "in_rate_hz",
        "out_rate_hz",
        "taps_per_phase",
        "up",
    )

    def __init__(
        self,
        in_rate_hz: int,
        out_rate_hz: int,
        *,
        passband: float = _PASSBAND,
        attenuation_db: float = _ATTENUATION_DB,
    ) -> None:
        common = math.gcd(in_rate_hz, out_rate_hz)
        self.in_rate_hz = in_rate_hz
        self.out_rate_hz = out_rate_hz
        self.up = out_rate_hz // common
        self.down = in_rate_hz // common
        upsampled_hz = in_rate_hz * self.up
        nyquist_hz = min(in_rate_hz, out_rate_hz) / 2
        edge_hz = passband * nyquist_hz
        transition = (nyquist_hz - edge_hz) / upsampled_hz
        taps = int(math.ceil((attenuation_db - 8) / (2.285 * 2 * math.pi * transition))) + 1
        taps = self.up * math.ceil(taps / self.up)  # whole phases
        beta = 0.1102 * (attenuation_db - 8.7)
        prototype = _kaiser_lowpass(taps, (edge_hz + nyquist_hz) / 2 / upsampled_hz, beta) * self.up
        self.taps_per_phase = taps // self.up
        # phase p holds h[p], h[p+L], …; reversed so it lines up with a window of inputs in time order
        self._phases = np.ascontiguousarray(prototype.reshape(self.taps_per_phase, self.up).T[:, ::-1], dtype=np.float32)
        self._phases_by_column = np.ascontiguousarray(self._phases.T)
        self.delay_samples = (taps - 1) / 2 / self.down
        """Group delay, in output samples."""
        self._buffer = np.zeros(self.taps_per_phase - 1 + in_rate_hz // 50, dtype=np.float32)
        """The last taps_per_phase − 1 inputs, then the current chunk."""
        self._next_out = 0
        self._in_count = 0
        self._plans: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}

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
        keep = self.taps_per_phase - 1
        if len(self._buffer) < keep + n_in:
            grown = np.zeros(keep + n_in, dtype=np.float32)
            grown[:keep] = self._buffer[:keep]
            self._buffer = grown
        buffer = self._buffer
        buffer[keep : keep + n_in] = x  # history stays in buffer[:keep]
        total_in = self._in_count + n_in
        end_out = -(-total_in * self.up // self.down)  # outputs whose newest input has arrived
        count = end_out - self._next_out
        out = np.empty(count, dtype=np.float32)
        if count:
            up, down, taps, item = self.up, self.down, self.taps_per_phase, buffer.itemsize
            if down == 1:  # each input's window feeds all up phases: one product, outputs already interleaved
                rows = np.ndarray((n_in, taps), np.float32, buffer, 0, (item, item))
                np.matmul(rows, self._phases_by_column, out=out.reshape(n_in, up))
            else:
                for phase, first_out, n, first_row in self._plan(n_in, count):
                    # every up-th output has this phase and reads windows down samples apart: a strided view
                    rows = np.ndarray((n, taps), np.float32, buffer, first_row * item, (down * item, item))
                    if up == 1:
                        np.dot(rows, self._phases[phase], out=out)
                    else:
                        out[first_out::up] = np.dot(rows, self._phases[phase])
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

    def _plan(self, chunk_len: int, count: int) -> list[tuple[int, int, int, int]]:
        """Per phase: (phase, first output of this call with it, how many, the window row it reads).

        Outputs ``up`` apart share a phase and read windows ``down`` apart."""
        offset = self._next_out * self.down - self._in_count * self.up
        key = (chunk_len, offset)
        plan = self._plans.get(key)
        if plan is None:
            plan = []
            for first_out in range(min(self.up, count)):
                position = first_out * self.down + offset  # in upsampled units from this chunk's first window
                n = (count - first_out + self.up - 1) // self.up
                plan.append((position % self.up, first_out, n, position // self.up))
            if len(self._plans) < 1024:
                self._plans[key] = plan
        return plan
