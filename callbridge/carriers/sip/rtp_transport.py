"""One SIP call's RTP socket (and its RTCP socket) as a ``CarrierTransport`` for the shared ``MediaStreamDriver``
(``carriers/sip/listener.py`` makes one per answered call): datagrams in through the peer's latch, the agent's
packets out, the 20 ms cadence kept with silence between its utterances, RFC 4733 digits, RTCP reports, and the
SIP layer's news (``start``, ``bye``, ``dtmf:<d>``) as text messages for the codec. Where the call's media is SRTP
(``MediaChoice.srtp``), every packet out is protected and every packet in unprotected here, RTCP too; one that fails
its check is dropped (``srtp_refused``) before it can latch the peer's address.

The BYE comes on the SIP socket, the media before it on the RTP socket, and after a stall (the process descheduled,
a long collection) both wait in the kernel: asyncio reads a datagram socket one datagram per turn of the loop, so the
BYE, read in the first turn, would end the stream with the caller's last packets (their last words, a digit's end
packet) still unread. ``signal("bye")`` first reads what waits on the RTP socket (``read_waiting``)."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from typing import Final, Protocol, cast

from callbridge.application.events import MediaQuality
from callbridge.bridge.carrier_transport import receive_within
from callbridge.carriers.sip.line_quality import LineQuality
from callbridge.carriers.sip.settings import SipSettings
from callbridge.carriers.sip.wire import PROVIDER, SipRtpCodec
from callbridge.logging import get_logger
from callbridge.sip import rtcp
from callbridge.sip.dtmf import dtmf_train
from callbridge.sip.rtp import Latch
from callbridge.sip.srtp import SrtpKeys, SrtpSession

__all__ = ["RtpOwner", "RtpTransport"]

log = get_logger(__name__)

_MAX_QUEUED: Final = 500
"""Datagrams one call may have waiting (10 s of 20 ms packets); beyond: dropped and counted."""
_DATAGRAM_BYTES: Final = 2048
"""More than any RTP packet a trunk sends (a 20 ms G.711 or G.722 packet is 172 bytes; SRTP adds 10 to 14)."""
_CADENCE_S: Final = 0.02


class RtpOwner(Protocol):
    """What a call's RTP socket needs of the listener that made it."""

    @property
    def address(self) -> str:
        """Our address (the RTCP CNAME's host)."""

    @property
    def dropped(self) -> Counter[str]:
        """Datagrams dropped, by reason."""

    @property
    def settings(self) -> SipSettings:
        """``sip``: its ``rtp_timeout_s`` (no RTP from a peer that should send it this long: the call is over; 0:
        never) and ``quality_floor_mos`` (a call whose MOS estimate falls below it is logged, once)."""

    def call_closed(self, call_id: str) -> None: ...


class RtpTransport(asyncio.DatagramProtocol):
    """One call's RTP socket as a ``CarrierTransport`` (see the module docstring). Between the agent's
    utterances it keeps the 20 ms cadence with silence."""

    def __init__(self, listener: RtpOwner, call_id: str, codec: SipRtpCodec, sip_peer_host: str) -> None:
        self.listener = listener
        self.call_id = call_id
        self.codec = codec
        signalled = (codec.choice.remote_host, codec.choice.remote_port)
        self.latch = Latch(signalled, frozenset({signalled[0], sip_peer_host}))
        self.queue: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None
        self.rtp_socket: socket.socket | None = None
        """The RTP socket itself (``listener.bind_rtp`` makes it), read at once at the BYE."""
        self.closed = False
        self.overflow = 0
        self.ringing = False
        """A call we place (``sip/dialing.py``), until its answer (``answered``): RTP before it is not read."""
        self.early_media = 0
        self.send_errors = 0
        self.timed_out = False
        self._last_sent_s = 0.0
        self._playout_end_s = 0.0
        """When the far end has played what was sent (loop time): each audio packet is 20 ms more, from when it was
        sent or from the end of what came before it, whichever is later."""
        self._silence_last = False
        """The last packet sent was the cadence's silence (not the agent's audio, nor DTMF)."""
        self._cadence: asyncio.Task[None] | None = None
        self._rtcp_task: asyncio.Task[None] | None = None
        self.rtcp = _RtcpProtocol(self._peer_reports)
        self.cname = f"callbridge-{secrets.token_hex(4)}@{listener.address}"
        self._srtp: SrtpSession | None = None
        self.quality = LineQuality(codec.choice.clock_hz)
        """The line's jitter, loss and round trip (the report's ``media``); made again at ``start`` (the codec's clock
        is the answer's)."""
        self.quality_warned = False

    @property
    def srtp(self) -> SrtpSession | None:
        """The call's SRTP contexts, for the keys its media choice holds now (a re-INVITE may change them). Read for
        every packet: unchanged keys (the same object) cost one comparison."""
        keys: SrtpKeys | None = self.codec.choice.srtp
        current = self._srtp
        if keys is None if current is None else current.keys is keys:
            return current
        if keys is None:
            self._srtp = None
        elif self._srtp is None:
            self._srtp = SrtpSession(keys)
        elif self._srtp.keys != keys:
            self._srtp.follow(keys)  # a re-INVITE keeps our key (``sdp.choose``'s ``local_key``) and our suite
        self.rtcp.srtp = self._srtp
        return self._srtp

    def _send_rtp(self, packet: bytes) -> None:
        """One RTP packet to the peer, protected where the media is SRTP. Raises ``OSError``."""
        assert self.transport is not None
        srtp = self.srtp
        self.transport.sendto(srtp.protect(packet) if srtp is not None else packet, self.latch.peer)

    # DatagramProtocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.closed:
            return
        if self.ringing:  # a call we place, not answered yet: its early media (ringback, an announcement) is no one's
            self.early_media += 1
            return
        if (srtp := self.srtp) is not None:
            plain = srtp.unprotect(data)
            if plain is None:  # forged, replayed or corrupt: not the peer's (and not to latch on)
                self.listener.dropped["srtp_refused"] += 1
                return
            data = plain
        if not self.latch.admit((str(addr[0]), int(addr[1]))):
            self.listener.dropped["rtp_unexpected_source"] += 1
            return
        if self.queue.qsize() >= _MAX_QUEUED:
            self.overflow += 1
            return
        if len(data) >= 12 and data[1] & 0x7F == self.codec.choice.payload_type:
            self.quality.media_arrived(data, time.monotonic())
        self.queue.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        self.send_errors += 1  # ICMP port unreachable and the like: the peer's problem, not the call's end

    # CarrierTransport
    async def receive(self) -> str | bytes | None:
        """The next datagram or SIP-layer message; ``bye`` when the peer has sent no RTP for
        ``sip.rtp_timeout_s`` while it should (a trunk gone without a BYE); None once closed."""
        timeout_s = self.listener.settings.rtp_timeout_s or None
        while not (self.closed and self.queue.empty()):
            try:
                return await receive_within(self.queue.get, timeout_s)
            except TimeoutError:
                if self.codec.started and self.codec.choice.direction.peer_sends:
                    self.timed_out = True
                    log.warning("sip_rtp_timeout", provider=PROVIDER, call_id=self.call_id, waited_s=timeout_s)
                    return "bye"
        return None

    async def send(self, message: str | bytes) -> None:
        if self.closed or self.transport is None:
            raise ConnectionError("RTP socket closed")
        if isinstance(message, str):
            raise TypeError("RTP carries bytes only")
        self._send_rtp(message)
        now = self._last_sent_s = asyncio.get_running_loop().time()
        self._playout_end_s = max(now, self._playout_end_s) + _CADENCE_S
        self._silence_last = False

    async def close(self, code: int = 1000) -> None:
        if self.closed:
            return
        self.closed = True
        self.listener.call_closed(self.call_id)
        for task in (self._cadence, self._rtcp_task):
            if task is not None:
                task.cancel()
        self.rtcp.send(rtcp.bye(self.codec.sender.ssrc, self.cname), self._rtcp_peer())
        self.rtcp.close()
        if self.transport is not None:
            self.transport.close()
        self.queue.put_nowait(None)

    def release(self) -> None:
        """Close the sockets of a call that never started (cancelled while it was set up, a dial not answered):
        no BYE, no RTCP BYE — there is no session to end."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self.rtcp.close()

    # the SIP layer
    def answered(self, codec: SipRtpCodec) -> None:
        """The answer came before ``start`` (a delayed offer's, in the ACK; a call we placed, its 2xx): its codec,
        and the latch aimed where it says."""
        self.ringing = False
        self.codec = codec
        signalled = (codec.choice.remote_host, codec.choice.remote_port)
        self.latch = Latch(signalled, self.latch.trusted_hosts | {signalled[0]})

    def start(self) -> None:
        _ = self.srtp  # the RTCP socket's too, before the peer's first report
        self.quality = LineQuality(self.codec.choice.clock_hz)
        self.queue.put_nowait("start")
        self._cadence = asyncio.create_task(self._keep_cadence())
        self._rtcp_task = asyncio.create_task(self._report())

    def signal(self, message: str) -> None:
        if not self.closed:
            if message == "bye":
                self.read_waiting()
            self.queue.put_nowait(message)

    def read_waiting(self) -> int:
        """Read now what waits on the RTP socket (see the module docstring), at most as much as the queue takes;
        how many datagrams."""
        sock, read = self.rtp_socket, 0
        while sock is not None and not self.closed and read < _MAX_QUEUED:
            try:
                data, address = sock.recvfrom(_DATAGRAM_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break  # the socket's own error (an ICMP report): the loop's reader sees it too
            read += 1
            self.datagram_received(data, address)
        return read

    async def _keep_cadence(self) -> None:
        """Silence between the agent's packets: after its last one, once the far end has played what was sent (and a
        packet and a half of nothing at the least: it may only be late) the first packet of silence, then one every
        20 ms on that one's grid until the agent's next. Not sooner: the agent's audio goes out up to the carrier's
        lead (60 ms) ahead, and silence sent behind it while that plays would keep the far end that much behind for
        good — every later reply heard that much later than sent, and than the playout ledger (the heard position
        of a barge-in, the recording) takes it to be: the far end holds at most one packet of silence when the
        agent speaks again."""
        loop = asyncio.get_running_loop()
        while not self.closed:
            now = loop.time()
            due = self._last_sent_s + _CADENCE_S if self._silence_last else max(self._last_sent_s + 1.5 * _CADENCE_S, self._playout_end_s)
            if now < due:
                await asyncio.sleep(due - now)
                continue  # the agent's audio may have been sent meanwhile: due again from it
            if self.transport is not None and (packet := self.codec.silence()) is not None:
                try:
                    self._send_rtp(packet)
                except OSError:
                    self.send_errors += 1
            # the grid kept while the loop is on time; after a stall (or before anything was sent), from now
            self._last_sent_s = due if now - due < _CADENCE_S else now
            self._playout_end_s = max(self._last_sent_s, self._playout_end_s) + _CADENCE_S
            self._silence_last = True

    async def play_dtmf(self, digits: str) -> bool:
        """Send ``digits`` as RFC 4733 events on this stream, paced on the loop's clock; audio (the agent's and
        the cadence's) is held back meanwhile. False, nothing sent, when telephone-event was not negotiated,
        the peer holds the call or the call ended."""
        codec = self.codec
        payload_type = codec.choice.dtmf_payload_type
        if payload_type is None or not codec.sending or codec.playing_events or self.transport is None:
            return False
        codec.playing_events = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            clocks = {"event_hz": codec.choice.dtmf_clock_hz, "media_hz": codec.choice.clock_hz}
            schedule, total_ms = dtmf_train(codec.sender, payload_type, digits, **clocks)
            for due_ms, packet in schedule:
                await asyncio.sleep(max(0.0, started + due_ms / 1000 - loop.time()))
                if self.closed or self.transport is None:
                    return False
                try:
                    self._send_rtp(packet)
                except OSError:
                    self.send_errors += 1
                self._last_sent_s = loop.time()
                self._silence_last = False
            await asyncio.sleep(max(0.0, started + total_ms / 1000 - loop.time()))
            return not self.closed
        finally:
            codec.playing_events = False

    def _rtcp_peer(self) -> tuple[str, int]:
        """Where our RTCP goes: where the peer's comes from, else its RTP port + 1 (RFC 3550 §11)."""
        host, port = self.latch.peer
        return self.rtcp.source or (host, port + 1)

    async def _report(self) -> None:
        while not self.closed:
            await asyncio.sleep(rtcp.next_interval_ms() / 1000)
            sender = self.codec.sender
            packet = rtcp.report(
                sender.ssrc,
                self.cname,
                unix_time_s=time.time(),
                rtp_timestamp=sender.timestamp,
                packets_sent=sender.packets_sent,
                octets_sent=sender.octets_sent,
                sending=self.codec.sending,
                received=self.quality.our_block(self.codec.reception(), time.time()),
            )
            self.rtcp.send(packet, self._rtcp_peer())
            self._check_quality()

    def media_quality(self) -> MediaQuality | None:
        """The call's codec, encryption and line figures (``bridge/carrier_transport.MeasuredTransport``); None for a
        call whose media never started."""
        if not self.codec.started:
            return None
        return self.quality.summary(self.codec, encrypted=self.codec.choice.srtp is not None)

    def _check_quality(self) -> None:
        """The first time the call's MOS estimate is below ``sip.quality_floor_mos``: a warning with the figures."""
        quality = self.media_quality()
        if quality is None or self.quality_warned or quality.mos >= self.listener.settings.quality_floor_mos:
            return
        self.quality_warned = True
        log.warning(
            "sip_call_quality_low", provider=PROVIDER, call_id=self.call_id, mos=quality.mos, floor=self.listener.settings.quality_floor_mos,
            loss_percent=quality.loss_percent, jitter_ms=quality.jitter_ms, round_trip_ms=quality.round_trip_ms, codec=quality.codec,
        )  # fmt: skip

    def _peer_reports(self, reports: list[rtcp.PeerReport]) -> None:
        self.quality.peer_reports(reports, self.codec.sender.ssrc, time.time())


class _RtcpProtocol(asyncio.DatagramProtocol):
    """A call's RTCP socket (RTP port + 1): sends our reports, counts the peer's."""

    def __init__(self, on_reports: Callable[[list[rtcp.PeerReport]], None]) -> None:
        self.on_reports = on_reports
        """Where the peer's SRs and RRs go (the call's ``LineQuality``)."""
        self.transport: asyncio.DatagramTransport | None = None
        self.srtp: SrtpSession | None = None
        """The call's SRTP, where its media is (SRTCP: reports protected out, unprotected in)."""
        self.source: tuple[str, int] | None = None
        self.received = 0
        self.malformed = 0
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.srtp is not None:
            plain = self.srtp.unprotect_rtcp(data)
            if plain is None:
                self.malformed += 1
                return
            data = plain
        try:
            rtcp.parse_rtcp(data)
        except rtcp.RtcpError:
            self.malformed += 1
            return
        self.received += 1
        self.on_reports(rtcp.read_reports(data))
        if self.source is None:
            self.source = (str(addr[0]), int(addr[1]))

    def error_received(self, exc: Exception) -> None:
        pass  # nobody listens on the peer's RTCP port: many trunks ignore RTCP

    def send(self, packet: bytes, address: tuple[str, int]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            with suppress(OSError):
                self.transport.sendto(self.srtp.protect_rtcp(packet) if self.srtp is not None else packet, address)
                self.sent += 1

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
