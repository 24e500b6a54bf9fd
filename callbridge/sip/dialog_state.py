"""What ``SipUas`` (``sip/dialog.py``) tells its server (``SipEvent``: a call offered, confirmed, changed, ended; a
digit, a transfer's result, a datagram dropped), its configuration (``UasConfig``), and one dialog's state with every
change of it (``DialogState``, ``TRANSITIONS``; h11's rule: a pair not listed is a bug)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from callbridge.codecs import AudioEncoding
from callbridge.sip.message import SipRequest, host_port
from callbridge.sip.refer import Transfer
from callbridge.sip.sdp import DEFAULT_CODECS, Encryption, MediaChoice
from callbridge.sip.transaction import Address, Retransmission
from callbridge.sources import Network

__all__ = [
    "TRANSITIONS",
    "CallConfirmed",
    "CallEnded",
    "CallOffered",
    "Dialog",
    "DialogState",
    "DialogStateError",
    "Dropped",
    "DtmfInfo",
    "MediaChanged",
    "OfferAnswered",
    "SipEvent",
    "TransferResult",
    "Trigger",
    "UasConfig",
]


@dataclass(frozen=True, slots=True)
class CallOffered:
    """A new call the server must ``accept`` (after binding its RTP port) or ``reject``."""

    call_id: str
    source: Address
    choice: MediaChoice
    caller: str
    callee: str
    delayed_offer: bool = False
    """The INVITE had no SDP: ``accept`` sends our offer, the answer comes in the ACK (``OfferAnswered``); until
    then ``choice`` is a placeholder (PCMU, nowhere to send)."""
    caller_name: str = ""
    """The From header's display name (``"Ada" <sip:…>``), where it has one."""
    extension_headers: tuple[tuple[str, str], ...] = ()
    """The INVITE's ``X-`` headers, as sent (the trunk's or the PBX's own: a customer id, a routing tag)."""


@dataclass(frozen=True, slots=True)
class OfferAnswered:
    """A delayed offer's answer arrived in the ACK: the media to use from now on. A missing or unusable answer
    ends the call instead (our BYE, ``CallEnded("bad_answer")``)."""

    call_id: str
    choice: MediaChoice


@dataclass(frozen=True, slots=True)
class CallConfirmed:
    call_id: str


@dataclass(frozen=True, slots=True)
class MediaChanged:
    call_id: str
    choice: MediaChoice


@dataclass(frozen=True, slots=True)
class DtmfInfo:
    call_id: str
    digit: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    call_id: str
    reason: str
    """``bye`` (the caller hung up), ``cancelled``, ``no_ack``, ``rejected``, ``hung_up`` (our BYE), ``bad_answer``
    (a delayed offer answered with nothing usable: our BYE), ``no_prack`` (our reliable 180 never acknowledged:
    504 to the INVITE)."""


@dataclass(frozen=True, slots=True)
class TransferResult:
    """How our REFER ended: ``ok`` when the peer reported the transfer target's 2xx (a sipfrag in a NOTIFY);
    otherwise ``status``/``reason`` say why (the REFER's own final response, the sipfrag's, 408 for no answer)."""

    call_id: str
    ok: bool
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """A datagram not answered (garbage, a stray response): counted and logged by the server."""

    reason: str
    source: Address


SipEvent = CallOffered | OfferAnswered | CallConfirmed | MediaChanged | DtmfInfo | CallEnded | TransferResult | Dropped


class DialogState(enum.Enum):
    OFFERED = "offered"
    """INVITE received, 100 sent; waiting for the server's accept/reject."""
    ANSWERED = "answered"
    """200 sent, retransmitted until the ACK."""
    CONFIRMED = "confirmed"
    ENDING = "ending"
    """Our BYE sent, waiting for its response."""
    ENDED = "ended"


class Trigger(enum.Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    CANCEL = "cancel"
    ACK = "ack"
    BYE_RECEIVED = "bye_received"
    BYE_SENT = "bye_sent"
    BYE_DONE = "bye_done"
    NO_ACK = "no_ack"


_S, _T = DialogState, Trigger
TRANSITIONS: Final[dict[tuple[DialogState, Trigger], DialogState]] = {
    (_S.OFFERED, _T.ACCEPT): _S.ANSWERED,
    (_S.OFFERED, _T.REJECT): _S.ENDED,
    (_S.OFFERED, _T.CANCEL): _S.ENDED,
    (_S.ANSWERED, _T.ACK): _S.CONFIRMED,
    (_S.ANSWERED, _T.BYE_RECEIVED): _S.ENDED,
    (_S.ANSWERED, _T.NO_ACK): _S.ENDING,
    (_S.CONFIRMED, _T.ACK): _S.CONFIRMED,
    (_S.CONFIRMED, _T.BYE_RECEIVED): _S.ENDED,
    (_S.CONFIRMED, _T.BYE_SENT): _S.ENDING,
    (_S.ENDING, _T.BYE_RECEIVED): _S.ENDED,
    (_S.ENDING, _T.BYE_DONE): _S.ENDED,
}
"""Every state change of a dialog. A pair not listed is a bug in the caller (``DialogStateError``)."""


class DialogStateError(Exception):
    """The server called an input the dialog's state does not allow."""


@dataclass(frozen=True, slots=True)
class UasConfig:
    host: str
    """The address we advertise (Contact, Via of our BYE, SDP)."""
    port: int
    tls_port: int | None = None
    """Where our TLS listener is (a dialog that came over TLS advertises it), if there is one."""
    media_encryption: Encryption = "optional"
    """SRTP: taken where offered (``optional``), demanded (``required``: a plain offer is refused 488), or never."""
    codecs: tuple[AudioEncoding, ...] = DEFAULT_CODECS
    """The codecs we take (in the offer's order) and offer (in this order): ``sip.codecs``."""
    allowed_networks: tuple[Network, ...] = ()
    username: str | None = None
    password: str | None = None
    realm: str = "callbridge"
    user_agent: str = "callbridge"
    source_requests_per_s: float = 200.0
    """Datagrams a source may send a second (twice that in a burst) before the rest are dropped unread."""
    requests_per_s: float = 2000.0
    """Datagrams read a second from all sources together (twice that in a burst)."""

    def host_port(self, transport: str) -> str:
        """Our ``host:port`` for a message on ``transport`` (TLS: the TLS listener's port)."""
        return host_port(self.host, self.tls_port if transport == "TLS" and self.tls_port is not None else self.port)


@dataclass(slots=True)
class Dialog:
    """One dialog's state (``SipUas`` keeps one per Call-ID)."""

    call_id: str
    state: DialogState
    invite: SipRequest
    source: Address
    local_tag: str
    remote_cseq: int
    choice: MediaChoice
    invite_branch: str
    local_cseq: int = 0
    sdp_host: str = ""
    rtp_port: int = 0
    session_id: int = 0
    sdp_version: int = 0
    sdp: str = ""
    retransmits: list[Retransmission] = field(default_factory=list)
    bye_after_ack: bool = False
    ended_at_ms: int | None = None
    delayed_offer: bool = False
    """Our 200 carries the offer; the ACK must carry the answer (RFC 3261 §13.2.1)."""
    offer_srtp_key: bytes | None = None
    """Our key in that offer, where SRTP is ``required`` (``RTP/SAVP``, one crypto line): the answer must be in kind."""
    transfer: Transfer | None = None
    reliable_provisional: bool = False
    """The INVITE had ``Require: 100rel``: our 180 goes reliably (RFC 3262)."""
    rseq: int = 0
    """The RSeq of our last reliable provisional response (0: none sent)."""
    unacked_rseq: int | None = None
    """That response's RSeq until its PRACK comes."""
