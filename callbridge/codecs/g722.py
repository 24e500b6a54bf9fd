"""G.722 (ITU-T, 64 kbit/s sub-band ADPCM) ⇄ PCM16 at 16 kHz: wideband SIP media (#43).

Through sippy's libg722 (the ``G722`` distribution: Steve Underwood's C coder, the one in spandsp, FreeSWITCH and
Asterisk, bit-exact to the ITU's test vectors, public domain, wheels for CPython on Linux and macOS) rather than
a port of our own: the codec is a few hundred lines of integer arithmetic whose every bit matters to the peer's
decoder, and sample-serial (each sample's step adapts on the last), so Python or numpy would cost far more than C.

Unlike G.711 it keeps state: each direction of a call has its own ``G722Encoder`` or ``G722Decoder``, fed the
stream in order (a lost packet is fed too, as ``SILENCE_BYTE``: the decoder's state stays in step with the
peer's encoder, and what comes out decays to silence). Two PCM samples make one byte, so 20 ms is 320 samples and
160 bytes, and RTP's clock for G.722 runs at 8000 Hz though the audio is sampled at 16000 (RFC 3551 §4.5.2): the
byte count is the timestamp step, as for G.711.
"""

from __future__ import annotations

from typing import Final

import G722
import numpy as np

from callbridge.codecs.g711 import Buffer

__all__ = ["BYTES_PER_MS", "RATE_HZ", "SILENCE_BYTE", "G722Decoder", "G722Encoder"]

RATE_HZ: Final = 16000
"""The audio's sample rate (RTP's clock for G.722 is 8000 all the same)."""
BYTES_PER_MS: Final = 8
SILENCE_BYTE: Final = 0xFC
"""A code the decoder turns into silence (from a fresh state: zeros; mid-stream it decays within 20 ms): what the
jitter buffer conceals a lost packet with."""
_BIT_RATE: Final = 64000
_ZEROS: Final = bytes(2 * RATE_HZ * 60 // 1000)
"""Digital silence, as long as the longest ``G722Encoder.silence`` asks (the cadence's packets are 20 ms)."""


class G722Encoder:
    """One stream's encoder: PCM16 little-endian at 16 kHz (an even count of samples) → G.722 bytes."""

    __slots__ = ("_coder",)

    def __init__(self) -> None:
        self._coder = G722.G722(RATE_HZ, _BIT_RATE)

    def encode(self, pcm: Buffer) -> bytes:
        encoded: bytes = self._coder.encode(np.frombuffer(pcm, dtype="<i2"))
        return encoded

    def silence(self, ms: int) -> bytes:
        """``ms`` of digital silence, encoded (through the encoder, so the peer's decoder stays in step)."""
        return self.encode(memoryview(_ZEROS)[: 2 * RATE_HZ * ms // 1000])


class G722Decoder:
    """One stream's decoder: G.722 bytes → PCM16 little-endian at 16 kHz (two samples a byte)."""

    __slots__ = ("_coder",)

    def __init__(self) -> None:
        self._coder = G722.G722(RATE_HZ, _BIT_RATE)

    def decode(self, payload: Buffer) -> bytes:
        decoded = self._coder.decode(bytes(payload))
        return decoded.tobytes()  # type: ignore[no-any-return]
