"""Issue #43's "a TLS client that never finishes its handshake is closed within the deadline while a call is up,
with no gap over 30 ms in that call's RTP", measured against a ``callbridge serve`` process on its shipped defaults
(SIP on, a TLS certificate from a test CA, the embedded engine's echo agent).

A trunk (this script) places one call over TLS, its RTP socket here; each round measures the largest gap between two
of the bridge's RTP packets over a quiet window, then over a window in which ``--clients`` connections open the TLS
port and stall their handshake (half after the first bytes of a ClientHello, half before any), until the bridge
has closed them all; and when each was closed, against ``sip.tls_handshake_timeout_s`` (5 s).

    python bench/sip_tls_stall.py [--clients 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import re
import secrets
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trustme

from callbridge.carriers.sip.sim_wire import SipReply, read_sip
from callbridge.sim.hostile import TLS_HELLO_START, RtpArrivals, stalled_tls_handshake
from callbridge.sim.runner import free_port, wait_http_up
from callbridge.sip.message import split_stream

HANDSHAKE_DEADLINE_S = 5.0
"""``sip.tls_handshake_timeout_s`` as shipped (the bridge runs on its defaults)."""
class Line:
    """The trunk's TLS connection: requests out, messages in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self._buffer = reader, writer, b""
        self._messages: list[bytes] = []
        host, port = writer.get_extra_info("sockname")[:2]
        self.local = f"{host}:{port}"

    async def final(self) -> SipReply:
        while True:
            while not self._messages:
                messages, self._buffer = split_stream(self._buffer + await asyncio.wait_for(self.reader.read(65536), 10))
                self._messages += messages
            reply = read_sip(self._messages.pop(0))
            assert isinstance(reply, SipReply), reply
            if reply.status >= 200:
                return reply

    def send(self, method: str, uri: str, call_id: str, cseq: int, *, to_tag: str = "", body: bytes = b"") -> None:
        lines = [
            f"{method} {uri} SIP/2.0", f"Via: SIP/2.0/TLS {self.local};branch=z9hG4bK{secrets.token_hex(8)};rport",
            "Max-Forwards: 70", "From: <sip:trunk@127.0.0.1>;tag=trunk1", f"To: <sip:agent@127.0.0.1>{';tag=' + to_tag if to_tag else ''}",
            f"Call-ID: {call_id}", f"CSeq: {cseq} {method}", f"Contact: <sip:trunk@{self.local};transport=tls>",
            *(["Content-Type: application/sdp"] if body else []), f"Content-Length: {len(body)}",
        ]  # fmt: skip
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)


def _offer(rtp_port: int) -> bytes:
    lines = ["v=0", "o=trunk 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0", f"m=audio {rtp_port} RTP/AVP 0", "a=rtpmap:0 PCMU/8000", "a=sendrecv"]
    return ("\r\n".join(lines) + "\r\n").encode()


async def _silence(transport: asyncio.DatagramTransport, to: tuple[str, int]) -> None:
    """The phone's side of the media: PCMU silence every 20 ms (a phone that sends nothing is hung up on)."""
    ssrc, started = secrets.randbits(32), time.monotonic()
    for n in itertools.count():
        header = struct.pack("!BBHII", 0x80, 0, n & 0xFFFF, (n * 160) & 0xFFFFFFFF, ssrc)
        transport.sendto(header + b"\xff" * 160, to)
        await asyncio.sleep(max(0.0, started + (n + 1) * 0.02 - time.monotonic()))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        certificate, key = Path(folder) / "sip.crt", Path(folder) / "sip.key"
        certificate.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(key))
        http_port, sip_port, tls_port = free_port(), free_port(), free_port()
        sets = ["sip.enabled=true", f"sip.port={sip_port}", f"sip.tls_port={tls_port}", f"sip.tls_certificate={certificate}", f"sip.tls_private_key={key}"]
        command = [sys.executable, "-m", "callbridge", "serve", "--port", str(http_port), "--log-level", "warning"]
        for each in sets:
            command += ["--set", each]
        bridge = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await asyncio.to_thread(wait_http_up, f"http://127.0.0.1:{http_port}/readyz", 30)
            await _measure(tls_port, ca, bridge.pid, args.clients, args.rounds)
        finally:
            bridge.terminate()
            bridge.wait(10)


async def _measure(tls_port: int, ca: trustme.CA, pid: int, clients: int, rounds: int) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_port, ssl=context, server_hostname="127.0.0.1")
    line = Line(reader, writer)
    rtp_port = free_port()
    transport, rtp = await asyncio.get_running_loop().create_datagram_endpoint(RtpArrivals, local_addr=("127.0.0.1", rtp_port))
    call_id, uri = f"stall-{secrets.token_hex(6)}", f"sips:agent@127.0.0.1:{tls_port}"
    line.send("INVITE", uri, call_id, 1, body=_offer(rtp_port))
    ok = await line.final()
    line.send("ACK", uri, call_id, 1, to_tag=ok.get("to").split("tag=")[1])
    bridge_rtp = int(re.search(rb"m=audio (\d+)", ok.body).group(1))  # type: ignore[union-attr]
    speaking = asyncio.create_task(_silence(transport, ("127.0.0.1", bridge_rtp)))
    await asyncio.sleep(1.0)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; {clients} stalled clients a round")
    print("| round | quiet window: largest RTP gap ms | stalled handshakes: largest RTP gap ms | closed after s (min–max) | bridge CPU s in the window |")
    print("|---|---|---|---|---|")
    quiet_gaps, stalled_gaps = [], []
    for round_ in range(1, rounds + 1):
        quiet_start = time.monotonic()
        await asyncio.sleep(HANDSHAKE_DEADLINE_S + 0.5)
        quiet_gaps.append(rtp.largest_gap_ms(quiet_start, time.monotonic()))
        cpu_before, started = _cpu_s(pid), time.monotonic()
        closed = await asyncio.gather(*(stalled_tls_handshake(tls_port, TLS_HELLO_START if i % 2 else b"") for i in range(clients)))
        stalled_gaps.append(rtp.largest_gap_ms(started, max(closed)))
        after = [at - started for at in closed]
        print(f"| {round_} | {quiet_gaps[-1]:.1f} | {stalled_gaps[-1]:.1f} | {min(after):.2f}–{max(after):.2f} | {_cpu_s(pid) - cpu_before:.2f} |")
    print(f"median largest gap: quiet {statistics.median(quiet_gaps):.1f} ms, stalled handshakes {statistics.median(stalled_gaps):.1f} ms")
    line.send("BYE", uri, call_id, 2, to_tag=ok.get("to").split("tag=")[1])
    await line.final()
    speaking.cancel()
    transport.close()
    writer.close()


if __name__ == "__main__":
    asyncio.run(main())
