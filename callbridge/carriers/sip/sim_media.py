"""The simulated trunk's side of a call's codec (``carriers/sip/sim_stream.py``): the simulator's audio is 8 kHz PCM,
coded as the bridge's answer took it — G.711 as it is, G.722 and Opus (#43) through 16 kHz (the codec's audio rate)
with a coder per direction, as a wideband phone does. What the phone sends of a 20 ms frame and what it plays of a
packet; what its RTP clock advances a packet; whether a packet is the bridge's silence (its cadence before the agent
speaks)."""

from __future__ import annotations

import audioop
from typing import Final

from callbridge.codecs import ResamplerQuality, StreamResampler
from callbridge.codecs.g722 import G722Decoder, G722Encoder
from callbridge.codecs.opus import OpusDecoder, OpusEncoder

__all__ = ["PhoneCodec"]

_TICKS_PER_FRAME: Final = {0: 160, 8: 160, 9: 160, 111: 960}
"""RTP clock ticks in 20 ms: 8000 Hz but for Opus's 48000 (G.722's clock is 8000 too, RFC 3551)."""
_QUIET: Final = 4
"""A decoded wideband packet whose samples all stay within this is the bridge's (coded) silence: played as digital
silence (G.722's decoder leaves a few steps of idle noise where zeros went in; the simulator tells the agent's
speech from the cadence by digital silence, as a G.711 call's silence byte is)."""


class PhoneCodec:
    """One call's codec on the phone's side: ``payload_type`` of ``sim_wire.CODEC_PT``."""

    def __init__(self, payload_type: int) -> None:
        self.payload_type = payload_type
        self.ticks_per_frame = _TICKS_PER_FRAME[payload_type]
        self.clock_hz = self.ticks_per_frame * 50
        self._up = self._down = None
        self._encoder: G722Encoder | OpusEncoder | None = None
        self._decoder: G722Decoder | OpusDecoder | None = None
        if payload_type in (9, 111):
            self._up, self._down = StreamResampler(8000, 16000, ResamplerQuality.LD), StreamResampler(16000, 8000, ResamplerQuality.LD)
            self._encoder, self._decoder = (G722Encoder(), G722Decoder()) if payload_type == 9 else (OpusEncoder(), OpusDecoder())

    @property
    def narrowband(self) -> bool:
        return self._encoder is None

    def encode(self, pcm_8k: bytes) -> bytes:
        """20 ms of the caller's audio as one packet's payload."""
        if self._encoder is None or self._up is None:
            return audioop.lin2ulaw(pcm_8k, 2) if self.payload_type == 0 else audioop.lin2alaw(pcm_8k, 2)
        return self._encoder.encode(self._up.process(pcm_8k))

    def decode(self, payload: bytes) -> bytes:
        """A packet of the bridge's as 8 kHz PCM (what the phone plays)."""
        if self._decoder is None or self._down is None:
            return audioop.ulaw2lin(payload, 2) if self.payload_type == 0 else audioop.alaw2lin(payload, 2)
        pcm = self._down.process(self._decoder.decode(payload))
        return bytes(len(pcm)) if pcm and audioop.max(pcm, 2) <= _QUIET else pcm

    def silent(self, payload: bytes, pcm_8k: bytes) -> bool:
        """Whether a packet (``payload``, decoded ``pcm_8k``) is only silence."""
        if self._encoder is None:
            return payload.count(0xFF if self.payload_type == 0 else 0xD5) == len(payload)
        return not pcm_8k or audioop.max(pcm_8k, 2) == 0
