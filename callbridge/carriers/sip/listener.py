"""The SIP trunk listener: the asyncio driver of ``SipUas`` (UDP and TCP on the same port) and of one RTP
socket (and its RTCP socket) per call.

Each answered call is served by the shared ``MediaStreamDriver`` over an
``RtpTransport`` (a ``CarrierTransport``) with the ``SipRtpCodec``: the SIP
layer's news reaches the codec as text messages (``start`` once the 200 OK
is out, ``bye`` when the dialog ends, ``dtmf:<d>`` from SIP INFO); closing
the transport (the engine or the bridge ended the call) sends our BYE.

The agent's actions (``CallActionPerformer``): ``send_dtmf`` plays an RFC
4733 digit train on the call's RTP stream (no audio meanwhile; the media
clock moves on with it); ``transfer_call`` sends REFER in the dialog and
waits for the NOTIFY that reports the target's answer. A transfer that
succeeded ends the call with our BYE (the call core closes the transport).

Admission: the source address in ``sip.allowed_ips`` or digest credentials
(``SipUas``), then ``services.admits`` (486 at capacity, 503 while
draining), then a free even RTP port in ``sip.rtp_port_min``–``max`` (503
when none). Garbage datagrams, RTP from a source other than the latched
peer, and SIP messages that cannot be answered are dropped and counted
(``dropped``), logged at debug level; no call but the addressed one is ever
touched.

Registrations (``sip.registrations``, ``registrar_client``): our REGISTERs
leave from this listener's socket (or a TCP connection it reads like an
accepted one); the responses to them are taken before the UAS sees them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self, cast

from prometheus_client import Counter as PromCounter

from callbridge.application import CallContext
from callbridge.application.context import call_context
from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf
from callbridge.bridge.call_setup import TransferTo
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_transport import receive_within
from callbridge.bridge.media import MediaStreamDriver
from callbridge.bridge.services import BridgeServices
from callbridge.carriers.sip.registrar import RegistrationClients
from callbridge.carriers.sip.wire import PROVIDER, SipRtpCodec
from callbridge.logging import get_logger
from callbridge.sip import rtcp
from callbridge.sip.dialog import (
    CallConfirmed,
    CallEnded,
    CallOffered,
    DialogState,
    Dropped,
    DtmfInfo,
    MediaChanged,
    OfferAnswered,
    SipUas,
    TransferResult,
    UasConfig,
)
from callbridge.sip.dtmf import dtmf_train
from callbridge.sip.message import SipParseError, split_stream
from callbridge.sip.rtp import Latch
from callbridge.sip.sdp import MediaChoice
from callbridge.sip.transaction import Outgoing

__all__ = ["CARRIER", "RtpTransport", "SipListener"]

log = get_logger(__name__)

_MAX_QUEUED: Final = 500
"""Datagrams one call may have waiting (10 s of 20 ms packets); beyond: dropped and counted."""
_CADENCE_S: Final = 0.02
_SHUTDOWN_WAIT_S: Final = 5.0
_FINISHED_KEPT: Final = 256
_TCP_READ_BYTES: Final = 64 * 1024
_TCP_CONNECT_S: Final = 5.0


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RtpTransport(asyncio.DatagramProtocol):
    """One call's RTP socket as a ``CarrierTransport`` (see the module docstring). Between the agent's
    utterances it keeps the 20 ms cadence with silence."""

    def __init__(self, listener: SipListener, call_id: str, codec: SipRtpCodec, sip_peer_host: str) -> None:
        self.listener = listener
        self.call_id = call_id
        self.codec = codec
        signalled = (codec.choice.remote_host, codec.choice.remote_port)
        self.latch = Latch(signalled, frozenset({signalled[0], sip_peer_host}))
        self.queue: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None
        self.closed = False
        self.overflow = 0
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
        self.rtcp = _RtcpProtocol()
        self.cname = f"callbridge-{secrets.token_hex(4)}@{listener.address}"

    # DatagramProtocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.closed:
            return
        if not self.latch.admit((str(addr[0]), int(addr[1]))):
            self.listener.dropped["rtp_unexpected_source"] += 1
            return
        if self.queue.qsize() >= _MAX_QUEUED:
            self.overflow += 1
            return
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
        self.transport.sendto(message, self.latch.peer)
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

    # the SIP layer
    def answered(self, codec: SipRtpCodec) -> None:
        """A delayed offer's answer came (before ``start``): its codec, and the latch aimed where it says."""
        self.codec = codec
        signalled = (codec.choice.remote_host, codec.choice.remote_port)
        self.latch = Latch(signalled, self.latch.trusted_hosts | {signalled[0]})

    def start(self) -> None:
        self.queue.put_nowait("start")
        self._cadence = asyncio.create_task(self._keep_cadence())
        self._rtcp_task = asyncio.create_task(self._report())

    def signal(self, message: str) -> None:
        if not self.closed:
            self.queue.put_nowait(message)

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
            transport = self.transport
            if transport is not None and (packet := self.codec.silence()) is not None:
                try:
                    transport.sendto(packet, self.latch.peer)
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
            schedule, total_ms = dtmf_train(codec.sender, payload_type, digits)
            for due_ms, packet in schedule:
                await asyncio.sleep(max(0.0, started + due_ms / 1000 - loop.time()))
                if self.closed or self.transport is None:
                    return False
                try:
                    self.transport.sendto(packet, self.latch.peer)
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
                received=self.codec.reception(),
            )
            self.rtcp.send(packet, self._rtcp_peer())


class _RtcpProtocol(asyncio.DatagramProtocol):
    """A call's RTCP socket (RTP port + 1): sends our reports, counts the peer's."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.source: tuple[str, int] | None = None
        self.received = 0
        self.malformed = 0
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            rtcp.parse_rtcp(data)
        except rtcp.RtcpError:
            self.malformed += 1
            return
        self.received += 1
        if self.source is None:
            self.source = (str(addr[0]), int(addr[1]))

    def error_received(self, exc: Exception) -> None:
        pass  # nobody listens on the peer's RTCP port: many trunks ignore RTCP

    def send(self, packet: bytes, address: tuple[str, int]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            with suppress(OSError):
                self.transport.sendto(packet, address)
                self.sent += 1

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _DropCounter(Counter[str]):
    """The listener's ``dropped`` counts, each increase also counted in a Prometheus counter labelled by reason
    (the reasons are a small fixed set: parse-error kinds, ``stray_response``, ``rtp_unexpected_source`` …)."""

    def __init__(self, metric: PromCounter) -> None:
        super().__init__()
        self._metric = metric

    def __setitem__(self, reason: str, count: int) -> None:
        increase = count - self.get(reason, 0)
        super().__setitem__(reason, count)
        if increase > 0:
            self._metric.labels(reason).inc(increase)


@dataclass(slots=True)
class _Call:
    transport: RtpTransport
    task: asyncio.Task[None] | None = None


def _size_receive_buffer(sock: socket.socket, wanted: int) -> None:
    """``SO_RCVBUF`` to ``wanted`` bytes (``SO_RCVBUFFORCE`` first: past ``net.core.rmem_max`` where the process
    may); logs what it got, and how to get more when the kernel capped it."""
    for option in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
        if option is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, wanted)
            break
        except OSError:  # not permitted (no CAP_NET_ADMIN): the plain option, capped by the kernel
            continue
    got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if sys.platform == "linux":
        got //= 2  # Linux books twice what was asked (its overhead) and reports that
    if got < wanted:
        log.warning("sip_receive_buffer_capped", wanted=wanted, got=got, detail="raise net.core.rmem_max to allow it")
    else:
        log.info("sip_receive_buffer", bytes=got)


class _SipProtocol(asyncio.DatagramProtocol):
    def __init__(self, listener: SipListener) -> None:
        self.listener = listener

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.listener.datagram_received(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        self.listener.dropped["send_error"] += 1


class SipListener(AbstractAsyncContextManager["SipListener"]):
    """The SIP UDP listener for the life of the app (nothing when ``sip.enabled`` is off)."""

    def __init__(self, services: BridgeServices) -> None:
        self.services = services
        self.settings = services.settings.sip
        settings = self.settings
        self.address = settings.public_address or settings.host
        self.uas = SipUas(
            UasConfig(
                host=self.address,
                port=settings.port,
                allowed_networks=tuple(ipaddress.ip_network(s, strict=False) for s in settings.allowed_ips),
                username=settings.username,
                password=settings.password.get_secret_value() if settings.password is not None else None,
                realm=settings.realm,
                source_requests_per_s=settings.source_requests_per_s,
                requests_per_s=settings.requests_per_s,
            )
        )
        self.registrations = RegistrationClients(
            settings.registrations, services.metrics, self._send_registration, lambda: services.draining
        )
        """Our REGISTERs (``sip.registrations``), sent from this listener's UDP socket (or over TCP connections it
        reads like the ones it accepts)."""
        self.calls: dict[str, _Call] = {}
        self.finished: deque[tuple[str, SipRtpCodec, RtpTransport]] = deque(maxlen=_FINISHED_KEPT)
        """The last calls served (call id, codec, transport): their counters, for metrics and tests."""
        self.dropped: Counter[str] = _DropCounter(services.metrics.sip_dropped)
        """What was dropped unanswered, by reason (also ``callbridge_sip_dropped_total``)."""
        self._transport: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tcp_writers: dict[tuple[str, int], asyncio.StreamWriter] = {}
        self._outbound_tcp: set[asyncio.Task[None]] = set()
        """Connections we opened to a registrar (``sip.registrations`` over TCP), read like accepted ones."""
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._timer_due_ms: int | None = None
        """When the timer task wakes next (the UAS's deadline when it went to sleep); None: not until woken."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._transfers: dict[str, asyncio.Future[TransferResult]] = {}
        self._answers: dict[str, asyncio.Future[MediaChoice | None]] = {}
        """Calls with a delayed offer, waiting for the answer in the ACK (None: the call ended without one)."""
        """call id → our REFER's outcome, awaited by ``perform``."""

    @property
    def port(self) -> int | None:
        if self._transport is None:
            return None
        port: int = self._transport.get_extra_info("sockname")[1]
        return port

    async def __aenter__(self) -> Self:
        if not self.settings.enabled:
            log.info("carrier_not_configured", provider=PROVIDER, detail="sip.enabled is false: no SIP listener")
            return self
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _SipProtocol(self), local_addr=(self.settings.host, self.settings.port)
        )
        _size_receive_buffer(self._transport.get_extra_info("socket"), self.settings.receive_buffer_bytes)
        self._tcp = await asyncio.start_server(self._tcp_connection, self.settings.host, self.port)
        self._timer = asyncio.create_task(self._run_timers())
        self.registrations.start(self.address, self.port or self.settings.port)
        self.services.carrier_state[PROVIDER] = self
        self.services.action_performers[PROVIDER] = self
        log.info("sip_listening", host=self.settings.host, port=self.port, transports="udp,tcp", allowed_ips=self.settings.allowed_ips)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._transport is None:
            return
        await self.registrations.stop()  # Expires: 0 first: the registrar stops sending calls here
        for call in list(self.calls.values()):
            await call.transport.close()  # our BYE; the driver closes the engine session
        tasks = {c.task for c in self.calls.values() if c.task is not None} | self._tasks
        if tasks:
            await asyncio.wait(tasks, timeout=_SHUTDOWN_WAIT_S)
        for task in tasks:
            task.cancel()
        if self._timer is not None:
            self._timer.cancel()
            with suppress(asyncio.CancelledError):
                await self._timer
        self._transport.close()
        self._transport = None
        if self._tcp is not None:
            self._tcp.close()
            for writer in list(self._tcp_writers.values()):
                writer.close()
            for task in list(self._outbound_tcp):
                task.cancel()
            with suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._tcp.wait_closed()
            self._tcp = None
        log.info("sip_stopped", dropped=dict(self.dropped))

    # ------------------------------------------------------------------ SIP

    def datagram_received(self, data: bytes, source: tuple[str, int]) -> None:
        if self.registrations.receive(data):
            return
        self.uas.receive_datagram(data, source, _now_ms())
        self._drain()

    def _send_registration(self, out: Outgoing) -> None:
        """A REGISTER: over UDP from our socket; over TCP on the connection to the registrar, opened when there is
        none (then read like an accepted one: the registrar may send its INVITEs on it)."""
        if out.transport == "TCP":
            writer = self._tcp_writers.get(out.address)
            if writer is not None and not writer.is_closing():
                writer.write(out.data)
            else:
                task = asyncio.create_task(self._connect_and_send(out))
                self._outbound_tcp.add(task)  # not in ``_tasks``: shutdown does not wait for its connection
                task.add_done_callback(self._outbound_tcp.discard)
        elif self._transport is not None:
            try:
                self._transport.sendto(out.data, out.address)
            except (OSError, OverflowError):  # the REGISTER is retransmitted, then counted as a timeout
                self.dropped["send_failed"] += 1

    async def _connect_and_send(self, out: Outgoing) -> None:
        try:
            async with asyncio.timeout(_TCP_CONNECT_S):
                reader, writer = await asyncio.open_connection(*out.address)
        except (OSError, TimeoutError):  # the REGISTER times out: a failure, retried after the backoff
            self.dropped["tcp_connect_failed"] += 1
            return
        self._tcp_writers[out.address] = writer
        writer.write(out.data)
        await self._tcp_connection(reader, writer)

    def _drain(self, *, wake_timer: bool = True) -> None:
        """Send what the UAS produced and act on its events; the timer task then sees the new deadline."""
        transport = self._transport
        for out in self.uas.datagrams_to_send():
            if out.transport == "TCP":
                writer = self._tcp_writers.get(out.address)
                if writer is None or writer.is_closing():
                    self.dropped["tcp_connection_gone"] += 1
                else:
                    writer.write(out.data)
            elif transport is not None:
                try:
                    transport.sendto(out.data, out.address)
                except (OSError, OverflowError):  # an address no socket takes: that message alone is lost
                    self.dropped["send_failed"] += 1
        for event in self.uas.events():
            match event:
                case CallOffered():
                    self._spawn(self._offer(event))
                case OfferAnswered(call_id, choice):
                    answered = self._answers.pop(call_id, None)
                    if answered is not None and not answered.done():
                        answered.set_result(choice)
                case CallEnded(call_id, reason):
                    call = self.calls.get(call_id)
                    log.info("sip_call_ended", provider=PROVIDER, call_id=call_id, reason=reason)
                    unanswered = self._answers.pop(call_id, None)
                    if unanswered is not None and not unanswered.done():
                        unanswered.set_result(None)
                    if call is not None and reason != "hung_up":
                        call.transport.signal("bye")
                case MediaChanged(call_id, choice):
                    call = self.calls.get(call_id)
                    if call is not None:
                        call.transport.codec.update(choice)
                        call.transport.latch.reoffer((choice.remote_host, choice.remote_port))
                        log.info("sip_media_changed", provider=PROVIDER, call_id=call_id, direction=choice.direction.value)
                case TransferResult(call_id):
                    waiting = self._transfers.get(call_id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(event)
                case DtmfInfo(call_id, digit):
                    call = self.calls.get(call_id)
                    if call is not None:
                        call.transport.signal(f"dtmf:{digit}")
                case Dropped(reason, source):
                    self.dropped[reason] += 1
                    log.debug("sip_dropped", provider=PROVIDER, reason=reason, peer=source[0])
                case CallConfirmed():
                    pass
        if wake_timer:  # only when something is due sooner than the timer sleeps for (not for every datagram)
            due = self.uas.next_deadline_ms()
            if due is not None and (self._timer_due_ms is None or due < self._timer_due_ms):
                self._wake.set()

    async def _tcp_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection: messages cut from the stream go to the UAS; its responses come back on it."""
        peer = writer.get_extra_info("peername")
        address = (str(peer[0]), int(peer[1]))
        self._tcp_writers[address] = writer
        buffer = b""
        try:
            while True:
                try:
                    chunk = await reader.read(_TCP_READ_BYTES)
                except OSError:
                    break
                if not chunk:
                    break
                try:
                    messages, buffer = split_stream(buffer + chunk)
                except SipParseError as exc:  # the stream cannot be re-synchronised: only this connection ends
                    self.dropped[f"tcp_malformed:{exc.reason.value}"] += 1
                    log.info("sip_tcp_closed", provider=PROVIDER, peer=address[0], reason=exc.reason.value)
                    break
                for message in messages:
                    if self.registrations.receive(message):
                        continue
                    self.uas.receive_datagram(message, address, _now_ms(), transport="TCP")
                    self._drain()
        finally:
            if self._tcp_writers.get(address) is writer:
                del self._tcp_writers[address]
            writer.close()

    async def _run_timers(self) -> None:
        while True:
            deadline = self._timer_due_ms = self.uas.next_deadline_ms()
            timeout = None if deadline is None else max(0.0, (deadline - _now_ms()) / 1000)
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            self.uas.tick(_now_ms())
            self._drain(wake_timer=False)

    # ---------------------------------------------------------------- calls

    async def _offer(self, offer: CallOffered) -> None:
        call_id = offer.call_id
        if not await self.services.admits(call_id):
            draining = self.services.draining
            self._refuse("draining" if draining else "capacity", call_id, offer.source[0])
            self.uas.reject(call_id, 503 if draining else 486, _now_ms())
            self._drain()
            return
        if self.services.assistants is not None:  # the application chooses the call's assistant, or refuses it
            chosen = await self.services.choose_assistant(sip_context(offer, self.services.settings.app.context_parameters))
            if isinstance(chosen, TransferTo):  # sent on: 302 Moved Temporarily, the target as the Contact
                self.services.not_answered_by_application(call_id, "sip", chosen)
                self.uas.reject(call_id, 302, _now_ms(), redirect_to=chosen.target)
                self._drain()
                return
            if isinstance(chosen, str):
                self.services.give_back_admission(call_id)
                self._refuse("application_rejected", call_id, offer.source[0])
                self.uas.reject(call_id, 486 if chosen == "busy" else 603, _now_ms())  # busy here / decline
                self._drain()
                return
        if self.settings.answer_delay_ms:
            self.uas.ring(call_id, _now_ms())
            self._drain()
            await asyncio.sleep(self.settings.answer_delay_ms / 1000)
            dialog = self.uas.dialogs.get(call_id)
            if dialog is None or dialog.state is not DialogState.OFFERED:  # cancelled while ringing
                return
        codec = SipRtpCodec(call_id, offer.choice, caller=offer.caller, callee=offer.callee)
        transport = RtpTransport(self, call_id, codec, offer.source[0])
        port = await self._bind_rtp(transport)
        dialog = self.uas.dialogs.get(call_id)
        if dialog is None or dialog.state is not DialogState.OFFERED:  # cancelled meanwhile
            if transport.transport is not None:
                transport.transport.close()
            transport.rtcp.close()
            return
        if port is None:
            self._refuse("no_rtp_port", call_id, offer.source[0])
            self.uas.reject(call_id, 503, _now_ms())
            self._drain()
            return
        call = _Call(transport)
        self.calls[call_id] = call
        answer: asyncio.Future[MediaChoice | None] | None = None
        if offer.delayed_offer:
            answer = self._answers[call_id] = asyncio.get_running_loop().create_future()
        self.uas.accept(call_id, self.address, port, _now_ms())
        self._drain()
        if answer is not None:  # our offer went in the 200; the answer comes in the ACK (or the call ends)
            choice = await answer
            if choice is None:
                await transport.close()
                if self.calls.get(call_id) is call:
                    del self.calls[call_id]
                return
            codec = SipRtpCodec(call_id, choice, caller=offer.caller, callee=offer.callee)
            transport.answered(codec)
        choice = codec.choice
        log.info("sip_call_answered", provider=PROVIDER, call_id=call_id, peer=offer.source[0], rtp_port=port,
                 codec=choice.encoding.value, remote_rtp=f"{choice.remote_host}:{choice.remote_port}", delayed_offer=offer.delayed_offer)
        transport.start()
        call.task = asyncio.current_task()
        try:
            await MediaStreamDriver(transport, codec, self.services, check_token=False).run()
        finally:
            await transport.close()
            if self.calls.get(call_id) is call:
                del self.calls[call_id]
            self.finished.append((call_id, codec, transport))
            for reason, count in (
                ("rtp_malformed", codec.malformed), ("rtp_late", codec.jitter.late), ("rtp_overflow", transport.overflow),
                ("rtp_other_payload_type", codec.other_payload_types), ("rtp_dtmf_malformed", codec.dtmf.malformed),
            ):  # fmt: skip
                if count:
                    self.dropped[reason] += count

    async def _bind_rtp(self, transport: RtpTransport) -> int | None:
        """Bind ``transport`` to a free even port of the range and its RTCP to the next (a random start spreads
        the calls)."""
        low, high = self.settings.rtp_port_min + (self.settings.rtp_port_min % 2), self.settings.rtp_port_max - 1
        ports = list(range(low, high + 1, 2))
        start = secrets.randbelow(len(ports))
        loop = asyncio.get_running_loop()
        for port in ports[start:] + ports[:start]:
            try:
                rtp_socket, _ = await loop.create_datagram_endpoint(lambda: transport, local_addr=(self.settings.host, port))
            except OSError:
                continue
            try:
                await loop.create_datagram_endpoint(lambda: transport.rtcp, local_addr=(self.settings.host, port + 1))
            except OSError:
                rtp_socket.close()
                continue
            return port
        return None

    async def perform(self, call_id: str, account_id: str | None, action: CarrierCallAction) -> ActionResult:
        """The agent's DTMF (RFC 4733 on the call's RTP) or transfer (REFER) on a call served here."""
        call = self.calls.get(call_id)
        if call is None:
            return ActionResult.failed("call_ended")
        if isinstance(action, SendDtmf):
            if call.transport.codec.choice.dtmf_payload_type is None:
                return ActionResult.failed("unsupported", "the trunk did not negotiate telephone-event (RFC 4733)")
            if not await call.transport.play_dtmf(action.digits):
                return ActionResult.failed("not_sent", "the call is on hold, ended, or already sending digits")
            return ActionResult.done()
        waiting: asyncio.Future[TransferResult] = asyncio.get_running_loop().create_future()
        self._transfers[call_id] = waiting
        try:
            self.uas.transfer(call_id, action.target, _now_ms())
            self._drain()
            result = await waiting
        finally:
            self._transfers.pop(call_id, None)
        log.info("sip_transfer", provider=PROVIDER, call_id=call_id, ok=result.ok, status=result.status, reason=result.reason)
        detail = f"{result.status} {result.reason}".strip() if result.status else result.reason
        return ActionResult.done(detail=detail) if result.ok else ActionResult.failed("transfer_failed", detail)

    def call_closed(self, call_id: str) -> None:
        """The call's transport closed (the engine or the bridge ended it): BYE unless the dialog is over."""
        self.uas.hang_up(call_id, _now_ms())
        self._drain()

    def _refuse(self, reason: str, call_id: str, peer: str) -> None:
        self.services.metrics.stream_refused.labels(PROVIDER, reason).inc()
        log.warning("stream_refused", provider=PROVIDER, reason=reason, call_id=call_id, peer=peer)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


CARRIER = Carrier(name=PROVIDER, listener=SipListener)


def sip_context(offer: CallOffered, allowed: list[str]) -> CallContext:
    """The call as its INVITE describes it: From's user (and display name), To's user, its ``X-`` headers."""
    return call_context(
        call_id=offer.call_id, carrier=PROVIDER, caller=offer.caller, called=offer.callee, caller_name=offer.caller_name,
        parameters=offer.extension_headers, allowed=allowed,
    )
