"""A SIP call's RTP media as a carrier codec (telephony-protocols.md §5.3, §5.4).

Messages in are of two kinds. Bytes are RTP datagrams from the latched peer
(``callbridge.sip.rtp.Latch`` in the listener drops the others): the call's
codec payload type goes through a small jitter buffer (re-ordered, a loss
concealed with silence) and comes out as ``MediaReceived`` without a media
timestamp (the buffer already filled the gaps); telephone-event packets
become ``DtmfReceived`` once per event; comfort noise and any other payload
type, and datagrams that are not RTP, are dropped and counted — a stray
datagram on a UDP port ends nothing. Text messages come from the SIP layer:
``start`` (the 200 OK went out: ``StreamStarted``), ``bye`` (the dialog
ended: ``StreamStopped``) and ``dtmf:<digit>`` (SIP INFO).

Out: ``SendMedia`` → one RTP packet (sequence +1, timestamp + samples, the
marker on a talk-spurt's first packet). The bridge paces the frames itself:
RTP has no buffer on our side, so the lead is one frame and a barge-in just
stops sending; there are no markers (``uses_marks=False``: the heard position
is the send clock). On hold (the peer's ``sendonly``/``inactive``) nothing
is sent. Hanging up is closing the transport: the listener sends the BYE.

G.722 (wideband, #43) is transcoded here, at the edge, by a coder per direction (``codecs/g722.py``: it keeps
state): the bridge sees L16 at 16 kHz, in and out, as it does a wideband carrier's. A placed call's codec is known
only from the answer (``update`` before the stream starts); a re-INVITE may not change it (the dialog answers 488).
"""

from __future__ import annotations

from typing import Final

from callbridge.carriers.base import (
    CarrierAction,
    CarrierEvent,
    CarrierProfile,
    DtmfReceived,
    HangUpMode,
    MediaReceived,
    ProtocolErrorReason,
    RemoteProtocolError,
    SendClear,
    SendMedia,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from callbridge.codecs import AudioEncoding
from callbridge.codecs.g722 import RATE_HZ, G722Decoder, G722Encoder
from callbridge.sip.dtmf import DIGITS, DtmfReceiver, dtmf_packets
from callbridge.sip.rtcp import ReceptionStats
from callbridge.sip.rtp import JitterBuffer, RtpError, RtpSender, parse_rtp
from callbridge.sip.sdp import MediaChoice

__all__ = ["COMFORT_NOISE_PT", "PROFILE", "PROVIDER", "SipRtpCodec"]

PROVIDER: Final = "sip"
COMFORT_NOISE_PT: Final = 13
_DIGITS: Final = frozenset(DIGITS)
"""One digit each (``"12" in DIGITS`` and ``"" in DIGITS`` hold: substrings)."""
PROFILE: Final = CarrierProfile(
    frame_ms=20, uses_marks=False, marks_echoed_on_clear=False, lead_ms=60, hang_up=HangUpMode.CLOSE, flushes=False
)
"""RTP plays what arrives: nothing to flush (a barge-in stops sending; what was sent is heard), no markers (the
ledger reports heard positions from the send clock), three frames of lead so a late pacer catches up instead of
drifting behind real time, hang-up = close → BYE."""


class SipRtpCodec:
    """One SIP call's RTP stream (see the module docstring)."""

    profile: Final = PROFILE
    provider: Final = PROVIDER

    def __init__(self, call_id: str, choice: MediaChoice, *, caller: str = "", callee: str = "", jitter_depth: int = 2) -> None:
        self.call_id = call_id
        self.stream_id: str | None = call_id
        self.choice = choice
        self.caller = caller
        self.callee = callee
        self.sender = RtpSender()
        self.jitter = JitterBuffer(jitter_depth, choice.encoding.silence_byte)
        self.dtmf = DtmfReceiver()
        self.started = False
        self.stopped = False
        self.malformed = 0
        self.other_payload_types = 0
        self.media_packets_sent = 0
        self.suppressed_on_hold = 0
        """Frames (agent audio or cadence silence) not sent because the peer holds the call."""
        self.playing_events = False
        """An RFC 4733 digit train is going out (``RtpTransport.play_dtmf``): no audio meanwhile."""
        self.suppressed_for_events = 0
        self._coders: tuple[G722Encoder, G722Decoder] | None = _coders_for(choice)
        """G.722's encoder (to the peer) and decoder (from it); None for G.711, which the bridge codes itself."""

    @property
    def sending(self) -> bool:
        """Whether we send media now (not while the peer holds the call)."""
        return self.started and not self.stopped and self.choice.direction.we_send

    def update(self, choice: MediaChoice) -> None:
        """A re-INVITE changed the media (hold, resume, a new address): same codec, maybe new payload types. Before
        the stream starts (a placed call's answer, a delayed offer's), the codec too."""
        resumed = choice.direction.we_send and not self.choice.direction.we_send
        if not self.started and choice.encoding is not self.choice.encoding:
            self.jitter.silence_byte = choice.encoding.silence_byte
            self._coders = _coders_for(choice)
        self.choice = choice
        if resumed:
            self.sender.talk_spurt = True

    # ------------------------------------------------------------------ in

    def receive_message(self, message: str | bytes) -> list[CarrierEvent]:
        if isinstance(message, str):
            return self._control(message)
        if not self.started or self.stopped:
            return []
        try:
            packet = parse_rtp(message)
        except RtpError:
            self.malformed += 1
            return []
        choice = self.choice
        if packet.payload_type == choice.payload_type:
            if self._coders is None:  # G.711: the bridge decodes it
                return [MediaReceived(payload) for payload in self.jitter.push(packet) if payload]
            decode = self._coders[1].decode
            return [MediaReceived(decode(payload)) for payload in self.jitter.push(packet) if payload]
        if packet.payload_type == choice.dtmf_payload_type:
            return [DtmfReceived(digit) for digit in self.dtmf.receive(packet)]
        if packet.payload_type != COMFORT_NOISE_PT:
            self.other_payload_types += 1
        return []

    def _control(self, message: str) -> list[CarrierEvent]:
        if message == "start" and not self.started:
            self.started = True
            parameters = {"from": self.caller, "to": self.callee}
            encoding, rate_hz = (AudioEncoding.L16, RATE_HZ) if self._coders is not None else (self.choice.encoding, 8000)
            return [StreamConnected(), StreamStarted(self.call_id, self.call_id, None, encoding, rate_hz, parameters)]
        if message == "bye" and self.started and not self.stopped:
            self.stopped = True
            decode = self._coders[1].decode if self._coders is not None else bytes
            events: list[CarrierEvent] = [MediaReceived(decode(payload)) for payload in self.jitter.drain() if payload]
            events.append(StreamStopped())
            return events
        if message.startswith("dtmf:") and self.started and not self.stopped and message[5:] in _DIGITS:
            return [DtmfReceived(message[5:])]
        raise RemoteProtocolError(
            ProtocolErrorReason.OUT_OF_ORDER, f"control {message!r}", provider=PROVIDER, stream_id=self.stream_id, call_id=self.call_id
        )

    # ----------------------------------------------------------------- out

    def send(self, action: CarrierAction) -> bytes | None:
        if isinstance(action, SendMedia):
            if self.playing_events:
                self.suppressed_for_events += 1
                return None
            if not self.sending or not action.payload:
                self.suppressed_on_hold += self.started and not self.stopped and bool(action.payload)
                return None
            self.media_packets_sent += 1
            payload = action.payload if self._coders is None else self._coders[0].encode(action.payload)
            return self.sender.packet(self.choice.payload_type, payload, len(payload))  # G.722 too: a byte a tick
        if isinstance(action, SendClear):
            self.sender.talk_spurt = True  # the next audio starts a new talk-spurt
        return None  # markers are not used; hang-up is closing the transport (the listener's BYE)

    def silence(self, ms: int = 20) -> bytes | None:
        """A packet of silence (the cadence between the agent's utterances: SBCs drop silent calls)."""
        if self.playing_events:
            return None
        if not self.sending:
            self.suppressed_on_hold += self.started and not self.stopped
            return None
        samples = 8 * ms
        if self._coders is not None:
            return self.sender.packet(self.choice.payload_type, self._coders[0].silence(ms), samples)
        return self.sender.packet(self.choice.payload_type, bytes((self.choice.encoding.silence_byte,)) * samples, samples)

    def reception(self) -> ReceptionStats | None:
        """The caller's stream as an RTCP report block sees it; None before any packet."""
        jitter = self.jitter
        if jitter.ssrc is None or jitter.next_sequence is None:
            return None
        return ReceptionStats(jitter.ssrc, jitter.received + jitter.concealed, jitter.concealed, (jitter.next_sequence - 1) & 0xFFFF)

    def dtmf_packets(self, digit: str) -> list[bytes]:
        """An RFC 4733 digit to the caller (empty when telephone-event was not negotiated)."""
        if self.choice.dtmf_payload_type is None or not self.sending:
            return []
        return dtmf_packets(self.sender, self.choice.dtmf_payload_type, digit)


def _coders_for(choice: MediaChoice) -> tuple[G722Encoder, G722Decoder] | None:
    return (G722Encoder(), G722Decoder()) if choice.encoding is AudioEncoding.G722 else None
