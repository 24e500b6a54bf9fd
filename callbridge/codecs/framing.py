"""Cut a byte stream of encoded audio into exact fixed-length frames.

Plan: keep at most one partial frame in a ``bytearray``. When nothing is
pending, whole frames are sliced straight out of the caller's buffer (one copy
per frame, the frame's own ``bytes``); only the remainder is kept. So a push of
whole frames — the common case — never grows or shifts the carry buffer.
"""

from __future__ import annotations

from typing import Final

from callbridge.codecs.g711 import AudioEncoding, Buffer

__all__ = ["FRAME_MS", "FrameAssembler", "frame_bytes"]

FRAME_MS: Final = 20


def frame_bytes(rate_hz: int, encoding: AudioEncoding, frame_ms: int = FRAME_MS) -> int:
    """Bytes in one frame of ``frame_ms`` at ``rate_hz`` (160 for 20 ms of 8 kHz μ-law)."""
    samples, rest = divmod(rate_hz * frame_ms, 1000)
    if rest or samples <= 0:
        raise ValueError(f"{frame_ms} ms at {rate_hz} Hz is not a whole number of samples")
    return samples * encoding.sample_bytes


class FrameAssembler:
    """Arbitrary-length audio in, exact ``frame_ms`` frames out.

    ``push()`` returns the frames completed by the new bytes and carries the
    remainder to the next push; ``flush()`` returns the remainder padded with
    the encoding's silence, or ``None`` when nothing is pending; ``clear()``
    drops the remainder (barge-in).
    """

    __slots__ = ("_pending", "_silence", "encoding", "frame_bytes", "frame_ms", "rate_hz")

    def __init__(self, rate_hz: int, encoding: AudioEncoding, frame_ms: int = FRAME_MS) -> None:
        self.rate_hz: Final = rate_hz
        self.encoding: Final = encoding
        self.frame_ms: Final = frame_ms
        self.frame_bytes: Final = frame_bytes(rate_hz, encoding, frame_ms)
        self._pending = bytearray()
        self._silence = bytes([encoding.silence_byte]) * self.frame_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes waiting for the rest of their frame."""
        return len(self._pending)

    def push(self, data: Buffer) -> list[bytes]:
        """Add ``data``; return every frame it completes, oldest first."""
        size = self.frame_bytes
        frames: list[bytes] = []
        view = memoryview(data)
        start = 0
        if self._pending:
            start = min(size - len(self._pending), len(view))
            self._pending += view[:start]
            if len(self._pending) < size:
                return frames
            frames.append(bytes(self._pending))
            self._pending.clear()
        whole_end = start + (len(view) - start) // size * size
        for offset in range(start, whole_end, size):
            frames.append(bytes(view[offset : offset + size]))
        if whole_end < len(view):
            self._pending += view[whole_end:]
        return frames

    def flush(self) -> bytes | None:
        """Return the pending partial frame padded with silence, or ``None``."""
        if not self._pending:
            return None
        frame = bytes(self._pending) + self._silence[len(self._pending) :]
        self._pending.clear()
        return frame

    def clear(self) -> int:
        """Drop the pending partial frame; returns how many bytes were dropped."""
        dropped = len(self._pending)
        self._pending.clear()
        return dropped
