"""An independent G.711 written from the definition (telephony-protocols.md §6.1–6.2).

Plain Python, one sample at a time: slow and obviously right, so the fast
codecs can be checked against it over every code and every PCM16 input.
"""

from __future__ import annotations

ULAW_BIAS = 0x84
ULAW_CLIP = 32635
_ALAW_SEGMENT_ENDS = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)


def ulaw_decode(code: int) -> int:
    u = ~code & 0xFF
    sign = u & 0x80
    exponent = (u >> 4) & 7
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + ULAW_BIAS) << exponent) - ULAW_BIAS
    return -magnitude if sign else magnitude


def ulaw_encode_bias_clip(sample: int) -> int:
    """The 16-bit bias/clip formulation of §6.1."""
    sign = 0x80 if sample < 0 else 0
    magnitude = 32767 if sample == -32768 else abs(sample)
    magnitude = min(magnitude, ULAW_CLIP) + ULAW_BIAS
    exponent = max(magnitude.bit_length() - 8, 0)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return ~(sign | exponent << 4 | mantissa) & 0xFF


def ulaw_encode_sun(sample: int) -> int:
    """Sun's 14-bit formulation (``s >> 2``, bias 0x21, clip 8159), the one audioop uses."""
    value = sample >> 2
    if value < 0:
        value = -value
        mask = 0x7F
    else:
        mask = 0xFF
    value = min(value, 8159) + 0x21
    segment = 0
    for end in (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF):
        if value <= end:
            break
        segment += 1
    else:
        return 0x7F ^ mask
    return ((segment << 4) | ((value >> (segment + 1)) & 0x0F)) ^ mask


def alaw_decode(code: int) -> int:
    a = code ^ 0x55
    t = (a & 0x0F) << 4
    segment = (a & 0x70) >> 4
    if segment == 0:
        t += 8
    elif segment == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (segment - 1)
    return t if a & 0x80 else -t


def alaw_encode(sample: int) -> int:
    p = sample >> 3
    if p >= 0:
        mask = 0xD5
    else:
        mask = 0x55
        p = -p - 1
    for segment, end in enumerate(_ALAW_SEGMENT_ENDS):
        if p <= end:
            break
    else:
        return 0x7F ^ mask
    a = segment << 4 | (((p >> 1) if segment < 2 else (p >> segment)) & 0x0F)
    return a ^ mask
