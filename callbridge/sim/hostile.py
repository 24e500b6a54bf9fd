"""Hostile peers and the measures taken while they run (issue #15): the adversarial tests and ``bench/hostile.py``.

An attacker here speaks raw websocket frames on a TCP socket, so it can announce a message of any size without
holding it; the server's memory is read from ``/proc`` (Linux); the healthy call's audio is timed as it arrives.
"""

from __future__ import annotations

import asyncio
import base64
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Final

import psutil

__all__ = [
    "MediaArrivals", "Refusal", "closed_by_peer", "how_they_end", "options_flood", "oversized_body", "oversized_message",
    "post_head", "rss_bytes", "slow_head", "status_of", "upgrade",
]  # fmt: skip


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` now."""
    return int(psutil.Process(pid).memory_info().rss)


def upgrade(port: int, path: str, timeout_s: float = 5.0) -> socket.socket:
    """A raw TCP socket to 127.0.0.1:``port``, upgraded to a websocket on ``path`` (the handshake done by hand)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            sock.close()
            raise ConnectionError("closed during the websocket handshake")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        sock.close()
        raise ConnectionError(f"upgrade refused: {head[:120]!r}")
    return sock


@dataclass(frozen=True, slots=True)
class Refusal:
    """How the server dealt with one message: payload bytes it let in, its close code, seconds to the close."""

    written: int
    close_code: int | None
    seconds: float


def oversized_message(port: int, size: int, path: str) -> Refusal:
    """One unauthenticated text message of ``size`` bytes on ``path``: its frame header, then as much of its
    payload as the server takes (64 KiB at a time) before it closes."""
    sock = upgrade(port, path)
    started = time.monotonic()
    written = 0
    try:
        sock.sendall(struct.pack("!BBQ", 0x81, 0x80 | 127, size) + b"\x00\x00\x00\x00")  # masked with a zero key
        chunk = bytes(64 * 1024)
        sock.settimeout(0.2)
        while written < size:
            part = chunk[: size - written]
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            written += len(part)
        sock.settimeout(5)
        received = b""
        try:
            while len(received) < 4:
                data = sock.recv(4096)
                if not data:
                    break
                received += data
        except (ConnectionResetError, TimeoutError):
            pass
        code = struct.unpack("!H", received[2:4])[0] if len(received) >= 4 and received[0] == 0x88 else None
        return Refusal(written, code, time.monotonic() - started)
    finally:
        sock.close()


@dataclass
class MediaArrivals:
    """When each message carrying agent audio arrived at the simulated carrier (set as its ``on_message``)."""

    marker: str = '"event":"media"'
    at_s: list[float] = field(default_factory=list)

    def __call__(self, message: str | bytes) -> None:
        if isinstance(message, bytes) or self.marker in message:
            self.at_s.append(time.monotonic())

    def largest_gap_ms(self, pause_ms: float = 500.0) -> float:
        """The longest wait between two pieces of one reply's audio (waits over ``pause_ms`` are the pauses
        between replies, not gaps)."""
        gaps = [(b - a) * 1000 for a, b in zip(self.at_s, self.at_s[1:], strict=False) if (b - a) * 1000 <= pause_ms]
        return max(gaps, default=0.0)


class RtpArrivals(asyncio.DatagramProtocol):
    """A SIP phone's RTP socket: when each packet from the bridge arrived (its media's largest gap, under attack)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.at.append(time.monotonic())

    def largest_gap_ms(self, start: float, end: float) -> float:
        """The longest wait between two packets that arrived from ``start`` to ``end`` (monotonic s); inf: fewer than two."""
        inside = [t for t in self.at if start <= t <= end]
        return max((b - a for a, b in zip(inside, inside[1:], strict=False)), default=float("inf")) * 1000


TLS_HELLO_START: Final = bytes.fromhex("160301020001") + b"\x00\x01\xfc\x03\x03"
"""A TLS record header announcing a 512-byte ClientHello, and its first bytes: the rest never comes."""


async def stalled_tls_handshake(port: int, hello: bytes) -> float:
    """A client that connects to 127.0.0.1:``port``, sends ``hello`` (``TLS_HELLO_START``, or nothing) and never goes
    on; when the server closed it (monotonic s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(hello)
    try:
        while await asyncio.wait_for(reader.read(65536), 30):
            pass
    except ConnectionError:
        pass
    finally:
        writer.close()
    return time.monotonic()


def post_head(port: int, path: str, headers: dict[str, str]) -> socket.socket:
    """A raw TCP socket to 127.0.0.1:``port`` with a POST's request head sent (its body left to the caller)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def status_of(sock: socket.socket, timeout_s: float = 5.0) -> int | None:
    """The status code of the response on ``sock`` (None: closed, or nothing within ``timeout_s``)."""
    sock.settimeout(timeout_s)
    head = b""
    try:
        while b"\r\n" not in head:
            data = sock.recv(4096)
            if not data:
                return None
            head += data
    except (ConnectionResetError, TimeoutError):
        return None
    return int(head.split(b" ", 2)[1])


def oversized_body(port: int, path: str, size: int, *, chunked: bool) -> tuple[int | None, int]:
    """A POST of ``size`` bytes to ``path``, its body sent 64 KiB at a time; after each piece, a look for the
    server's answer. Returns (its status, body bytes written before it came). ``chunked``: no length declared."""
    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(size)}
    sock = post_head(port, path, {"Content-Type": "application/json", **framing})
    written = 0
    piece = bytes(64 * 1024)
    try:
        status = status_of(sock, 0.05)
        while status is None and written < size:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            written += len(piece)
            status = status_of(sock, 0.005)
        return (status if status is not None else status_of(sock)), written
    finally:
        sock.close()


def slow_head(port: int, source: str = "127.0.0.2") -> socket.socket:
    """A connection from ``source`` (any 127/8 address is this host) that begins a request head and sends no
    more of it (slowloris); the caller may trickle header lines."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
    return sock


def how_they_end(socks: list[socket.socket], opened: float, within_s: float) -> list[tuple[int | None, float]]:
    """How each connection ended: the status the server answered (None: closed without one), and when, in seconds
    after ``opened``; watched together (a selector), so each end is timed as it comes."""
    ends: dict[socket.socket, tuple[int | None, float]] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while len(ends) < len(socks) and time.monotonic() - opened < within_s:
            for key, _ in selector.select(timeout=0.1):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                ends[ready] = (status_of(ready, 1.0), time.monotonic() - opened)
                selector.unregister(ready)
    for sock in socks:
        sock.close()
    return [ends.get(sock, (None, float("inf"))) for sock in socks]


def options_flood(target: tuple[str, int], rate_per_s: int, seconds: float, source: str = "127.0.0.2") -> tuple[int, int]:
    """SIP OPTIONS from ``source`` to ``target`` over UDP at ``rate_per_s`` for ``seconds`` (each its own
    transaction: a fresh Call-ID and branch, so none is a retransmission), sent in 10 ms batches; (sent, answered).
    Blocking: run it in a process of its own, so the sender's own work does not slow the one measuring."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((source, 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    sent = answered = 0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        for _ in range(int(elapsed * rate_per_s) - sent):
            tag = os.urandom(6).hex()
            request = (
                f"OPTIONS sip:{target[0]}:{target[1]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP {source}:{port};branch=z9hG4bK{tag}\r\nMax-Forwards: 70\r\n"
                f"From: <sip:flood@{source}>;tag={tag}\r\nTo: <sip:{target[0]}>\r\nCall-ID: {tag}@{source}\r\n"
                "CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
            )
            try:
                sock.sendto(request.encode(), target)
            except BlockingIOError:
                pass
            sent += 1
        while True:
            try:
                sock.recv(65536)
            except BlockingIOError:
                break
            answered += 1
        time.sleep(0.01)
    # the last answers: for 1 s, and on while they keep coming (a loaded bridge reads its backlog late) until 0.5 s
    # pass without one, 10 s at most
    now = time.monotonic()
    quiet_from, deadline, last = now + 1.0, now + 10.0, now
    while (now := time.monotonic()) < deadline and (now < quiet_from or now - last < 0.5):
        try:
            sock.recv(65536)
            answered += 1
            last = now
        except BlockingIOError:
            time.sleep(0.01)
    sock.close()
    return sent, answered


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end has closed ``sock`` (or reset it) by now, without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
