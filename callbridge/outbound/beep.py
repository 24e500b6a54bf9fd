"""A voicemail's beep, heard on the callee's line, sans-I/O (#42): the agent's voicemail message must start after the
beep and never before it, so the answering-machine detector waits for this.

A beep is a tone: nearly all of a frame's energy in one narrow peak. Each 20 ms frame of the callee's audio is
judged over the last 40 ms (a Hann window, 25 Hz bins at any rate): a frame is *tonal* where it is at least
``min_db`` loud and the spectral peak in ``low_hz``–``high_hz``, with its two bins either side (the window's main
lobe), holds at least ``min_tone_share`` of the energy. A *tone* is a stretch of tonal frames that holds its pitch
(within ``_STEADY_HZ`` of its first frame: a voice's pitch glides); a beep is a run of tones ``min_beep_ms`` or longer,
each at least ``_MIN_TONE_MS``, where one frame that is not tonal between two does not end the run (a two-tone beep
stepping from one to the next). It is reported as it ends — a frame after its last, for that reason — with where it
began and its first tone's frequency: the message goes after it. Speech is not a tone (a voice's energy is spread
over its harmonics, and its pitch moves), nor is a DTMF digit (two tones: half the energy each), nor line noise.

Why not a bank of Goertzel filters at the usual beep frequencies: machines beep at 440 to 2000 Hz and more, and a
spectrum of 160 bins costs a few microseconds a frame with numpy; measured in ``tests/outbound/test_beep.py``
against tones at 440–2000 Hz in line noise, DTMF, and the project's speech corpus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from callbridge.bridge.echo_gate import level_db

__all__ = ["Beep", "BeepDetector", "BeepSettings"]

_MIN_TONE_MS = 60
"""Each of a beep's tones lasts this long at least (a two-tone beep's are 100 ms and more); shorter tonal stretches of
a sound (a door's thud, a voice) are not chained into one."""
_STEADY_HZ = 4.0
"""A tone's frames stay within this of its first (the estimate's own spread: 0.1 Hz in line noise 40 dB under the
tone, 2.2 Hz at 13 dB under); a voice's pitch glides further within a few frames (a vowel through the telephone band,
near-pure at 400 Hz: 4–5 Hz a frame)."""


@dataclass(frozen=True, slots=True)
class BeepSettings:
    min_beep_ms: int = 120
    """The shortest tone taken for a beep (machines' beeps are 150–1000 ms; a tonal syllable is not this long)."""
    min_db: float = 40.0
    """A frame this loud or louder may be a tone (20·log10 of its RMS in PCM16 units; line noise is about 30)."""
    min_tone_share: float = 0.8
    """The share of a frame's energy its peak must hold to be a tone (a pure tone's: 0.99; a voice's: under 0.6)."""
    low_hz: float = 300.0
    high_hz: float = 3400.0
    frame_ms: int = 20

    def __post_init__(self) -> None:
        if not (0 < self.low_hz < self.high_hz and 0 < self.min_tone_share <= 1 and self.min_beep_ms >= self.frame_ms > 0):
            raise ValueError("beep settings out of order")


@dataclass(frozen=True, slots=True)
class Beep:
    """A beep heard: from ``start_ms`` to ``end_ms`` of the callee's audio, at ``frequency_hz`` (its first tone's)."""

    start_ms: int
    end_ms: int
    frequency_hz: float


class BeepDetector:
    """One call's beep detector (see the module docstring): ``frame`` each 20 ms of the callee's audio, in order."""

    def __init__(self, rate_hz: int = 8000, settings: BeepSettings | None = None) -> None:
        self.settings = s = settings or BeepSettings()
        self.rate_hz = rate_hz
        self._samples = rate_hz * s.frame_ms // 1000
        size = 2 * self._samples
        self._window = np.hanning(size)
        bin_hz = rate_hz / size
        self._low_bin, self._high_bin = max(1, math.ceil(s.low_hz / bin_hz)), min(size // 2, int(s.high_hz / bin_hz))
        self._bin_hz = bin_hz
        self._last = np.zeros(self._samples)
        self._run_from_ms: int | None = None
        """Where the run of tonal frames now going on began."""
        self._run_hz = 0.0
        self._tone_from_ms = 0
        self._tone_hz_from = 0.0
        """Where the tone sounding began, and its frequency there."""
        self._gap_from_ms: int | None = None
        """The run's first frame that was not tonal, where one came after it (the run goes on if the next is)."""
        self.tone_ms = 0
        """How long the run of tones now sounding has lasted (0: none): a beep under way."""
        self.level_db = 0.0
        """The last frame's level (``echo_gate.level_db``)."""

    def frame(self, pcm: bytes, at_ms: int) -> Beep | None:
        """The callee's next frame (PCM16, ``frame_ms`` at ``rate_hz``) from ``at_ms``: the beep that just ended, if
        one did."""
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        if len(samples) != self._samples:
            raise ValueError(f"a frame is {self._samples} samples, not {len(samples)}")
        window = np.concatenate((self._last, samples))
        self._last = samples
        self.level_db = level_db(pcm)
        frequency = self._tone_hz(window) if self.level_db >= self.settings.min_db else None
        if self._run_from_ms is None:
            if frequency is not None:
                self._begin(at_ms, frequency, run=True)
            return None
        if frequency is None:
            if self._gap_from_ms is None and at_ms - self._tone_from_ms >= _MIN_TONE_MS:
                self._gap_from_ms = at_ms  # the run's end, unless the next frame steps to another tone
                return None
            return self._ended(self._gap_from_ms if self._gap_from_ms is not None else self._tone_end(at_ms))
        if self._gap_from_ms is not None:  # a two-tone beep's next tone
            self._gap_from_ms = None
            self._begin(at_ms, frequency, run=False)
        elif not self._steady(frequency):  # a glide (a voice's pitch): not one tone; a new run from here
            beep = self._ended(self._tone_end(at_ms))
            self._begin(at_ms, frequency, run=True)
            return beep
        self.tone_ms = at_ms + self.settings.frame_ms - self._run_from_ms
        return None

    def _begin(self, at_ms: int, frequency: float, *, run: bool) -> None:
        """A tone begins at ``at_ms``: a run's first (``run``), or its next."""
        if run:
            self._run_from_ms, self._run_hz = at_ms, frequency
        self._tone_from_ms, self._tone_hz_from = at_ms, frequency
        self.tone_ms = at_ms + self.settings.frame_ms - (self._run_from_ms or at_ms)

    def _tone_end(self, at_ms: int) -> int:
        """Where the run ends if its tone stops at ``at_ms``: there, or where that tone began if it was too short to
        be one of a beep's."""
        return at_ms if at_ms - self._tone_from_ms >= _MIN_TONE_MS else self._tone_from_ms

    def _steady(self, frequency: float) -> bool:
        """Whether ``frequency`` is the tone sounding (a tone holds its pitch; a voice glides)."""
        return abs(frequency - self._tone_hz_from) <= _STEADY_HZ

    def _ended(self, end_ms: int) -> Beep | None:
        """The run is over at ``end_ms``: a beep, where it lasted long enough."""
        run_from = self._run_from_ms
        self._run_from_ms = self._gap_from_ms = None
        self.tone_ms = 0
        if run_from is None or end_ms - run_from < self.settings.min_beep_ms:
            return None
        return Beep(run_from, end_ms, round(self._run_hz, 1))

    def _tone_hz(self, window: np.ndarray) -> float | None:
        """The frequency of the tone the newest frame holds (judged over ``window``, it and the one before), or None."""
        power = np.abs(np.fft.rfft(window * self._window)) ** 2
        total = float(power[1:].sum())
        band = power[self._low_bin : self._high_bin + 1]
        peak = self._low_bin + int(np.argmax(band))
        if peak - 2 < 1 or peak + 2 >= len(power):
            return None
        if float(power[peak - 2 : peak + 3].sum()) < self.settings.min_tone_share * total:
            return None
        # the peak between bins: a parabola through the log powers of the peak bin and its neighbours
        left, centre, right = (math.log(float(power[k]) + 1e-12) for k in (peak - 1, peak, peak + 1))
        curve = left - 2 * centre + right
        offset = 0.5 * (left - right) / curve if curve < 0 else 0.0
        return (peak + offset) * self._bin_hz
