"""Whether the SIP user-agent server (``sip/dialog.py``) takes a new INVITE, before any dialog exists, sans-I/O:
who may call (a source in ``allowed_networks``; else, with credentials set, a digest answering a nonce we issued:
401 with a challenge until then; else 403), what the INVITE requires (an option we lack: 420 + ``Unsupported``),
what its body is (not SDP: 415 + ``Accept``; SDP we cannot read: 400) and what audio it offers (nothing we take:
488). A refusal is a final response, retransmitted until its ACK.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Final, NamedTuple

from callbridge.codecs import AudioEncoding
from callbridge.sip import digest
from callbridge.sip.dialog_state import UasConfig
from callbridge.sip.message import SipRequest
from callbridge.sip.sdp import DEFAULT_CODECS, Direction, Encryption, MediaChoice, SdpError, choose, codec_name
from callbridge.sip.transaction import Address
from callbridge.sip.uas_messages import SUPPORTED
from callbridge.sources import source_allowed

__all__ = ["Admission", "Refusal", "placeholder_choice", "read_offer"]

_MAX_NONCES: Final = 1024


class Refusal(NamedTuple):
    """A final response refusing an INVITE."""

    status: int
    extra: list[tuple[str, str]]
    reason: str | None = None


class Admission:
    """Who may call (see the module docstring); the nonces of the last ``_MAX_NONCES`` challenges are honoured."""

    def __init__(self, config: UasConfig) -> None:
        self._config = config
        self._nonces: deque[str] = deque(maxlen=_MAX_NONCES)

    def refusal(self, request: SipRequest, source: Address) -> Refusal | None:
        """None: admitted; else the refusal (401 with a challenge, or 403)."""
        config = self._config
        if source_allowed(source[0], config.allowed_networks):
            return None
        if config.username is None or config.password is None:
            return Refusal(403, [])
        credentials = request.header("Authorization")
        if credentials is not None and digest.verify(
            credentials, method=request.method, realm=config.realm, username=config.username, password=config.password,
            nonce_valid=self._nonces.__contains__,
        ):  # fmt: skip
            return None
        nonce = secrets.token_hex(16)
        self._nonces.append(nonce)
        return Refusal(401, [("WWW-Authenticate", challenge) for challenge in digest.challenges(config.realm, nonce)])


def read_offer(
    request: SipRequest, source: Address, encryption: Encryption = "optional", codecs: tuple[AudioEncoding, ...] = DEFAULT_CODECS
) -> MediaChoice | Refusal:
    """The audio a new INVITE offers, as we take it (a delayed offer, with no body: a placeholder until the ACK's
    answer; where SRTP is ``required`` our offer in the 200 is SRTP), or its refusal (488 where SRTP is ``required``
    and the offer has none we take)."""
    unsupported = [opt for opt in (request.headers_all("Require") + request.headers_all("Proxy-Require")) if opt.lower() not in SUPPORTED]
    if unsupported:
        return Refusal(420, [("Unsupported", ", ".join(unsupported))])
    if request.body and request.media_type != "application/sdp":
        return Refusal(415, [("Accept", "application/sdp")])
    try:
        choice = choose(request.body.decode("utf-8", "replace"), encryption=encryption, codecs=codecs) if request.body else placeholder_choice(source)
    except SdpError as exc:
        return Refusal(400, [], f"Bad Request (SDP: {exc})")
    if choice is None:  # nothing we take
        names = [codec_name(encoding) for encoding in codecs]
        audio = f"{', '.join(names[:-1])} or {names[-1]} audio" if len(names) > 1 else f"{names[0]} audio"
        needed = f"SRTP (SDES) with {audio}" if encryption == "required" else audio
        return Refusal(488, [("Warning", f'304 callbridge "{needed} required"')])
    return choice


def placeholder_choice(source: Address) -> MediaChoice:
    """The media of a delayed offer until the answer comes: PCMU, nowhere to send yet."""
    line = "m=audio 0 RTP/AVP 0 8"
    return MediaChoice(AudioEncoding.PCMU, 0, None, source[0], 0, Direction.SENDRECV, None, 0, (line,))
