"""The browser's audio on its way in: aiortc's jitter buffer, sized by us and made to get over a lost packet.

aiortc's audio receiver keeps a ``JitterBuffer(capacity=16, prefetch=4)``: a frame is decoded once 4 more have arrived
(80 ms of every word), and one frame comes out per packet that arrives. A packet that never comes stalls it: nothing
comes out until 16 packets wait behind the gap, and from then on still one frame per packet — the caller's audio
reaches the bridge 280 ms late for the rest of the call (2 frames lost besides; ``tests/carriers/test_webrtc_jitter.py``
shows it on aiortc's own). ``AudioJitterBuffer`` keeps the same frames-out-per-packet-in contract the receiver
relies on, and:

- hands a frame on once ``prefetch`` more have arrived (``webrtc.jitter_frames``: 1 as shipped);
- waits for a missing packet while ``wait`` more arrive past the prefetch (a late one, reordered), then gives it up:
  what waited behind it is let go up to the newest ``prefetch`` frames, so the stream is back to its delay at once (the
  frames let go are lost: ``skipped`` counts them; a lost packet costs ``wait`` + 1 frames of audio, not 280 ms for
  good);
- the same where a packet out of order left the stream a frame further behind (one frame goes out per packet that
  comes, so nothing else would take it back): past ``wait`` frames behind, the oldest are let go.

It reaches into aiortc's buffer (``_origin``, ``remove``, ``_remove_frame``) and its receiver (``install``): a test pins
both on the aiortc this runs with.
"""

from __future__ import annotations

from typing import Final

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket

__all__ = ["AudioJitterBuffer", "install"]

CAPACITY: Final = 16
"""aiortc's own for audio (a power of two): packets held at most."""
_RECEIVER_BUFFER: Final = "_RTCRtpReceiver__jitter_buffer"


class AudioJitterBuffer(JitterBuffer):
    """See the module docstring."""

    def __init__(self, prefetch: int, wait: int = 2) -> None:
        super().__init__(capacity=CAPACITY, prefetch=prefetch)
        self.wait = wait
        self.skipped = 0
        """Frames given up: the lost ones, and what waited behind them past the prefetch."""

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        pli, frame = super().add(packet)
        origin = self._origin
        if origin is None:
            return pli, frame
        # packets from the oldest not handed on to this one: ``prefetch`` in a steady stream (less one once a frame is
        # out); more behind a gap, or after a packet came out of order (one frame goes out per packet that comes, so
        # what a hiccup put behind stays behind)
        held = (packet.sequence_number - origin) & 0xFFFF
        steady = self._prefetch - (frame is not None)
        if held >= 0x8000 or held <= steady + self.wait:  # a packet from before the origin (late), or within the wait
            return pli, frame
        let_go = held - steady
        self.remove(let_go)
        while (origin := self._origin) is not None and origin != packet.sequence_number and self._packets[origin % CAPACITY] is None:
            self.remove(1)  # more of the same loss: on to the first packet that came
            let_go += 1
        self.skipped += let_go
        return pli, frame if frame is not None else self._remove_frame(packet.sequence_number)


def install(connection: RTCPeerConnection, prefetch: int) -> bool:
    """Give each audio receiver of ``connection`` an ``AudioJitterBuffer``; whether it could (False: this aiortc keeps its
    buffer elsewhere, and its own stays)."""
    done = False
    for transceiver in connection.getTransceivers():
        receiver = transceiver.receiver
        if transceiver.kind == "audio" and isinstance(getattr(receiver, _RECEIVER_BUFFER, None), JitterBuffer):
            setattr(receiver, _RECEIVER_BUFFER, AudioJitterBuffer(prefetch))
            done = True
    return done
