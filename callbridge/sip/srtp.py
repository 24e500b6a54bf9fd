"""SRTP with SDES keys (RFC 4568) for a SIP call's media (#43), through libsrtp2 (``pylibsrtp``).

Why libsrtp: it is the SRTP every SIP stack links (Asterisk, FreeSWITCH, baresip, Chrome), kept by Cisco; pylibsrtp
(aiortc's) ships it in its wheels, so nothing is compiled here. A hand-written SRTP (AES counter mode, HMAC-SHA1, the
replay window, the rollover counter) would be a second copy of security code to keep.

The offer's ``a=crypto`` lines (``1 AES_CM_128_HMAC_SHA1_80 inline:<base64 key‖salt>[|lifetime][|MKI:len]``) are read
by ``parse_crypto``; ``pick`` takes the first whose suite we speak (the offer lists its preference first), and our
answer carries its tag and suite with a key of ours (``SrtpKeys``). A line with an MKI, several keys or session
parameters (``UNENCRYPTED_SRTP``, ``KDR=``, …) is not one we take: another line may be. ``SrtpSession`` protects what we
send with our key and unprotects what the peer sends with its key, RTP and RTCP alike; a packet that fails its
authentication or replay check is None.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pylibsrtp import Error as SrtpError
from pylibsrtp import Policy, Session

__all__ = [
    "KEY_BYTES", "OFFER_CRYPTO_TAG", "OFFER_SUITE", "SUITES", "SdesCrypto", "SrtpKeys", "SrtpSession", "offer_line", "parse_crypto", "pick",
]  # fmt: skip

SUITES: Final = {
    "AES_CM_128_HMAC_SHA1_80": Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
"""The suites we speak, ours first (RFC 4568 §6.2: every SDES peer speaks both)."""
KEY_BYTES: Final = 30
"""An AES_CM_128 master key (16 bytes) and master salt (14)."""


@dataclass(frozen=True, slots=True)
class SdesCrypto:
    """One ``a=crypto`` line's tag, suite and master key‖salt."""

    tag: int
    suite: str
    key: bytes

    def line(self) -> str:
        return f"a=crypto:{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode()}"


def parse_crypto(value: str) -> SdesCrypto | None:
    """An ``a=crypto`` attribute's value (after ``crypto:``), or None where it is not one we can take."""
    parts = value.split()
    if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit() or len(parts[0]) > 9:
        return None  # session parameters after the key, or not a crypto line
    suite, params = parts[1], parts[2]
    if suite not in SUITES or not params.startswith("inline:") or ";" in params:
        return None  # a suite we do not speak, or several keys
    key_text, *rest = params[len("inline:") :].split("|")
    if any(":" in part for part in rest) or len(rest) > 1:
        return None  # an MKI: each packet would carry it, which we do not
    try:
        key = base64.b64decode(key_text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(key) != KEY_BYTES:
        return None
    return SdesCrypto(int(parts[0]), suite, key)


def pick(offered: list[SdesCrypto]) -> SdesCrypto | None:
    """The offer's first line we take (its order is its preference)."""
    return offered[0] if offered else None


@dataclass(frozen=True, slots=True)
class SrtpKeys:
    """A call's SRTP: the suite and tag the offer named, its key (what it sends) and ours (what we send)."""

    suite: str
    tag: int
    remote_key: bytes
    local_key: bytes

    @classmethod
    def answering(cls, offered: SdesCrypto, local_key: bytes | None = None) -> SrtpKeys:
        """Our side of ``offered``: its tag and suite, a new key of ours (or ``local_key``, kept across a
        re-INVITE)."""
        return cls(offered.suite, offered.tag, offered.key, local_key or secrets.token_bytes(KEY_BYTES))

    def answer_line(self) -> str:
        return SdesCrypto(self.tag, self.suite, self.local_key).line()


OFFER_CRYPTO_TAG: Final = 1
OFFER_SUITE: Final = "AES_CM_128_HMAC_SHA1_80"
"""What our own offer (a call we place with SRTP) names: one line, tag 1, the suite every SDES peer speaks first."""


def offer_line(local_key: bytes) -> str:
    """Our offer's ``a=crypto`` line, with ``local_key`` (what we will send with)."""
    return SdesCrypto(OFFER_CRYPTO_TAG, OFFER_SUITE, local_key).line()


class SrtpSession:
    """One call's SRTP contexts: ours to protect, the peer's to unprotect (RTP and RTCP)."""

    def __init__(self, keys: SrtpKeys) -> None:
        self.keys = keys
        profile = SUITES[keys.suite]
        self._out = Session(Policy(key=keys.local_key, ssrc_type=Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile))
        self._in = self._inbound(keys)
        self.refused = 0
        """Packets from the peer that failed their authentication or replay check."""

    def follow(self, keys: SrtpKeys) -> None:
        """The call's keys now (a re-INVITE's answer): a new key of the peer's gets a new inbound context; ours keeps
        its outbound one (its rollover counter goes on with our sequence numbers, as the peer's context for our key
        does)."""
        if keys.suite != self.keys.suite or keys.local_key != self.keys.local_key:
            raise ValueError("our SRTP key and suite stay the call's")
        if keys.remote_key != self.keys.remote_key:
            self._in = self._inbound(keys)
        self.keys = keys

    @staticmethod
    def _inbound(keys: SrtpKeys) -> Session:
        return Session(Policy(key=keys.remote_key, ssrc_type=Policy.SSRC_ANY_INBOUND, srtp_profile=SUITES[keys.suite]))

    def protect(self, rtp: bytes) -> bytes:
        return bytes(self._out.protect(rtp))

    def protect_rtcp(self, rtcp: bytes) -> bytes:
        return bytes(self._out.protect_rtcp(rtcp))

    def unprotect(self, srtp: bytes) -> bytes | None:
        return self._checked(self._in.unprotect, srtp)

    def unprotect_rtcp(self, srtcp: bytes) -> bytes | None:
        return self._checked(self._in.unprotect_rtcp, srtcp)

    def _checked(self, unprotect: Callable[[bytes], bytes], packet: bytes) -> bytes | None:
        """``packet`` unprotected, or None (counted) where it fails its authentication or replay check."""
        try:
            return bytes(unprotect(packet))
        except SrtpError:
            self.refused += 1
            return None
