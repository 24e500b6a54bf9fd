"""What G.722 costs a SIP call (#43): the RTP edge (``callbridge.carriers.sip.wire.SipRtpCodec``) receiving 20 ms
packets from the phone and sending the agent's 20 ms frames back, G.722 (decoded and encoded there, libg722) against
PCMU (passed through: the bridge's own μ-law step, ``audioop``, is added to it here), CPU time per call-second (50
packets each way), both in the same run.

    python bench/g722_cost.py [--seconds 200] [--rounds 3]

Machine: the one it runs on (CPU time, not wall: what a call adds to the process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.carriers.base import MediaReceived, SendMedia  # noqa: E402
from callbridge.carriers.sip.wire import SipRtpCodec  # noqa: E402
from callbridge.codecs import AudioEncoding, decode_to_pcm16, encode_from_pcm16  # noqa: E402
from callbridge.codecs.g722 import G722Encoder  # noqa: E402
from callbridge.sip.rtp import build_rtp  # noqa: E402
from callbridge.sip.sdp import choose  # noqa: E402

_OFFER = "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP {pt} 101\r\na=rtpmap:101 telephone-event/8000\r\n"


def call_seconds_cost(pt: int, seconds: int) -> float:
    """CPU-ms per call-second of the edge for payload type ``pt`` (0: PCMU, 9: G.722)."""
    choice = choose(_OFFER.format(pt=pt))
    assert choice is not None
    codec = SipRtpCodec("bench", choice)
    codec.receive_message("start")
    rate = 16000 if pt == 9 else 8000
    t = np.arange(rate * seconds) / rate
    voice = (4000 * np.sin(2 * np.pi * 300 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype("<i2").tobytes()
    step = 2 * rate // 50
    frames = [voice[i : i + step] for i in range(0, len(voice), step)]
    phone = G722Encoder()
    wire = [phone.encode(frame) if pt == 9 else encode_from_pcm16(AudioEncoding.PCMU, frame) for frame in frames]
    packets = [build_rtp(pt, n & 0xFFFF, 160 * n, 7, bytes(payload)) for n, payload in enumerate(wire, 1)]
    started = time.process_time()
    for packet, frame in zip(packets, frames, strict=True):
        for event in codec.receive_message(packet):
            if isinstance(event, MediaReceived) and pt == 0:
                decode_to_pcm16(AudioEncoding.PCMU, event.payload)  # the bridge's own step for G.711
        codec.send(SendMedia(frame if pt == 9 else bytes(encode_from_pcm16(AudioEncoding.PCMU, frame))))
    return (time.process_time() - started) * 1000 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pcmu, g722 = [], []
    for _ in range(args.rounds):  # interleaved: the machine's drift falls on both
        pcmu.append(call_seconds_cost(0, args.seconds))
        g722.append(call_seconds_cost(9, args.seconds))
    print(f"PCMU: {statistics.median(pcmu):.3f} CPU-ms a call-second (rounds: {', '.join(f'{v:.3f}' for v in pcmu)})")
    print(f"G722: {statistics.median(g722):.3f} CPU-ms a call-second (rounds: {', '.join(f'{v:.3f}' for v in g722)})")
    print(f"G.722 adds {statistics.median(g722) - statistics.median(pcmu):.3f} CPU-ms a call-second at the edge")


if __name__ == "__main__":
    main()
