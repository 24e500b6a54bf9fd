"""A simulated SIP trunk placing calls on the bridge's SIP listener, faithful to the wire (RFC 3261, 3264, 3550,
4733; telephony-protocols.md §5), for the demo, the tests and load tests.

Each call is a user-agent client over UDP, as a trunk's SBC or a phone is:

- one SIP socket and one (even) RTP socket per call on the caller's address;
  ``INVITE`` with an SDP offer (PCMU and PCMA, or the one ``codec`` given
  first, and ``telephone-event``; G.722 or Opus alone where the bridge's
  ``sip.codecs`` names it first, SRTP with a key of ours where its
  ``sip.media_encryption`` is ``required``: a wideband, encrypting phone),
  retransmitted at T1, 2·T1 … until a
  response (Timer A); ``100``/``180`` then ``200`` with the SDP answer, or a
  ``401`` answered once with digest credentials (RFC 2617 ``qop=auth``: the
  simulated account's ``secret`` is the trunk's password), or another final
  response (acknowledged, the call refused); ``ACK`` to the ``200``'s
  ``Contact``, sent again for every retransmitted ``200``;
- the caller's audio as RTP every 20 ms from the shared timer (G.711, or coded
  at 16 kHz as G.722 or Opus: ``sim_media.py``; protected where SRTP): one SSRC,
  sequence +1 and timestamp +160 per packet (+960 for Opus), the marker on the first; a digit
  as RFC 4733 events in place of the audio packets (updates every 20 ms, the
  end packet three times, the media timestamp then moved on by the time the
  event took);
- the bridge's RTP played as it arrives (a phone's small jitter buffer: there
  is nothing to flush, a barge-in is the bridge's audio stopping): the first
  packet that is not pure silence starts the agent's audio, the bridge's
  20 ms silence cadence before it is not agent audio, and a frame that
  decodes to digital silence is not agent speech;
- ``BYE`` from the caller (retransmitted until its ``200``), or from the
  bridge (answered ``200``: the call is over);
- the agent's actions as a trunk sees them: its digits as RFC 4733 events
  (``agent_digits``, each once, with a warning for an event whose end packet
  is not repeated), a transfer as REFER (``transfers``; ``202``, then NOTIFYs
  with ``100 Trying`` and the target's answer, ``transfer_status``).

Everything the bridge sends is read strictly, with a protocol warning for
what a real trunk would reject or complain about: responses are parsed by
this module's own reader (CRLF lines, an exact ``Content-Length``, the
transaction's Via branch, From, Call-ID and CSeq echoed, one To tag per
dialog, a ``Contact`` and an SDP answer that takes exactly one offered codec
on a real port); RTP must come from the address the answer gave (symmetric
RTP), as version 2 without padding, extension or CSRCs, in the negotiated
payload types, with one SSRC, consecutive sequence numbers, timestamps that
advance by the samples sent, and 20 ms payloads (the answer's ``ptime``);
the bridge's own requests must belong to the dialog.

SIP has no reconnect: a call whose media is gone is over (``can_reconnect``
is False), so ``--drop-every`` / ``--drop-at`` do not apply. The bad input a
broken peer sends on a SIP call (``bad_inputs``) does not end it: the bridge
answers or drops and counts it, and the call carries on.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Callable
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from callbridge.carriers.sip.sim_callee import Invited, SipCallee
from callbridge.carriers.sip.sim_stream import SipConnection, SipStream, _Datagrams, _Dialog, bind_udp
from callbridge.carriers.sip.sim_wire import (
    CODEC_PT,
    DTMF_PT,
    RTPMAP,
    Address,
    SdpAnswer,
    SipReply,
    digest_authorization,
    name_addr_uri,
    parse_sdp_answer,
    parse_sdp_offer,
    read_sip,
    tag_param,
    uri_target,
)
from callbridge.codecs.opus import problem as opus_problem
from callbridge.config import Settings
from callbridge.sim.carrier import CallResult, OpenReason, SimCall, SimStream, SimulatedCarrier
from callbridge.sim.ports import RTP_PORTS, free_port
from callbridge.sim.transfer import sent_on
from callbridge.sip.dtmf import event_payload
from callbridge.sip.message import SipRequest
from callbridge.sip.rtp import RtpSender, build_rtp
from callbridge.sip.srtp import KEY_BYTES, offer_line

__all__ = ["SimulatedSip", "SipConnection", "SipStream"]

T1_S: Final = 0.5
_INVITE_TIMEOUT_S: Final = 10.0
"""How long a trunk waits for a final response before it gives up on the call (Timer B is 32 s)."""
_STRAY_RESPONSE: Final = (
    "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKstray\r\nFrom: <sip:a@b>;tag=1\r\n"
    "To: <sip:c@d>;tag=2\r\nCall-ID: stray@sim\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
)


class SimulatedSip(SimulatedCarrier):
    """A SIP trunk sending calls to the bridge's SIP listener (see the module docstring)."""

    provider: ClassVar[str] = "sip"
    can_reconnect: ClassVar[bool] = False
    says_goodbye: ClassVar[bool] = True
    uses_marks: ClassVar[bool] = False
    username: ClassVar[str] = "callbridge-sim"
    places_calls: ClassVar[bool] = True
    """The bridge places calls through it (``sip.outbound.trunk``: its called side, ``sim_callee``)."""

    def __init__(
        self,
        bridge_url: str,
        secret: str,
        *,
        codec: str | None = None,
        local_host: str = "127.0.0.1",
        transfer_status: int = 200,
    ) -> None:
        super().__init__(bridge_url, secret)
        self.offer = (8, 0) if codec == "PCMA" else (0, 8) if codec is None else (0,)
        """Payload types offered, in our order of preference."""
        self.srtp_key: bytes | None = None
        """SRTP: our key, offered in every INVITE (each call's own context: the key is what the offer says)."""
        self.local_host = local_host
        self.transfer_status = transfer_status
        """What a transfer target answers when the bridge REFERs a call (200: the transfer succeeds)."""
        self.host = "127.0.0.1"
        self.port = 5060
        self.streams: dict[str, SipStream] = {}
        self.callee = SipCallee(self)
        """The trunk's called side: the calls the bridge places (``sip.outbound.trunk``, on the REST port's number)."""

    @classmethod
    def bridge_settings(cls, secret: str, rest_url: str) -> dict[str, dict[str, Any]]:
        port = urlsplit(rest_url).port  # the callee's UAS (``sim_callee``) listens on its number, over UDP
        return {
            "sip": {
                "enabled": True, "host": "127.0.0.1", "port": free_port(), "allowed_ips": ["127.0.0.1/32", "::1/128"],
                "username": cls.username, "password": secret, **RTP_PORTS, **({"outbound": {"trunk": f"sip:127.0.0.1:{port}"}} if port else {}),
            }
        }  # fmt: skip

    async def start_rest(self, port: int | socket.socket) -> str:
        """SIP has no REST API: the port's number serves the trunk's called side, over UDP (``sim_callee``)."""
        url = await super().start_rest(port)
        number = urlsplit(url).port
        assert number is not None
        await self.callee.start("127.0.0.1", number)
        return url

    async def aclose(self) -> None:
        await super().aclose()
        self.callee.close()

    def configure(self, settings: Settings) -> None:
        self.host, self.port = (settings.sip.public_address or settings.sip.host, settings.sip.port)
        first = settings.sip.codecs[0]
        if first in ("G722", "opus"):  # a wideband phone, offering the codec the bridge prefers
            self.offer = (CODEC_PT[first],)
        if settings.sip.media_encryption == "required":
            self.srtp_key = secrets.token_bytes(KEY_BYTES)

    def new_call_id(self) -> str:
        return f"{secrets.token_hex(12)}@sim.callbridge"

    async def _sockets(self) -> SipConnection:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, bytes, Address] | None] = asyncio.Queue()
        _, sip = await loop.create_datagram_endpoint(lambda: _Datagrams(queue, "sip"), sock=bind_udp(self.local_host))
        _, rtp = await loop.create_datagram_endpoint(
            lambda: _Datagrams(queue, "rtp"), sock=bind_udp(self.local_host, even=True)
        )
        return SipConnection(sip, rtp, queue, (self.host, self.port))

    def _offer_sdp(self, rtp_port: int) -> bytes:
        session = secrets.randbelow(2**31)
        formats = " ".join(str(pt) for pt in (*self.offer, DTMF_PT))
        lines = [
            "v=0", f"o=sim {session} {session} IN IP4 {self.local_host}", "s=sim", f"c=IN IP4 {self.local_host}", "t=0 0",
            f"m=audio {rtp_port} {'RTP/AVP' if self.srtp_key is None else 'RTP/SAVP'} {formats}",
            *(f"a=rtpmap:{pt} {RTPMAP[pt]}" for pt in self.offer),
            f"a=rtpmap:{DTMF_PT} telephone-event/8000", f"a=fmtp:{DTMF_PT} 0-16", "a=ptime:20", "a=sendrecv",
            *([offer_line(self.srtp_key)] if self.srtp_key is not None else []),
        ]  # fmt: skip
        return ("\r\n".join(lines) + "\r\n").encode()

    def _invite(
        self, conn: SipConnection, call_id: str, from_header: str, cseq: int, authorization: str | None
    ) -> tuple[SipRequest, bytes]:
        host, port = conn.local_sip
        request = SipRequest(method="INVITE", uri=f"sip:agent@{self.host}:{self.port}")
        request.add("Via", f"SIP/2.0/UDP {host}:{port};branch=z9hG4bK{secrets.token_hex(8)};rport")
        request.add("Max-Forwards", "70")
        request.add("From", from_header)
        request.add("To", f"<sip:agent@{self.host}:{self.port}>")
        request.add("Call-ID", call_id)
        request.add("CSeq", f"{cseq} INVITE")
        request.add("Contact", f"<sip:trunk@{host}:{port}>")
        if authorization is not None:
            request.add("Authorization", authorization)
        request.add("User-Agent", "callbridge-sim")
        request.add("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO")
        request.add("Content-Type", "application/sdp")
        request.body = self._offer_sdp(conn.local_rtp[1])
        return request, request.serialize()

    async def _transaction(
        self, conn: SipConnection, request: SipRequest, data: bytes, warn: Callable[[str], None]
    ) -> list[SipReply]:
        """One INVITE client transaction: the responses until the final one (empty: none came)."""
        branch = request.branch
        replies: list[SipReply] = []
        interval, provisional = T1_S, False
        conn.send_sip(data)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _INVITE_TIMEOUT_S
        resend_at = loop.time() + interval
        while loop.time() < deadline:
            received = await conn.next_sip(
                max(0.0, (deadline if provisional else min(deadline, resend_at)) - loop.time())
            )
            if received is None:
                if conn.closed:
                    return replies
                if not provisional and loop.time() >= resend_at:  # Timer A
                    conn.send_sip(data)
                    interval = min(interval * 2, 4.0)
                    resend_at = loop.time() + interval
                continue
            raw, source = received
            reply = read_sip(raw)
            if isinstance(reply, str):
                warn(f"unreadable response to our INVITE: {reply}")
                continue
            if source != conn.bridge_sip:
                warn(f"a response from {source}, not {conn.bridge_sip}")
                continue
            problem = self._not_ours(reply, request, branch)
            if problem is not None:
                warn(problem)
                continue
            replies.append(reply)
            if reply.status >= 200:
                return replies
            provisional = True
        return replies

    @staticmethod
    def _not_ours(reply: SipReply, request: SipRequest, branch: str) -> str | None:
        """Why a response does not belong to ``request``'s transaction (RFC 3261 §8.1.3.3, §17.1.3), or None."""
        vias = reply.headers.get("via", [])
        if not reply.status:
            return f"a {reply.method} request during our INVITE transaction"
        if (
            len(vias) != 1
            or f"branch={branch}" not in vias[0].split(";")
            or not vias[0].startswith(request.top_via.split(";")[0])
        ):
            return f"the {reply.status}'s Via {vias} is not ours"
        if reply.get("from") != request.header("From"):
            return f"the {reply.status}'s From {reply.get('from')!r} is not ours"
        if reply.get("call-id") != request.call_id or reply.cseq != request.cseq:
            return f"the {reply.status}'s Call-ID/CSeq are not ours"
        if name_addr_uri(reply.get("to")) != name_addr_uri(request.header("To") or ""):
            return f"the {reply.status}'s To {reply.get('to')!r} is not ours"
        if reply.status > 100 and tag_param(reply.get("to")) is None:
            return f"a {reply.status} without a To tag"
        return None

    def _ack(self, conn: SipConnection, invite: SipRequest, reply: SipReply, *, uri: str | None = None) -> bytes:
        """ACK of ``reply``: for a non-2xx the INVITE's branch and URI (§17.1.1.3), for a 2xx a new transaction
        to the Contact (§13.2.2.4)."""
        ack = SipRequest(method="ACK", uri=uri or invite.uri)
        via = invite.top_via
        if uri is not None:
            host, port = conn.local_sip
            via = f"SIP/2.0/UDP {host}:{port};branch=z9hG4bK{secrets.token_hex(8)};rport"
        ack.add("Via", via)
        ack.add("Max-Forwards", "70")
        ack.add("From", invite.header("From") or "")
        ack.add("To", reply.get("to"))
        ack.add("Call-ID", invite.call_id)
        ack.add("CSeq", f"{invite.cseq[0]} ACK")
        return ack.serialize()

    async def open_stream(self, call: SimCall, reason: OpenReason) -> SipStream | None:
        result = call.result
        invited = self.callee.answering.pop(call.call_id, None)
        if invited is not None and reason == "answer":  # a call the bridge placed: we answer it
            return await self._answer_invite(call, invited)
        if reason != "answer":
            result.log(
                call.clock(), "sip", f"the call's media is gone ({reason}): SIP has no reconnect, the call is over"
            )
            return None
        conn = await self._sockets()
        warnings: list[str] = []
        local_tag = secrets.token_hex(6)
        from_header = f"<sip:+15550100@{self.local_host}>;tag={local_tag}"
        authorization: str | None = None
        try:
            for cseq in (1, 2):
                invite, data = self._invite(conn, call.call_id, from_header, cseq, authorization)
                replies = await self._transaction(conn, invite, data, warnings.append)
                result.warnings.extend(warnings)
                warnings.clear()
                if not replies or replies[-1].status < 200:
                    result.log(call.clock(), "sip", "no final response to the INVITE: the trunk gives up")
                    await conn.close()
                    return None
                final = replies[-1]
                tags = {tag_param(r.get("to")) for r in replies if r.status > 100}
                if len(tags) > 1:
                    result.warnings.append(f"To tags {sorted(t or '' for t in tags)} in one INVITE transaction")
                if final.status == 200:
                    return self._answered(call, conn, invite, final)
                conn.send_sip(self._ack(conn, invite, final))
                challenge = final.get("www-authenticate")
                if final.status == 401 and authorization is None and challenge:
                    authorization = digest_authorization(challenge, "INVITE", invite.uri, self.username, self.secret)
                    if authorization is not None:
                        continue
                if final.status == 302:  # Moved Temporarily: the trunk sends the call to the Contact
                    contact = (final.get("contact") or "").strip().strip("<>")
                    user = contact.split(":", 1)[-1].split("@", 1)[0] if contact.startswith("sip:") else ""
                    sent_on(result, call.clock(), "sip", "302 Moved Temporarily", user if user.startswith("+") else contact)
                else:
                    result.log(call.clock(), "sip", f"the bridge refused the call: {final.status}")
                await conn.close()
                return None
        except BaseException:
            await conn.close()
            raise
        await conn.close()
        return None

    def _answered(self, call: SimCall, conn: SipConnection, invite: SipRequest, ok: SipReply) -> SipStream | None:
        result = call.result
        contact = name_addr_uri(ok.get("contact"))
        target = uri_target(contact)
        answer = (
            parse_sdp_answer(ok.body, self.offer, self.srtp_key)
            if ok.get("content-type").lower() == "application/sdp"
            else "no SDP in the 200"
        )
        problem = "the 200 has no usable Contact" if target is None else answer if isinstance(answer, str) else None
        to = ok.get("to")
        remote_tag = tag_param(to) or ""
        if problem is not None or target is None or isinstance(answer, str):
            result.warnings.append(f"200 OK to the INVITE: {problem}")
            # a trunk ACKs the 2xx and hangs up at once (§13.2.2.4 needs the ACK even for an answer it cannot use)
            conn.send_sip(self._ack(conn, invite, ok))
            return None
        ack = self._ack(conn, invite, ok, uri=contact)
        conn.send_sip(ack, target)
        conn.bridge_rtp = (answer.host, answer.port)
        dialog = _Dialog(
            call.call_id, tag_param(invite.header("From") or "") or "", remote_tag, invite.header("From") or "", to, contact, target,
            list(reversed(ok.headers.get("record-route", []))), invite.cseq[0],
        )  # fmt: skip
        stream = SipStream(conn, call, dialog, answer, ack, lambda: self.end_call(call.call_id), self.transfer_status)
        self.streams[call.call_id] = stream
        result.log(call.clock(), "sip", f"200 OK: {RTPMAP[answer.payload_type]} to {answer.host}:{answer.port}")
        return stream

    async def _answer_invite(self, call: SimCall, invited: Invited) -> SipStream | None:
        """The callee picks up the bridge's call: our answer to its offer in a 200 (our Contact the call's own SIP
        socket), sent again until the bridge's ACK comes there; then the call's stream, as for an inbound call."""
        conn = await self._sockets()
        conn.bridge_sip = invited.source
        supported = (0, 8, 9, *(() if opus_problem() else (111,)))
        offer = parse_sdp_offer(invited.request.body, supported, secrets.token_bytes(KEY_BYTES))
        if isinstance(offer, str):
            call.result.warnings.append(f"the bridge's offer: {offer}")
            self.callee.respond(invited, 488, "Not Acceptable Here")
            await conn.close()
            return None
        conn.bridge_rtp = (offer.host, offer.port)
        host, port = conn.local_sip
        contact = f"<sip:{invited.user}@{host}:{port}>"
        self.callee.respond(invited, 200, "OK", contact=contact, body=self._answer_sdp(offer, conn.local_rtp[1]))
        if not await self._acked(conn, invited):
            call.result.warnings.append("no ACK to our 200 from the bridge")
            await conn.close()
            return None
        request = invited.request
        remote_contact = name_addr_uri(request.get("contact"))
        target = uri_target(remote_contact)
        if target is None:
            call.result.warnings.append(f"the INVITE's Contact {remote_contact!r} is not an address")
            await conn.close()
            return None
        ours = f"{request.get('to')};tag={invited.to_tag}"
        dialog = _Dialog(
            call.call_id, invited.to_tag, tag_param(request.get("from")) or "", ours, request.get("from"), remote_contact, target,
            request.headers.get("record-route", []), 0,
        )  # fmt: skip
        stream = SipStream(conn, call, dialog, offer, b"", lambda: self.end_call(call.call_id), self.transfer_status)
        self.streams[call.call_id] = stream
        call.result.log(call.clock(), "sip", f"answered the bridge's call: {RTPMAP[offer.payload_type]} to {offer.host}:{offer.port}")
        return stream

    def _answer_sdp(self, offer: SdpAnswer, rtp_port: int) -> bytes:
        formats = " ".join(str(pt) for pt in (offer.payload_type, *([offer.dtmf_payload_type] if offer.dtmf_payload_type is not None else [])))
        session = secrets.randbelow(2**31)
        lines = [
            "v=0", f"o=sim {session} {session} IN IP4 {self.local_host}", "s=sim", f"c=IN IP4 {self.local_host}", "t=0 0",
            f"m=audio {rtp_port} {'RTP/AVP' if offer.srtp is None else 'RTP/SAVP'} {formats}",
            f"a=rtpmap:{offer.payload_type} {RTPMAP[offer.payload_type]}",
            *([f"a=rtpmap:{offer.dtmf_payload_type} telephone-event/8000"] if offer.dtmf_payload_type is not None else []),
            "a=ptime:20", "a=sendrecv", *([offer.srtp.answer_line()] if offer.srtp is not None else []),
        ]  # fmt: skip
        return ("\r\n".join(lines) + "\r\n").encode()

    async def _acked(self, conn: SipConnection, invited: Invited) -> bool:
        """Wait for the bridge's ACK of our 200 on the call's socket, sending the 200 again at T1, doubling (§13.3.1.4)."""
        loop = asyncio.get_running_loop()
        deadline, interval = loop.time() + _INVITE_TIMEOUT_S, T1_S
        while loop.time() < deadline:
            received = await conn.next_sip(interval)
            if received is None:
                if conn.closed:
                    return False
                self.callee.resend(invited)
                interval = min(interval * 2, 4.0)
                continue
            request = read_sip(received[0])
            if isinstance(request, SipReply) and request.method == "ACK" and request.get("call-id") == invited.request.get("call-id"):
                return True
        return False

    def bad_inputs(self, stream: SimStream) -> dict[str, tuple[str | bytes, str]]:
        """What a broken peer sends on a SIP call: case → (message: text on the SIP socket, bytes on the RTP
        socket; what the bridge must do: ``status:N`` answer with N and carry on, ``dropped:REASON`` drop it and
        count it as REASON in ``callbridge_sip_dropped_total`` (RTP: when the call ends), and carry on)."""
        assert isinstance(stream, SipStream)
        pt = stream.answer.payload_type
        sender = RtpSender()
        rtcp_sr = bytes((0x80, 200)) + (6).to_bytes(2, "big") + bytes(24)
        return {
            "rtp_garbage": (b"\x00garbage", "dropped:rtp_malformed"),
            "rtp_version_1": (b"\x40" + build_rtp(pt, 1, 160, 7, bytes(160))[1:], "dropped:rtp_malformed"),
            "rtcp_on_the_rtp_port": (rtcp_sr, "dropped:rtp_malformed"),
            "rtp_unknown_payload_type": (build_rtp(96, 1, 160, 7, bytes(160)), "dropped:rtp_other_payload_type"),
            "rtp_short_telephone_event": (sender.event_packet(DTMF_PT, event_payload(5, end=True, duration=800)[:2], 0, marker=True), "dropped:rtp_dtmf_malformed"),
            "sip_garbage": ("\udcff\udcfe not SIP at all", "dropped:malformed:no_headers_end"),
            "sip_bad_header": ("OPTIONS sip:agent@x SIP/2.0\r\nthis is no header\r\n\r\n", "dropped:malformed:bad_header"),
            "sip_stray_response": (_STRAY_RESPONSE, "dropped:stray_response"),
            "bye_with_a_wrong_content_length": (stream.in_dialog("BYE", content_length=99), "status:400"),
            "unknown_method": (stream.in_dialog("FROBNICATE"), "status:501"),
            "bye_with_another_to_tag": (self._foreign_bye(stream), "status:481"),
            "subscribe_not_done": (stream.in_dialog("SUBSCRIBE", headers=(("Event", "dialog"),)), "status:405"),
        }  # fmt: skip

    @staticmethod
    def _foreign_bye(stream: SipStream) -> str:
        dialog = stream.dialog
        saved = dialog.to_header
        dialog.to_header = saved.replace(f"tag={dialog.remote_tag}", "tag=not-the-bridges")
        try:
            return stream.in_dialog("BYE")
        finally:
            dialog.to_header = saved

    async def forged_requests_refused(self) -> bool:
        """INVITEs from 127.0.0.2, outside the bridge's ``allowed_ips``: without credentials (a 401 challenge, no
        call), then with a wrong password (refused again). True when neither got a call (no 100, no 200)."""
        forger = SimulatedSip(self.bridge_url, "not-the-" + self.secret, local_host="127.0.0.2")
        forger.host, forger.port = self.host, self.port
        call_id = forger.new_call_id()
        call = SimCall(call_id, forger_result := CallResult(call_id), lambda: 0)
        forger.calls[call_id] = call
        conn = await forger._sockets()
        refused = True
        try:
            from_header = f"<sip:+15550199@127.0.0.2>;tag={secrets.token_hex(6)}"
            authorization: str | None = None
            for cseq in (1, 2):
                invite, data = forger._invite(conn, call_id, from_header, cseq, authorization)
                replies = await forger._transaction(conn, invite, data, forger_result.warnings.append)
                if not replies or any(r.status in (100, 180, 183, 200) for r in replies):
                    return False
                final = replies[-1]
                conn.send_sip(forger._ack(conn, invite, final))
                if cseq == 1:
                    challenge = final.get("www-authenticate")
                    if final.status != 401 or not challenge:
                        refused = refused and final.status in (401, 403)
                        break
                    authorization = digest_authorization(challenge, "INVITE", invite.uri, self.username, forger.secret)
                else:
                    refused = refused and final.status in (401, 403)
            return refused
        finally:
            await conn.close()
