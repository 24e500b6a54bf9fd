"""AudioSocket's byte-stream codec, fuzzed: arbitrary bytes, and streams of frames of every kind (well formed or
not, in any order) cut into chunks anywhere. Only ``RemoteProtocolError`` escapes, the carrier contract holds
(tests/fuzz/contract.py), and how the stream is cut never changes what it means."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from callbridge.carriers.audiosocket.wire import AUDIO_KINDS, AudioSocketCodec, frame
from callbridge.carriers.base import CarrierEvent, RemoteProtocolError
from tests.fuzz.contract import CodecRun

pytestmark = [pytest.mark.hot_path, pytest.mark.background]
"""Run again on the compiled build (``-m 'core or hot_path'``, .ci/run)."""

CALL = uuid.UUID("40325ec2-5efd-4bd3-805f-53576e581d13")
UUID_FRAME = frame(0x01, CALL.bytes)

_kinds = st.sampled_from([0x00, 0x01, 0x02, 0x03, 0xFF, *AUDIO_KINDS]) | st.integers(0, 255)


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    """One frame, usually with the payload its kind wants (16-byte uuid, even PCM, one DTMF byte, a code)."""
    kind = draw(_kinds)
    digit = st.sampled_from(b"0123456789*#ABCDabcdx\x00\xb5\xdf\xff").map(lambda b: bytes((b,))) | st.binary(
        min_size=1, max_size=1
    )
    wanted = {0x01: st.binary(min_size=16, max_size=16), 0x03: digit, 0xFF: st.binary(max_size=3)}
    pcm = st.integers(0, 200).map(lambda n: bytes(2 * n))
    payload = draw(wanted.get(kind, pcm if kind in AUDIO_KINDS else st.binary(max_size=4)) | st.binary(max_size=40))
    data = frame(kind, payload)
    if draw(st.integers(0, 9)) == 0:  # a header whose length lies
        data = data[:1] + draw(st.binary(min_size=2, max_size=2)) + data[3:]
    return data


_streams = st.lists(_frames(), max_size=12).map(lambda frames: UUID_FRAME + b"".join(frames))


def _feed(chunks: list[bytes]) -> tuple[list[CarrierEvent], str | None]:
    """Every event of the stream, and the reason of the error that ended it (None: none did)."""
    codec = AudioSocketCodec(7)
    run = CodecRun(codec)
    events: list[CarrierEvent] = []
    for chunk in chunks:
        try:
            events += codec.receive_message(chunk)
        except RemoteProtocolError as exc:
            for event in events:  # the contract over what came before the error
                run.check(event)
            return events, exc.reason.value
    for event in events:
        run.check(event)
    run.check_sends()
    return events, None


@given(messages=st.lists(st.binary(max_size=60) | st.text(max_size=5), max_size=8))
def test_any_bytes(messages: list[str | bytes]) -> None:
    CodecRun(AudioSocketCodec(7)).feed(messages)


@given(stream=_streams, data=st.data())
@example(stream=UUID_FRAME + frame(0x03, b"\xdf"), data=None)  # "ß".upper() is "SS", which ord() refuses
def test_frames_in_any_order_cut_anywhere(stream: bytes, data: st.DataObject | None) -> None:
    whole_events, whole_error = _feed([stream])
    cuts = (
        sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="cuts"))
        if data is not None
        else [1, 2]
    )
    events, error = _feed([stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)])
    assert error == whole_error
    if error is None:
        assert events == whole_events
    else:  # a chunk that ends in an error is refused whole: the events before it come out only when cut before it
        assert events[: len(whole_events)] == whole_events
