"""What SRTP costs a SIP call (#43): libsrtp2's protect and unprotect (``callbridge.sip.srtp.SrtpSession``) of 20 ms
PCMU packets (172 bytes), AES_CM_128_HMAC_SHA1_80, CPU time per packet and per call-second (50 packets each way).

    python bench/srtp_cost.py [--packets 20000]

Machine: the one it runs on (CPU time, not wall: what a call adds to the process).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.sip.srtp import KEY_BYTES, SrtpKeys, SrtpSession  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packets", type=int, default=20_000)
    args = parser.parse_args()
    keys = SrtpKeys("AES_CM_128_HMAC_SHA1_80", 1, secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES))
    ours, theirs = SrtpSession(keys), SrtpSession(SrtpKeys(keys.suite, 1, keys.local_key, keys.remote_key))
    packets = [
        bytes([0x80, 0, (n >> 8) & 0xFF, n & 0xFF]) + (160 * n).to_bytes(4, "big") + b"\x00\x00\x30\x39" + b"\xff" * 160
        for n in range(1, args.packets + 1)
    ]
    started = time.process_time()
    protected = [ours.protect(packet) for packet in packets]
    protect_s = time.process_time() - started
    started = time.process_time()
    assert all(theirs.unprotect(packet) is not None for packet in protected)
    unprotect_s = time.process_time() - started
    per_packet = (protect_s + unprotect_s) / len(packets)
    print(f"protect {protect_s / len(packets) * 1e6:.1f} µs, unprotect {unprotect_s / len(packets) * 1e6:.1f} µs a packet")
    print(f"a call-second (50 packets each way): {per_packet * 50 * 1000:.3f} CPU-ms")


if __name__ == "__main__":
    main()
