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

G.722 and Opus (wideband, #43) are transcoded here, at the edge, by a coder per direction (``codecs/g722.py``,
``codecs/opus.py``: they keep state): the bridge sees L16 at 16 kHz, in and out, as it does a wideband carrier's.
An Opus packet lost on the way is concealed by its decoder (from the next packet's FEC where that is here already),
not with silence bytes. A placed call's codec is known only from the answer (``update`` before the stream starts); a
re-INVITE may not change it (the dialog answers 488).
"""

from __future__ import annotations

from typing import Final, Protocol

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
from callbridge.codecs.opus import OpusDecoder, OpusEncoder
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

    def __init__(
        self, call_id: str, choice: MediaChoice, *, caller: str = "", callee: str = "", jitter_depth: int = 2, opus_fec: bool = True
    ) -> None:
        self.call_id = call_id
        self.stream_id: str | None = call_id
        self.choice = choice
        self.caller = caller
        self.callee = callee
        self.sender = RtpSender()
        self.jitter = JitterBuffer(jitter_depth, _concealment(choice))
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
        self.opus_fec = opus_fec
        """``sip.opus_fec``: an Opus call's packets carry FEC for the peer."""
        self._coder: WidebandCoder | None = _coder_for(choice, opus_fec)
        """G.722's or Opus's coders (to the peer and from it); None for G.711, which the bridge codes itself."""

    @property
    def sending(self) -> bool:
        """Whether we send media now (not while the peer holds the call)."""
        return self.started and not self.stopped and self.choice.direction.we_send

    def update(self, choice: MediaChoice) -> None:
        """A re-INVITE changed the media (hold, resume, a new address): same codec, maybe new payload types. Before
        the stream starts (a placed call's answer, a delayed offer's), the codec too."""
        resumed = choice.direction.we_send and not self.choice.direction.we_send
        if not self.started and choice.encoding is not self.choice.encoding:
            self.jitter.silence_byte = _concealment(choice)
            self._coder = _coder_for(choice, self.opus_fec)
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
            if self._coder is None:  # G.711: the bridge decodes it
                return [MediaReceived(payload) for payload in self.jitter.push(packet) if payload]
            return [MediaReceived(pcm) for pcm in self._coder.decode(self.jitter.push(packet)) if pcm]
        if packet.payload_type == choice.dtmf_payload_type:
            return [DtmfReceived(digit) for digit in self.dtmf.receive(packet)]
        if packet.payload_type != COMFORT_NOISE_PT:
            self.other_payload_types += 1
        return []

    def _control(self, message: str) -> list[CarrierEvent]:
        if message == "start" and not self.started:
            self.started = True
            parameters = {"from": self.caller, "to": self.callee}
            encoding, rate_hz = (AudioEncoding.L16, RATE_HZ) if self._coder is not None else (self.choice.encoding, 8000)
            return [StreamConnected(), StreamStarted(self.call_id, self.call_id, None, encoding, rate_hz, parameters)]
        if message == "bye" and self.started and not self.stopped:
            self.stopped = True
            held = self.jitter.drain()
            pcm = held if self._coder is None else self._coder.decode(held)
            events: list[CarrierEvent] = [MediaReceived(payload) for payload in pcm if payload]
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
            if self._coder is None:  # G.711: a byte a tick
                return self.sender.packet(self.choice.payload_type, action.payload, len(action.payload))
            ticks = len(action.payload) // 2 * self.choice.clock_hz // RATE_HZ
            return self.sender.packet(self.choice.payload_type, self._coder.encoder.encode(action.payload), ticks)
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
        ticks = self.choice.clock_hz * ms // 1000
        if self._coder is not None:
            return self.sender.packet(self.choice.payload_type, self._coder.encoder.silence(ms), ticks)
        return self.sender.packet(self.choice.payload_type, bytes((self.choice.encoding.silence_byte,)) * ticks, ticks)

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
        clocks = {"event_hz": self.choice.dtmf_clock_hz, "media_hz": self.choice.clock_hz}
        return dtmf_packets(self.sender, self.choice.dtmf_payload_type, digit, **clocks)


class WidebandCoder(Protocol):
    """A wideband codec's two directions at the edge: the bridge's side is PCM16 at 16 kHz."""

    @property
    def encoder(self) -> G722Encoder | OpusEncoder:
        """To the peer: the agent's frames and the cadence's silence."""
        ...

    def decode(self, payloads: list[bytes]) -> list[bytes]:
        """The jitter buffer's payloads, in order (``b""``: a lost packet, where the codec conceals its own), as
        PCM16."""
        ...


class _G722Coder:
    __slots__ = ("decoder", "encoder")

    def __init__(self) -> None:
        self.encoder, self.decoder = G722Encoder(), G722Decoder()

    def decode(self, payloads: list[bytes]) -> list[bytes]:
        decode = self.decoder.decode
        return [decode(payload) for payload in payloads if payload]  # a loss came as SILENCE_BYTEs: decoded in step


class _OpusCoder:
    __slots__ = ("decoder", "encoder")

    def __init__(self, fec: bool) -> None:
        self.encoder, self.decoder = OpusEncoder(fec=fec), OpusDecoder()

    def decode(self, payloads: list[bytes]) -> list[bytes]:
        decoder = self.decoder
        return [
            decoder.decode(payload) if payload else decoder.conceal(payloads[i + 1] if i + 1 < len(payloads) else None)
            for i, payload in enumerate(payloads)
        ]


def _coder_for(choice: MediaChoice, opus_fec: bool) -> WidebandCoder | None:
    if choice.encoding is AudioEncoding.G722:
        return _G722Coder()
    return _OpusCoder(opus_fec) if choice.encoding is AudioEncoding.OPUS else None


def _concealment(choice: MediaChoice) -> int | None:
    """What the jitter buffer fills a lost packet with: the codec's silence byte; None (an empty payload) for Opus,
    whose decoder conceals it."""
    return None if choice.encoding is AudioEncoding.OPUS else choice.encoding.silence_byte
