"""RTP packets, the jitter buffer, latching, RFC 4733 DTMF, and the RTP carrier codec."""

from __future__ import annotations

import numpy as np
import pytest

from callbridge.carriers.base import (
    DtmfReceived,
    HangUpMode,
    MediaReceived,
    RemoteProtocolError,
    SendClear,
    SendMark,
    SendMedia,
    StreamStarted,
    StreamStopped,
)
from callbridge.carriers.sip.wire import PROFILE, SipRtpCodec
from callbridge.codecs import AudioEncoding
from callbridge.codecs.g722 import G722Decoder, G722Encoder
from callbridge.codecs.opus import OpusDecoder, OpusEncoder
from callbridge.sip.dtmf import DtmfReceiver, dtmf_packets, event_payload
from callbridge.sip.rtcp import (
    ReceptionStats,
    RtcpError,
    bye,
    next_interval_ms,
    parse_rtcp,
    report,
)
from callbridge.sip.rtp import (
    JitterBuffer,
    Latch,
    RtpError,
    RtpPacket,
    RtpSender,
    build_rtp,
    parse_rtp,
)
from callbridge.sip.sdp import Direction, MediaChoice, choose
from tests.conftest import NEEDS_LIBOPUS

pytestmark = pytest.mark.core

OFFER = "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP 8 101\r\na=rtpmap:101 telephone-event/8000\r\n"


def packet(seq: int, payload: bytes = b"\x01" * 160, *, ssrc: int = 7, pt: int = 8, ts: int | None = None, marker: bool = False) -> RtpPacket:
    return RtpPacket(pt, seq & 0xFFFF, seq * 160 if ts is None else ts, ssrc, marker, payload)


def test_parse_build_round_trip_and_header_fields() -> None:
    data = build_rtp(8, 65535, 2**32 - 1, 0xDEADBEEF, b"abc", marker=True)
    assert data[0] == 0x80 and data[1] == 0x88
    parsed = parse_rtp(data)
    assert (parsed.payload_type, parsed.sequence, parsed.timestamp, parsed.ssrc, parsed.marker, parsed.payload) == (
        8, 65535, 2**32 - 1, 0xDEADBEEF, True, b"abc"
    )


def test_csrc_extension_and_padding_are_skipped() -> None:
    header = bytes((0x80 | 0x20 | 0x10 | 1, 0)) + bytes(10)  # P, X, CC=1
    data = header + b"CSRC" + b"\xbe\xde\x00\x01" + b"EXT!" + b"payload" + b"\x00\x00\x03"
    assert parse_rtp(data).payload == b"payload"


@pytest.mark.parametrize("data", [b"", b"\x80" * 11, b"\x40" + bytes(20), bytes((0x80, 200)) + bytes(20), bytes((0xA0,)) + bytes(11) + b"\xff"])
def test_not_rtp(data: bytes) -> None:
    with pytest.raises(RtpError):
        parse_rtp(data)


def test_sender_numbers_packets_and_marks_talk_spurts() -> None:
    sender = RtpSender(ssrc=1, sequence=65535, timestamp=2**32 - 160)
    first, second = parse_rtp(sender.packet(0, b"\xff" * 160, 160)), parse_rtp(sender.packet(0, b"\xff" * 240, 240))
    assert (first.sequence, second.sequence) == (65535, 0)
    assert (first.timestamp, second.timestamp) == (2**32 - 160, 0)
    assert first.marker and not second.marker and first.ssrc == second.ssrc == 1


def test_jitter_buffer_reorders_conceals_and_drops_late() -> None:
    buffer = JitterBuffer(depth=2, silence_byte=0xD5)
    out: list[bytes] = []
    for seq in (1, 3, 2, 4):  # 3 before 2: re-ordered
        out += buffer.push(packet(seq, bytes([seq]) * 160))
    assert out == [bytes([n]) * 160 for n in (1, 2, 3, 4)]
    out = []
    for seq in (6, 7, 8):  # 5 lost: concealed once two later packets are in
        out += buffer.push(packet(seq, bytes([seq]) * 160))
    assert out == [b"\xd5" * 160, bytes([6]) * 160, bytes([7]) * 160, bytes([8]) * 160]
    assert buffer.push(packet(5)) == [] and buffer.late == 1  # too late: dropped, counted
    assert buffer.push(packet(9, b"\x09" * 240)) == [b"\x09" * 240]
    assert buffer.push(packet(9)) == [] and buffer.late == 2  # a duplicate of a released packet is late too
    assert buffer.concealed == 1


def test_jitter_buffer_holds_until_depth_and_handles_wrap_and_new_ssrc() -> None:
    buffer = JitterBuffer(depth=2)
    assert buffer.push(packet(65534)) == [b"\x01" * 160]
    assert buffer.push(packet(0)) == []  # 65535 missing: held
    assert buffer.push(packet(1)) == [b"\xff" * 160, b"\x01" * 160, b"\x01" * 160]
    assert buffer.push(packet(3)) == []
    assert buffer.push(packet(500, b"\x02" * 160, ssrc=8)) == [b"\x01" * 160, b"\x02" * 160]  # the old stream drains


def test_latch_keeps_the_first_trusted_source() -> None:
    latch = Latch(("10.0.0.1", 4000), frozenset({"10.0.0.1", "192.0.2.1"}))
    assert latch.peer == ("10.0.0.1", 4000)
    assert not latch.admit(("198.51.100.9", 4000)) and latch.latched is None  # a stranger cannot latch
    assert latch.admit(("192.0.2.1", 5555)) and latch.peer == ("192.0.2.1", 5555)  # the SIP peer, behind NAT
    assert not latch.admit(("192.0.2.1", 5557)) and latch.unexpected_source == 2
    assert latch.admit(("192.0.2.1", 5555))
    latch.reoffer(("10.0.0.2", 4002))
    assert latch.admit(("10.0.0.2", 4002)) and latch.peer == ("10.0.0.2", 4002)


def test_dtmf_reported_once_per_event() -> None:
    receiver = DtmfReceiver()
    digits: list[str] = []
    for i, duration in enumerate((0, 320, 640)):
        digits += receiver.receive(RtpPacket(101, i, 8000, 1, i == 0, event_payload(1, end=False, duration=duration)))
    for i in range(3):  # the end packet, three times
        digits += receiver.receive(RtpPacket(101, 3 + i, 8000, 1, False, event_payload(1, end=True, duration=960)))
    assert digits == ["1"]
    # the next event lost all its end packets: reported when another event starts
    assert receiver.receive(RtpPacket(101, 7, 16000, 1, True, event_payload(11, end=False, duration=0))) == []
    assert receiver.receive(RtpPacket(101, 8, 24000, 1, True, event_payload(10, end=True, duration=800))) == ["#", "*"]
    assert receiver.receive(RtpPacket(101, 9, 24000, 1, False, b"\x01")) == [] and receiver.malformed == 1


def test_dtmf_send_follows_rfc4733() -> None:
    sender = RtpSender(ssrc=5, sequence=10, timestamp=1000)
    packets = [parse_rtp(p) for p in dtmf_packets(sender, 101, "5", duration_ms=100)]
    assert all(p.timestamp == 1000 and p.payload_type == 101 for p in packets)
    assert [p.marker for p in packets] == [True] + [False] * (len(packets) - 1)
    ends = [p for p in packets if p.payload[1] & 0x80]
    assert len(ends) == 3 and all(p.payload[0] == 5 and int.from_bytes(p.payload[2:4], "big") == 800 for p in ends)
    assert [p.sequence for p in packets] == list(range(10, 10 + len(packets)))
    assert sender.timestamp == 1800
    receiver = DtmfReceiver()
    assert [d for p in packets for d in receiver.receive(p)] == ["5"]


def test_codec_profile_and_flow() -> None:
    assert PROFILE.uses_marks is False and PROFILE.lead_ms == 60 and PROFILE.hang_up is HangUpMode.CLOSE and not PROFILE.flushes
    choice = choose(OFFER)
    assert choice is not None
    codec = SipRtpCodec("call-1", choice, caller="sip:a@b")
    assert codec.receive_message(build_rtp(8, 1, 0, 9, b"\x00" * 240)) == []  # before start: ignored
    events = codec.receive_message("start")
    started = events[-1]
    assert isinstance(started, StreamStarted) and started.encoding is AudioEncoding.PCMA and started.rate_hz == 8000
    assert started.call_id == "call-1" and started.custom_parameters["from"] == "sip:a@b"
    media = [codec.receive_message(build_rtp(8, seq, seq * 240, 9, bytes([seq]) * 240)) for seq in range(1, 5)]
    assert media[0] == [MediaReceived(b"\x01" * 240)]
    assert codec.receive_message(b"garbage") == [] and codec.malformed == 1
    assert codec.receive_message(build_rtp(0, 9, 0, 9, b"\xff" * 160)) == [] and codec.other_payload_types == 1
    assert codec.receive_message(build_rtp(13, 9, 0, 9, b"\x40")) == [] and codec.other_payload_types == 1  # comfort noise
    assert codec.receive_message(build_rtp(101, 10, 0, 9, event_payload(11, end=True, duration=800))) == [DtmfReceived("#")]
    assert codec.receive_message("dtmf:7") == [DtmfReceived("7")]
    sent = parse_rtp(codec.send(SendMedia(b"\x55" * 160)) or b"")
    assert sent.payload_type == 8 and sent.marker and sent.payload == b"\x55" * 160
    assert codec.send(SendMark("m1")) is None and codec.send(SendClear()) is None
    assert parse_rtp(codec.send(SendMedia(b"\x55" * 160)) or b"").marker  # a new talk-spurt after the clear
    silence = parse_rtp(codec.silence() or b"")
    assert silence.payload == b"\xd5" * 160 and silence.sequence == (sent.sequence + 2) & 0xFFFF
    held = choose(OFFER + "a=sendonly\r\n")
    assert held is not None and held.direction is Direction.RECVONLY
    codec.update(held)
    assert codec.send(SendMedia(b"\x55" * 160)) is None and codec.silence() is None  # on hold: nothing sent
    codec.update(choice)
    assert codec.send(SendMedia(b"\x55" * 160)) is not None
    stop = codec.receive_message("bye")
    assert isinstance(stop[-1], StreamStopped)
    assert codec.receive_message(build_rtp(8, 20, 0, 9, b"\x00" * 240)) == []  # after bye: ignored
    with pytest.raises(RemoteProtocolError):
        codec.receive_message("start")


def tone_over(choice: MediaChoice, phone: G722Encoder | OpusEncoder, *, packets: int, lost: int) -> tuple[bytes, list[bytes]]:
    """A wideband call (``choice``) whose caller's phone (``phone``) sends ``packets`` of a 5 kHz tone (above G.711's
    band), the ``lost``-th lost, then hangs up: the tone, and what the bridge got of it packet by packet. The bridge is
    told L16 at 16 kHz."""
    codec = SipRtpCodec("call-w", choice)
    started = codec.receive_message("start")[-1]
    assert isinstance(started, StreamStarted) and (started.encoding, started.rate_hz) == (AudioEncoding.L16, 16000)
    t = np.arange(320 * packets) / 16000
    caller = (6000 * np.sin(2 * np.pi * 5000 * t)).astype("<i2").tobytes()
    ticks = choice.clock_hz // 50
    wire = [phone.encode(caller[i : i + 640]) for i in range(0, len(caller), 640)]
    events = [
        e for seq, payload in enumerate(wire, 1) if seq != lost
        for e in codec.receive_message(build_rtp(choice.payload_type, seq, seq * ticks, 5, payload))
    ]  # fmt: skip
    events += codec.receive_message("bye")
    return caller, [e.payload for e in events if isinstance(e, MediaReceived)]


def test_a_g722_call_is_l16_at_16_khz_to_the_bridge_and_g722_on_the_wire() -> None:
    """G.722 is coded at the edge, a coder per direction (it keeps state): the bridge is told L16 at 16 kHz, gets
    640 bytes of PCM a 20 ms packet and sends 640; the wire carries 160 bytes a packet, the timestamp stepping 160
    (RTP's 8 kHz clock for G.722), and a lost packet comes out as (near) silence of its length."""
    choice = choose(OFFER.replace("RTP/AVP 8 101", "RTP/AVP 9 101"))
    assert choice is not None and choice.encoding is AudioEncoding.G722
    caller, heard = tone_over(choice, G722Encoder(), packets=6, lost=4)
    assert [len(pcm) for pcm in heard] == [640] * 6  # the fourth lost, concealed
    assert np.abs(np.frombuffer(heard[3], dtype="<i2")[-160:]).max() < 3000  # silence of a sort, not the tone
    level = np.sqrt(np.mean(np.frombuffer(heard[1], dtype="<i2").astype(np.float64) ** 2))
    assert level > 3000  # the 5 kHz tone came through
    codec = SipRtpCodec("call-w2", choice)
    codec.receive_message("start")
    first, second = (parse_rtp(codec.send(SendMedia(caller[i : i + 640])) or b"") for i in (0, 640))
    assert (first.payload_type, len(first.payload), len(second.payload)) == (9, 160, 160)
    assert (second.timestamp - first.timestamp) & 0xFFFFFFFF == 160
    decoded = G722Decoder().decode(first.payload + second.payload)
    assert np.sqrt(np.mean(np.frombuffer(decoded, dtype="<i2")[200:].astype(np.float64) ** 2)) > 3000
    quiet = parse_rtp(codec.silence() or b"")
    assert len(quiet.payload) == 160 and (quiet.timestamp - second.timestamp) & 0xFFFFFFFF == 160


OPUS_OFFER = (
    "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP 107 101\r\na=rtpmap:107 opus/48000/2\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
)


@NEEDS_LIBOPUS
def test_an_opus_call_is_l16_at_16_khz_to_the_bridge_opus_at_48_khz_rtp_clock_on_the_wire_and_a_loss_is_rebuilt() -> None:
    """Opus is coded at the edge like G.722: the bridge is told L16 at 16 kHz both ways; the wire carries one packet
    a 20 ms frame, the timestamp stepping 960 (RTP's 48 kHz clock for Opus), the cadence's silence too; a lost
    packet comes out as 20 ms rebuilt from the next packet's FEC (close to what was lost, not silence)."""
    choice = choose(OPUS_OFFER, codecs=(AudioEncoding.PCMA, AudioEncoding.OPUS))
    assert choice is not None and (choice.encoding, choice.payload_type) == (AudioEncoding.OPUS, 107)
    caller, heard = tone_over(choice, OpusEncoder(), packets=12, lost=8)
    assert [len(pcm) for pcm in heard] == [640] * 12  # the eighth lost, rebuilt
    level = [np.sqrt(np.mean(np.frombuffer(pcm, dtype="<i2").astype(np.float64) ** 2)) for pcm in heard]
    assert min(level[4:]) > 3000  # the 5 kHz tone came through, the lost packet's 20 ms too
    codec = SipRtpCodec("call-o2", choice)
    codec.receive_message("start")
    first, second = (parse_rtp(codec.send(SendMedia(caller[i : i + 640])) or b"") for i in (0, 640))
    assert (first.payload_type, second.payload_type) == (107, 107) and (second.timestamp - first.timestamp) & 0xFFFFFFFF == 960
    decoder = OpusDecoder()
    assert [len(decoder.decode(p.payload)) for p in (first, second)] == [640, 640]
    quiet = parse_rtp(codec.silence() or b"")
    assert len(decoder.decode(quiet.payload)) == 640 and (quiet.timestamp - second.timestamp) & 0xFFFFFFFF == 960


@NEEDS_LIBOPUS
def test_a_digit_on_an_opus_call_counts_its_duration_in_telephone_events_clock_and_moves_the_audios_by_48_khz() -> None:
    choice = choose(OPUS_OFFER, codecs=(AudioEncoding.OPUS,))
    assert choice is not None and (choice.dtmf_clock_hz, choice.clock_hz) == (8000, 48000)
    codec = SipRtpCodec("call-o3", choice)
    codec.receive_message("start")
    before = codec.sender.timestamp
    events = [parse_rtp(p) for p in codec.dtmf_packets("7")]
    assert int.from_bytes(events[-1].payload[2:4], "big") == 800  # 100 ms at telephone-event's 8000
    assert (codec.sender.timestamp - before) & 0xFFFFFFFF == 4800  # 100 ms at Opus's 48000
    at_48k = choose(OPUS_OFFER.replace("telephone-event/8000", "telephone-event/48000"), codecs=(AudioEncoding.OPUS,))
    assert at_48k is not None and at_48k.dtmf_clock_hz == 48000
    codec = SipRtpCodec("call-o4", at_48k)
    codec.receive_message("start")
    assert int.from_bytes(parse_rtp(codec.dtmf_packets("7")[-1]).payload[2:4], "big") == 4800


def test_a_placed_calls_codec_is_the_answers_set_before_the_stream_starts() -> None:
    placeholder = choose(OFFER.replace("RTP/AVP 8 101", "RTP/AVP 0 8 101"))
    answered = choose(OFFER.replace("RTP/AVP 8 101", "RTP/AVP 9 101"))
    assert placeholder is not None and answered is not None
    codec = SipRtpCodec("call-out", placeholder)
    codec.update(answered)
    started = codec.receive_message("start")[-1]
    assert isinstance(started, StreamStarted) and (started.encoding, started.rate_hz) == (AudioEncoding.L16, 16000)
    assert len(parse_rtp(codec.send(SendMedia(bytes(640))) or b"").payload) == 160


def test_rtcp_reports_and_bye() -> None:
    stats = ReceptionStats(ssrc=9, expected=100, lost=5, highest_sequence=1234)
    sr = report(7, "cb@host", unix_time_s=1_700_000_000.5, rtp_timestamp=160, packets_sent=50, octets_sent=8000, sending=True, received=stats)
    assert parse_rtcp(sr) == [200, 202]
    assert sr[0] == 0x81 and int.from_bytes(sr[2:4], "big") == 12  # SR: 6 words + 1 report block of 6, minus one
    assert int.from_bytes(sr[8:12], "big") == 1_700_000_000 + 2_208_988_800  # NTP seconds
    assert int.from_bytes(sr[12:16], "big") == 2**31  # .5 s
    assert int.from_bytes(sr[20:24], "big") == 50 and int.from_bytes(sr[24:28], "big") == 8000
    block = sr[28:52]
    assert int.from_bytes(block[:4], "big") == 9 and block[4] == 5 * 256 // 100 and int.from_bytes(block[5:8], "big") == 5
    assert b"cb@host" in sr and len(sr) % 4 == 0
    rr = report(7, "cb@host", unix_time_s=0, rtp_timestamp=0, packets_sent=0, octets_sent=0, sending=False, received=None)
    assert parse_rtcp(rr) == [201, 202] and rr[0] == 0x80
    assert parse_rtcp(bye(7, "cb")) == [201, 202, 203]
    assert 2500 <= next_interval_ms() <= 7500


@pytest.mark.parametrize("data", [b"", b"\x80\xc8", build_rtp(0, 1, 2, 3, b"x" * 160), bytes((0x80, 202, 0, 1)) + bytes(4), bytes((0x80, 200, 0, 40)) + bytes(8)])
def test_not_rtcp(data: bytes) -> None:
    with pytest.raises(RtcpError):
        parse_rtcp(data)


def test_codec_reception_stats() -> None:
    choice = choose(OFFER)
    assert choice is not None
    codec = SipRtpCodec("c", choice)
    assert codec.reception() is None
    codec.receive_message("start")
    for seq in (10, 11, 13, 14):
        codec.receive_message(build_rtp(8, seq, seq * 160, 5, b"\x00" * 160))
    stats = codec.reception()
    assert stats is not None and stats.ssrc == 5 and stats.lost == 1 and stats.expected == 5 and stats.highest_sequence == 14


def test_random_datagrams_never_raise() -> None:
    """Random and corrupted datagrams on a call's RTP port are dropped and counted; none raises."""
    import random

    rng = random.Random(4733)
    choice = choose(OFFER)
    assert choice is not None
    codec = SipRtpCodec("c", choice)
    codec.receive_message("start")
    good = [build_rtp(8, seq, seq * 160, 5, b"\x00" * 160) for seq in range(50)]
    good += [build_rtp(101, 60 + i, 9000, 5, event_payload(3, end=i > 2, duration=160 * i)) for i in range(6)]
    for _ in range(5000):
        data = bytearray(rng.choice(good)) if rng.random() < 0.8 else bytearray(rng.randbytes(rng.randint(0, 300)))
        for _ in range(rng.randint(0, 4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        for event in codec.receive_message(bytes(data)):
            assert isinstance(event, MediaReceived | DtmfReceived)
    assert codec.malformed > 0
    assert isinstance(codec.receive_message("bye")[-1], StreamStopped)
