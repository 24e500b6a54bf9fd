"""The browser's audio on its way in (``carriers/webrtc/jitter.py``), packet by packet: what aiortc's own audio jitter
buffer does with one lost packet, and what ours does."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from callbridge.carriers.webrtc.jitter import AudioJitterBuffer

pytestmark = pytest.mark.core

SAMPLES = 960
"""An Opus packet of 20 ms on its 48 kHz clock: a frame each."""


def frames_out(buffer: JitterBuffer, sequence: Iterable[int]) -> list[tuple[int, int | None]]:
    """(packet that arrived, frame handed on at its arrival, None: none)."""
    out: list[tuple[int, int | None]] = []
    for number in sequence:
        packet = RtpPacket(payload_type=111, sequence_number=number & 0xFFFF, timestamp=(number * SAMPLES) & 0xFFFFFFFF)
        packet._data = b"\xfc"  # type: ignore[attr-defined]  # what aiortc's receiver puts there: the payload
        _, frame = buffer.add(packet)
        out.append((number & 0xFFFF, None if frame is None else (frame.timestamp // SAMPLES) & 0xFFFF))
    return out


def lag(out: list[tuple[int, int | None]]) -> int:
    """Packets between the newest arrived and the frame handed on, at the end."""
    arrived, frame = out[-1]
    assert frame is not None
    return (arrived - frame) & 0xFFFF


def without(lost: set[int], count: int = 60) -> list[int]:
    return [number for number in range(count) if number not in lost]


def test_aiortcs_own_buffer_falls_280_ms_behind_for_good_after_one_lost_packet() -> None:
    """Why ours: aiortc's waits until 16 packets are behind the gap, then still hands on one frame per packet."""
    clean = frames_out(JitterBuffer(capacity=16, prefetch=4), without(set()))
    lossy = frames_out(JitterBuffer(capacity=16, prefetch=4), without({10}))
    assert lag(clean) == 4 and lag(lossy) == 14


@pytest.mark.parametrize("jitter_frames", [1, 2])
def test_ours_hands_on_a_frame_once_jitter_frames_more_have_come(jitter_frames: int) -> None:
    out = frames_out(AudioJitterBuffer(jitter_frames), without(set()))
    assert lag(out) == jitter_frames
    assert [frame for _, frame in out if frame is not None] == list(range(60 - jitter_frames))  # every frame, in order


def test_a_lost_packet_is_waited_for_two_packets_then_given_up_and_the_delay_is_back_at_once() -> None:
    buffer = AudioJitterBuffer(1)
    out = frames_out(buffer, without({10}))
    assert out[10:13] == [(11, None), (12, None), (13, 12)]  # waited for 10 while 11 and 12 came, then on from 12
    assert lag(out) == 1 and buffer.skipped == 3  # 10 lost; 9 and 11 (waiting behind it) let go


def test_a_late_packet_within_the_wait_is_played_in_its_place() -> None:
    buffer = AudioJitterBuffer(1)
    out = frames_out(buffer, [0, 1, 2, 4, 3, 5, 6, 7, 8])
    assert [frame for _, frame in out if frame is not None] == [0, 1, 2, 3, 4, 5, 6] and buffer.skipped == 0


@pytest.mark.parametrize("burst", [5, 12, 20])
def test_a_burst_of_losses_costs_its_own_frames_and_the_delay_comes_back(burst: int) -> None:
    """Past 16 packets (20) aiortc's own overflow lets the gap go first: the same delay after it."""
    buffer = AudioJitterBuffer(1)
    out = frames_out(buffer, without(set(range(10, 10 + burst)), count=80))
    assert lag(out) == 1
    if burst < 16:
        assert burst <= buffer.skipped <= burst + 2


def test_the_sequence_number_wraps() -> None:
    buffer = AudioJitterBuffer(1)
    out = frames_out(buffer, range(65530, 65550))
    assert lag(out) == 1 and buffer.skipped == 0
    assert [frame for _, frame in out if frame is not None] == [*range(65530, 65536), *range(0, 13)]


def test_packets_out_of_order_again_and_again_never_leave_it_more_than_the_wait_behind() -> None:
    order = [n for pair in zip(range(1, 200, 2), range(0, 200, 2), strict=True) for n in pair]  # 1 0 3 2 5 4 …
    buffer = AudioJitterBuffer(1)
    out = frames_out(buffer, order)
    assert max((arrived - frame) & 0xFFFF for arrived, frame in out if frame is not None) <= 1 + buffer.wait + 1
