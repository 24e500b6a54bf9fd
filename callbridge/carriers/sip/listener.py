"""The SIP trunk listener: the asyncio driver of ``SipUas`` (UDP and TCP on the same port, TLS on ``sip.tls_port``
where a certificate is configured: ``tls.TlsAcceptor``) and of one RTP socket (and its RTCP socket) per call.

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
(``SipUas``), then ``services.desk.stream_refusal`` (486 at capacity, 503 while
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
from typing import Any, Final, Self

from prometheus_client import Counter as PromCounter

from callbridge.application import CallContext
from callbridge.application.context import call_context
from callbridge.bridge.actions import ActionResult, CarrierCallAction, SendDtmf
from callbridge.bridge.answer_desk import StreamRefusal
from callbridge.bridge.call_setup import TransferTo
from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.sip.dialing import SipDialing
from callbridge.carriers.sip.registrar import RegistrationClients
from callbridge.carriers.sip.rtp_transport import RtpTransport
from callbridge.carriers.sip.tls import TlsAcceptor, TlsCertificate, TlsPeer, client_context
from callbridge.carriers.sip.wire import PROVIDER, SipRtpCodec
from callbridge.logging import get_logger
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
from callbridge.sip.message import SipParseError, split_stream
from callbridge.sip.sdp import MediaChoice
from callbridge.sip.transaction import Outgoing
from callbridge.sources import source_allowed

__all__ = ["CARRIER", "RtpTransport", "SipListener"]

log = get_logger(__name__)

_SHUTDOWN_WAIT_S: Final = 5.0
_FINISHED_KEPT: Final = 256
_TCP_READ_BYTES: Final = 64 * 1024
_TCP_CONNECT_S: Final = 5.0


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


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

    def __init__(self, services: CarrierServices) -> None:
        self.services = services
        self.settings = services.settings.sip
        settings = self.settings
        self.address = settings.public_address or settings.host
        self.uas = SipUas(
            UasConfig(
                host=self.address,
                port=settings.port,
                tls_port=settings.tls_port if settings.tls else None,
                media_encryption=settings.media_encryption,
                codecs=settings.encodings,
                allowed_networks=tuple(ipaddress.ip_network(s, strict=False) for s in settings.allowed_ips),
                username=settings.username,
                password=settings.password.get_secret_value() if settings.password is not None else None,
                realm=settings.realm,
                source_requests_per_s=settings.source_requests_per_s,
                requests_per_s=settings.requests_per_s,
            )
        )
        self.tls_peers: dict[tuple[str, int], TlsPeer] = {}
        """Each address we open TLS to: the name its certificate must bear (what it was resolved from), its CAs."""
        self.registrations = RegistrationClients(
            settings.registrations, services.metrics, self.send_own, lambda: services.desk.draining, self.tls_peers
        )
        """Our REGISTERs (``sip.registrations``), sent from this listener's UDP socket (or over TCP connections it
        reads like the ones it accepts)."""
        self.dialing = SipDialing(self, settings.outbound, settings.port)
        """The calls the agent places through the trunk (``sip.outbound``)."""
        self.calls: dict[str, _Call] = {}
        self.finished: deque[tuple[str, SipRtpCodec, RtpTransport]] = deque(maxlen=_FINISHED_KEPT)
        """The last calls served (call id, codec, transport): their counters, for metrics and tests."""
        self.dropped: Counter[str] = _DropCounter(services.metrics.sip_dropped)
        """What was dropped unanswered, by reason (also ``callbridge_sip_dropped_total``)."""
        self._transport: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self.tls: TlsAcceptor | None = None
        """The TLS port (``sip.tls_certificate``), its connections served as TCP ones are."""
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
        self._tcp = await asyncio.start_server(self._stream_connection, self.settings.host, self.port)
        if self.settings.tls:
            self.tls = self._tls_acceptor()
            await self.tls.start(self.settings.host, self.settings.tls_port)
        self._timer = asyncio.create_task(self._run_timers())
        self.registrations.start(self.address, self.port or self.settings.port, self.tls.port if self.tls else None)
        self.dialing.started(self.port or self.settings.port, self.tls.port if self.tls else None)
        if self.services.dialer is not None:
            self.services.dialer.add(PROVIDER, self.dialing)
        self.services.carrier_state[PROVIDER] = self
        self.services.action_performers[PROVIDER] = self
        log.info(
            "sip_listening", host=self.settings.host, port=self.port, transports="udp,tcp,tls" if self.tls else "udp,tcp",
            tls_port=self.tls.port if self.tls else None, allowed_ips=self.settings.allowed_ips,
        )  # fmt: skip
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._transport is None:
            return
        await self.registrations.stop()  # Expires: 0 first: the registrar stops sending calls here
        self.dialing.stop()  # the calls we place that still ring: canceled
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
        if self.tls is not None:
            await self.tls.close()
            self.tls = None
        log.info("sip_stopped", dropped=dict(self.dropped))

    # ------------------------------------------------------------------ SIP

    def datagram_received(self, data: bytes, source: tuple[str, int]) -> None:
        if self.registrations.receive(data):
            return
        if not self.dialing.receive(data, source):
            self.uas.receive_datagram(data, source, _now_ms())
        self._drain()

    def flush(self) -> None:
        """Send what the SIP cores produced and act on their events (after an input from outside a datagram)."""
        self._drain()

    def send_own(self, out: Outgoing) -> None:
        """A request of our own that opens a conversation (a REGISTER, the INVITE of a call we place, its CANCEL and
        ACK): over UDP from our socket; over TCP on the connection to the registrar or trunk, opened when there is
        none (then read like an accepted one: the registrar may send its INVITEs on it, the trunk its responses)."""
        if out.transport in ("TCP", "TLS"):
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
        tls, peer = None, self.tls_peers.get(out.address, TlsPeer(out.address[0]))
        if out.transport == "TLS":  # the peer's certificate, checked against the name we resolved; ours where set
            settings = self.settings
            ours = (settings.tls_certificate, settings.tls_private_key) if settings.tls_certificate and settings.tls_private_key else None
            tls = client_context(peer.ca_file, ours)
        try:
            async with asyncio.timeout(_TCP_CONNECT_S):
                reader, writer = await asyncio.open_connection(*out.address, ssl=tls, server_hostname=peer.name if tls else None)
        except (OSError, TimeoutError) as exc:  # the REGISTER (or INVITE) times out: a failure, retried after the backoff
            self.dropped["tls_connect_failed" if tls else "tcp_connect_failed"] += 1
            if tls:
                log.warning("sip_tls_connect_failed", peer=out.address[0], name=peer.name, detail=repr(exc)[:300])
            return
        self._tcp_writers[out.address] = writer
        writer.write(out.data)
        await self._stream_connection(reader, writer, out.transport)

    def _drain(self, *, wake_timer: bool = True) -> None:
        """Send what the UAC and the UAS produced and act on their events; the timer task then sees the new
        deadline. The UAC's first: a call it placed may be handed to the UAS (and ended there at once)."""
        transport = self._transport
        for out in self.dialing.uac.datagrams_to_send():
            self.send_own(out)
        self.dialing.take_events()
        for out in self.uas.datagrams_to_send():
            if out.transport in ("TCP", "TLS"):
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
            due = self._next_deadline_ms()
            if due is not None and (self._timer_due_ms is None or due < self._timer_due_ms):
                self._wake.set()

    def _tls_acceptor(self) -> TlsAcceptor:
        """The TLS port's acceptor: a source may connect where it could place a call (in ``sip.allowed_ips``, or
        anywhere when digest credentials are configured)."""
        settings = self.settings
        assert settings.tls_certificate is not None and settings.tls_private_key is not None
        networks, digest = self.uas.config.allowed_networks, settings.username is not None
        return TlsAcceptor(
            TlsCertificate(settings.tls_certificate, settings.tls_private_key, settings.tls_client_ca_file),
            may_call=lambda host: digest or source_allowed(host, networks),
            serve=self._stream_connection, dropped=self.dropped,
            max_connections=settings.max_tls_connections, handshake_timeout_s=settings.tls_handshake_timeout_s,
        )  # fmt: skip

    async def _stream_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str = "TCP") -> None:
        """One TCP (or TLS) connection: messages cut from the stream go to the UAS; its responses come back on it."""
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
                    if not self.dialing.receive(message, address):
                        self.uas.receive_datagram(message, address, _now_ms(), transport=transport)
                    self._drain()
        finally:
            if self._tcp_writers.get(address) is writer:
                del self._tcp_writers[address]
            writer.close()

    async def _run_timers(self) -> None:
        while True:
            deadline = self._timer_due_ms = self._next_deadline_ms()
            timeout = None if deadline is None else max(0.0, (deadline - _now_ms()) / 1000)
            with suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            now = _now_ms()
            self.uas.tick(now)
            self.dialing.uac.tick(now)
            self._drain(wake_timer=False)

    def _next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (self.uas.next_deadline_ms(), self.dialing.uac.next_deadline_ms()) if d is not None]
        return min(deadlines) if deadlines else None

    # ---------------------------------------------------------------- calls

    async def _offer(self, offer: CallOffered) -> None:
        call_id = offer.call_id
        if (refusal := await self.services.desk.stream_refusal(call_id)) is not None:
            self._refuse(refusal, call_id, offer.source[0])
            self.uas.reject(call_id, 503 if refusal is StreamRefusal.DRAINING else 486, _now_ms())
            self._drain()
            return
        if self.services.assistants is not None:  # the application chooses the call's assistant, or refuses it
            chosen = await self.services.desk.choose_assistant(sip_context(offer, self.services.settings.app.context_parameters))
            if isinstance(chosen, TransferTo):  # sent on: 302 Moved Temporarily, the target as the Contact
                self.services.desk.not_answered_by_application(call_id, "sip", chosen)
                self.uas.reject(call_id, 302, _now_ms(), redirect_to=chosen.target)
                self._drain()
                return
            if isinstance(chosen, str):
                self.services.desk.give_back_admission(call_id)
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
        codec = SipRtpCodec(call_id, offer.choice, caller=offer.caller, callee=offer.callee, opus_fec=self.settings.opus_fec)
        transport = RtpTransport(self, call_id, codec, offer.source[0])
        port = await self.bind_rtp(transport)
        dialog = self.uas.dialogs.get(call_id)
        if dialog is None or dialog.state is not DialogState.OFFERED:  # cancelled meanwhile
            transport.release()
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
            codec = SipRtpCodec(call_id, choice, caller=offer.caller, callee=offer.callee, opus_fec=self.settings.opus_fec)
            transport.answered(codec)
        choice = codec.choice
        log.info("sip_call_answered", provider=PROVIDER, call_id=call_id, peer=offer.source[0], rtp_port=port,
                 codec=choice.encoding.value, remote_rtp=f"{choice.remote_host}:{choice.remote_port}", delayed_offer=offer.delayed_offer)
        await self.serve(transport, codec)

    async def serve(self, transport: RtpTransport, codec: SipRtpCodec) -> None:
        """An answered call (ours to an INVITE, or the far end's to ours): its media through the call core until it
        ends, then its counters kept (``finished``, ``dropped``)."""
        call_id = transport.call_id
        call = self.calls.get(call_id)
        if call is None or call.transport is not transport:
            call = self.calls[call_id] = _Call(transport)
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

    async def bind_rtp(self, transport: RtpTransport) -> int | None:
        """Bind ``transport`` to a free even port of the range and its RTCP to the next (a random start spreads
        the calls)."""
        low, high = self.settings.rtp_port_min + (self.settings.rtp_port_min % 2), self.settings.rtp_port_max - 1
        ports = list(range(low, high + 1, 2))
        start = secrets.randbelow(len(ports))
        loop = asyncio.get_running_loop()
        host = self.settings.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as preflight binds it: a name is looked up as IPv4
        for port in ports[start:] + ports[:start]:
            sock = socket.socket(family, socket.SOCK_DGRAM)  # ours, so the BYE can read it at once (``read_waiting``)
            try:
                sock.setblocking(False)
                sock.bind((host, port))
                rtp_socket, _ = await loop.create_datagram_endpoint(lambda: transport, sock=sock)
            except OSError:
                sock.close()
                continue
            try:
                await loop.create_datagram_endpoint(lambda: transport.rtcp, local_addr=(self.settings.host, port + 1))
            except OSError:
                rtp_socket.close()
                continue
            transport.rtp_socket = sock
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

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as one of the listener's tasks (waited for at shutdown)."""
        self._spawn(work)

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
