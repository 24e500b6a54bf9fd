"""RTP (RFC 3550, profile RFC 3551; telephony-protocols.md §5.3): packets, a sender, a jitter buffer, latching.

- ``parse_rtp`` validates V=2 and skips CSRCs, the header extension and
  padding (RFC 3550 App. A.1); ``RtpError`` otherwise.
- ``RtpSender`` numbers what we send: a random SSRC, sequence number and
  timestamp start; +1 per packet, +samples per packet; the marker bit on the
  first packet of a talk-spurt.
- ``JitterBuffer`` re-orders by sequence number and conceals a loss with
  silence once ``depth`` later packets have arrived (no clock: a packet is
  released when the buffer holds more than ``depth`` after it, so the delay is
  ``depth`` packet times). A packet older than what was already released is
  late: dropped and counted, as are duplicates. A new SSRC starts a new stream.
- ``Latch`` is symmetric RTP (RFC 4961) for callers behind NAT: the first
  packet's source (from a trusted host) becomes the peer we send to; packets
  from any other source are dropped and counted until a new offer
  (re-INVITE) re-opens the latch.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Final

from callbridge.reorder import Missing, Placed, Reorder

__all__ = ["JitterBuffer", "Latch", "RtpError", "RtpPacket", "RtpSender", "build_rtp", "parse_rtp"]

HEADER_BYTES: Final = 12
RTCP_TYPES: Final = range(72, 77)
"""The second byte & 0x7f of RTCP SR/RR/SDES/BYE/APP (200–204): an RTCP packet on a muxed port, not RTP."""


class RtpError(Exception):
    """A datagram that is not an RTP packet."""


@dataclass(frozen=True, slots=True)
class RtpPacket:
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    marker: bool
    payload: bytes = field(repr=False)


def parse_rtp(data: bytes) -> RtpPacket:
    """One RTP packet. Raises ``RtpError``."""
    if len(data) < HEADER_BYTES:
        raise RtpError(f"{len(data)} bytes, shorter than an RTP header")
    first, second = data[0], data[1]
    if first >> 6 != 2:
        raise RtpError(f"version {first >> 6}")
    if second & 0x7F in RTCP_TYPES:
        raise RtpError("RTCP packet")
    offset = HEADER_BYTES + 4 * (first & 0x0F)
    if first & 0x10:  # header extension: 16-bit profile, 16-bit length in words
        if len(data) < offset + 4:
            raise RtpError("truncated header extension")
        offset += 4 + 4 * int.from_bytes(data[offset + 2 : offset + 4], "big")
    end = len(data)
    if first & 0x20:
        end -= data[-1]
    if offset > end:
        raise RtpError("header longer than the packet")
    return RtpPacket(
        payload_type=second & 0x7F,
        sequence=int.from_bytes(data[2:4], "big"),
        timestamp=int.from_bytes(data[4:8], "big"),
        ssrc=int.from_bytes(data[8:12], "big"),
        marker=bool(second & 0x80),
        payload=data[offset:end],
    )


def build_rtp(payload_type: int, sequence: int, timestamp: int, ssrc: int, payload: bytes, *, marker: bool = False) -> bytes:
    header = bytes((0x80, (0x80 if marker else 0) | payload_type)) + (
        (sequence & 0xFFFF).to_bytes(2, "big") + (timestamp & 0xFFFFFFFF).to_bytes(4, "big") + ssrc.to_bytes(4, "big")
    )
    return header + payload


class RtpSender:
    """Sequence numbers, timestamps and the SSRC of what we send (random starts, RFC 3550 §5.1)."""

    def __init__(self, ssrc: int | None = None, sequence: int | None = None, timestamp: int | None = None) -> None:
        self.ssrc = secrets.randbits(32) if ssrc is None else ssrc
        self.sequence = secrets.randbits(16) if sequence is None else sequence
        self.timestamp = secrets.randbits(32) if timestamp is None else timestamp
        self.talk_spurt = True
        """The next packet starts a talk-spurt (marker bit)."""
        self.packets_sent = 0
        self.octets_sent = 0
        """Payload bytes sent (RTCP SR)."""

    def packet(self, payload_type: int, payload: bytes, samples: int) -> bytes:
        """The next media packet; the timestamp then advances by ``samples``."""
        data = build_rtp(payload_type, self.sequence, self.timestamp, self.ssrc, payload, marker=self.talk_spurt)
        self.talk_spurt = False
        self.sequence = (self.sequence + 1) & 0xFFFF
        self.timestamp = (self.timestamp + samples) & 0xFFFFFFFF
        self.packets_sent += 1
        self.octets_sent += len(payload)
        return data

    def event_packet(self, payload_type: int, payload: bytes, timestamp: int, *, marker: bool) -> bytes:
        """A telephone-event packet: its own timestamp (the event's start), the next sequence number."""
        data = build_rtp(payload_type, self.sequence, timestamp, self.ssrc, payload, marker=marker)
        self.sequence = (self.sequence + 1) & 0xFFFF
        self.packets_sent += 1
        self.octets_sent += len(payload)
        return data


class JitterBuffer:
    """Re-order by sequence number; conceal losses with silence; drop and count late packets (module docstring;
    the ordering is ``callbridge.reorder.Reorder``'s, with ``depth`` as its reach).

    ``push`` returns the payloads now due, in order (a lost packet as ``silence_byte`` times the last payload's
    size; where that is None, a codec whose decoder conceals a loss itself, Opus: as ``b""``). ``drain`` releases
    what is held (the stream ended).
    """

    def __init__(self, depth: int = 2, silence_byte: int | None = 0xFF, *, max_gap: int = 50) -> None:
        self.depth = depth
        self.silence_byte = silence_byte
        self.max_gap = max_gap
        """A jump of more packets than this is a restart of the sequence, not a loss."""
        self.ssrc: int | None = None
        self._order: Reorder[bytes] = Reorder(depth, modulus=0x10000)
        self.last_size = 160
        self.late = 0
        self.duplicates = 0
        self.concealed = 0
        self.received = 0

    @property
    def next_sequence(self) -> int | None:
        return self._order.next

    @property
    def held(self) -> dict[int, bytes]:
        return self._order.held

    def push(self, packet: RtpPacket) -> list[bytes]:
        self.received += 1
        out: list[bytes] = []
        order = self._order
        if packet.ssrc != self.ssrc:
            out.extend(self.drain())
            self.ssrc = packet.ssrc
            order.restart(packet.sequence)
        delta = order.distance(packet.sequence)
        if delta < -self.max_gap or delta > self.max_gap + self.depth:  # the peer restarted its numbering
            out.extend(self.drain())
            order.restart(packet.sequence)
        placed, due = order.push(packet.sequence, packet.payload)
        if placed is Placed.BEHIND:
            self.late += 1
        elif placed is Placed.DUPLICATE:
            self.duplicates += 1
        for payload in due:
            if isinstance(payload, Missing):  # lost: silence of the usual size
                lost = b"" if self.silence_byte is None else bytes((self.silence_byte,)) * self.last_size
                out.extend([lost] * payload.count)
                self.concealed += payload.count
            else:
                if payload:
                    self.last_size = len(payload)
                out.append(payload)
        return out

    def drain(self) -> list[bytes]:
        """Everything held, in order, with the gaps left out (the stream ended or restarted)."""
        return self._order.flush()


class Latch:
    """Symmetric RTP: send to the source of the first packet; ignore other sources (module docstring).

    Only a packet from one of ``trusted_hosts`` (the SDP's address, the SIP peer's address) may latch: a
    stranger who guesses the port first cannot take the call's audio. Behind NAT the RTP comes from the same
    public address as the SIP, on a port of the NAT's choosing.
    """

    def __init__(self, signalled: tuple[str, int], trusted_hosts: frozenset[str] | None = None) -> None:
        self.signalled = signalled
        """Where the SDP said to send, used until a packet arrives."""
        self.trusted_hosts = trusted_hosts if trusted_hosts is not None else frozenset({signalled[0]})
        self.latched: tuple[str, int] | None = None
        self.unexpected_source = 0

    @property
    def peer(self) -> tuple[str, int]:
        return self.latched or self.signalled

    def admit(self, source: tuple[str, int]) -> bool:
        """Whether a packet from ``source`` belongs to this call (latching to the first trusted one)."""
        if self.latched is None and source[0] in self.trusted_hosts:
            self.latched = source
            return True
        if source == self.latched:
            return True
        self.unexpected_source += 1
        return False

    def reoffer(self, signalled: tuple[str, int]) -> None:
        """A new offer (re-INVITE) may move the peer: latch again from its next packet."""
        if signalled != self.signalled:
            self.trusted_hosts = self.trusted_hosts | {signalled[0]}
            self.signalled = signalled
            self.latched = None
