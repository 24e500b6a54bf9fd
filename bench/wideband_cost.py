"""What a wideband codec and SRTP cost a SIP call (#43): the RTP edge (``callbridge.carriers.sip.wire.SipRtpCodec``)
receiving 20 ms packets from the phone and sending the agent's 20 ms frames back, PCMU (passed through: the bridge's
own μ-law steps, ``audioop``, are added to it here), G.722 (libg722) and Opus (libopus), each plain and with SRTP
(libsrtp2 unprotecting what comes in and protecting what goes out, as ``RtpTransport`` does), CPU time per
call-second (50 packets each way, speech both ways all the time: more than a call has), all in the same run,
interleaved.

    python bench/wideband_cost.py [--seconds 200] [--rounds 3]

What it leaves out: the rest of a call (the bridge's framing and resampling, the engine), the same for every codec
but for the resampling (an 8 kHz call is resampled to the engine's 16 kHz, a wideband one is not), and the
phone's side (its packets are made before the clock starts).

Machine: the one it runs on (CPU time, not wall: what a call adds to the process).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.carriers.base import MediaReceived, SendMedia  # noqa: E402
from callbridge.carriers.sip.wire import SipRtpCodec  # noqa: E402
from callbridge.codecs import AudioEncoding, ResamplerQuality, StreamResampler, decode_to_pcm16, encode_from_pcm16  # noqa: E402
from callbridge.codecs.g722 import G722Encoder  # noqa: E402
from callbridge.codecs.opus import OpusEncoder  # noqa: E402
from callbridge.sim.runner import load_wav_8k, sample_caller_wav  # noqa: E402
from callbridge.sip.rtp import build_rtp  # noqa: E402
from callbridge.sip.sdp import choose  # noqa: E402
from callbridge.sip.srtp import KEY_BYTES, SrtpKeys, SrtpSession  # noqa: E402

_OFFER = "v=0\r\nc=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP {pt} 101\r\na=rtpmap:101 telephone-event/8000\r\n{rtpmap}"
_CODECS = {  # name: (payload type, rtpmap line, audio rate, RTP ticks a packet)
    "PCMU": (0, "", 8000, 160),
    "G722": (9, "", 16000, 160),
    "opus": (111, "a=rtpmap:111 opus/48000/2\r\n", 16000, 960),
    "opus, sip.opus_fec off": (111, "a=rtpmap:111 opus/48000/2\r\n", 16000, 960),
}


def voice(rate: int, seconds: int) -> bytes:
    """Speech: the bundled caller utterance (3.7 s, looped) at ``rate``; the codecs' cost depends on what they code."""
    speech = load_wav_8k(sample_caller_wav())
    if rate != 8000:
        up = StreamResampler(8000, rate, ResamplerQuality.HQ)
        speech = up.process(speech) + up.flush()
    frame = 2 * rate // 50
    speech = speech[: len(speech) // frame * frame]
    return (speech * (2 * rate * seconds // len(speech) + 1))[: 2 * rate * seconds]


def call_seconds_cost(name: str, seconds: int, srtp: bool) -> float:
    """CPU-ms per call-second of the edge for codec ``name``, with SRTP or not."""
    pt, rtpmap, rate, ticks = _CODECS[name]
    choice = choose(_OFFER.format(pt=pt, rtpmap=rtpmap), codecs=(AudioEncoding.PCMU, AudioEncoding.G722, AudioEncoding.OPUS))
    assert choice is not None and choice.payload_type == pt
    codec = SipRtpCodec("bench", choice, opus_fec="off" not in name)
    codec.receive_message("start")
    audio = voice(rate, seconds)
    step = 2 * rate // 50
    frames = [audio[i : i + step] for i in range(0, len(audio), step)]
    phone = G722Encoder if name == "G722" else OpusEncoder if name.startswith("opus") else None
    coder = phone() if phone is not None else None
    wire = [coder.encode(frame) if coder is not None else encode_from_pcm16(AudioEncoding.PCMU, frame) for frame in frames]
    packets = [build_rtp(pt, n & 0xFFFF, ticks * n, 7, bytes(payload)) for n, payload in enumerate(wire, 1)]
    ours = theirs = None
    if srtp:
        key, phone_key = secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES)
        ours = SrtpSession(SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, phone_key, key))
        theirs = SrtpSession(SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, key, phone_key))
        packets = [theirs.protect(packet) for packet in packets]
    started = time.process_time()
    for packet, frame in zip(packets, frames, strict=True):
        if ours is not None:
            packet = ours.unprotect(packet) or b""
        for event in codec.receive_message(packet):
            if isinstance(event, MediaReceived) and name == "PCMU":
                decode_to_pcm16(AudioEncoding.PCMU, event.payload)  # the bridge's own step for G.711
        sent = codec.send(SendMedia(bytes(encode_from_pcm16(AudioEncoding.PCMU, frame)) if name == "PCMU" else frame))
        if ours is not None and sent is not None:
            ours.protect(sent)
    return (time.process_time() - started) * 1000 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = [(name, srtp) for name in _CODECS for srtp in (False, True)]
    costs: dict[tuple[str, bool], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):  # interleaved: the machine's drift falls on all
        for name, srtp in cases:
            costs[(name, srtp)].append(call_seconds_cost(name, args.seconds, srtp))
    base = statistics.median(costs[("PCMU", False)])
    print("| codec | SRTP | CPU-ms a call-second (median) | rounds | against plain PCMU |")
    print("|---|---|---|---|---|")
    for (name, srtp), values in costs.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.3f}" for v in values)
        print(f"| {name} | {'yes' if srtp else 'no'} | {median:.3f} | {rounds} | +{median - base:.3f} |")


if __name__ == "__main__":
    main()
