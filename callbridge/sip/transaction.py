"""SIP's retransmission timers (RFC 3261 §17, RFC 3262 §3), once, for every message we send and repeat until it is
answered: the UAS's responses and in-dialog requests (``dialog.py``), REGISTER (``registration.py``), and the
INVITE and CANCEL of a call we place (``uac.py``).

A ``Retransmission`` holds one message and its timer; its ``kind`` (``TxKind``) says what ends it and how it repeats:
over UDP every kind goes again at T1, doubling to T2 (Timers E/G; an INVITE's Timer A doubles uncapped); a 2xx to an INVITE (§13.3.1.4) and a reliable
1xx (RFC 3262 §3, doubling without the T2 cap) go again over any transport, since they are end to end. Each gives
up at 64·T1 (Timers B/F/H). Sans-I/O: the caller asks what is due (``due``) with the time, and sends the datagram
``resend`` says goes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

__all__ = ["T1_MS", "T2_MS", "TIMEOUT_MS", "Address", "Due", "Outgoing", "Retransmission", "TxKind", "retransmission_of"]

T1_MS: Final = 500
T2_MS: Final = 4000
TIMEOUT_MS: Final = 64 * T1_MS


Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message to send."""

    data: bytes = field(repr=False)
    address: Address
    transport: str = "UDP"
    """UDP, or TCP: write it on the connection from ``address``."""


class TxKind(enum.Enum):
    """What a retransmitted message is, and so what ends it."""

    INVITE_2XX = "2xx"
    """Our 2xx to an INVITE, until its ACK."""
    INVITE_FINAL = "final"
    """Our non-2xx final response to an INVITE, until its ACK (Timer G)."""
    RELIABLE_1XX = "1xx"
    """Our reliable provisional response (``Require: 100rel``), until its PRACK."""
    BYE = "bye"
    """Our BYE, until a final response (Timer E)."""
    REFER = "refer"
    """Our REFER, until a final response (Timer E)."""
    REGISTER = "register"
    """Our REGISTER, until a final response (Timer E; a provisional one slows it to T2)."""
    INVITE = "invite"
    """Our INVITE (``uac.py``), until any response (Timer A, doubling without the T2 cap; Timer B at 64·T1)."""
    CANCEL = "cancel"
    """Our CANCEL of an INVITE still ringing, until a final response (Timer E)."""

    @property
    def end_to_end(self) -> bool:
        """Retransmitted over reliable transports too (the transaction layer does not carry it)."""
        return self in (TxKind.INVITE_2XX, TxKind.RELIABLE_1XX)


class Due(enum.Enum):
    WAIT = "wait"
    RESEND = "resend"
    GIVE_UP = "give_up"


@dataclass(slots=True)
class Retransmission:
    kind: TxKind
    data: bytes = field(repr=False)
    address: Address
    transport: str
    cseq: int
    """The CSeq (or, for a reliable 1xx, the RSeq) that its answer names."""
    next_ms: int
    interval_ms: int
    give_up_ms: int

    @classmethod
    def start(cls, kind: TxKind, data: bytes, address: Address, transport: str, now_ms: int, *, cseq: int = 0) -> Retransmission:
        """A message sent at ``now_ms`` (the caller sent it): the first repeat at T1, the last chance at 64·T1."""
        return cls(kind, data, address, transport, cseq, now_ms + T1_MS, T1_MS, now_ms + TIMEOUT_MS)

    @property
    def deadline_ms(self) -> int:
        return min(self.next_ms, self.give_up_ms)

    def due(self, now_ms: int) -> Due:
        if self.give_up_ms <= now_ms:
            return Due.GIVE_UP
        return Due.RESEND if self.next_ms <= now_ms else Due.WAIT

    def resend(self, now_ms: int) -> bool:
        """Set the next repeat (the interval doubled, to T2 unless a reliable 1xx); True when the datagram goes
        again on this transport now (UDP, or an end-to-end kind)."""
        goes = self.transport == "UDP" or self.kind.end_to_end
        doubled = self.interval_ms * 2
        self.interval_ms = doubled if self.kind in (TxKind.RELIABLE_1XX, TxKind.INVITE) else min(doubled, T2_MS)
        self.next_ms = now_ms + self.interval_ms
        return goes

    def provisional_received(self, now_ms: int) -> None:
        """A provisional answer to our request: it arrived; repeat only every T2 (§17.1.2.2)."""
        self.interval_ms = T2_MS
        self.next_ms = now_ms + T2_MS


def retransmission_of(kind: TxKind, sent: Outgoing, now_ms: int, cseq: int = 0) -> Retransmission:
    """The retransmission schedule of ``sent``, started at ``now_ms``."""
    return Retransmission.start(kind, sent.data, sent.address, sent.transport, now_ms, cseq=cseq)
