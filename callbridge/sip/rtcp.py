"""Minimal RTCP (RFC 3550 §6; telephony-protocols.md §5.5): what we send and what we read of what we get.

We send a compound packet every ~5 s (randomised ×[0.5, 1.5], §6.3.1): an
SR while we send media (an RR otherwise), with one report block about the
caller's stream when we receive one (its loss, jitter, and the LSR/DLSR of the
peer's last SR, so the peer can time its round trip), then SDES with our CNAME;
and a BYE when the call ends. What the peer sends is checked (``parse_rtcp`` →
the packet types of a compound packet; ``RtcpError`` for anything else) and
its SR/RR read (``read_reports``: its NTP time, its report blocks — the one
about our stream times our round trip, ``sip/call_quality.py``). Clocks come in
as arguments: the NTP time as seconds since 1970 (``time.time()`` at the
driver), the RTP timestamp of "now" from the sender.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "RTCP_INTERVAL_MS", "PeerReport", "ReceptionStats", "ReportBlock", "RtcpError", "bye", "next_interval_ms", "parse_rtcp",
    "read_reports", "report",
]  # fmt: skip

RTCP_INTERVAL_MS: Final = 5000
SR, RR, SDES, BYE, APP = 200, 201, 202, 203, 204
_NTP_EPOCH_OFFSET: Final = 2_208_988_800
"""Seconds from 1900-01-01 (NTP) to 1970-01-01 (Unix)."""


class RtcpError(Exception):
    """A datagram on the RTCP port that is not a compound RTCP packet."""


@dataclass(frozen=True, slots=True)
class ReceptionStats:
    """What a report block says about the caller's stream (RFC 3550 §6.4.1)."""

    ssrc: int
    expected: int
    lost: int
    highest_sequence: int
    """Extended highest sequence number received."""
    jitter: int = 0
    """Interarrival jitter, in RTP clock units."""
    lsr: int = 0
    """The middle 32 bits of the NTP time of the peer's last SR (0: none yet)."""
    dlsr: int = 0
    """How long ago that SR came, in 1/65536 s."""


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One report block of the peer's SR or RR: what it received of the stream ``ssrc`` (ours, where it is)."""

    ssrc: int
    fraction_lost: int
    """Lost since its last report, out of 256."""
    cumulative_lost: int
    """Signed (24 bits): duplicates can make it negative."""
    highest_sequence: int
    jitter: int
    lsr: int
    dlsr: int


@dataclass(frozen=True, slots=True)
class PeerReport:
    """An SR or RR the peer sent."""

    ntp_middle: int | None
    """An SR's NTP time, its middle 32 bits (what our next report block returns as LSR); None for an RR."""
    blocks: tuple[ReportBlock, ...]


def next_interval_ms(rng: random.Random | None = None) -> int:
    return int(RTCP_INTERVAL_MS * (rng or random).uniform(0.5, 1.5))


def _header(count: int, packet_type: int, body: bytes) -> bytes:
    assert len(body) % 4 == 0
    return bytes((0x80 | count, packet_type)) + (len(body) // 4).to_bytes(2, "big") + body


def _report_block(stats: ReceptionStats) -> bytes:
    lost = max(0, min(stats.lost, 0x7FFFFF))
    fraction = min(255, lost * 256 // stats.expected) if stats.expected > 0 else 0
    return (
        stats.ssrc.to_bytes(4, "big")
        + bytes((fraction,))
        + lost.to_bytes(3, "big")
        + (stats.highest_sequence & 0xFFFFFFFF).to_bytes(4, "big")
        + (max(0, stats.jitter) & 0xFFFFFFFF).to_bytes(4, "big")
        + (stats.lsr & 0xFFFFFFFF).to_bytes(4, "big")
        + (stats.dlsr & 0xFFFFFFFF).to_bytes(4, "big")
    )


def _sdes(ssrc: int, cname: str) -> bytes:
    item = bytes((1, len(cname.encode()))) + cname.encode()
    chunk = ssrc.to_bytes(4, "big") + item + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    return _header(1, SDES, chunk)


def report(
    ssrc: int,
    cname: str,
    *,
    unix_time_s: float,
    rtp_timestamp: int,
    packets_sent: int,
    octets_sent: int,
    sending: bool,
    received: ReceptionStats | None,
) -> bytes:
    """SR (while sending) or RR, then SDES CNAME: one compound packet."""
    blocks = _report_block(received) if received is not None else b""
    count = 1 if received is not None else 0
    if sending:
        ntp = unix_time_s + _NTP_EPOCH_OFFSET
        seconds = int(ntp)
        fraction = int((ntp - seconds) * 2**32) & 0xFFFFFFFF
        body = (
            ssrc.to_bytes(4, "big")
            + (seconds & 0xFFFFFFFF).to_bytes(4, "big")
            + fraction.to_bytes(4, "big")
            + (rtp_timestamp & 0xFFFFFFFF).to_bytes(4, "big")
            + (packets_sent & 0xFFFFFFFF).to_bytes(4, "big")
            + (octets_sent & 0xFFFFFFFF).to_bytes(4, "big")
        )
        first = _header(count, SR, body + blocks)
    else:
        first = _header(count, RR, ssrc.to_bytes(4, "big") + blocks)
    return first + _sdes(ssrc, cname)


def bye(ssrc: int, cname: str) -> bytes:
    """RR, SDES and BYE: we leave the session (§6.6)."""
    return _header(0, RR, ssrc.to_bytes(4, "big")) + _sdes(ssrc, cname) + _header(1, BYE, ssrc.to_bytes(4, "big"))


def _packets(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """Each packet of a compound RTCP packet: its type, its count field, where it starts and ends. Raises
    ``RtcpError``."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise RtcpError("truncated header")
        if data[pos] >> 6 != 2:
            raise RtcpError(f"version {data[pos] >> 6}")
        packet_type = data[pos + 1]
        if not SR <= packet_type <= APP and packet_type not in (205, 206, 207):
            raise RtcpError(f"packet type {packet_type}")
        end = pos + (int.from_bytes(data[pos + 2 : pos + 4], "big") + 1) * 4
        if end > len(data):
            raise RtcpError("length past the datagram")
        yield packet_type, data[pos] & 0x1F, pos, end
        pos = end


def parse_rtcp(data: bytes) -> list[int]:
    """The packet types of a compound RTCP packet. Raises ``RtcpError``."""
    types = [packet_type for packet_type, _, _, _ in _packets(data)]
    if not types or types[0] not in (SR, RR):
        raise RtcpError("a compound packet starts with SR or RR")
    return types


def read_reports(data: bytes) -> list[PeerReport]:
    """The SRs and RRs of a compound RTCP packet ``parse_rtcp`` took; a report block past its packet's length is
    left out. Raises ``RtcpError``."""
    reports: list[PeerReport] = []
    for packet_type, count, pos, end in _packets(data):
        if packet_type in (SR, RR):
            body = pos + 8  # past the header and the sender's SSRC
            ntp: int | None = None
            if packet_type == SR and body + 20 <= end:
                ntp = int.from_bytes(data[body + 2 : body + 6], "big")
                body += 20  # NTP, RTP timestamp, packet and octet counts
            blocks = []
            for start in range(body, body + 24 * count, 24):
                if start + 24 > end:
                    break
                block = data[start : start + 24]
                blocks.append(
                    ReportBlock(
                        ssrc=int.from_bytes(block[0:4], "big"), fraction_lost=block[4],
                        cumulative_lost=int.from_bytes(block[5:8], "big", signed=True),  # duplicates make it negative
                        highest_sequence=int.from_bytes(block[8:12], "big"),
                        jitter=int.from_bytes(block[12:16], "big"), lsr=int.from_bytes(block[16:20], "big"),
                        dlsr=int.from_bytes(block[20:24], "big"),
                    )  # fmt: skip
                )
            reports.append(PeerReport(ntp, tuple(blocks)))
    return reports
