"""What the simulated caller's line adds to what the caller says (``CallerScript.echo_db``, ``backchannels_ms``): the
agent's own voice coming back — a speakerphone, a PBX without echo cancelling — short "go on" sounds over the
agent, line noise, and the telephone network's band (300–3400 Hz). PCM16 8 kHz, one 20 ms frame at a time, from
what the caller heard (``CallResult.heard``)."""

from __future__ import annotations

import audioop
from typing import Final

import numpy as np

__all__ = ["FRAME_BYTES", "CallerLine", "LineNoise", "TelephoneBand", "backchannel_piece", "echo_of", "mixed"]

FRAME_BYTES: Final = 320
"""20 ms of PCM16 at 8 kHz."""
_BYTES_PER_MS: Final = 16


def echo_of(heard: bytes | bytearray, t_ms: int, *, delay_ms: int, down_db: float) -> bytes:
    """The 20 ms frame at ``t_ms`` of what the caller heard, as it comes back ``delay_ms`` later, ``down_db`` weaker
    (a flat echo path: no filtering, no noise)."""
    start = (t_ms - delay_ms) * _BYTES_PER_MS
    piece = bytes(heard[max(0, start) : start + FRAME_BYTES]) if start + FRAME_BYTES > 0 else b""
    if start < 0:
        piece = bytes(min(-start, FRAME_BYTES)) + piece
    piece = piece.ljust(FRAME_BYTES, b"\x00")[:FRAME_BYTES]
    return audioop.mul(piece, 2, 10 ** (-down_db / 20))


def mixed(first: bytes, second: bytes) -> bytes:
    """Two frames heard at once (saturating, as a line would clip)."""
    return audioop.add(first, second, 2)


def backchannel_piece(t_ms: int, agent_from_ms: int, after_ms: tuple[int, ...], length_ms: int, speech: bytes) -> tuple[bytes, bool]:
    """The 20 ms the caller says at ``t_ms`` of a backchannel (the first ``length_ms`` of ``speech``) said each
    ``after_ms`` after the agent was first heard at ``agent_from_ms``; and whether one begins there. b"": none."""
    for after in after_ms:
        at = agent_from_ms + after // 20 * 20
        if at <= t_ms < at + length_ms:
            offset = (t_ms - at) * _BYTES_PER_MS
            return speech[offset : offset + FRAME_BYTES], t_ms == at
    return b"", False


class LineNoise:
    """Line noise (``CallerScript.noise_db``): white noise at ``level_db`` (20·log10 of its RMS in int16 units, as
    ``bridge/echo_gate.py`` measures a frame; speech is about 60–75), the same every run of a call (``seed``)."""

    def __init__(self, level_db: float, seed: int = 0) -> None:
        self._rms = 10 ** (level_db / 20)
        self._rng = np.random.default_rng(seed)

    def frame(self) -> bytes:
        noise = self._rng.normal(0.0, self._rms, FRAME_BYTES // 2)
        return np.clip(noise, -32768, 32767).astype("<i2").tobytes()



class TelephoneBand:
    """The telephone network's band, 300–3400 Hz, on a stream of 20 ms frames: each frame filtered with the one
    before it (an FFT mask over both, the newer half kept), so the frames' edges do not click."""

    def __init__(self, low_hz: float = 300.0, high_hz: float = 3400.0) -> None:
        samples = FRAME_BYTES // 2
        freqs = np.fft.rfftfreq(2 * samples, 1 / 8000)
        self._mask = (freqs >= low_hz) & (freqs <= high_hz)
        self._before = np.zeros(samples)

    def frame(self, pcm: bytes) -> bytes:
        now = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        both = np.concatenate([self._before, now])
        self._before = now
        filtered = np.fft.irfft(np.fft.rfft(both) * self._mask, len(both))[len(now) :]
        return np.clip(filtered, -32768, 32767).astype("<i2").tobytes()


class CallerLine:
    """What the caller's line adds to their voice, frame by frame: the agent's echo (``echo_db`` down,
    ``echo_delay_ms`` late, from what the caller heard), voices in their room (``room``: PCM16, dB down, again and
    again from the call's start), line noise (``noise_db``), and — all of it — the telephone band (``band``)."""

    def __init__(
        self, *, echo_db: float | None = None, echo_delay_ms: int = 0, noise_db: float | None = None,
        room: tuple[bytes, float] | None = None, band: bool = False,
    ) -> None:  # fmt: skip
        self.echo_db, self.echo_delay_ms, self.room = echo_db, echo_delay_ms, room
        self._noise = LineNoise(noise_db) if noise_db is not None else None
        self._band = TelephoneBand() if band else None

    def frame(self, voice: bytes, heard: bytes | bytearray, t_ms: int) -> bytes:
        """The 20 ms the line sends at ``t_ms``: ``voice`` (the caller's own, or silence) and all the line adds."""
        frame = voice
        if self.room is not None:
            room, down_db = self.room
            offset = t_ms * _BYTES_PER_MS % max(FRAME_BYTES, len(room) - FRAME_BYTES)
            frame = mixed(frame, audioop.mul(room[offset : offset + FRAME_BYTES].ljust(FRAME_BYTES, b"\x00"), 2, 10 ** (-down_db / 20)))
        if self.echo_db is not None:
            frame = mixed(frame, echo_of(heard, t_ms, delay_ms=self.echo_delay_ms, down_db=self.echo_db))
        if self._noise is not None:
            frame = mixed(frame, self._noise.frame())
        return self._band.frame(frame) if self._band is not None else frame
