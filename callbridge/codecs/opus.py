"""Opus (RFC 6716) ⇄ PCM16 at 16 kHz: wideband SIP media (#43), carried over RTP as RFC 7587 says.

Through libopus, Xiph's reference coder (the one every WebRTC stack, FreeSWITCH, Asterisk and baresip use; Debian's
``libopus0``), bound here with ``ctypes`` to the seven functions a call needs. Why not a Python package: ``opuslib``
has not been released since 2018; ``opuslib-next`` (one maintainer) copies each decoded frame through a Python list
(3.1 against 1.5 CPU-ms a call-second here); PyAV is well kept and bundles libopus, but through FFmpeg's frame API a
call-second cost 13 CPU-ms against 5.4 (one script, both ways, this project's machine, session 42), its decoder gives 48 kHz only (a
resampler more) and it cannot conceal a lost packet (FFmpeg takes an empty packet for the stream's end). The codec
itself is never ours: only the calls into it.

Opus is coded at 16 kHz both ways (libopus resamples inside itself: a fullband peer's packets decode to 16 kHz, and
ours carry wideband speech), 20 ms a packet, mono, in-band FEC on with the loss it is sized for (or off:
``sip.opus_fec``, for CPU). RTP's clock for Opus
is 48000 whatever the audio's rate (RFC 7587 §4.1), so 20 ms is 960 ticks. Each direction of a call keeps its own
state: one ``OpusEncoder`` and one ``OpusDecoder`` a call, fed the stream in order. A lost packet is concealed by
the decoder itself (``OpusDecoder.conceal``): from the next packet's FEC where that has come, else libopus's packet
loss concealment, which fades out rather than clicking to silence.

The library is loaded when the first coder is made, not at import: a deployment without Opus in ``sip.codecs``
needs no libopus, and one with it is told at ``callbridge config check`` (``problem()``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from typing import Final

from callbridge.codecs.g711 import Buffer

__all__ = [
    "FRAME_MS", "RATE_HZ", "RTP_CLOCK_HZ", "OpusDecoder", "OpusEncoder", "OpusUnavailable", "library", "problem",
]  # fmt: skip

RATE_HZ: Final = 16000
"""The audio's rate on our side, both ways (what the engine takes)."""
RTP_CLOCK_HZ: Final = 48000
"""RTP's clock for Opus, whatever the audio's rate (RFC 7587 §4.1)."""
FRAME_MS: Final = 20
BITRATE: Final = 32000
"""Bits a second we send: wideband speech is transparent from about 24 kbit/s, and FEC takes its share of these."""
LOSS_PERCENT: Final = 5
"""The packet loss our encoder's FEC is sized for (libopus adds FEC only when told to expect some)."""
COMPLEXITY_WITH_FEC: Final = 2
"""libopus's effort, 0–10, where FEC is on: 2 is the least at which libopus 1.3 adds FEC at all (at 0 and 1 a lost
packet rebuilt from the next one's FEC was no better than concealment: 5 dB against 16–18 at 2 and 3,
``tests/codecs/test_opus.py``). Encoding speech at 16 kHz with FEC cost 10.7 CPU-ms a call-second at 2, 11.0 at 3
(14.0 at 5, 27.6 at 10 without), on the machine of the session that chose it; decoding 1.5 at any."""
COMPLEXITY_WITHOUT_FEC: Final = 1
"""Without FEC: 5.4 CPU-ms a call-second encoding speech (7.1 at 2). What is lost below 5 is analysis effort (pitch
search, noise shaping), not band: the packets still carry 8 kHz of audio at our bit rate."""
_MAX_SAMPLES: Final = RATE_HZ * 120 // 1000
"""The longest packet Opus has, 120 ms, at our rate: what a decode is given room for."""
_MAX_PACKET: Final = 1500
"""Room for one encoded packet (a 20 ms frame is at most 1,275 bytes)."""
_ZEROS: Final = bytes(2 * RATE_HZ * 60 // 1000)
"""Digital silence, as long as the longest ``OpusEncoder.silence`` asks (the cadence's packets are 20 ms)."""

_APPLICATION_VOIP: Final = 2048
_SET_BITRATE: Final = 4002
_SET_COMPLEXITY: Final = 4010
_SET_INBAND_FEC: Final = 4012
_SET_PACKET_LOSS_PERC: Final = 4014
_SET_SIGNAL: Final = 4024
_SIGNAL_VOICE: Final = 3001
_NAMES: Final = ("libopus.so.0", "libopus.0.dylib", "libopus.dylib", "opus.dll")


class OpusUnavailable(RuntimeError):
    """libopus cannot be loaded (not installed)."""


@functools.cache
def library() -> ctypes.CDLL:
    """libopus, loaded once, with the signatures we call. Raises ``OpusUnavailable``."""
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        pointer, i32 = ctypes.c_void_p, ctypes.c_int32
        lib.opus_encoder_create.argtypes = [i32, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.opus_encoder_create.restype = pointer
        lib.opus_encoder_destroy.argtypes = [pointer]
        lib.opus_encode.argtypes = [pointer, ctypes.c_char_p, ctypes.c_int, pointer, i32]
        lib.opus_encode.restype = i32
        lib.opus_decoder_create.argtypes = [i32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.opus_decoder_create.restype = pointer
        lib.opus_decoder_destroy.argtypes = [pointer]
        lib.opus_decode.argtypes = [pointer, ctypes.c_char_p, i32, pointer, ctypes.c_int, ctypes.c_int]
        lib.opus_decode.restype = ctypes.c_int
        lib.opus_encoder_ctl.restype = ctypes.c_int  # variadic: its arguments go as ctypes.c_int
        lib.opus_get_version_string.restype = ctypes.c_char_p
        return lib
    raise OpusUnavailable("libopus is not installed (Debian/Ubuntu: apt-get install libopus0; macOS: brew install opus)")


def _candidates() -> Iterator[str]:
    """The library's usual names, then what the system's lookup finds (on Linux it runs ``ldconfig``: last)."""
    yield from _NAMES
    if (found := ctypes.util.find_library("opus")) is not None:
        yield found


def problem() -> str | None:
    """Why Opus cannot be used here, in one sentence; None when it can."""
    try:
        library()
    except OpusUnavailable as error:
        return str(error)
    return None


class OpusEncoder:
    """One stream's encoder: PCM16 little-endian at 16 kHz, a packet's worth at a time (2.5–60 ms; 20 ms on a
    call) → one Opus packet. ``fec``: each packet carries the last one again, coarser, for a peer that lost it (at
    the least complexity that does it: ``COMPLEXITY_WITH_FEC``)."""

    __slots__ = ("_lib", "_out", "_state")

    def __init__(self, *, fec: bool = True, bitrate: int = BITRATE, complexity: int | None = None) -> None:
        lib = library()
        error = ctypes.c_int()
        state = lib.opus_encoder_create(RATE_HZ, 1, _APPLICATION_VOIP, ctypes.byref(error))
        if not state or error.value != 0:
            raise OpusUnavailable(f"opus_encoder_create failed ({error.value})")
        self._lib, self._state = lib, ctypes.c_void_p(state)
        effort = complexity if complexity is not None else COMPLEXITY_WITH_FEC if fec else COMPLEXITY_WITHOUT_FEC
        for request, value in (
            (_SET_BITRATE, bitrate), (_SET_COMPLEXITY, effort), (_SET_INBAND_FEC, int(fec)),
            (_SET_PACKET_LOSS_PERC, LOSS_PERCENT if fec else 0), (_SET_SIGNAL, _SIGNAL_VOICE),
        ):  # fmt: skip
            if (status := lib.opus_encoder_ctl(self._state, ctypes.c_int(request), ctypes.c_int(value))) != 0:
                raise ValueError(f"opus_encoder_ctl({request}, {value}) failed ({status})")
        self._out = ctypes.create_string_buffer(_MAX_PACKET)

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            self._lib.opus_encoder_destroy(self._state)

    def encode(self, pcm: Buffer) -> bytes:
        size = self._lib.opus_encode(self._state, bytes(pcm), len(pcm) // 2, self._out, _MAX_PACKET)
        if size < 0:  # only for a length Opus has no frame of: the bridge's frames are 20 ms
            raise ValueError(f"opus_encode of {len(pcm)} bytes failed ({size})")
        return ctypes.string_at(self._out, size)

    def silence(self, ms: int) -> bytes:
        """``ms`` of digital silence, encoded (through the encoder, so the peer's decoder stays in step)."""
        return self.encode(memoryview(_ZEROS)[: 2 * RATE_HZ * ms // 1000])


class OpusDecoder:
    """One stream's decoder: an Opus packet (narrowband to fullband, mono or stereo) → PCM16 little-endian at 16 kHz."""

    __slots__ = ("_lib", "_pcm", "_state", "last_samples")

    def __init__(self) -> None:
        lib = library()
        error = ctypes.c_int()
        state = lib.opus_decoder_create(RATE_HZ, 1, ctypes.byref(error))
        if not state or error.value != 0:
            raise OpusUnavailable(f"opus_decoder_create failed ({error.value})")
        self._lib, self._state = lib, ctypes.c_void_p(state)
        self._pcm = (ctypes.c_int16 * _MAX_SAMPLES)()
        self.last_samples = RATE_HZ * FRAME_MS // 1000
        """The last packet's length, in samples: what a lost one is taken to have lasted."""

    def __del__(self) -> None:
        if getattr(self, "_state", None):
            self._lib.opus_decoder_destroy(self._state)

    def decode(self, payload: bytes) -> bytes:
        """One packet's audio; a packet libopus cannot read (corrupt, or not Opus) comes out as a concealed one."""
        samples = self._lib.opus_decode(self._state, payload, len(payload), self._pcm, _MAX_SAMPLES, 0)
        if samples < 0:
            return self.conceal()
        self.last_samples = samples
        return ctypes.string_at(self._pcm, 2 * samples)

    def conceal(self, following: bytes | None = None) -> bytes:
        """The audio of a lost packet (as long as the last one): rebuilt from the FEC in ``following`` (the packet
        after it, where it has come), else libopus's concealment."""
        samples = -1
        if following:
            samples = self._lib.opus_decode(self._state, following, len(following), self._pcm, self.last_samples, 1)
        if samples < 0:
            samples = self._lib.opus_decode(self._state, None, 0, self._pcm, self.last_samples, 0)
        return ctypes.string_at(self._pcm, 2 * max(samples, 0))
