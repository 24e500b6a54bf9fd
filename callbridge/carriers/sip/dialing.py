"""The calls the agent places through the SIP trunk (#42): the SIP listener's ``CarrierDialer`` (``Dialer`` paces and
follows them as any carrier's), driving the user-agent client (``callbridge.sip.uac``).

A dial: the call is admitted here first (a slot held while it rings: a person who answers is never hung up on for
want of one), its RTP port bound (the offer names it), the trunk (or ``outbound_proxy``) resolved, and the INVITE
sent to ``sip:<to>@<trunk>``. 180 / 183 → ``ringing``; a final refusal → ``busy`` (486, 600), ``declined`` (603),
``no_answer`` (408, 480, and our CANCEL at the ring timeout), ``canceled`` (the application's CANCEL), else
``failed`` with the status; each within the time it takes to read the response. Early media is not read.

Answered: the dialog goes to the UAS (``SipUas.adopt``), the call's context is the placed call's (its dial id and
metadata), its assistant the request's or the application's, and the call is served as an answered inbound one
(``SipListener.serve``): barge-in, heard accounting, DTMF, transfer, recording. A 2xx that crossed our CANCEL, or
one with no audio we offered, is ended at once with a BYE.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

from callbridge.bridge.answer_desk import StreamRefusal
from callbridge.bridge.call_setup import CallSetup
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.dialer import DialLeg, DialProgress, DialRejected
from callbridge.carriers.sip.rtp_transport import RtpOwner, RtpTransport
from callbridge.carriers.sip.settings import SipOutboundSettings
from callbridge.carriers.sip.tls import TlsPeer
from callbridge.carriers.sip.wire import PROVIDER, SipRtpCodec
from callbridge.logging import get_logger
from callbridge.sip.dialog import SipUas
from callbridge.sip.invite_offer import placeholder_choice
from callbridge.sip.message import SipParseError, SipResponse, host_port, parse_message, uri_of, via_sent_by
from callbridge.sip.sdp import MediaChoice, offer
from callbridge.sip.srtp import KEY_BYTES
from callbridge.sip.transaction import Address
from callbridge.sip.uac import DialAnswered, DialEnded, Invitation, Provisional, SipUac, UacConfig

__all__ = ["DialingHost", "SipDialing", "progress_of"]

log = get_logger(__name__)

_BUSY: Final = frozenset({486, 600})
_DECLINED: Final = frozenset({603})
_NO_ANSWER: Final = frozenset({408, 480})


def progress_of(event: DialEnded) -> DialProgress:
    """How a dial that ended unanswered failed, in the dialer's words (the status's meaning, or our CANCEL's)."""
    if event.cause == "ring_timeout":
        return "no_answer"
    if event.cause == "canceled" or (event.cause == "rejected" and event.status == 487):
        return "canceled"
    if event.cause != "rejected":
        return "failed"
    if event.status in _BUSY:
        return "busy"
    if event.status in _DECLINED:
        return "declined"
    return "no_answer" if event.status in _NO_ANSWER else "failed"


class DialingHost(RtpOwner, Protocol):
    """What the outbound calls use of their SIP listener (``SipListener``)."""

    @property
    def services(self) -> CarrierServices: ...

    @property
    def uas(self) -> SipUas:
        """Where an answered call's dialog goes."""

    @property
    def port(self) -> int | None:
        """Where the listener is bound (None: not up)."""

    @property
    def tls_peers(self) -> dict[tuple[str, int], TlsPeer]:
        """Each address we open TLS to: the name its certificate must bear, the CAs it must chain to."""

    async def bind_rtp(self, transport: RtpTransport) -> int | None: ...

    async def serve(self, transport: RtpTransport, codec: SipRtpCodec) -> None:
        """An answered call, served until it ends."""

    def flush(self) -> None:
        """Send what the SIP cores produced, act on their events."""

    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...


@dataclass(slots=True)
class _Ringing:
    leg: DialLeg
    transport: RtpTransport


class SipDialing:
    """The SIP listener's outbound calls (see the module docstring)."""

    def __init__(self, listener: DialingHost, settings: SipOutboundSettings, port: int) -> None:
        self._listener = listener
        self._settings = settings
        password = settings.password.get_secret_value() if settings.password is not None else None
        codecs = listener.uas.config.codecs
        self.uac = SipUac(UacConfig(host=listener.address, port=port, username=settings.username, password=password, codecs=codecs))
        self._ringing: dict[str, _Ringing] = {}

    def started(self, port: int, tls_port: int | None = None) -> None:
        """The listener is up on ``port`` (and TLS on ``tls_port``): our Via and Contact."""
        self.uac.config = replace(self.uac.config, port=port, tls_port=tls_port)

    # ------------------------------------------------------------ CarrierDialer

    @property
    def can_dial(self) -> bool:
        return self._settings.trunk is not None and self._listener.port is not None

    async def dial(self, leg: DialLeg) -> str:
        """Admit the call, bind its RTP port, send the INVITE; the SIP Call-ID. Raises ``DialRejected``."""
        settings, listener = self._settings, self._listener
        services = listener.services
        if settings.trunk is None or listener.port is None:
            raise DialRejected("not_configured", "sip.outbound.trunk is not set, or the SIP listener is not up")
        call_id = f"{secrets.token_hex(16)}@callbridge"
        if (refusal := await services.desk.stream_refusal(call_id)) is not None:
            raise DialRejected("refused", "this process is draining" if refusal is StreamRefusal.DRAINING else "no capacity for another call")
        trunk_host = uri_of(settings.trunk)[4:].split(";")[0]
        next_hop = uri_of(settings.outbound_proxy)[4:].split(";")[0] if settings.outbound_proxy else trunk_host
        try:
            destination = await _resolve(next_hop, settings.transport)
        except OSError as exc:
            services.desk.give_back_admission(call_id)
            raise DialRejected("unreachable", f"{next_hop}: {exc}") from None
        if settings.transport == "tls":  # its certificate is checked against the name, not the address
            listener.tls_peers[destination] = TlsPeer(via_sent_by(next_hop)[0].strip("[]"), settings.tls_ca_file)
        fec = listener.settings.opus_fec
        codec = SipRtpCodec(call_id, placeholder_choice(destination), caller=leg.from_, callee=leg.to, opus_fec=fec)
        transport = RtpTransport(listener, call_id, codec, destination[0])
        transport.ringing = True
        rtp_port = await listener.bind_rtp(transport)
        if rtp_port is None:
            services.desk.give_back_admission(call_id)
            raise DialRejected("refused", "no free RTP port")
        session_id = secrets.randbelow(2**31)
        # SRTP where it is required (SDES, our key in the offer; the answer must take it in kind); else plain RTP, which
        # every trunk takes (an SRTP offer to a trunk without it would be refused, 488, and the call not placed)
        srtp_key = secrets.token_bytes(KEY_BYTES) if listener.uas.config.media_encryption == "required" else None
        invitation = Invitation(
            call_id=call_id, request_uri=f"sip:{leg.to}@{trunk_host}", from_uri=f"sip:{leg.from_}@{settings.from_domain or via_sent_by(trunk_host)[0]}",
            destination=destination, srtp_key=srtp_key,
            offer=offer(host=listener.address, port=rtp_port, session_id=session_id, version=session_id, codecs=self.uac.config.codecs, srtp_key=srtp_key),
            rtp_host=listener.address, rtp_port=rtp_port, session_id=session_id, ring_timeout_ms=leg.ring_timeout_s * 1000,
            transport=settings.transport.upper(), route=(f"<{settings.outbound_proxy};lr>",) if settings.outbound_proxy else (),
        )  # fmt: skip
        self._ringing[call_id] = _Ringing(leg, transport)
        self.uac.invite(invitation, _now_ms())
        listener.flush()
        log.info("sip_dialing", provider=PROVIDER, call_id=call_id, dial_id=leg.dial_id, to=leg.to, via=host_port(*destination), rtp_port=rtp_port)
        return call_id

    async def prepare(self) -> None:
        """Nothing to get ready: every dial is one request with the credentials as they are."""

    async def cancel(self, call_id: str) -> bool:
        """CANCEL a dial still ringing (its 487 reports it ``canceled``); False: answered or over already."""
        if not self.uac.dialling(call_id):
            return False
        self.uac.cancel(call_id, _now_ms())
        self._listener.flush()
        return True

    def stop(self) -> None:
        """The listener is closing: every dial still ringing is canceled (CANCEL, where a provisional came), so no
        phone rings on for a bridge that is gone."""
        for call_id in list(self._ringing):
            self.uac.cancel(call_id, _now_ms())
        self._listener.flush()

    # --------------------------------------------------------------- the listener

    def receive(self, data: bytes, source: Address) -> bool:
        """A datagram (or a message cut from a TCP stream): True when it was a response to our INVITE or CANCEL."""
        if not data.startswith(b"SIP/2.0 ") or not self.uac.awaits(source):
            return False
        try:
            message = parse_message(data)
        except SipParseError:
            return False
        return isinstance(message, SipResponse) and self.uac.receive_response(message, source, _now_ms())

    def take_events(self) -> None:
        """Act on what the UAC told (the listener drains its datagrams first)."""
        dialer = self._listener.services.dialer
        for event in self.uac.events():
            match event:
                case Provisional(call_id):
                    if dialer is not None:
                        dialer.progress(PROVIDER, call_id, "ringing")
                case DialEnded(call_id, status, reason):
                    log.info("sip_dial_ended", provider=PROVIDER, call_id=call_id, status=status, reason=reason, cause=event.cause)
                    self._release(call_id)
                    if dialer is not None:
                        dialer.progress(PROVIDER, call_id, progress_of(event), f"SIP {status} {reason}".strip())
                case DialAnswered(call_id, dialog, choice, canceled):
                    self._listener.uas.adopt(dialog)
                    if canceled or choice is None:  # nobody wants it now, or it cannot carry our audio: our BYE
                        why = "answered after our CANCEL" if canceled else "the answer has no audio we offered"
                        log.info("sip_dial_answered_ended", provider=PROVIDER, call_id=call_id, reason=why)
                        self._listener.uas.hang_up(call_id, _now_ms())
                        self._release(call_id)
                        if dialer is not None:
                            dialer.progress(PROVIDER, call_id, "canceled" if canceled else "failed", why)
                        continue
                    ringing = self._ringing.pop(call_id, None)
                    if ringing is not None:
                        self._listener.spawn(self._answered(ringing, choice))

    async def _answered(self, ringing: _Ringing, choice: MediaChoice) -> None:
        """The far end answered: the placed call's context and assistant, then the call served like any other."""
        listener, leg, transport = self._listener, ringing.leg, ringing.transport
        services, call_id = listener.services, transport.call_id
        placed = await services.dialer.answering(leg.dial_id, PROVIDER, call_id) if services.dialer is not None else None
        if placed is not None:
            chosen = await services.desk.choose_for_placed(placed, placed.context)
            if chosen is not None and not isinstance(chosen, CallSetup):  # the application will not have the call it placed
                log.info("sip_dial_answered_refused", provider=PROVIDER, call_id=call_id, dial_id=leg.dial_id)
                services.desk.give_back_admission(call_id)
                await transport.close()  # our BYE
                return
        codec = SipRtpCodec(call_id, choice, caller=leg.from_, callee=leg.to, opus_fec=transport.codec.opus_fec)
        transport.answered(codec)
        log.info("sip_call_answered", provider=PROVIDER, call_id=call_id, direction="outbound", dial_id=leg.dial_id,
                 codec=choice.encoding.value, remote_rtp=f"{choice.remote_host}:{choice.remote_port}")  # fmt: skip
        await listener.serve(transport, codec)

    def _release(self, call_id: str) -> None:
        """A dial over unanswered (or answered and ended at once): its RTP sockets closed, its slot given back."""
        ringing = self._ringing.pop(call_id, None)
        if ringing is None:
            return
        ringing.transport.release()
        self._listener.services.desk.give_back_admission(call_id)


async def _resolve(hostport: str, transport: str) -> Address:
    """``host[:port]`` → the first IPv4 or IPv6 address it names (a literal is taken as it is; no port: 5060, over
    TLS 5061). Raises ``OSError``."""
    host, port = via_sent_by(hostport)
    if transport == "tls" and ":" not in hostport.rsplit("]", 1)[-1]:  # no port named (``[v6]`` has its own colons)
        port = 5061
    kind = socket.SOCK_DGRAM if transport == "udp" else socket.SOCK_STREAM
    infos = await asyncio.get_running_loop().getaddrinfo(host.strip("[]"), port, type=kind)
    if not infos:
        raise OSError(f"{host} has no address")
    address = infos[0][4]
    return str(address[0]), int(address[1])


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
