"""Per-frame cost of each carrier's wire codec, in µs per 20 ms of audio.

    python bench/carrier_codecs.py [--frames 20000]

For every carrier: parse one inbound media message (``receive_message``: JSON,
base64, checks; Telnyx also re-orders by sequence number) and build one
outbound media message (``send(SendMedia)``), each timed alone with
``perf_counter_ns``, garbage collection off. Exotel carries 100 ms per
inbound message and 200 ms per outbound chunk at 8 kHz, so its figures are
divided to give the cost per 20 ms of audio. Decoding, resampling and pacing
come after the codec and are the same for every carrier (``bench/codecs.py``).
Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import base64
import gc
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from callbridge.carriers.audiosocket.wire import AudioSocketCodec, Kind, frame
from callbridge.carriers.bandwidth.wire import BandwidthCodec
from callbridge.carriers.base import ProviderCodec, SendMedia
from callbridge.carriers.exotel.wire import ExotelCodec
from callbridge.carriers.jambonz.wire import JambonzCodec
from callbridge.carriers.plivo.wire import PlivoCodec
from callbridge.carriers.signalwire.wire import signalwire_codec
from callbridge.carriers.telnyx.wire import TelnyxCodec
from callbridge.carriers.twilio.wire import TwilioCodec
from callbridge.carriers.vonage.wire import VonageCodec

ULAW_20MS = bytes(range(96, 256)) * 1  # 160 bytes of varied μ-law
L16_20MS_8K = bytes(range(256)) + bytes(range(64))  # 320 bytes
L16_20MS_16K = L16_20MS_8K * 2
L16_20MS_24K = L16_20MS_8K * 3


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def dumps(payload: object) -> str:
    return orjson.dumps(payload).decode()


@dataclass(frozen=True)
class Case:
    name: str
    codec: Callable[[], ProviderCodec]
    start: list[str | bytes]
    media: Callable[[int], str | bytes]
    """The inbound media message number ``i`` (sequence numbers, timestamps)."""
    outbound: bytes
    """One outbound frame, as the bridge hands it to ``send``."""
    inbound_ms: int = 20
    outbound_ms: int = 20


def cases() -> list[Case]:
    sid = "MZ" + "1" * 32
    twilio_start = dumps({"event": "start", "sequenceNumber": "1", "streamSid": sid, "start": {
        "streamSid": sid, "accountSid": "AC" + "0" * 32, "callSid": "CA" + "2" * 32, "tracks": ["inbound"], "customParameters": {},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}})  # fmt: skip

    def twilio_media(i: int) -> str:
        media = {"track": "inbound", "chunk": str(i), "timestamp": str(20 * i), "payload": b64(ULAW_20MS)}
        return dumps({"event": "media", "sequenceNumber": str(i + 2), "media": media, "streamSid": sid})

    signalwire_start = twilio_start.replace('"AC' + "0" * 32, '"3f2b1c0e-0000-4000-8000-000000000000').replace(
        '"encoding":"audio/x-mulaw","sampleRate":8000', '"encoding":"audio/x-l16","sampleRate":24000'
    )

    def signalwire_media(i: int) -> str:
        media = {"track": "inbound", "chunk": str(i), "timestamp": str(20 * i), "payload": b64(L16_20MS_24K)}
        return dumps({"event": "media", "sequenceNumber": str(i + 2), "media": media, "streamSid": sid})

    telnyx_start = dumps({"event": "start", "sequence_number": "1", "stream_id": "s-1", "start": {
        "call_control_id": "v3:abc", "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}})  # fmt: skip

    def telnyx_media(i: int) -> str:
        media = {"track": "inbound", "chunk": str(i), "timestamp": str(20 * i), "payload": b64(ULAW_20MS)}
        return dumps({"event": "media", "sequence_number": str(i + 2), "stream_id": "s-1", "media": media})

    plivo_start = dumps({"event": "start", "sequenceNumber": 1, "start": {"callId": "c-1", "streamId": "s-1", "accountId": "MA1",
        "tracks": ["inbound"], "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}, "extra_headers": ""})  # fmt: skip

    def plivo_media(i: int) -> str:
        media = {"track": "inbound", "chunk": i, "timestamp": str(1_718_000_000_000 + 20 * i), "payload": b64(ULAW_20MS)}
        return dumps({"event": "media", "sequenceNumber": i + 2, "streamId": "s-1", "media": media})

    exotel_start = dumps({"event": "start", "sequence_number": "1", "stream_sid": "MZ3", "start": {"stream_sid": "MZ3",
        "call_sid": "CA3", "account_sid": "AC3", "custom_parameters": {},
        "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"}}})  # fmt: skip
    chunk_100ms = b64(L16_20MS_8K * 5)

    def exotel_media(i: int) -> str:
        media = {"chunk": str(i), "timestamp": str(100 * i), "payload": chunk_100ms}
        return dumps({"event": "media", "sequence_number": str(i + 2), "stream_sid": "MZ3", "media": media})

    bandwidth_start = dumps({"eventType": "start", "metadata": {"accountId": "9900001", "callId": "c-1", "streamId": "s-1",
        "streamName": "n", "tracks": [{"name": "inbound", "mediaFormat": {"encoding": "audio/PCMU", "sampleRate": 8000}}]}})  # fmt: skip
    ulaw_b64 = b64(ULAW_20MS)

    def bandwidth_media(i: int) -> str:
        return dumps({"eventType": "media", "track": "inbound", "sequenceNumber": i + 1, "payload": ulaw_b64})

    jambonz_start = dumps({"sampleRate": 16000, "mixType": "mono", "callSid": "c-1", "from": "+1", "to": "+2"})
    vonage_start = dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=16000", "call_uuid": "c-1"})
    call_uuid = uuid.UUID(int=7).bytes
    return [
        Case("twilio (μ-law 8 kHz)", TwilioCodec, [twilio_start], twilio_media, ULAW_20MS),
        Case("signalwire (L16 24 kHz)", signalwire_codec, [signalwire_start], signalwire_media, L16_20MS_24K),
        Case("telnyx (PCMU, re-ordering)", TelnyxCodec, [telnyx_start], telnyx_media, ULAW_20MS),
        Case("plivo (μ-law 8 kHz)", PlivoCodec, [plivo_start], plivo_media, ULAW_20MS),
        Case("exotel (L16 8 kHz, 100 ms in / 200 ms out)", ExotelCodec, [exotel_start], exotel_media, L16_20MS_8K * 10, 100, 200),
        Case("vonage (binary L16 16 kHz)", VonageCodec, [vonage_start], lambda i: L16_20MS_16K, L16_20MS_16K),
        Case("bandwidth (μ-law 8 kHz)", BandwidthCodec, [bandwidth_start], bandwidth_media, ULAW_20MS),
        Case("jambonz (binary L16 16 kHz)", JambonzCodec, [jambonz_start], lambda i: L16_20MS_16K, L16_20MS_16K),
        Case("audiosocket (TLV slin 8 kHz)", AudioSocketCodec, [frame(Kind.UUID, call_uuid)], lambda i: frame(Kind.SLIN, L16_20MS_8K), L16_20MS_8K),
    ]


def time_each(step: Callable[[int], object], count: int) -> list[float]:
    samples: list[float] = []
    gc.disable()
    try:
        for i in range(count):
            start = time.perf_counter_ns()
            step(i)
            samples.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=20_000)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, {args.frames} messages each way\n")
    print("| carrier | inbound parse, µs per 20 ms (median / mean) | outbound build, µs per 20 ms (median / mean) |")
    print("|---|---|---|")
    for case in cases():
        codec = case.codec()
        for message in case.start:
            codec.receive_message(message)
        messages = [case.media(i) for i in range(args.frames)]
        inbound = time_each(lambda i, c=codec, m=messages: c.receive_message(m[i]), args.frames)
        action = SendMedia(case.outbound)
        outbound = time_each(lambda i, c=codec, a=action: c.send(a), args.frames)
        scale_in, scale_out = case.inbound_ms / 20, case.outbound_ms / 20
        print(
            f"| {case.name} | {statistics.median(inbound) / scale_in:.1f} / {statistics.fmean(inbound) / scale_in:.1f} "
            f"| {statistics.median(outbound) / scale_out:.1f} / {statistics.fmean(outbound) / scale_out:.1f} |"
        )


if __name__ == "__main__":
    main()
