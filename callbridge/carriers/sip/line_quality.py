"""One SIP call's line as the end-of-call report and the metrics show it (#43): jitter of the caller's packets as they
arrive, the jitter buffer's loss, the round trip from the peer's RTCP, and the E-model MOS
(``callbridge/sip/call_quality.py`` has the methods). Sans-I/O: the RTP transport hands in each media packet's
header and arrival, the peer's reports and the clocks."""

from __future__ import annotations

import dataclasses

from callbridge.application.events import MediaQuality
from callbridge.carriers.sip.wire import SipRtpCodec
from callbridge.sip.call_quality import ArrivalJitter, RoundTrip, e_model_mos
from callbridge.sip.rtcp import PeerReport, ReceptionStats, ReportBlock
from callbridge.sip.sdp import codec_name

__all__ = ["LineQuality"]

_PACKET_MS = 20
"""What a packet adds to the delay the MOS counts (the phone's packetisation)."""


class LineQuality:
    """The figures of one call's line (module docstring)."""

    __slots__ = ("arrivals", "peer_block", "round_trip", "_ssrc")

    def __init__(self, clock_hz: int) -> None:
        self.arrivals = ArrivalJitter(clock_hz)
        self.round_trip = RoundTrip()
        self.peer_block: ReportBlock | None = None
        """The peer's last report block about our stream."""
        self._ssrc: int | None = None

    def media_arrived(self, packet: bytes, at_s: float) -> None:
        """A packet of the call's codec arrived (its RTP header read here: 12 bytes at least, the listener checked)."""
        ssrc = int.from_bytes(packet[8:12], "big")
        if ssrc != self._ssrc:
            self._ssrc = ssrc
            self.arrivals.restart()
        self.arrivals.arrived(int.from_bytes(packet[4:8], "big"), at_s)

    def peer_reports(self, reports: list[PeerReport], our_ssrc: int, at_s: float) -> None:
        """The peer's SRs and RRs, arrived at ``at_s`` (Unix seconds)."""
        for report in reports:
            if report.ntp_middle is not None:
                self.round_trip.peer_sent_report(report.ntp_middle, at_s)
            for block in report.blocks:
                if block.ssrc == our_ssrc:
                    self.peer_block = block
                    self.round_trip.report_of_ours(block.lsr, block.dlsr, at_s)

    def our_block(self, stats: ReceptionStats | None, now_s: float) -> ReceptionStats | None:
        """What our next report block says of the caller's stream: the jitter buffer's counts, our jitter, and the
        LSR/DLSR the peer times its round trip by."""
        if stats is None:
            return None
        lsr, dlsr = self.round_trip.our_block_fields(now_s)
        return dataclasses.replace(stats, jitter=int(self.arrivals.jitter), lsr=lsr, dlsr=dlsr)

    def summary(self, codec: SipRtpCodec, *, encrypted: bool) -> MediaQuality:
        """The call's figures now (the report's ``media``)."""
        jitter = codec.jitter
        in_time = max(0, jitter.received - jitter.late - jitter.duplicates)
        expected = in_time + jitter.concealed
        loss = 100 * jitter.concealed / expected if expected else 0.0
        round_trip, round_trip_max = self.round_trip.last_ms, self.round_trip.max_ms
        one_way = (round_trip or 0.0) / 2 + _PACKET_MS + jitter.depth * _PACKET_MS
        peer = self.peer_block
        sent = codec.sender.packets_sent
        return MediaQuality(
            codec=codec_name(codec.choice.encoding),
            encryption="srtp" if encrypted else "none",
            packets_expected=expected,
            packets_lost=jitter.concealed,
            packets_late=jitter.late,
            loss_percent=round(loss, 2),
            jitter_ms=round(self.arrivals.ms, 2),
            jitter_max_ms=round(self.arrivals.max_ms, 2),
            round_trip_ms=None if round_trip is None else round(round_trip, 1),
            round_trip_max_ms=None if round_trip_max is None else round(round_trip_max, 1),
            peer_loss_percent=None if peer is None else round(100 * min(max(0, peer.cumulative_lost), sent) / max(sent, 1), 2),
            peer_jitter_ms=None if peer is None else round(peer.jitter * 1000 / codec.choice.clock_hz, 2),
            mos=e_model_mos(loss_percent=loss, one_way_ms=one_way),
        )
