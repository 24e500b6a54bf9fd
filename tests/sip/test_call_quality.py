"""A SIP call's line figures (#43): RFC 3550's interarrival jitter, the round trip from RTCP's LSR/DLSR, the E-model
MOS, our report blocks carrying what the peer needs, the peer's read back, and a call's ``LineQuality`` summary
with the loss its jitter buffer concealed."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from callbridge.carriers.sip import rtp_transport
from callbridge.carriers.sip.line_quality import LineQuality
from callbridge.carriers.sip.rtp_transport import RtpTransport
from callbridge.carriers.sip.settings import SipSettings
from callbridge.carriers.sip.wire import SipRtpCodec
from callbridge.sip.call_quality import ArrivalJitter, RoundTrip, e_model_mos, ntp_middle
from callbridge.sip.rtcp import ReceptionStats, parse_rtcp, read_reports, report
from callbridge.sip.rtp import build_rtp
from callbridge.sip.sdp import choose

pytestmark = pytest.mark.core

OFFER = "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"


def test_packets_on_a_steady_clock_have_no_jitter_and_alternating_delay_converges_on_it() -> None:
    steady = ArrivalJitter(8000)
    for n in range(100):
        steady.arrived(160 * n, 5.0 + 0.02 * n)
    assert steady.ms < 0.2  # the clock's rounding only
    wobbly = ArrivalJitter(8000)
    for n in range(300):
        wobbly.arrived(160 * n, 5.0 + 0.02 * n + (0.010 if n % 2 else 0.0))  # every other packet 10 ms late
    assert 9.5 < wobbly.ms < 10.2 and wobbly.max_ms < 10.2  # |D| is 10 ms (± a tick) each time: J tends to it (A.8)


def test_the_timestamp_wrapping_at_2_32_is_no_jump() -> None:
    meter = ArrivalJitter(48000)
    start = 2**32 - 960 * 5
    for n in range(20):
        meter.arrived((start + 960 * n) % 2**32, 1.0 + 0.02 * n)
    assert meter.ms < 0.2


def test_the_round_trip_is_the_arrival_less_lsr_less_dlsr_and_our_block_returns_the_peers_sr() -> None:
    trip = RoundTrip()
    sent_s = 1_700_000_000.25
    lsr = ntp_middle(sent_s)  # our SR went out then; the peer held it 50 ms, the report took 40 ms back
    rtt = trip.report_of_ours(lsr, int(0.050 * 65536), sent_s + 0.020 + 0.050 + 0.040)
    assert rtt is not None and abs(rtt - 60.0) < 0.1 and trip.last_ms == rtt
    assert trip.report_of_ours(0, 0, sent_s + 1) is None  # the peer has seen no SR of ours yet
    assert trip.report_of_ours(lsr, 0, sent_s + 30) is None  # 30 s: a misread, not a round trip
    assert trip.our_block_fields(sent_s) == (0, 0)
    trip.peer_sent_report(0x12345678, sent_s)
    assert trip.our_block_fields(sent_s + 0.5) == (0x12345678, 32768)  # held half a second


def test_the_mos_estimate_is_near_4_4_on_a_clean_line_and_falls_with_loss_and_long_delay() -> None:
    clean = e_model_mos(loss_percent=0, one_way_ms=60)
    assert 4.3 <= clean <= 4.45
    lossy = [e_model_mos(loss_percent=p, one_way_ms=60) for p in (1, 3, 7, 15)]
    assert lossy == sorted(lossy, reverse=True) and lossy[0] > 4.1 and 3.4 < lossy[2] < 3.7 and lossy[3] < 3.0
    assert e_model_mos(loss_percent=0, one_way_ms=400) < 4.0 < e_model_mos(loss_percent=0, one_way_ms=150)
    assert e_model_mos(loss_percent=100, one_way_ms=2000) == 1.0


def test_our_report_block_carries_jitter_lsr_and_dlsr_and_the_peers_report_reads_back() -> None:
    stats = ReceptionStats(ssrc=9, expected=100, lost=5, highest_sequence=1234, jitter=77, lsr=0xAABBCCDD, dlsr=65536)
    sr = report(7, "cb@host", unix_time_s=1_700_000_000.5, rtp_timestamp=160, packets_sent=50, octets_sent=8000, sending=True, received=stats)
    assert parse_rtcp(sr) == [200, 202]
    ((ours,),) = [r.blocks for r in read_reports(sr)]
    assert (ours.ssrc, ours.cumulative_lost, ours.highest_sequence, ours.jitter, ours.lsr, ours.dlsr) == (9, 5, 1234, 77, 0xAABBCCDD, 65536)
    (read,) = read_reports(sr)
    assert read.ntp_middle == ntp_middle(1_700_000_000.5)
    rr = report(7, "cb", unix_time_s=0, rtp_timestamp=0, packets_sent=0, octets_sent=0, sending=False, received=None)
    assert [(r.ntp_middle, r.blocks) for r in read_reports(rr)] == [(None, ())]
    truncated = bytes((0x81, 200, 0, 6)) + sr[4:28]  # an SR that claims a block it has no room for (its length says 7 words)
    assert [r.blocks for r in read_reports(truncated)] == [()]
    duplicated = sr[:33] + (-3 & 0xFFFFFF).to_bytes(3, "big") + sr[36:]  # more came than was sent: RFC 3550's signed 24 bits
    assert [b.cumulative_lost for r in read_reports(duplicated) for b in r.blocks] == [-3]


def test_a_calls_summary_has_its_codec_its_loss_its_jitter_and_a_lower_mos_for_the_loss() -> None:
    choice = choose(OFFER)
    assert choice is not None
    codec = SipRtpCodec("q", choice)
    codec.receive_message("start")
    line = LineQuality(choice.clock_hz)
    for seq in range(1, 205):
        if seq % 20 == 0:  # 10 of 204 lost
            continue
        packet = build_rtp(0, seq, 160 * seq, 5, b"\xff" * 160)
        line.media_arrived(packet, 10.0 + 0.02 * seq + (0.004 if seq % 2 else 0.0))
        codec.receive_message(packet)
    media = line.summary(codec, encrypted=False)
    assert (media.codec, media.encryption, media.packets_lost, media.packets_late) == ("PCMU", "none", 10, 0)
    assert media.packets_expected == 204 and media.loss_percent == 4.9 and 3.5 < media.jitter_ms < 4.2
    assert media.round_trip_ms is None and media.peer_loss_percent is None  # no RTCP from the peer
    assert media.mos == e_model_mos(loss_percent=100 * 10 / 204, one_way_ms=20 + codec.jitter.depth * 20) < 4.0
    ours = line.our_block(codec.reception(), 11.0)
    assert ours is not None and ours.jitter == int(line.arrivals.jitter) and ours.lost == 10 and (ours.lsr, ours.dlsr) == (0, 0)


def test_a_call_below_the_floor_is_logged_once_with_its_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """At each RTCP report (every ~5 s) the call's figures are checked against ``sip.quality_floor_mos``: the first
    time below it, one warning naming the MOS, the loss and the jitter; a call above it logs nothing."""
    choice = choose(OFFER)
    assert choice is not None
    warned: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(rtp_transport.log, "warning", lambda event, **fields: warned.append((event, fields)))
    owner = SimpleNamespace(address="127.0.0.1", dropped=Counter(), settings=SipSettings(), call_closed=lambda call_id: None)
    clean, lossy = RtpTransport(owner, "clean", SipRtpCodec("clean", choice), "127.0.0.1"), RtpTransport(owner, "lossy", SipRtpCodec("lossy", choice), "127.0.0.1")
    for transport, every in ((clean, 0), (lossy, 8)):  # the lossy line loses one packet in eight: 12.5 %
        transport.codec.receive_message("start")
        for seq in range(1, 300):
            if every and seq % every == 0:
                continue
            transport.codec.receive_message(build_rtp(0, seq, 160 * seq, 5, b"\xff" * 160))
        for _ in range(2):
            transport._check_quality()
    ((event, fields),) = warned
    assert event == "sip_call_quality_low" and fields["call_id"] == "lossy" and fields["floor"] == 3.6, warned
    assert 12 < fields["loss_percent"] < 13 and fields["mos"] < 3.6 and fields["codec"] == "PCMU", fields  # type: ignore[operator]
    assert lossy.quality_warned and not clean.quality_warned
