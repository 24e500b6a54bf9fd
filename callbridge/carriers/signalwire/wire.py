"""SignalWire's media stream: Twilio's wire (``TwilioCodec``) under SignalWire's name, and its one extra format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from callbridge.carriers.json_wire import start_body
from callbridge.carriers.twilio.wire import MULAW_8K, TwilioCodec
from callbridge.carriers.twilio.wire import recognises as twilio_recognises
from callbridge.codecs import AudioEncoding

__all__ = ["SIGNALWIRE_FORMATS", "recognises", "signalwire_codec"]

SIGNALWIRE_FORMATS: Final = {
    **MULAW_8K,
    ("audio/x-l16", 24000): AudioEncoding.L16,
    ("audio/l16", 24000): AudioEncoding.L16,
    ("L16", 24000): AudioEncoding.L16,
}
"""μ-law 8 kHz, or little-endian PCM16 at 24 kHz (``L16@24000h``), as the ``start`` message announces it."""


def signalwire_codec() -> TwilioCodec:
    return TwilioCodec(provider="signalwire", formats=SIGNALWIRE_FORMATS)


def recognises(first: Mapping[str, Any]) -> bool:
    """A first message on the generic ``/media`` URL is SignalWire's: Twilio's ``start`` with ``streamSid``, from
    an account that is not Twilio's ``AC…`` (a project UUID)."""
    start = start_body(first)
    return start is not None and ("streamSid" in first or "streamSid" in start) and not twilio_recognises(first)
