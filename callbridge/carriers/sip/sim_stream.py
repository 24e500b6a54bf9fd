"""The simulated SIP trunk's calls (``carriers/sip/sim.py`` places them): a call's SIP and RTP sockets
(``SipConnection``) and its media and in-dialog requests once answered (``SipStream``: the caller's RTP out on the
shared timer, the bridge's RTP read strictly and played, digits, BYE, REFER and NOTIFY). The module docstring of
``carriers/sip/sim.py`` says what is simulated and what is checked."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import ClassVar, Final, cast

from callbridge.carriers.sip.sim_media import PhoneCodec
from callbridge.carriers.sip.sim_wire import (
    Address,
    SdpAnswer,
    SipReply,
    name_addr_uri,
    read_sip,
    tag_param,
)
from callbridge.sim.carrier import FRAME_MS, SimCall, SimStream
from callbridge.sip.dtmf import dtmf_packets
from callbridge.sip.message import SipRequest
from callbridge.sip.rtp import RtpSender
from callbridge.sip.srtp import SrtpSession

__all__ = ["SipConnection", "SipStream", "bind_udp"]


T1_S: Final = 0.5
_BYE_TIMEOUT_S: Final = 4.0
MAX_AHEAD_MS: Final = 200
"""Beyond this, the bridge's RTP arrived so far ahead of real time that a phone's (adaptive) jitter buffer would
overflow and drop audio. The bridge's lead is 60 ms (``bridge.providers.sip.PROFILE``); the margin above it
absorbs this simulator reading a burst of packets late when a busy machine stalls its event loop (it shares one
with the bridge in the tests), packets the kernel had received on time. A bridge that stops pacing is seconds
ahead."""
CLOCK_RUN_GAP_S: Final = 0.1
"""Packets further apart than this start a new run for the clock check (a pause, hold, or a stalled machine)."""
CLOCK_CHECK_AFTER_S: Final = 2.0
MIN_CLOCK_RATE: Final = 0.75
"""Within a run of ``CLOCK_CHECK_AFTER_S`` or more, the media time the RTP timestamps cover must be at least this
share of the wall time that passed: a sender slower than its own clock (the old 40 ms cadence of 20 ms packets:
half) makes a phone's jitter buffer run dry."""


# ------------------------------------------------------------------------------ the sockets


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[tuple[str, bytes, Address] | None], kind: str) -> None:
        self.queue = queue
        self.kind = kind
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.queue.put_nowait((self.kind, data, (str(addr[0]), int(addr[1]))))

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP unreachable: the bridge's port is gone; what it means shows up as silence or no response


class SipConnection:
    """A call's SIP and RTP sockets as a ``SimConnection``: ``send(str)`` is a SIP datagram to the bridge's SIP
    address, ``send(bytes)`` an RTP packet to the address its SDP answer gave; ``messages()`` yields the bridge's
    SIP messages as text (UTF-8, lossless) and its RTP packets as bytes, each from where it must come from (else
    ``on_warning``, and dropped)."""

    def __init__(
        self,
        sip: _Datagrams,
        rtp: _Datagrams,
        queue: asyncio.Queue[tuple[str, bytes, Address] | None],
        bridge_sip: Address,
    ) -> None:
        self.sip = sip
        self.rtp = rtp
        self.queue = queue
        self.bridge_sip = bridge_sip
        self.bridge_rtp: Address | None = None
        self.early: list[tuple[str, bytes, Address]] = []
        """What arrived while the INVITE transaction read the SIP socket (RTP before the ACK)."""
        self.on_warning: Callable[[str], None] | None = None
        self.closed = False

    @property
    def local_sip(self) -> Address:
        return cast(Address, self.sip.transport.get_extra_info("sockname")[:2]) if self.sip.transport else ("", 0)

    @property
    def local_rtp(self) -> Address:
        return cast(Address, self.rtp.transport.get_extra_info("sockname")[:2]) if self.rtp.transport else ("", 0)

    def send_sip(self, data: bytes, address: Address | None = None) -> None:
        if self.closed or self.sip.transport is None:
            raise ConnectionError("SIP socket closed")
        self.sip.transport.sendto(data, address or self.bridge_sip)

    async def send(self, message: str | bytes) -> None:
        if self.closed or self.rtp.transport is None:
            raise ConnectionError("call sockets closed")
        if isinstance(message, str):
            self.send_sip(message.encode("utf-8", "surrogateescape"))
        elif self.bridge_rtp is not None:
            self.rtp.transport.sendto(message, self.bridge_rtp)

    async def next_sip(self, timeout_s: float) -> tuple[bytes, Address] | None:
        """The next SIP datagram within ``timeout_s`` (RTP meanwhile is kept for ``messages``); None: none came."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    item = await self.queue.get()
                    if item is None:
                        return None
                    if item[0] == "sip":
                        return item[1], item[2]
                    self.early.append(item)
        except TimeoutError:
            return None

    async def messages(self) -> AsyncIterator[str | bytes]:
        while True:
            if self.early:
                item: tuple[str, bytes, Address] | None = self.early.pop(0)
            else:
                item = await self.queue.get()
            if item is None:
                return
            kind, data, source = item
            expected = self.bridge_rtp if kind == "rtp" else self.bridge_sip
            if source != expected:
                if self.on_warning is not None:
                    self.on_warning(f"{kind.upper()} from {source[0]}:{source[1]}, not {expected}")
                continue
            yield data.decode("utf-8", "surrogateescape") if kind == "sip" else data

    def abort(self) -> None:
        """The network is gone: the sockets close, nothing more is said."""
        self._close()

    async def close(self) -> None:
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for side in (self.sip, self.rtp):
            if side.transport is not None:
                side.transport.close()
        self.queue.put_nowait(None)

    @property
    def close_code(self) -> int | None:
        return None  # UDP has no close code


# ------------------------------------------------------------------------------ one call


@dataclass(slots=True)
class _Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    from_header: str
    to_header: str
    """To, with the bridge's tag."""
    remote_target: str
    """The bridge's Contact URI: where in-dialog requests go."""
    target_address: Address
    route: list[str]
    cseq: int


class SipStream(SimStream):
    """One SIP call's media and in-dialog signalling (see the module docstring)."""

    marks_echoed_on_clear: ClassVar[bool] = False

    def __init__(
        self,
        conn: SipConnection,
        call: SimCall,
        dialog: _Dialog,
        answer: SdpAnswer,
        invite_ack: bytes,
        on_bye: Callable[[], object],
        transfer_status: int = 200,
    ) -> None:
        super().__init__(conn, dialog.call_id, 8000, call)
        self.on_bye = on_bye
        """The bridge hung up: the call is over on the caller's side."""
        self.transfer_status = transfer_status
        """What the transfer target answers when the bridge REFERs the call (reported in the final NOTIFY)."""
        self.transfers: list[str] = []
        """The ``Refer-To`` URI of each REFER the bridge sent."""
        self._answered_cseqs: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.conn: SipConnection = conn
        self.dialog = dialog
        self.answer = answer
        self.invite_ack = invite_ack
        self.sender = RtpSender()
        self.codec = PhoneCodec(answer.payload_type)
        self.srtp = SrtpSession(answer.srtp) if answer.srtp is not None else None
        """SRTP: what we send is protected, what the bridge sends must authenticate."""
        self.dtmf_train: list[bytes] = []
        self.bye_received = False
        self.bye_answered = asyncio.Event()
        self.bye_cseq = -1
        """The CSeq of our BYE (the caller's hang-up), once sent."""
        self.responses: list[tuple[str, int]] = []
        """(method, status) of every response to a request we sent in the dialog (bad inputs, BYE)."""
        self.agent_started = False
        """The bridge has sent audio that is not pure silence: from then on every packet is agent audio."""
        self.max_ahead_ms = 0.0
        self.rtp_received = 0
        self.events_received = 0
        self._ssrc: int | None = None
        self._sequence = 0
        self._timestamp = 0
        self._payload_samples = 0
        self._event: tuple[int, int, int] | None = None
        """The agent's RFC 4733 event being received: (its timestamp, event code, end packets so far)."""
        self.agent_digits: list[str] = []
        """The agent's digits, as RFC 4733 events reached the caller."""
        self._playout_end_s = 0.0
        self._clock_run: tuple[float, int] | None = None
        """The current run of contiguous packets for the clock check: (when its first arrived, its timestamp)."""
        self._last_arrival_s = 0.0
        self._warned: set[str] = set()
        conn.on_warning = self.warn

    # ------------------------------------------------------------ caller → bridge

    async def send_audio(self, pcm_8k: bytes) -> None:
        if self.dtmf_train:  # a phone sends the digit's events instead of its audio
            await self.send(self.dtmf_train.pop(0))
            self.sender.timestamp = (self.sender.timestamp + self.codec.ticks_per_frame) & 0xFFFFFFFF  # the media clock runs on
            return
        await self.send(self.sender.packet(self.answer.payload_type, self.codec.encode(pcm_8k), self.codec.ticks_per_frame))

    async def send(self, message: str | bytes) -> None:
        """RTP (bytes) protected where the call is SRTP."""
        await super().send(self.srtp.protect(message) if isinstance(message, bytes) and self.srtp is not None else message)

    async def send_dtmf(self, digit: str) -> None:
        """RFC 4733: the event's packets go out one per 20 ms tick in place of audio (``send_audio``)."""
        if self.answer.dtmf_payload_type is None:
            self.warn("a key press, but the bridge's answer has no telephone-event")
            return
        start = self.sender.timestamp
        train = dtmf_packets(self.sender, self.answer.dtmf_payload_type, digit, media_hz=self.codec.clock_hz)
        self.sender.timestamp = start  # advanced per packet sent, as real time passes (send_audio)
        self.dtmf_train.extend(train)

    async def send_stop(self) -> None:
        """The caller hangs up: BYE, retransmitted (Timer E) until the bridge's 200 or 4 s; then the sockets close."""
        if self.bye_received or self.conn.closed:
            await self.conn.close()
            self.dropped = True
            return
        request = self._request("BYE")
        self.bye_cseq = self.dialog.cseq
        interval = T1_S
        waited = 0.0
        try:
            while waited < _BYE_TIMEOUT_S:
                self.conn.send_sip(request, self.dialog.target_address)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self.bye_answered.wait()
                if self.bye_answered.is_set():
                    break
                waited += interval
                interval = min(interval * 2, 4.0)
            else:
                self.warn("no response to our BYE")
        except ConnectionError:
            pass
        self.dropped = True
        await self.conn.close()

    def mark_message(self, name: str) -> None:
        return None  # never called: RTP has no markers

    def in_dialog(
        self,
        method: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        content_length: int | None = None,
    ) -> str:
        """A request in this dialog, as text for ``conn.send`` (the bad-input cases)."""
        return self._request(method, body=body, headers=headers, content_length=content_length).decode(
            "utf-8", "surrogateescape"
        )

    def _request(
        self,
        method: str,
        *,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        content_length: int | None = None,
    ) -> bytes:
        dialog = self.dialog
        dialog.cseq += 1
        host, port = self.conn.local_sip
        request = SipRequest(method=method, uri=dialog.remote_target)
        request.add("Via", f"SIP/2.0/UDP {host}:{port};branch=z9hG4bK{secrets.token_hex(8)};rport")
        request.add("Max-Forwards", "70")
        for route in dialog.route:
            request.add("Route", route)
        request.add("From", dialog.from_header)
        request.add("To", dialog.to_header)
        request.add("Call-ID", dialog.call_id)
        request.add("CSeq", f"{dialog.cseq} {method}")
        for name, value in headers:
            request.add(name, value)
        request.body = body
        data = request.serialize()
        if content_length is not None:  # a broken peer's
            data = data.replace(
                f"Content-Length: {len(body)}\r\n".encode(), f"Content-Length: {content_length}\r\n".encode()
            )
        return data

    # ------------------------------------------------------------ bridge → caller

    def receive(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            plain = self.srtp.unprotect(message) if self.srtp is not None else message
            if plain is None:
                self.once("an RTP packet from the bridge that fails SRTP's authentication")
                return
            self._receive_rtp(plain)
            return
        reply = read_sip(message.encode("utf-8", "surrogateescape"))
        if isinstance(reply, str):
            self.warn(f"unreadable SIP from the bridge: {reply}")
            return
        if reply.status:
            self._response(reply)
        else:
            self._bridge_request(reply)

    def _response(self, reply: SipReply) -> None:
        _, method = reply.cseq
        dialog = self.dialog
        if reply.get("call-id") != dialog.call_id or tag_param(reply.get("from")) != dialog.local_tag:
            self.warn(f"a {reply.status} response for another dialog")
            return
        if method == "INVITE":
            if reply.status == 200:  # our ACK was lost, or is on its way: ACK again (§13.2.2.4)
                self.conn.send_sip(self.invite_ack, dialog.target_address)
            return
        if reply.status < 200:
            return
        if reply.status < 300 and tag_param(reply.get("to")) != dialog.remote_tag:
            self.warn(f"the {reply.status} to our {method} has another To tag")
        self.responses.append((method, reply.status))
        self._answered_cseqs.add(reply.cseq[0])
        if reply.cseq == (self.bye_cseq, "BYE"):
            if reply.status != 200:
                self.warn(f"our BYE got {reply.status}")
            self.bye_answered.set()

    def _bridge_request(self, request: SipReply) -> None:
        dialog = self.dialog
        ours = (
            request.get("call-id") == dialog.call_id
            and tag_param(request.get("to")) == dialog.local_tag
            and tag_param(request.get("from")) == dialog.remote_tag
            and request.cseq[0] >= 1
        )
        if request.method == "ACK":
            return
        if not ours:
            self.warn(f"a {request.method} from the bridge outside our dialog")
            self._reply(request, 481, "Call/Transaction Does Not Exist")
            return
        if request.method == "BYE":
            self._reply(request, 200, "OK")
            if not self.bye_received:
                self.bye_received = True
                self.call.result.log(self.call.clock(), "bridge", "BYE: the bridge hangs up")
                self.dropped = True
                self.on_bye()
            return
        if request.method in ("OPTIONS", "INFO"):
            self._reply(request, 200, "OK")
            return
        if request.method == "REFER":
            self._refer(request)
            return
        self.warn(f"{request.method} from the bridge")
        self._reply(request, 501, "Not Implemented")

    def _refer(self, request: SipReply) -> None:
        """The bridge transfers the call (RFC 3515): 202, then the implicit subscription's NOTIFYs — ``100 Trying``
        at once (§2.4.4), then the target's answer (``transfer_status``), subscription terminated. A REFER
        without exactly one ``Refer-To`` is a 400 and a warning."""
        refer_to = request.headers.get("refer-to", [])
        if len(refer_to) != 1 or not name_addr_uri(refer_to[0]).startswith(("sip:", "sips:", "tel:")):
            self.warn(f"a REFER with Refer-To {refer_to}")
            self._reply(request, 400, "Bad Request")
            return
        target = name_addr_uri(refer_to[0])
        self._reply(request, 202, "Accepted")
        if target not in self.transfers:  # (a retransmitted REFER is answered again, not acted on twice)
            self.transfers.append(target)
            self.call.result.log(self.call.clock(), "bridge", f"REFER: transfer the call to {target}")
            reason = {200: "OK", 404: "Not Found", 486: "Busy Here", 487: "Request Terminated"}.get(self.transfer_status, "Failed")
            self._notify("active;expires=60", "SIP/2.0 100 Trying")
            self._notify("terminated;reason=noresource", f"SIP/2.0 {self.transfer_status} {reason}")

    def _notify(self, state: str, sipfrag: str) -> None:
        host, port = self.conn.local_sip
        headers = (
            ("Event", "refer"), ("Subscription-State", state), ("Contact", f"<sip:trunk@{host}:{port}>"),
            ("Content-Type", "message/sipfrag;version=2.0"),
        )  # fmt: skip
        request = self._request("NOTIFY", body=(sipfrag + "\r\n").encode(), headers=headers)
        task = asyncio.get_running_loop().create_task(self._until_answered(request, self.dialog.cseq, "NOTIFY"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _until_answered(self, request: bytes, cseq: int, method: str) -> None:
        """Send an in-dialog request, again at T1, 2·T1 … (Timer E) until its response, for at most 4 s."""
        interval, waited = T1_S, 0.0
        while waited < _BYE_TIMEOUT_S and cseq not in self._answered_cseqs:
            try:
                self.conn.send_sip(request, self.dialog.target_address)
            except ConnectionError:
                return
            await asyncio.sleep(interval)
            waited += interval
            interval = min(interval * 2, 4.0)
        if cseq not in self._answered_cseqs and not self.conn.closed:
            self.warn(f"no response to our {method}")

    def _reply(self, request: SipReply, status: int, reason: str) -> None:
        lines = [f"SIP/2.0 {status} {reason}"]
        lines += [f"Via: {via}" for via in request.headers.get("via", [])]
        to = request.get("to")
        if tag_param(to) is None:
            to += f";tag={self.dialog.local_tag}"
        lines += [
            f"From: {request.get('from')}",
            f"To: {to}",
            f"Call-ID: {request.get('call-id')}",
            f"CSeq: {request.get('cseq')}",
        ]
        lines.append("Content-Length: 0")
        with contextlib.suppress(ConnectionError):
            self.conn.send_sip(("\r\n".join(lines) + "\r\n\r\n").encode(), self.conn.bridge_sip)

    def _receive_rtp(self, data: bytes) -> None:
        self.rtp_received += 1
        if len(data) < 12:
            self.warn(f"a {len(data)}-byte RTP packet")
            return
        first, second = data[0], data[1]
        if first != 0x80:
            self.once(f"RTP first byte 0x{first:02x}: version 2, no padding, extension or CSRC expected")
            return
        payload_type = second & 0x7F
        sequence = int.from_bytes(data[2:4], "big")
        timestamp = int.from_bytes(data[4:8], "big")
        ssrc = int.from_bytes(data[8:12], "big")
        payload = data[12:]
        if self._ssrc is None:
            self._ssrc = ssrc
        elif ssrc != self._ssrc:
            self.once(f"the bridge's SSRC changed from {self._ssrc:08x} to {ssrc:08x}")
            self._ssrc = ssrc
        elif sequence != (self._sequence + 1) & 0xFFFF:
            self.once(f"RTP sequence {sequence} after {self._sequence}")
        elif (
            payload_type == self.answer.payload_type
            and self._event is None
            and timestamp != (self._timestamp + self._payload_samples) & 0xFFFFFFFF
        ):
            self.once(f"RTP timestamp {timestamp} after {self._timestamp} + {self._payload_samples} samples")
        self._sequence = sequence
        if payload_type == self.answer.dtmf_payload_type:
            self._telephone_event(timestamp, payload)
            return
        if self._event is not None and payload_type == self.answer.payload_type:
            self._event_over()
        if payload_type != self.answer.payload_type:
            self.once(f"RTP payload type {payload_type}, negotiated {self.answer.payload_type}")
            return
        codec = self.codec
        self._check_clock(timestamp, contiguous=timestamp == (self._timestamp + self._payload_samples) & 0xFFFFFFFF)
        self._timestamp, self._payload_samples = timestamp, len(payload) if codec.narrowband else codec.ticks_per_frame
        if codec.narrowband and len(payload) != codec.ticks_per_frame:
            self.once(f"a {len(payload)}-sample RTP payload: the answer said ptime 20")
        pcm = codec.decode(payload)
        if not self.agent_started:
            if codec.silent(payload, pcm):
                return  # the bridge's cadence before the agent says anything
            self.agent_started = True
        # how far ahead of real time this packet is: a phone's playout clock (wall time, not this simulator's
        # ticks, which a busy machine delays) plays each packet 20 ms after the previous one or on arrival
        now_s = time.monotonic()
        self._playout_end_s = max(self._playout_end_s, now_s) + len(pcm) / 16000
        ahead_ms = (self._playout_end_s - now_s) * 1000 - FRAME_MS
        self.max_ahead_ms = max(self.max_ahead_ms, ahead_ms)
        if ahead_ms > MAX_AHEAD_MS:
            self.once(f"RTP arrived {ahead_ms:.0f} ms ahead of real time: a phone's jitter buffer overflows")
        self.enqueue_audio(pcm)

    def _check_clock(self, timestamp: int, *, contiguous: bool) -> None:
        """The bridge's RTP clock against wall time, as a phone's playout sees it (the timestamps alone cannot show a
        sender that is slow: each packet follows the last by its samples). Within a run of contiguous packets
        arriving less than ``CLOCK_RUN_GAP_S`` apart, the media time must keep up with the wall time."""
        now_s = time.monotonic()
        if self._clock_run is None or not contiguous or now_s - self._last_arrival_s > CLOCK_RUN_GAP_S:
            self._clock_run = (now_s, timestamp)
        self._last_arrival_s = now_s
        start_s, start_timestamp = self._clock_run
        wall_s = now_s - start_s
        media_s = ((timestamp - start_timestamp) & 0xFFFFFFFF) / self.codec.clock_hz
        if wall_s >= CLOCK_CHECK_AFTER_S and media_s < MIN_CLOCK_RATE * wall_s:
            self.once(
                f"the bridge's RTP covered {media_s * 1000:.0f} ms of media in {wall_s * 1000:.0f} ms of wall time: "
                "it sends slower than its timestamps advance"
            )
            self._clock_run = (now_s, timestamp)

    def _telephone_event(self, timestamp: int, payload: bytes) -> None:
        """An RFC 4733 packet of the agent's digit (§2.3): every packet of an event carries its start timestamp;
        the digit counts once, at its first end packet (E bit), which should come three times (§2.5.1.4)."""
        self.events_received += 1
        if len(payload) != 4 or payload[0] > 15:
            self.once(f"a telephone-event payload {payload.hex()}: 4 bytes, events 0-15 (DTMF) expected")
            return
        if self._event is not None and self._event[0] != timestamp:
            self._event_over()
        if self._event is None:
            self._event = (timestamp, payload[0], 0)
        start, code, ends = self._event
        if code != payload[0]:
            self.once(f"telephone-event {payload[0]} in the packets of event {code}")
        if payload[1] & 0x80:
            if not ends:
                self.agent_digits.append("0123456789*#ABCD"[code])
                self.call.result.log(self.call.clock(), "agent", f"sends digit {self.agent_digits[-1]} (RFC 4733)")
            self._event = (start, code, ends + 1)

    def _event_over(self) -> None:
        """The media (or the next event) follows an event: it must have ended, with the end packet repeated; the
        media clock then stands past it (not where the last audio packet left it)."""
        assert self._event is not None
        _, code, ends = self._event
        if ends < 3:
            self.once(f"telephone-event {code} ended with {ends} end packets: 3 expected (RFC 4733 §2.5.1.4)")
        self._event = None

    def play(self, until_s: float = math.inf) -> tuple[bytes, bool]:
        """As ``SimStream.play``; a frame of digital silence (the bridge's cadence) is not the agent speaking."""
        frame, agent = super().play(until_s)
        return frame, agent and frame.count(0) != len(frame)

    def once(self, text: str) -> None:
        """A warning, once per call for each kind (a broken RTP stream would repeat it every 20 ms)."""
        key = re.sub(r"\d+", "#", text)
        if key not in self._warned:
            self._warned.add(key)
            self.warn(text)


# ------------------------------------------------------------------------------ the trunk


def bind_udp(host: str, *, even: bool = False) -> socket.socket:
    for _ in range(50):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        if not even or sock.getsockname()[1] % 2 == 0:
            sock.setblocking(False)
            return sock
        sock.close()
    raise OSError("no even UDP port")
