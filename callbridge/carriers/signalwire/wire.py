"""SignalWire's media stream: Twilio's wire (``TwilioCodec``) under SignalWire's name, and its one extra format."""

from __future__ import annotations

from typing import Final

from callbridge.carriers.twilio.wire import MULAW_8K, TwilioCodec
from callbridge.codecs import AudioEncoding

__all__ = ["SIGNALWIRE_FORMATS", "signalwire_codec"]

SIGNALWIRE_FORMATS: Final = {
    **MULAW_8K,
    ("audio/x-l16", 24000): AudioEncoding.L16,
    ("audio/l16", 24000): AudioEncoding.L16,
    ("L16", 24000): AudioEncoding.L16,
}
"""μ-law 8 kHz, or little-endian PCM16 at 24 kHz (``L16@24000h``), as the ``start`` message announces it."""


def signalwire_codec() -> TwilioCodec:
    return TwilioCodec(provider="signalwire", formats=SIGNALWIRE_FORMATS)
