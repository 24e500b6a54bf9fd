"""Sending a string of digits as RFC 4733 events (``dtmf_train``) and holding audio back while it plays."""

from __future__ import annotations

import pytest

from callbridge.carriers.base import SendMedia
from callbridge.carriers.sip.wire import SipRtpCodec
from callbridge.sip.dtmf import DtmfReceiver, dtmf_train
from callbridge.sip.rtp import RtpSender, parse_rtp
from callbridge.sip.sdp import choose
from tests.sip.test_dialog import SDP

pytestmark = pytest.mark.core


def test_each_digit_is_its_own_event_on_the_media_clock() -> None:
    sender = RtpSender(ssrc=7, sequence=65530, timestamp=0xFFFFFF00)
    schedule, total_ms = dtmf_train(sender, 101, "123")
    assert total_ms == 600  # 100 ms tone + 100 ms pause per digit
    packets = [(due, parse_rtp(data)) for due, data in schedule]
    by_digit = [[p for _, p in packets if p.payload[0] == code] for code in (1, 2, 3)]
    # RFC 4733 §2.5.1.1: every packet of an event carries its start; digits start 200 ms (1600 units) apart
    starts = [{p.timestamp for p in digit} for digit in by_digit]
    assert starts == [{0xFFFFFF00}, {(0xFFFFFF00 + 1600) & 0xFFFFFFFF}, {(0xFFFFFF00 + 3200) & 0xFFFFFFFF}]
    for k, digit in enumerate(by_digit):
        dues = [due for due, p in packets if p.payload[0] == k + 1]
        assert dues == [k * 200 + 20 * (i + 1) for i in range(7)]  # 20 ms apart, all inside the digit's period
        durations = [int.from_bytes(p.payload[2:4], "big") for p in digit]
        assert durations == [160, 320, 480, 640, 800, 800, 800]  # the duration so far when each is sent
        assert [bool(p.payload[1] & 0x80) for p in digit] == [False] * 4 + [True] * 3  # the end packet ×3
        assert [p.marker for p in digit] == [True] + [False] * 6
    assert [p.sequence for _, p in packets] == [(65530 + i) & 0xFFFF for i in range(21)]  # one sequence, wrapping
    assert sender.timestamp == (0xFFFFFF00 + 4800) & 0xFFFFFFFF and sender.talk_spurt  # audio resumes after the train
    receiver = DtmfReceiver()
    assert [d for _, p in packets for d in receiver.receive(p)] == ["1", "2", "3"]


def test_the_pause_must_hold_the_end_packets() -> None:
    with pytest.raises(ValueError):
        dtmf_train(RtpSender(), 101, "1", pause_ms=40)


def test_no_audio_goes_out_while_digits_play() -> None:
    choice = choose(SDP)
    assert choice is not None and choice.dtmf_payload_type == 101
    codec = SipRtpCodec("c1", choice)
    codec.receive_message("start")
    assert codec.send(SendMedia(b"\xff" * 160)) is not None
    codec.playing_events = True
    timestamp = codec.sender.timestamp
    assert codec.send(SendMedia(b"\xff" * 160)) is None and codec.silence() is None
    assert codec.sender.timestamp == timestamp and codec.suppressed_for_events == 1  # the media clock did not move
