"""Audio at the edges: G.711 and L16 ⇄ PCM16, streaming resampling, 20 ms framing.

Pure and synchronous; nothing here knows about calls, carriers or clocks.
"""

from __future__ import annotations

from callbridge.codecs.framing import FRAME_MS, FrameAssembler, frame_bytes
from callbridge.codecs.g711 import (
    PCM16_SAMPLE_BYTES,
    AudioEncoding,
    Buffer,
    alaw_to_pcm16,
    decode_to_pcm16,
    encode_from_pcm16,
    pcm16_rms,
    pcm16_to_alaw,
    pcm16_to_ulaw,
    ulaw_to_pcm16,
)
from callbridge.codecs.resample import ResamplerQuality, StreamResampler

__all__ = [
    "FRAME_MS",
    "PCM16_SAMPLE_BYTES",
    "AudioEncoding",
    "Buffer",
    "FrameAssembler",
    "ResamplerQuality",
    "StreamResampler",
    "alaw_to_pcm16",
    "decode_to_pcm16",
    "encode_from_pcm16",
    "frame_bytes",
    "pcm16_rms",
    "pcm16_to_alaw",
    "pcm16_to_ulaw",
    "ulaw_to_pcm16",
]
