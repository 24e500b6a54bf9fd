"""The simulated SIP trunk as the called side (#42): the calls the bridge places through ``sip.outbound.trunk`` reach
this user-agent server on UDP (on the simulator's REST port number: ``SimulatedSip.bridge_settings`` points the
trunk there), and ring the ``Callee`` its Request-URI's user names (``SimulatedCarrier.callees``), as a REST carrier's
dial does.

Per INVITE (read strictly: one Via, a From tag, no To tag, ``CSeq: n INVITE``, a Contact, an SDP offer; else a protocol
warning in ``warnings``): ``100 Trying``, ``180 Ringing`` with our To tag, then as the callee goes — answered (the
call's own SIP and RTP sockets are made, the offer read by ``sim_wire.parse_sdp_offer``, ``200 OK`` with our answer
and our Contact on the call's own socket, sent again at T1, doubling, until the bridge's ACK comes there; the call then
runs as an inbound one does, ``SipStream`` and the callee's script), ``486 Busy Here``, ``503 Service Unavailable``
(fails), ``480 Temporarily Unavailable`` (rang out); a CANCEL while it rings gets ``200`` and the INVITE ``487``. A
retransmitted INVITE gets the last response again. The responses are kept as the call's progress reports
(``status_reports``: SIP's word for what a REST carrier reports by callback).
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Final, cast

from callbridge.carriers.sip.sim_wire import Address, SipReply, read_sip, tag_param
from callbridge.sim.callee import Callee
from callbridge.sim.carrier import CallResult, SimulatedCarrier

__all__ = ["Invited", "SipCallee"]

RING_TIMEOUT_S: Final = 120.0
"""How long the phone rings unanswered before the trunk gives up (480); the bridge's own ring timeout, which sends
CANCEL, comes first."""
_FINAL: Final = {"canceled": (487, "Request Terminated"), "busy": (486, "Busy Here"), "fails": (503, "Service Unavailable"),
                 "no_answer": (480, "Temporarily Unavailable")}  # fmt: skip


@dataclass(slots=True)
class Invited:
    """One INVITE the bridge sent: the request, where it came from, our To tag, the last response sent to it."""

    request: SipReply
    source: Address
    to_tag: str
    user: str
    last: bytes = b""


class SipCallee(asyncio.DatagramProtocol):
    """The trunk's UAS socket for the calls the bridge places (see the module docstring)."""

    def __init__(self, carrier: SimulatedCarrier) -> None:
        self.carrier = carrier
        self.transport: asyncio.DatagramTransport | None = None
        self.invites: dict[str, Invited] = {}
        self.answering: dict[str, Invited] = {}
        """Call-ID → an INVITE to answer: the carrier's ``open_stream`` takes it when the callee's call starts."""
        self.warnings: list[str] = []
        """What the bridge sent that a real trunk would reject or complain about, outside any answered call."""

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        source = (str(addr[0]), int(addr[1]))
        request = read_sip(data)
        if isinstance(request, str):
            self.warnings.append(f"unreadable SIP at the trunk: {request}")
            return
        if request.status:
            self.warnings.append(f"a {request.status} response at the trunk's UAS")
            return
        match request.method:
            case "INVITE":
                self._invite(request, source)
            case "ACK":
                pass  # of a final response other than 2xx (§17.1.1.3): the transaction is over
            case "CANCEL":
                self._cancel(request, source)
            case "OPTIONS":
                self._send(self._response(request, 200, "OK", ""), source)
            case _:
                self._send(self._response(request, 481, "Call/Transaction Does Not Exist", ""), source)

    def respond(self, invited: Invited, status: int, reason: str, *, contact: str | None = None, body: bytes = b"") -> bytes:
        """A response to ``invited``'s INVITE, sent to where it came from (and kept for a retransmission)."""
        data = self._response(invited.request, status, reason, invited.to_tag if status > 100 else "", contact, body)
        invited.last = data
        self._send(data, invited.source)
        self.carrier.status_reports.append((invited.request.get("call-id"), f"{status} {reason}"))
        return data

    def resend(self, invited: Invited) -> None:
        """The last response to ``invited`` again (a 200 not yet acknowledged)."""
        self._send(invited.last, invited.source)

    def _invite(self, request: SipReply, source: Address) -> None:
        call_id = request.get("call-id")
        known = self.invites.get(call_id)
        if known is not None:  # a retransmission: the last response again (§17.2.1)
            if known.last:
                self._send(known.last, source)
            return
        problem = _not_an_invite(request)
        if problem is not None:
            self.warnings.append(problem)
        user = request.uri.split(":", 1)[1].split("@", 1)[0] if "@" in request.uri else ""
        invited = self.invites[call_id] = Invited(request, source, secrets.token_hex(6), user)
        self.respond(invited, 100, "Trying")
        self.carrier.dial_taken(call_id, self._ring(invited, self.carrier.callees.get(user, Callee())))

    async def _ring(self, invited: Invited, callee: Callee) -> CallResult | None:
        call_id = invited.request.get("call-id")
        self.respond(invited, 180, "Ringing", contact=f"<sip:{invited.user}@{self._host_port()}>")
        end = await self.carrier.ring(call_id, callee, RING_TIMEOUT_S)
        if end != "answered":
            self.respond(invited, *_FINAL[end])
            return None
        self.answering[call_id] = invited
        return await self.carrier.take_answered(call_id, invited.user, callee)

    def _cancel(self, request: SipReply, source: Address) -> None:
        invited = self.invites.get(request.get("call-id"))
        if invited is None:
            self._send(self._response(request, 481, "Call/Transaction Does Not Exist", ""), source)
            return
        self._send(self._response(request, 200, "OK", invited.to_tag), source)
        self.carrier.stop_ringing(request.get("call-id"))  # the ring ends "canceled": 487 to the INVITE

    def _host_port(self) -> str:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("sockname")[:2]
        return f"{host}:{port}"

    def _response(self, request: SipReply, status: int, reason: str, to_tag: str, contact: str | None = None, body: bytes = b"") -> bytes:
        to = request.get("to")
        lines = [
            f"SIP/2.0 {status} {reason}", *(f"Via: {via}" for via in request.headers.get("via", [])),
            f"From: {request.get('from')}", f"To: {to}{';tag=' + to_tag if to_tag and tag_param(to) is None else ''}",
            f"Call-ID: {request.get('call-id')}", f"CSeq: {request.get('cseq')}",
            *([f"Contact: {contact}"] if contact else []), *(["Content-Type: application/sdp"] if body else []),
            f"Content-Length: {len(body)}",
        ]  # fmt: skip
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def _send(self, data: bytes, to: Address) -> None:
        if self.transport is not None:
            self.transport.sendto(data, to)


def _not_an_invite(request: SipReply) -> str | None:
    """What a trunk would reject in the bridge's INVITE (RFC 3261 §8.1.1), or None."""
    if len(request.headers.get("via", [])) != 1:
        return f"the bridge's INVITE has {len(request.headers.get('via', []))} Via headers"
    if tag_param(request.get("from")) is None or tag_param(request.get("to")) is not None:
        return "the bridge's INVITE needs a From tag and no To tag"
    if request.cseq[1] != "INVITE" or not request.get("contact") or not request.get("max-forwards"):
        return "the bridge's INVITE lacks its CSeq method, Contact or Max-Forwards"
    if request.get("content-type").lower() != "application/sdp" or not request.body:
        return "the bridge's INVITE carries no SDP offer"
    return None
