"""A SIP call's network as its RTP and RTCP show it (#43): what a trunk can be judged by. Pure: the transport hands
in arrivals, the peer's RTCP reports and the clocks.

- **Jitter**: RFC 3550's interarrival jitter (§6.4.1, A.8): for each media packet, how much its transit time (arrival
  on our clock less its RTP timestamp) differs from the last one's, smoothed by 1/16. In the codec's clock units on
  the wire (our RTCP report blocks), in ms in the report. Its largest value over the call is kept too.
- **Loss**: the jitter buffer's account: packets expected (sequence numbers), concealed as lost, and late (came
  after their turn had been concealed: lost to the listener all the same).
- **Round trip**: from the peer's RTCP report of our stream (§6.4.1): its arrival on the NTP clock, less the
  last SR of ours it saw (LSR), less how long it held it (DLSR). None where the peer sends no RTCP, or none yet.
- **MOS**: an E-model estimate (ITU-T G.107, random loss), every codec rated as G.711 with packet loss concealment
  (Ie 0, Bpl 25.1, ITU-T G.113 Appendix I): what it shows is the network's part, on the 1–4.5 scale. The one-way
  delay is half the round trip (0 where unknown) plus a packet and the jitter buffer's depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ArrivalJitter", "RoundTrip", "e_model_mos", "ntp_middle"]

_NTP_EPOCH_OFFSET: Final = 2_208_988_800
"""Seconds from 1900-01-01 (NTP) to 1970-01-01 (Unix)."""
_IE: Final = 0.0
"""G.711's equipment impairment (G.113): no loss, no coding distortion to speak of."""
_BPL: Final = 25.1
"""G.711 with packet loss concealment: its robustness to random loss (G.113 Appendix I)."""
_MAX_ROUND_TRIP_S: Final = 10.0
"""A round trip over this is a report we misread (or a peer that made up its LSR): not kept."""


def ntp_middle(unix_time_s: float) -> int:
    """The middle 32 bits of the NTP timestamp of ``unix_time_s`` (16.16 fixed point seconds): RTCP's LSR."""
    return int((unix_time_s + _NTP_EPOCH_OFFSET) * 65536) & 0xFFFFFFFF


@dataclass(slots=True)
class ArrivalJitter:
    """RFC 3550 A.8's estimate over one stream's media packets."""

    clock_hz: int
    jitter: float = 0.0
    """In RTP clock units."""
    max_jitter: float = 0.0
    _transit: int | None = None

    def arrived(self, timestamp: int, arrival_s: float) -> None:
        """A media packet with RTP ``timestamp`` arrived at ``arrival_s`` (any steady clock, in seconds)."""
        transit = int(arrival_s * self.clock_hz) - timestamp
        if self._transit is not None:
            d = ((transit - self._transit + 2**31) % 2**32) - 2**31  # the timestamp wraps at 2**32
            self.jitter += (abs(d) - self.jitter) / 16
            self.max_jitter = max(self.max_jitter, self.jitter)
        self._transit = transit

    def restart(self) -> None:
        """The stream restarted (a new SSRC, a new clock base): the next packet starts the estimate again."""
        self._transit = None

    @property
    def ms(self) -> float:
        return self.jitter * 1000 / self.clock_hz

    @property
    def max_ms(self) -> float:
        return self.max_jitter * 1000 / self.clock_hz


@dataclass(slots=True)
class RoundTrip:
    """Round trips from the peer's reports of our stream, and what our own report blocks say back (LSR, DLSR)."""

    last_ms: float | None = None
    """The last round trip a report showed (None: none yet)."""
    max_ms: float | None = None
    peer_sr: tuple[int, float] | None = None
    """The peer's last SR: its NTP time's middle 32 bits, and when it came (Unix seconds)."""

    def peer_sent_report(self, ntp_middle_bits: int, at_s: float) -> None:
        self.peer_sr = (ntp_middle_bits, at_s)

    def report_of_ours(self, lsr: int, dlsr: int, at_s: float) -> float | None:
        """A report block about our stream came at ``at_s`` (Unix seconds): the round trip it shows, in ms (kept),
        or None (the peer has not seen an SR of ours yet, or the figures make no sense)."""
        if lsr == 0:
            return None
        units = (ntp_middle(at_s) - lsr - dlsr) & 0xFFFFFFFF
        seconds = units / 65536
        if seconds >= _MAX_ROUND_TRIP_S:
            return None
        self.last_ms = seconds * 1000
        self.max_ms = max(self.max_ms or 0.0, self.last_ms)
        return self.last_ms

    def our_block_fields(self, now_s: float) -> tuple[int, int]:
        """LSR and DLSR for our next report block: the peer's last SR and how long ago it came (1/65536 s)."""
        if self.peer_sr is None:
            return 0, 0
        lsr, at_s = self.peer_sr
        return lsr, int(max(0.0, now_s - at_s) * 65536) & 0xFFFFFFFF


def e_model_mos(*, loss_percent: float, one_way_ms: float) -> float:
    """ITU-T G.107's R factor for G.711 with PLC at this random loss and mouth-to-ear delay, as a MOS (1–4.5)."""
    loss = max(0.0, min(100.0, loss_percent))
    ie_eff = _IE + (95 - _IE) * loss / (loss + _BPL)
    delay = max(0.0, one_way_ms)
    impairment = 0.024 * delay + (0.11 * (delay - 177.3) if delay > 177.3 else 0.0)
    r = 93.2 - impairment - ie_eff
    if r <= 0:
        return 1.0
    if r >= 100:
        return 4.5
    return round(1 + 0.035 * r + r * (r - 60) * (100 - r) * 7e-6, 2)
