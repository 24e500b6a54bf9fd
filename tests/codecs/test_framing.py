"""Frame assembly: exact 20 ms frames for every rate and codec, remainder carried, silence-padded flush."""

from __future__ import annotations

import pytest

from callbridge.codecs import AudioEncoding, FrameAssembler, frame_bytes

pytestmark = pytest.mark.core


@pytest.mark.parametrize(
    ("rate_hz", "encoding", "expected"),
    [
        (8000, AudioEncoding.PCMU, 160),
        (8000, AudioEncoding.PCMA, 160),
        (8000, AudioEncoding.L16, 320),
        (16000, AudioEncoding.L16, 640),
        (24000, AudioEncoding.L16, 960),
        (16000, AudioEncoding.L16_BE, 640),
    ],
)
def test_frame_size(rate_hz: int, encoding: AudioEncoding, expected: int) -> None:
    assert frame_bytes(rate_hz, encoding) == expected
    assert FrameAssembler(rate_hz, encoding).frame_bytes == expected


def test_frame_of_fractional_samples_rejected() -> None:
    with pytest.raises(ValueError, match="whole number of samples"):
        frame_bytes(11025, AudioEncoding.L16)


def test_arbitrary_pushes_give_the_stream_back_in_exact_frames() -> None:
    assembler = FrameAssembler(8000, AudioEncoding.PCMU)
    stream = bytes(i % 251 for i in range(10_000))
    frames: list[bytes] = []
    cuts = [0, 1, 7, 159, 160, 161, 320, 333, 1000, 1001, 4096, 10_000]
    for a, b in zip(cuts, cuts[1:]):
        frames += assembler.push(stream[a:b])
        assert assembler.pending_bytes == b % 160
    assert all(len(f) == 160 for f in frames)
    assert b"".join(frames) == stream[: len(frames) * 160]
    tail = assembler.flush()
    assert tail is not None and len(tail) == 160
    assert tail == stream[len(frames) * 160 :] + b"\xff" * (160 - 10_000 % 160)
    assert assembler.flush() is None


def test_push_of_whole_frames_keeps_nothing() -> None:
    assembler = FrameAssembler(16000, AudioEncoding.L16)
    frames = assembler.push(b"\x01" * 640 * 3)
    assert len(frames) == 3 and assembler.pending_bytes == 0
    assert assembler.flush() is None


def test_small_pushes_complete_a_frame() -> None:
    assembler = FrameAssembler(8000, AudioEncoding.PCMA)
    for _ in range(15):
        assert assembler.push(b"\x10" * 10) == []
    (frame,) = assembler.push(b"\x20" * 20)
    assert frame == b"\x10" * 150 + b"\x20" * 10
    assert assembler.pending_bytes == 10


@pytest.mark.parametrize(("encoding", "fill"), [(AudioEncoding.PCMU, 0xFF), (AudioEncoding.PCMA, 0xD5), (AudioEncoding.L16, 0)])
def test_flush_pads_with_the_codecs_silence(encoding: AudioEncoding, fill: int) -> None:
    assembler = FrameAssembler(8000, encoding)
    assembler.push(b"\x42\x42")
    frame = assembler.flush()
    assert frame == b"\x42\x42" + bytes([fill]) * (assembler.frame_bytes - 2)


def test_clear_drops_the_remainder() -> None:
    assembler = FrameAssembler(8000, AudioEncoding.PCMU)
    assembler.push(b"\x00" * 200)
    assert assembler.clear() == 40
    assert assembler.pending_bytes == 0
    assert assembler.push(b"\x01" * 160) == [b"\x01" * 160]


def test_accepts_memoryview_and_bytearray() -> None:
    assembler = FrameAssembler(8000, AudioEncoding.PCMU)
    assert assembler.push(memoryview(b"\x05" * 100)) == []
    assert assembler.push(bytearray(b"\x06" * 60)) == [b"\x05" * 100 + b"\x06" * 60]
