"""G.711 μ-law / A-law and L16 ⇄ PCM16, at C speed through ``audioop``.

Every function takes and returns ``bytes``-like buffers: PCM16 is signed
16-bit little-endian mono, the byte order of every carrier's L16 except RTP's
(RFC 3551 L16 is big-endian). View PCM16 as samples with
``numpy.frombuffer(pcm, dtype="<i2")`` — no copy.

``audioop`` is in the standard library up to Python 3.12 and comes from the
``audioop-lts`` distribution from 3.13 on; both are the same C code, so the
μ-law encoder is Sun's 14-bit formulation (telephony-protocols.md §6.3: it
rounds negative inputs toward −∞, one code step off the bias/clip formulation
on 381 negative inputs).
"""

from __future__ import annotations

import enum
import sys
import warnings
from typing import Final

with warnings.catch_warnings():
    # Deprecated in 3.11/3.12 (PEP 594), restored by audioop-lts on 3.13+.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

if sys.byteorder != "little":  # pragma: no cover - every supported platform is LE
    raise ImportError("callbridge.codecs assumes a little-endian host (audioop is native-endian)")

__all__ = [
    "PCM16_SAMPLE_BYTES",
    "AudioEncoding",
    "Buffer",
    "alaw_to_pcm16",
    "decode_to_pcm16",
    "encode_from_pcm16",
    "pcm16_rms",
    "pcm16_to_alaw",
    "pcm16_to_ulaw",
    "ulaw_to_pcm16",
]

Buffer = bytes | bytearray | memoryview
"""Anything ``audioop`` and ``numpy.frombuffer`` read without a copy."""

PCM16_SAMPLE_BYTES: Final = 2
_WIDTH: Final = PCM16_SAMPLE_BYTES


class AudioEncoding(enum.Enum):
    """How a carrier puts samples on the wire."""

    PCMU = "pcmu"  # G.711 μ-law, 1 byte/sample
    PCMA = "pcma"  # G.711 A-law, 1 byte/sample
    L16 = "l16"  # signed 16-bit little-endian (most carriers' PCM)
    L16_BE = "l16-be"  # signed 16-bit big-endian (RFC 3551 L16 over RTP)
    G722 = "g722"
    """G.722 wideband over RTP (one byte per tick of its 8 kHz RTP clock, two 16 kHz samples): stateful, so only
    the SIP media edge (``carriers/sip/wire.py``) has it, with a coder per stream (``codecs/g722.py``); what it
    gives the bridge is L16 at 16 kHz. ``decode_to_pcm16`` and ``encode_from_pcm16`` refuse it."""
    OPUS = "opus"
    """Opus over RTP (RFC 7587): packets of any size on a 48 kHz RTP clock, coded at the SIP media edge as G.722
    is (``codecs/opus.py``), L16 at 16 kHz to the bridge. It has no silence byte: a lost packet is concealed by its
    decoder (``silence_byte`` raises ``KeyError``)."""

    @property
    def sample_bytes(self) -> int:
        return 2 if self in (AudioEncoding.L16, AudioEncoding.L16_BE) else 1

    @property
    def silence_byte(self) -> int:
        """The byte that fills silence: μ-law 0xFF, A-law 0xD5 (§6.3), L16 zero (Opus has none: ``KeyError``)."""
        return _SILENCE_BYTE[self]


_SILENCE_BYTE: Final = {
    AudioEncoding.PCMU: 0xFF,
    AudioEncoding.PCMA: 0xD5,
    AudioEncoding.L16: 0x00,
    AudioEncoding.L16_BE: 0x00,
    AudioEncoding.G722: 0xFC,  # codecs/g722.py: SILENCE_BYTE
}

def ulaw_to_pcm16(data: Buffer) -> bytes:
    """μ-law bytes → PCM16 (two bytes per code)."""
    return audioop.ulaw2lin(data, _WIDTH)


def pcm16_to_ulaw(pcm: Buffer) -> bytes:
    """PCM16 → μ-law bytes. ``pcm`` must hold whole samples."""
    return audioop.lin2ulaw(pcm, _WIDTH)


def alaw_to_pcm16(data: Buffer) -> bytes:
    """A-law bytes → PCM16."""
    return audioop.alaw2lin(data, _WIDTH)


def pcm16_to_alaw(pcm: Buffer) -> bytes:
    """PCM16 → A-law bytes. ``pcm`` must hold whole samples."""
    return audioop.lin2alaw(pcm, _WIDTH)


def pcm16_rms(pcm: Buffer) -> int:
    """Root mean square of PCM16 samples, in sample units (0…32768)."""
    return audioop.rms(pcm, _WIDTH)


def decode_to_pcm16(encoding: AudioEncoding, payload: Buffer) -> Buffer:
    """Wire payload in ``encoding`` → PCM16 little-endian.

    L16 comes back as the very buffer it was given (no copy); callers that keep
    it past the next receive must copy it themselves.
    """
    if encoding is AudioEncoding.PCMU:
        return audioop.ulaw2lin(payload, _WIDTH)
    if encoding is AudioEncoding.PCMA:
        return audioop.alaw2lin(payload, _WIDTH)
    if encoding is AudioEncoding.L16:
        return payload
    if encoding is AudioEncoding.L16_BE:
        return audioop.byteswap(payload, _WIDTH)
    raise ValueError(f"{encoding.name} keeps state: a stream's own coder decodes it (callbridge.codecs.g722, .opus)")


def encode_from_pcm16(encoding: AudioEncoding, pcm: Buffer) -> Buffer:
    """PCM16 little-endian → wire payload in ``encoding`` (L16: no copy)."""
    if encoding is AudioEncoding.PCMU:
        return audioop.lin2ulaw(pcm, _WIDTH)
    if encoding is AudioEncoding.PCMA:
        return audioop.lin2alaw(pcm, _WIDTH)
    if encoding is AudioEncoding.L16:
        return pcm
    if encoding is AudioEncoding.L16_BE:
        return audioop.byteswap(pcm, _WIDTH)
    raise ValueError(f"{encoding.name} keeps state: a stream's own coder encodes it (callbridge.codecs.g722, .opus)")
